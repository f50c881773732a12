"""Framework registry: ``framework.name`` -> implementation class and config schema, as ``"module:attr"`` strings
(imported only when that name is used).

Each framework owns its schema (``frameworks/<name>/config.py``, extending
:class:`~pretrain_exp.core.config.FrameworkConf`, with a ``validate(key)`` of its one-schema checks); its
``conf/framework/<name>.yaml`` extends ``schema/framework/<name>`` (:func:`register_framework_schemas`), so a field
of another framework is refused while composing. Schema modules are dataclasses only: registering them imports
neither torch nor transformers nor OLMo-core.

``olmo_core`` and ``olmo2`` need the ``olmo`` extra: :func:`importlib.util.find_spec` looks for ``olmo_core``
before the import, so a missing install is one :class:`~pretrain_exp.core.errors.ConfigError` with the install
hint rather than an ``ImportError`` from deep inside the framework.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from pretrain_exp.core.config import typed_node as typed
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.registry import load, lookup

FRAMEWORKS = {
    "hf": "pretrain_exp.frameworks.hf.framework:HFFramework",
    "olmo_core": "pretrain_exp.frameworks.olmo_core.framework:OlmoCoreFramework",
    "olmo2": "pretrain_exp.frameworks.olmo2.framework:Olmo2Framework",
}

#: framework -> its schema (a :class:`~pretrain_exp.core.config.FrameworkConf` subclass)
SCHEMAS = {
    "hf": "pretrain_exp.frameworks.hf.config:HFConf",
    "olmo_core": "pretrain_exp.frameworks.olmo_core.config:OlmoCoreConf",
    "olmo2": "pretrain_exp.frameworks.olmo2.config:Olmo2Conf",
}

OLMO_HINT = "pip install -e '.[olmo]' (ai2-olmo-core==3.0.0)"
#: framework -> (top-level module it needs, install hint)
REQUIRES = {"olmo_core": ("olmo_core", OLMO_HINT), "olmo2": ("olmo_core", OLMO_HINT)}


def get_framework_class(name: str) -> type:
    """The framework class registered as ``name``.

    :raises ConfigError: (key ``framework.name``) for an unknown name, listing the registered ones, or for a
        framework whose optional dependency is not installed (``"framework 'olmo_core' needs olmo_core: pip
        install -e '.[olmo]' ..."``).
    """
    return lookup(FRAMEWORKS, name, "framework.name", "framework", REQUIRES)


def schema(name: str, key: str = "framework.name") -> type:
    """The schema dataclass of framework ``name`` (no optional dependency needed).

    :raises ConfigError: (key ``key``) for an unknown name, listing the registered ones.
    """
    return lookup(SCHEMAS, name, key, "framework")


def register_framework_schemas(cs) -> None:
    """Store each framework's schema in Hydra's ConfigStore as ``schema/framework/<name>``."""
    for name, target in SCHEMAS.items():
        cs.store(group="schema/framework", name=name, node=load(target))


def typed_node(key: str, node: Any) -> DictConfig:
    """A composed or loaded ``framework`` node (configured under ``key``) as a node of its framework's schema (a
    ``DictConfig`` of that dataclass, chosen by ``name``; :func:`pretrain_exp.core.config.typed_node`).

    :raises ConfigError: for an unknown framework name (listing the registered ones), fields composed for another
        framework, or a field the framework's schema lacks or a wrong type, naming the key.
    """
    return typed(key, node, "name", SCHEMAS, schema, "framework", _composed_for_another)


def _composed_for_another(key: str, name: str, node: Any, cls: type) -> None:
    src = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if isinstance(src, type) and src is not dict and not issubclass(cls, src):  # framework=hf framework.name=olmo2
        raise ConfigError(f"{key}.name", f"{name!r} was composed with the fields of another framework "
                          f"({src.__name__}); choose it with framework={name}")

"""Framework registry: ``framework.name`` -> implementation class (imported only when that name is used).

``olmo_core`` and ``olmo2`` need the ``olmo`` extra: :func:`importlib.util.find_spec` looks for ``olmo_core``
before the import, so a missing install is one :class:`~pretrain_exp.core.errors.ConfigError` with the install
hint rather than an ``ImportError`` from deep inside the framework.
"""

from __future__ import annotations

from pretrain_exp.core.registry import lookup

FRAMEWORKS = {
    "hf": "frameworks.hf.framework:HFFramework",
    "olmo_core": "frameworks.olmo_core.framework:OlmoCoreFramework",
    "olmo2": "frameworks.olmo2.framework:Olmo2Framework",
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

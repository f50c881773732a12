"""Framework registry: ``framework.name`` -> implementation class (imported lazily)."""

from __future__ import annotations

import importlib

from pretrain_exp.core.errors import ConfigError

FRAMEWORKS = {
    "hf": "frameworks.hf.framework:HFFramework",
    "olmo_core": "frameworks.olmo_core.framework:OlmoCoreFramework",
    "olmo2": "frameworks.olmo2.framework:Olmo2Framework",
}


def get_framework_class(name: str) -> type:
    """The framework class registered as ``name``.

    :raises ConfigError: for an unknown name, listing the registered ones.
    """
    if name not in FRAMEWORKS:
        raise ConfigError("framework.name", f"unknown framework {name!r}; allowed: {sorted(FRAMEWORKS)}")
    module, cls = FRAMEWORKS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "olmo_core":
            raise
        raise ConfigError("framework.name", f"framework {name!r} needs OLMo-core: pip install -e '.[olmo]' "
                          "(ai2-olmo-core==3.0.0)") from None

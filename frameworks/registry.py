"""Framework registry: ``framework.name`` -> implementation class (imported lazily)."""

from __future__ import annotations

import importlib

from pretrain_exp.errors import ConfigError

FRAMEWORKS = {
    "hf": "frameworks.hf.framework:HFFramework",
}


def get_framework_class(name: str) -> type:
    """The framework class registered as ``name``.

    :raises ConfigError: for an unknown name, listing the registered ones.
    """
    if name not in FRAMEWORKS:
        raise ConfigError("framework.name", f"unknown framework {name!r}; allowed: {sorted(FRAMEWORKS)}")
    module, cls = FRAMEWORKS[name].split(":")
    return getattr(importlib.import_module(module), cls)

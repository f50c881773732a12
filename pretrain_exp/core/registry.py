"""Name registries: a plugin name maps to a ``"module:attr"`` string, imported only when the name is used.

Registries live beside what they name and depend only on this module, so choosing a plugin by name never imports
the other plugins (nor their heavy dependencies).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Mapping, Optional

from pretrain_exp.core.errors import ConfigError


def load(target: str) -> Any:
    """The object named by ``"package.module:attr"``."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def lookup(registry: Mapping[str, str], name: str, key: str, kind: str,
           requires: Optional[Mapping[str, tuple[str, str]]] = None) -> Any:
    """The object registered as ``name``.

    :param key: dotted config key, for messages (``framework.name``).
    :param kind: what the registry names, for messages (``framework``).
    :param requires: name -> ``(top-level module, install hint)`` of an optional dependency, checked with
        :func:`importlib.util.find_spec` before the import so that a missing extra gets its install hint.
    :raises ConfigError: for an unknown name (listing the registered ones) or a missing optional dependency.
    """
    if name not in registry:
        raise ConfigError(key, f"unknown {kind} {name!r}; allowed: {sorted(registry)}")
    if requires and name in requires:
        module, hint = requires[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(key, f"{kind} {name!r} needs {module}: {hint}")
    return load(registry[name])

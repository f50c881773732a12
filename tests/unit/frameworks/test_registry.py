"""The framework registry: names, and the install hint when OLMo-core is missing."""

from __future__ import annotations

import importlib.util

import pytest

from pretrain_exp.core.capabilities import APPLIES_EMBEDDING_NOISE, has
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.frameworks import registry


@pytest.mark.parametrize("name", ["olmo_core", "olmo2"])
def test_missing_olmo_core_gives_the_install_hint(name, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda mod, *a: None if mod == "olmo_core" else real(mod, *a))
    hint = r"framework.name: framework '.*' needs olmo_core: pip install -e '\.\[olmo\]'"
    with pytest.raises(ConfigError, match=hint):
        registry.get_framework_class(name)


def test_unknown_name_lists_the_frameworks():
    with pytest.raises(ConfigError, match=r"unknown framework 'jax'; allowed: \['hf', 'olmo2', 'olmo_core'\]"):
        registry.get_framework_class("jax")


def test_hf_is_found_and_declares_what_it_supports():
    cls = registry.get_framework_class("hf")
    assert cls.__name__ == "HFFramework" and has(cls, APPLIES_EMBEDDING_NOISE)
    assert {"cosine", "linear", "constant", "cosine_with_restarts"} <= set(cls.lr_schedulers)

"""The framework registry: names, and the install hint when OLMo-core is missing."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from pretrain_exp.core.capabilities import APPLIES_EMBEDDING_NOISE, has
from pretrain_exp.core.config import TrainingConf
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.frameworks import registry
from tests.conftest import CHECKOUT_PYTHONPATH, ROOT


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


@pytest.mark.parametrize("name", ["hf", "olmo_core", "olmo2"])
def test_the_default_lr_scheduler_is_one_of_every_framework(name):
    """Validation reads a framework's ``lr_schedulers`` only for another value than the schema's default."""
    assert TrainingConf.lr_scheduler in registry.get_framework_class(name).lr_schedulers


def test_a_refusal_before_training_does_not_import_the_trainer_utilities():
    """``transformers.trainer_utils`` (SchedulerType) pulls in peft: 2 s that a refused run does not spend."""
    code = ("import sys\n"
            "from pretrain_exp.app.cli import main\n"
            "sys.argv = ['pretrain_exp', 'experiment=tiny', 'training.num_steps=1']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('exit', e.code)\n"
            "print(sorted(m for m in ('transformers.trainer_utils', 'peft') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=os.environ | {"PYTHONPATH": CHECKOUT_PYTHONPATH})
    assert out.stdout.splitlines()[-2:] == ["exit 2", "[]"], out.stdout[-2000:] + out.stderr[-2000:]

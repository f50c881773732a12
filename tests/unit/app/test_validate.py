"""Cross-plugin rules checked when the config is validated."""

from __future__ import annotations

import pytest

from pretrain_exp.core.errors import ConfigError
from tests.conftest import make_config


def test_lr_scheduler_must_be_one_the_framework_supports(tmp_path):
    make_config("training.lr_scheduler=cosine_with_restarts", run_dir=tmp_path)  # hf: every transformers scheduler
    pytest.importorskip("olmo_core")
    with pytest.raises(ConfigError, match=r"training.lr_scheduler: unknown scheduler 'cosine_with_restarts' for "
                                          r"framework 'olmo_core'; allowed: \['constant', 'constant_with_warmup', "
                                          r"'cosine', 'linear'\]"):
        make_config("framework=olmo_core", "training.lr_scheduler=cosine_with_restarts", run_dir=tmp_path)
    make_config("framework=olmo_core", "training.lr_scheduler=linear", run_dir=tmp_path)

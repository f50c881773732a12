"""Bad placements: explicit positions that overlap, leave the window or cross rows; windows too full; noise rows."""

from __future__ import annotations

import pytest

from pretrain_exp.core.errors import ConfigError, InsertionError
from pretrain_exp.insertion.plan import build_plan
from pretrain_exp.insertion.schema import (
    EosPolicy,
    PlacementConf,
    RangeUnit,
)
from pretrain_exp.insertion.types import load_items
from pretrain_exp.insertion.types.gaussian import GaussianConf
from pretrain_exp.insertion.types.tokens import TokensConf
from tests.bad_input import TOK, VOCAB, L, assert_error, write_jsonl

WINDOW = (4 * L, 12 * L)  #: a run continuing from step 2 with B=2 rows for 4 steps


def plan_explicit(tmp_path, lines, name="exp", allow_row_crossing=False):
    f = write_jsonl(tmp_path / f"{name}.jsonl", lines)
    exp = TokensConf(file=str(f), key="tokens", eos=EosPolicy.none,
                     placement=PlacementConf(kind="explicit", allow_row_crossing=allow_row_crossing))
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
    explicit = PlacementConf(kind="explicit")
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
    placement = PlacementConf(kind="range", start=start, end=end, unit=unit)
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
    _, plan = _gaussian(tmp_path, PlacementConf(kind="explicit"), [{"position": [4 * L, 7 * L]}])
    assert plan().noise_rows.tolist() == [4, 7]


@pytest.mark.parametrize("pos, needles", [
    (5 * L + 3, [f"position {5 * L + 3} is not a row start", f"q * {L}"]),
    (12 * L, [f"[{12 * L}, {13 * L})", "outside the training window"]),
    (0, [f"[0, {L})", "outside the training window"]),
])
def test_gaussian_explicit_row_outside_the_run_or_not_a_row_start(tmp_path, pos, needles):
    f, plan = _gaussian(tmp_path, PlacementConf(kind="explicit"), [{"position": 6 * L}, {"position": pos}])
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

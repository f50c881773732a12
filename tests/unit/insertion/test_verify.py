"""The verifier: verify_batches reads a framework's own batches (peek_rows) and checks them against the schedule;
verify_plan names the row, span or offset that is wrong."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pretrain_exp.core.errors import InsertionError
from pretrain_exp.data.schedule import rows_for
from pretrain_exp.insertion.plan import Plan
from pretrain_exp.insertion.verify import (
    VerifyReport,
    rows_to_verify,
    untouched_rows,
    verify_batches,
    verify_plan,
)
from tests.unit.insertion.test_plan import verify_setup  # noqa: F401  (fixture: plan over rows [8, 48), L=16, B=2)


def peek_from(rows, permute=False):
    calls = []

    def peek(step, rank, world, only):
        calls.append((step, rank, world))
        q = rows_for(step, rank, world, rows.order.global_batch_size)
        q = q[np.isin(q, only)]
        if permute:
            q = q[::-1]
        return q, np.stack([rows.row(int(x)) for x in q])

    return peek, calls


@pytest.mark.parametrize("world", [1, 2])
def test_the_frameworks_batches_are_verified_like_the_rows(verify_setup, world):  # noqa: F811
    plan, order, rows = verify_setup
    peek, calls = peek_from(rows)
    got = verify_batches(plan, peek, order.row_tokens, (8, 48), world, untouched_sample=5, seed=1)
    want = verify_plan(plan, rows.row, order.row_tokens, (8, 48), untouched_sample=5, seed=1)
    assert got == want
    steps = {k for k, _, _ in calls}
    affected_steps = {int(q) // 2 + 1 for q in plan.affected_rows()}
    assert affected_steps <= steps and len(calls) == len(set(calls))  # each (step, rank) read once


def test_rows_out_of_schedule_order_are_refused(verify_setup):  # noqa: F811
    plan, order, rows = verify_setup
    peek, _ = peek_from(rows, permute=True)
    with pytest.raises(InsertionError, match="the schedule"):
        verify_batches(plan, peek, order.row_tokens, (8, 48), 1, untouched_sample=40)


def test_a_batch_without_the_planned_span_is_refused(verify_setup):  # noqa: F811
    plan, order, rows = verify_setup

    def peek(step, rank, world, only):
        q = rows_for(step, rank, world, 2)
        q = q[np.isin(q, only)]
        return q, np.stack([order.row_tokens(int(x)) for x in q])  # insertions not applied

    with pytest.raises(InsertionError, match="did not land"):
        verify_batches(plan, peek, order.row_tokens, (8, 48), 1)


# --- a hand-built plan: L=4, B=1, rows 0..39, token q*4+o at offset o of row q --------------------------------

def hand_plan(spans, items=((100, 101, 102), (200, 201)), global_batch_size=1):
    """A :class:`Plan` of one experiment with ``items`` and ``spans`` (``(position, item)``, sorted) over rows
    ``[0, 40)``, built as ``build_plan`` lays it out (no placement rules applied, so a test can break them)."""
    lengths = [len(t) for t in items]
    return Plan(4, global_batch_size, (0, 160), ["e"],
                token_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                tokens=np.array([t for it in items for t in it], dtype=np.uint16),
                item_experiment=np.zeros(len(items), np.int32), item_dup_count=np.ones(len(items), np.int32),
                span_positions=np.array([p for p, _ in spans], np.int64),
                span_item_ids=np.array([i for _, i in spans], np.int32),
                span_dup_index=np.zeros(len(spans), np.int32))


def base_row(q):
    return np.arange(4 * q, 4 * q + 4, dtype=np.int64)


def trained_row(plan):
    def read(q):
        row = base_row(q)
        plan.apply(q, row)
        return row
    return read


def test_a_changed_token_outside_the_spans_is_named_by_row_and_offset():
    plan = hand_plan([(5, 0), (11, 1)])  # [5, 8) in row 1; [11, 13) across rows 2 and 3
    ok = trained_row(plan)

    def read(q):
        row = ok(q)
        if q == 2:
            row[2] += 1  # row 2: offsets 0..2 are outside every span, 3 is span 1's first token
        return row

    with pytest.raises(InsertionError) as e:
        verify_plan(plan, read, base_row, (0, 40))
    assert str(e.value) == "row 2: token outside every planned span changed (offset 2)"


def test_a_plan_with_overlapping_spans_is_refused():
    """Two copies of the same tokens overlapping in row 1 write a row that matches both spans: only the overlap
    check refuses it."""
    plan = hand_plan([(5, 0), (6, 1)], items=((7, 7, 7), (7, 7, 7)))
    with pytest.raises(InsertionError) as e:
        verify_plan(plan, trained_row(plan), base_row, (0, 40))
    assert str(e.value) == "row 1: insertion 1 overlaps another span"


class RowsMissingPlan(Plan):
    """A plan whose row index leaves out the last row of its row-crossing span (the verifier must not trust it)."""

    def affected_rows(self):
        return super().affected_rows()[:-1]


def test_a_span_that_lands_only_in_part_is_refused_with_its_count():
    plan = hand_plan([(5, 0), (11, 1)])
    short = RowsMissingPlan(**{f: getattr(plan, f) for f in plan.__dataclass_fields__})
    assert short.affected_rows().tolist() == [1, 2]
    with pytest.raises(InsertionError) as e:
        verify_plan(short, trained_row(short), base_row, (0, 40))
    assert str(e.value) == "insertion 1 at 11: 1 of 2 tokens landed"


def test_the_verifier_logs_what_it_checked(caplog):
    plan = hand_plan([(5, 0), (11, 1)])
    with caplog.at_level(logging.INFO, logger="pretrain_exp.insertion.verify"):
        report = verify_plan(plan, trained_row(plan), base_row, (0, 40), untouched_sample=4)
    assert report == VerifyReport(rows_checked=3, spans_checked=2, tokens_inserted=5, untouched_rows_checked=4)
    assert [r.getMessage() for r in caplog.records] == [
        "verified plan: 2 insertions (5 tokens) in 3 rows landed exactly once; 4 untouched rows unchanged"]


def test_untouched_rows_of_an_empty_range_or_sample():
    plan = hand_plan([(5, 0), (11, 1)])
    for row_range, n in [((7, 7), 16), ((9, 7), 16), ((0, 40), 0)]:
        got = untouched_rows(plan, row_range, n, 0)
        assert got.dtype == np.int64 and got.shape == (0,)
    got = untouched_rows(plan, (0, 40), 8, 3)
    assert got.dtype == np.int64 and got.size == 8 and np.all(np.diff(got) > 0)
    assert not set(got.tolist()) & {1, 2, 3} and got.min() >= 0 and got.max() < 40
    rows = rows_to_verify(plan, (0, 40), 8, 3)
    assert rows.dtype == np.int64 and rows.tolist() == sorted({1, 2, 3} | set(got.tolist()))


def test_the_defaults_read_the_rows_rows_to_verify_names():
    """verify_plan and verify_batches with their default sample and seed read exactly the rows
    ``rows_to_verify`` gives with its defaults (16 untouched rows here: the range has 37); verify_batches hands
    them to its ``fetch`` once, before it reads any."""
    plan = hand_plan([(5, 0), (11, 1)])
    want = rows_to_verify(plan, (0, 40))
    assert want.size == 3 + 16
    read = []
    ok = trained_row(plan)
    verify_plan(plan, lambda q: read.append(q) or ok(q), base_row, (0, 40))
    assert sorted(set(read)) == want.tolist()
    asked, fetched = [], []

    def peek(step, rank, world, only):
        assert fetched, "a row is read before the rows are fetched"
        asked.extend(only.tolist())
        q = rows_for(step, rank, world, 1)
        q = q[np.isin(q, only)]
        return q, np.stack([ok(int(x)) for x in q])

    verify_batches(plan, peek, base_row, (0, 40), 1, fetch=lambda rows: fetched.append(rows.tolist()))
    assert sorted(asked) == want.tolist() and fetched == [want.tolist()]  # fetched once, before the first read


def test_a_batch_in_the_wrong_order_is_named_with_its_first_eight_rows():
    plan = hand_plan([(5, 0), (11, 1)], global_batch_size=10)
    ok = trained_row(plan)

    def peek(step, rank, world, only):
        q = rows_for(step, rank, world, 10)[::-1]
        q = q[np.isin(q, only)]
        return q, np.stack([ok(int(x)) for x in q])

    with pytest.raises(InsertionError) as e:
        verify_batches(plan, peek, base_row, (0, 10), 1, untouched_sample=40)
    assert str(e.value) == ("step 1, rank 0 of 1: the framework's batch holds rows [9, 8, 7, 6, 5, 4, 3, 2], "
                            "the schedule (rows_for) [0, 1, 2, 3, 4, 5, 6, 7]")

"""verify_batches: the verifier reads a framework's own batches (peek_rows) and checks them against the schedule."""

from __future__ import annotations

import numpy as np
import pytest

from pretrain_exp.core.errors import InsertionError
from pretrain_exp.data.schedule import rows_for
from pretrain_exp.insertion.verify import verify_batches, verify_plan
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

"""The verifier: read affected rows back through the training data path and prove the plan landed.

For every training-order row touched by the plan, the row as the trainer's dataset yields it is compared with
the same row read from the token files without insertions: inside each planned span it must equal the
planned tokens, outside all spans it must equal the original tokens, and every planned token position must be
covered exactly once over all rows. A sample of untouched rows must come back unchanged.

:func:`verify_batches` reads those rows through a framework's own batches (``Framework.peek_rows``: the rows DP
rank ``r`` of ``W`` trains at step ``k``, read through the framework's data path with the insertions applied as
training applies them), checks that each (step, rank) holds exactly :func:`~pretrain_exp.data.schedule.rows_for`'s
rows in that order, and runs :func:`verify_plan` on what came back. Only the (step, rank) batches holding an
affected or sampled row are read, and of them only those rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from pretrain_exp.core.errors import InsertionError
from pretrain_exp.data.schedule import rows_for, step_and_rank

#: ``(step, dp_rank, dp_world, only) -> (q int64 (n,), tokens int64 (n, L))``: a framework's ``peek_rows``
PeekFn = Callable[[int, int, int, np.ndarray], Tuple[np.ndarray, np.ndarray]]

log = logging.getLogger(__name__)


@dataclass
class VerifyReport:
    """What the verifier checked."""

    rows_checked: int
    spans_checked: int
    tokens_inserted: int
    untouched_rows_checked: int


def untouched_rows(plan, row_range: tuple[int, int], n: int, seed: int) -> np.ndarray:
    """Up to ``n`` rows of ``[first, end)`` without any planned span (seeded sample): ``int64``, sorted."""
    if row_range[1] <= row_range[0] or not n:
        return np.empty(0, dtype=np.int64)
    cand = np.unique(np.random.default_rng(seed).integers(row_range[0], row_range[1], size=4 * n))
    return cand[~np.isin(cand, plan.affected_rows())][:n].astype(np.int64)


def verify_plan(plan, read_row: Callable[[int], np.ndarray], base_row: Callable[[int], np.ndarray],
                row_range: tuple[int, int], untouched_sample: int = 16, seed: int = 0) -> VerifyReport:
    """Check that ``read_row`` (the data path with insertions) realizes ``plan`` exactly.

    :param read_row: training-order row ``q`` -> tokens as trained, shape ``(L,)``.
    :param base_row: training-order row ``q`` -> tokens from the files, no insertions, shape ``(L,)``.
    :param row_range: ``[first, end)`` rows the run trains (untouched rows are sampled from it).
    :raises InsertionError: naming the first row/span that is wrong.
    """
    L = plan.sequence_length
    covered = np.zeros(plan.num_insertions, dtype=np.int64)
    rows = plan.affected_rows()
    for q in rows:
        q = int(q)
        got, base = np.asarray(read_row(q)), np.asarray(base_row(q))
        lo = q * L
        mask = np.zeros(L, dtype=bool)
        i0, i1 = plan.spans_in_row(q)
        for i in range(i0, i1):
            s, e = int(plan.positions[i]), int(plan.ends[i])
            a, b = max(s, lo), min(e, lo + L)
            want = plan.item_tokens(int(plan.item_ids[i]))[a - s:b - s]
            if mask[a - lo:b - lo].any():
                raise InsertionError(f"row {q}: insertion {i} overlaps another span")
            if not np.array_equal(got[a - lo:b - lo], want):
                raise InsertionError(f"row {q}: span of insertion {i} at [{s}, {e}) did not land as planned")
            mask[a - lo:b - lo] = True
            covered[i] += b - a
        if not np.array_equal(got[~mask], base[~mask]):
            bad = int(np.flatnonzero(got[~mask] != base[~mask])[0])
            raise InsertionError(f"row {q}: token outside every planned span changed "
                                 f"(offset {np.flatnonzero(~mask)[bad]})")
    if not np.array_equal(covered, plan.lengths):
        i = int(np.flatnonzero(covered != plan.lengths)[0])
        raise InsertionError(f"insertion {i} at {int(plan.positions[i])}: {int(covered[i])} of "
                             f"{int(plan.lengths[i])} tokens landed")
    sample = untouched_rows(plan, row_range, untouched_sample, seed)
    for q in sample:
        if not np.array_equal(np.asarray(read_row(int(q))), np.asarray(base_row(int(q)))):
            raise InsertionError(f"row {int(q)} has no planned insertion but changed")
    report = VerifyReport(int(rows.size), plan.num_insertions, int(plan.lengths.sum()), int(sample.size))
    log.info("verified plan: %d insertions (%d tokens) in %d rows landed exactly once; %d untouched rows unchanged",
             report.spans_checked, report.tokens_inserted, report.rows_checked, report.untouched_rows_checked)
    return report


def rows_to_verify(plan, row_range: tuple[int, int], untouched_sample: int = 16, seed: int = 0) -> np.ndarray:
    """The training-order rows :func:`verify_batches` reads: the plan's affected rows and the sample of untouched
    ones; ``int64``, sorted."""
    return np.union1d(plan.affected_rows(), untouched_rows(plan, row_range, untouched_sample, seed)).astype(np.int64)


def verify_batches(plan, peek: PeekFn, base_row: Callable[[int], np.ndarray], row_range: tuple[int, int],
                   dp_world: int, untouched_sample: int = 16, seed: int = 0,
                   fetch: Optional[Callable[[np.ndarray], object]] = None) -> VerifyReport:
    """:func:`verify_plan` on the batches a framework will train (module docstring).

    :param peek: the framework's ``peek_rows`` bound to the run's rows: ``(step, dp_rank, dp_world, only)`` ->
        ``(q, tokens)`` for the rows of ``only`` among those rank ``dp_rank`` trains at global step ``step``.
    :param base_row: training-order row ``q`` -> tokens from the files, no insertions, shape ``(L,)``.
    :param row_range: ``[first, end)`` rows the run trains.
    :param dp_world: data-parallel processes ``W`` of the run.
    :param fetch: called once, before any row is read, with the rows it reads (:func:`rows_to_verify`): remote rows
        not fetched yet (a window streamed beside training) fetched ahead
        (:func:`~pretrain_exp.data.prefetch.prefetch_rows`).
    :raises InsertionError: if a batch does not hold its scheduled rows in order, or a span did not land exactly.
    """
    B = plan.global_batch_size
    wanted = rows_to_verify(plan, row_range, untouched_sample, seed)
    if fetch is not None:
        fetch(wanted)
    steps, ranks, _ = step_and_rank(wanted, dp_world, B)
    got: Dict[int, np.ndarray] = {}
    for k, r in sorted(set(zip(steps.tolist(), ranks.tolist()))):
        only = wanted[(steps == k) & (ranks == r)]
        q, tokens = peek(k, r, dp_world, only)
        scheduled = rows_for(k, r, dp_world, B)
        want = scheduled[np.isin(scheduled, only)]
        if not np.array_equal(np.asarray(q, dtype=np.int64), want):
            raise InsertionError(f"step {k}, rank {r} of {dp_world}: the framework's batch holds rows "
                                 f"{np.asarray(q).tolist()[:8]}, the schedule (rows_for) {want.tolist()[:8]}")
        got.update(zip(want.tolist(), np.asarray(tokens)))
    return verify_plan(plan, lambda q: got[q], base_row, row_range, untouched_sample, seed)

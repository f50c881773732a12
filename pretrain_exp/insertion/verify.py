"""The verifier: read affected rows back through the training data path and prove the plan landed.

For every training-order row touched by the plan, the row as the trainer's dataset yields it is compared with
the same row read from the token files without insertions: inside each planned span it must equal the
planned tokens, outside all spans it must equal the original tokens, and every planned token position must be
covered exactly once over all rows. A sample of untouched rows must come back unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pretrain_exp.core.errors import InsertionError

log = logging.getLogger(__name__)


@dataclass
class VerifyReport:
    """What the verifier checked."""

    rows_checked: int
    spans_checked: int
    tokens_inserted: int
    untouched_rows_checked: int


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
    rng = np.random.default_rng(seed)
    sample = np.empty(0, dtype=np.int64)
    if row_range[1] > row_range[0] and untouched_sample:
        cand = np.unique(rng.integers(row_range[0], row_range[1], size=4 * untouched_sample))
        sample = cand[~np.isin(cand, rows)][:untouched_sample]
    for q in sample:
        if not np.array_equal(np.asarray(read_row(int(q))), np.asarray(base_row(int(q)))):
            raise InsertionError(f"row {int(q)} has no planned insertion but changed")
    report = VerifyReport(int(rows.size), plan.num_insertions, int(plan.lengths.sum()), int(sample.size))
    log.info("verified plan: %d insertions (%d tokens) in %d rows landed exactly once; %d untouched rows unchanged",
             report.spans_checked, report.tokens_inserted, report.rows_checked, report.untouched_rows_checked)
    return report

"""Choosing global token positions for insertions, with no overlaps across all experiments of a run.

- ``explicit`` experiments are placed first, at the positions their items give. Each span must lie inside the
  training window; it may not cross a row boundary unless ``placement.allow_row_crossing``; overlapping
  explicit spans are an error naming both items.
- ``random`` and ``range`` experiments follow, in sorted order of their names, each with its own RNG. A copy of
  length ``n`` gets a row drawn uniformly from the allowed rows and an offset drawn uniformly from
  ``[0, L - n]``, so it never crosses a row boundary. Candidates that overlap anything already placed (or each
  other) are redrawn, all at once, round after round (vectorized; 1M items place in seconds).
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

from pretrain_exp.core.errors import ConfigError, InsertionError
from pretrain_exp.insertion.schema import PlacementConf

MAX_ROUNDS = 200  #: redraw rounds before a random placement gives up (the window is too full)


class Occupancy:
    """The spans placed so far: sorted, non-overlapping ``[start, end)`` token intervals (``int64`` arrays)."""

    def __init__(self):
        self.starts = np.empty(0, dtype=np.int64)
        self.ends = np.empty(0, dtype=np.int64)

    def conflicts(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Boolean mask, shape ``starts.shape``: does ``[starts[i], ends[i])`` overlap a placed span?"""
        j = np.searchsorted(self.ends, starts, side="right")  # first placed span ending after the start
        hit = j < self.ends.size
        hit[hit] = self.starts[j[hit]] < ends[hit]
        return hit

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Add spans that overlap neither each other nor the placed ones."""
        s = np.concatenate([self.starts, starts])
        order = np.argsort(s, kind="stable")
        self.starts, self.ends = s[order], np.concatenate([self.ends, ends])[order]


def place_explicit(positions: np.ndarray, lengths: np.ndarray, labels: Sequence[str], window: tuple[int, int],
                   sequence_length: int, allow_crossing: np.ndarray, occ: Occupancy) -> None:
    """Check explicit spans and add them to ``occ``.

    :param positions: ``int64`` start positions, shape ``(n,)``; ``lengths`` likewise.
    :param labels: a description of each span's item, for messages.
    :param allow_crossing: ``bool`` per span: may it cross a row boundary?
    :raises InsertionError: for a span outside ``window``, a forbidden row crossing, or two overlapping spans.
    """
    L = sequence_length
    w0, w1 = window
    ends = positions + lengths
    for i in np.flatnonzero((positions < w0) | (ends > w1))[:1]:
        raise InsertionError(f"{labels[i]}: span [{positions[i]}, {ends[i]}) lies outside the training window "
                             f"[{w0}, {w1})")
    crossing = (positions // L != (ends - 1) // L) & ~allow_crossing
    for i in np.flatnonzero(crossing)[:1]:
        raise InsertionError(f"{labels[i]}: span [{positions[i]}, {ends[i]}) crosses the row boundary at "
                             f"{(positions[i] // L + 1) * L}; set placement.allow_row_crossing=true to allow it")
    order = np.argsort(positions, kind="stable")
    s, e = positions[order], ends[order]
    bad = np.flatnonzero(s[1:] < e[:-1])
    if bad.size:
        a, b = order[bad[0]], order[bad[0] + 1]
        raise InsertionError(f"overlapping explicit positions: {labels[a]} at [{positions[a]}, {ends[a]}) and "
                             f"{labels[b]} at [{positions[b]}, {ends[b]})")
    hit = occ.conflicts(s, e)
    if hit.any():
        i = order[np.flatnonzero(hit)[0]]
        raise InsertionError(f"{labels[i]}: span [{positions[i]}, {ends[i]}) overlaps an earlier insertion")
    occ.add(s, e)


def allowed_rows(key: str, pl: PlacementConf, row_range: tuple[int, int], window: tuple[int, int],
                 sequence_length: int, global_batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows a random/range experiment may use, as sorted disjoint intervals ``[starts[i], ends[i])``
    (``int64``): the training-order rows ``row_range = [lo, hi)`` its placement kind gives
    (:meth:`PlacementSpec.row_range <pretrain_exp.insertion.placements.base.PlacementSpec.row_range>`: the whole
    window for ``random``, the complete rows inside the range for ``range``), intersected with the batches of
    ``pl.steps`` (global steps) or of every ``pl.every_n_steps``-th step of the run (steps S+n, S+2n, ... for a run
    continuing step S); ``key``: the experiment's config key, for messages.

    :raises ConfigError: for a step outside the run, or a selection that leaves no row.
    """
    lo, hi = row_range
    B = global_batch_size
    first_step, last_step = window[0] // (sequence_length * B) + 1, window[1] // (sequence_length * B)
    if pl.steps:
        bad = [k for k in pl.steps if not first_step <= k <= last_step]
        if bad:
            raise ConfigError(f"{key}.placement.steps", f"steps {bad} are outside the run's steps "
                              f"[{first_step}, {last_step}]")
        steps = np.unique(np.asarray(pl.steps, dtype=np.int64))
    elif pl.every_n_steps:
        steps = np.arange(first_step - 1 + pl.every_n_steps, last_step + 1, pl.every_n_steps, dtype=np.int64)
    else:
        return np.array([lo], np.int64), np.array([hi], np.int64)
    starts, ends = np.clip((steps - 1) * B, lo, hi), np.clip(steps * B, lo, hi)
    keep = ends > starts
    if not keep.any():
        raise ConfigError(f"{key}.placement", "the selected steps hold no row of the placement's range")
    return starts[keep], ends[keep]


def place_random(lengths: np.ndarray, rows: tuple[np.ndarray, np.ndarray], sequence_length: int,
                 rng: np.random.Generator, occ: Occupancy, what: str, global_batch_size: int = 1,
                 max_per_batch: int = 0) -> np.ndarray:
    """Uniform positions for spans of ``lengths`` within the row intervals ``rows`` (as :func:`allowed_rows`
    returns them; each row equally likely), none crossing a row boundary or overlapping ``occ`` or each other,
    and, if ``max_per_batch`` > 0, at most that many per global batch of ``global_batch_size`` rows. The spans
    are added to ``occ``.

    :returns: ``int64`` start positions, shape ``lengths.shape``.
    :raises InsertionError: if a copy is longer than a row, or the rows cannot hold the copies (naming
        ``what`` and how full the rows are).
    """
    L = sequence_length
    lengths = np.asarray(lengths, dtype=np.int64)
    n = lengths.size
    pos = np.empty(n, dtype=np.int64)
    if n == 0:
        return pos
    r0, r1 = (np.atleast_1d(np.asarray(r, dtype=np.int64)) for r in rows)
    cum = np.cumsum(r1 - r0)
    if lengths.max() > L:
        raise InsertionError(f"{what}: a copy of {int(lengths.max())} tokens cannot fit in a row of {L} "
                             "tokens")
    capacity = int(cum[-1]) * L
    where = f"rows [{r0[0]}, {r1[-1]})" + (f" ({r0.size} intervals)" if r0.size > 1 else "")
    B = global_batch_size
    if lengths.sum() > capacity:
        raise InsertionError(f"{what}: {int(lengths.sum())} tokens to insert do not fit in {where} "
                             f"({capacity} tokens); {_fit_hint(int(lengths.sum()), capacity, L, B)}")
    if max_per_batch:
        batches = np.unique(np.concatenate([np.arange(a // B, (b - 1) // B + 1) for a, b in zip(r0, r1)]))
        if n > batches.size * max_per_batch:
            raise InsertionError(f"{what}: {n} copies at most {max_per_batch} per batch need "
                                 f"{-(-n // max_per_batch)} batches; the placement allows {batches.size}")
    placed_batches = np.empty(0, dtype=np.int64)
    pending = np.arange(n)
    for _ in range(MAX_ROUNDS):
        m = pending.size
        ln = lengths[pending]
        u = rng.integers(0, cum[-1], size=m, dtype=np.int64)
        i = np.searchsorted(cum, u, side="right")
        row = r0[i] + u - (cum[i] - (r1[i] - r0[i]))
        s = row * L + (rng.random(m) * (L - ln + 1)).astype(np.int64)
        e = s + ln
        free = np.flatnonzero(~occ.conflicts(s, e))
        order = free[np.argsort(s[free], kind="stable")]
        ss, ee = s[order], e[order]
        clash = np.zeros(order.size, dtype=bool)
        if order.size > 1:
            clash[1:] = ss[1:] < np.maximum.accumulate(ee)[:-1]
        acc = order[~clash]
        if max_per_batch:
            acc = _cap_per_batch(acc, s[acc] // L // B, placed_batches, max_per_batch)
            placed_batches = np.concatenate([placed_batches, s[acc] // L // B])
        pos[pending[acc]] = s[acc]
        occ.add(s[acc], e[acc])
        keep = np.ones(m, dtype=bool)
        keep[acc] = False
        pending = pending[keep]
        if pending.size == 0:
            return pos
    used = sum(int((np.clip(occ.ends, a * L, b * L) - np.clip(occ.starts, a * L, b * L)).sum())
               for a, b in zip(r0, r1))
    raise InsertionError(f"{what}: could not place {pending.size} of {n} copies without overlap after "
                         f"{MAX_ROUNDS} rounds ({where} are {used / max(capacity, 1):.0%} full); "
                         f"{_fit_hint(int(lengths.sum()), capacity, L, B)}")


def _fit_hint(tokens: int, capacity: int, L: int, B: int) -> str:
    """How to make ``tokens`` of copies fit (random placement needs room to spare: about half the rows' tokens)."""
    steps = -(-2 * tokens // (L * B))
    return (f"random placement needs about twice the tokens it inserts: about {steps} steps of {B} x {L} tokens "
            f"(training.num_steps={steps}, or a wider placement range), or fewer items or repetitions "
            f"(about {capacity // 2} tokens fit here)")


def _cap_per_batch(cand: np.ndarray, batch: np.ndarray, placed: np.ndarray, cap: int) -> np.ndarray:
    """The candidates (in their given order) that keep every batch at ``<= cap`` copies, given the batches of
    the copies ``placed`` already."""
    have = np.zeros(batch.size, dtype=np.int64)
    if placed.size:
        ub, uc = np.unique(placed, return_counts=True)
        idx = np.minimum(np.searchsorted(ub, batch), ub.size - 1)
        have = np.where(ub[idx] == batch, uc[idx], 0)
    order = np.argsort(batch, kind="stable")
    b_sorted = batch[order]
    first = np.searchsorted(b_sorted, b_sorted, side="left")
    rank = np.arange(b_sorted.size) - first
    ok = np.zeros(cand.size, dtype=bool)
    ok[order] = rank + have[order] < cap
    return cand[ok]


def expand_copies(dup_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(item index, dup index)`` of every copy, item-major: ``int64`` arrays of shape ``(sum(dup_counts),)``."""
    item = np.repeat(np.arange(dup_counts.size, dtype=np.int64), dup_counts)
    starts = np.repeat(np.cumsum(dup_counts) - dup_counts, dup_counts)
    return item, np.arange(item.size, dtype=np.int64) - starts


def explicit_positions(positions: List[List[int]]) -> np.ndarray:
    """Flatten per-item explicit position lists (item-major, as :func:`expand_copies`) to ``int64``."""
    return np.asarray([p for ps in positions for p in ps], dtype=np.int64)

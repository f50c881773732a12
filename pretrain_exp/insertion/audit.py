"""The natural-duplicate audit: how often every plan item already occurs in the data the run trains.

A dup-0 control that already sits in the training window, or a "clean" benchmark item whose question occurs in
the natural data, is not a control. For every item of a plan the audit counts, in the rows the run trains (the
training window, read from the token files *before* insertion) and in the held-out rows:

- **exact occurrences**: start offsets where the item's whole token sequence occurs inside one row;
- **n-gram overlap**: how many of the item's distinct ``n``-token n-grams (default ``n = 13``) occur in some
  row, and how many window n-grams hit one of them.

The n-gram rule is the decontamination rule of GPT-3 (Brown et al. 2020, *Language Models are Few-Shot Learners*,
appendix C: an example is "dirty" if any of its N-grams, N = 13 at most, occurs in the training data), which
EleutherAI's lm-evaluation-harness decontamination (``lm_eval/decontamination``, 13-grams) also follows; we apply
it to token n-grams rather than to normalized words. An item is compared by its *content*: leading and
trailing ``strip`` tokens (the EOS delimiters of the EOS policy) are dropped first. An item shorter than ``n``
tokens has no n-grams; its overlap is its exact occurrence. Occurrences crossing a row boundary are not counted
(consecutive rows are unrelated instances of the shuffled data order).

Method: a polynomial hash of every n-gram of a block of rows (``h = sum_j t[o + j] * P^(n-1-j) mod 2^64``, in
``O(log n)`` vectorized passes by doubling: ``h_{a+b}[o] = h_a[o] P^b + h_b[o + a]``), a direct-mapped table of the
items' n-gram hashes as a prefilter, ``searchsorted`` in the items' sorted hashes for the survivors, and exact
token comparison of every candidate, so a hash collision never counts. Items shorter than ``n`` get the same
treatment at their own length. Memory is ``O(block)`` plus ``O(item tokens)``; throughput and the cost at OLMo
scale are measured by ``benchmarks/audit.py``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from pretrain_exp.core.errors import CheckpointError, InsertionError
from pretrain_exp.core.io import write_json
from pretrain_exp.core.logs import MEASURABLE_S, rate
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.data.order import step_row_offset

log = logging.getLogger(__name__)

DEFAULT_NGRAM = 13  #: GPT-3 appendix C / lm-eval decontamination
#: odd 64-bit multiplier of the polynomial hash (any odd constant works: candidates are verified exactly)
HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
MAX_LOCATIONS = 20  #: occurrence positions kept per item and kind
#: rows read and hashed at once by default: ``block_tokens`` tokens (~40 B of memory per token)
BLOCK_TOKENS = 1 << 22
SOURCE = ("GPT-3 (Brown et al. 2020) appendix C; lm-evaluation-harness decontamination: 13-gram overlap, on "
          "token n-grams here")


def ngram_hashes(rows: np.ndarray, n: int, multiplier: np.uint64 = HASH_MULTIPLIER) -> np.ndarray:
    """Polynomial hashes of every ``n``-gram inside each row.

    :param rows: token ids, integer array of shape ``(R, L)`` (one row per training-order row).
    :param n: n-gram length, ``1 <= n <= L``.
    :returns: ``uint64`` array ``(R, L - n + 1)``: entry ``[r, o]`` hashes ``rows[r, o:o + n]``.
    """
    t = np.ascontiguousarray(rows).astype(np.uint64, copy=False)
    R, W = t.shape
    width = W - n + 1
    flat = t.ravel()  # hash the rows as one stream (contiguous slices), then drop the n-grams crossing rows
    h = _stream_hashes(flat, n, int(multiplier))
    h = np.concatenate([h, np.zeros(n - 1, np.uint64)]).reshape(R, W)[:, :width]
    return h


def _stream_hashes(flat: np.ndarray, n: int, mult: int) -> np.ndarray:
    """Hashes of the ``flat.size - n + 1`` n-grams of a ``uint64`` stream, by doubling: the hash of an
    ``(a + b)``-gram is ``h_a[o] * P^b + h_b[o + a]`` (mod 2^64), so ``n`` takes ``O(log n)`` passes."""
    if n == 1:
        return flat.copy()
    half = _stream_hashes(flat, n // 2, mult)  # (n//2)-grams
    m = flat.size - n + 1
    pw = np.uint64(pow(mult, n - n // 2, 1 << 64))
    if n % 2 == 0:  # h_n[o] = h_{n/2}[o] * P^{n/2} + h_{n/2}[o + n/2]
        h = half[:m] * pw
        h += half[n // 2:n // 2 + m]
    else:  # h_n[o] = h_{n-1}[o] * P + t[o + n - 1], h_{n-1} from the halves
        k = n // 2
        h = half[:m] * np.uint64(pow(mult, k, 1 << 64))
        h += half[k:k + m]
        h *= np.uint64(mult)
        h += flat[n - 1:n - 1 + m]
    return h


@dataclass
class Hit:
    """One verified occurrence: item ``item`` starts at offset ``offset`` of training-order row ``q``."""

    item: int
    q: int
    offset: int


@dataclass
class ItemIndex:
    """The items' n-grams (and short items' whole sequences) as sorted hash arrays for the scan.

    :param contents: per item its content tokens (int64, shape ``(m_i,)``; empty for a noise item).
    :param n: n-gram length.
    """

    contents: List[np.ndarray]
    n: int
    multiplier: np.uint64 = HASH_MULTIPLIER
    keys: Dict[int, tuple] = field(default_factory=dict)  #: length -> (sorted hashes, item, item offset)

    def __post_init__(self):
        n = self.n
        self.lengths = np.array([c.size for c in self.contents], dtype=np.int64)
        self.flat = np.concatenate(self.contents) if self.contents else np.empty(0, np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        #: per item: number of distinct n-grams (items shorter than n: 0)
        self.ngrams = np.zeros(self.lengths.size, dtype=np.int64)
        long_items = np.flatnonzero(self.lengths >= n)
        if long_items.size:  # every n-gram of every item: one hash pass over the items' tokens back to back
            h_all = _stream_hashes(self.flat.astype(np.uint64), n, int(self.multiplier))
            per = self.lengths[long_items] - n + 1
            item = np.repeat(long_items.astype(np.int64), per)
            off = np.arange(int(per.sum()), dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
            self._add(n, h_all[self.starts[item] + off], item, off)
            self.ngrams = distinct_per_item(item, h_all[self.starts[item] + off], self.lengths.size)
        for m in np.unique(self.lengths[(self.lengths > 0) & (self.lengths < n)]):
            short = np.flatnonzero(self.lengths == m)
            h = ngram_hashes(np.stack([self.contents[i] for i in short]), int(m), self.multiplier)[:, 0]
            self._add(int(m), h, short.astype(np.int64), np.zeros(short.size, np.int64))

    def _add(self, m: int, h: np.ndarray, item: np.ndarray, off: np.ndarray) -> None:
        order = np.argsort(h, kind="stable")
        h = h[order]
        bits = int(np.clip(np.ceil(np.log2(max(h.size, 1))) + 5, 12, 26))
        table = np.zeros(1 << bits, dtype=bool)
        table[h >> np.uint64(64 - bits)] = True
        self.keys[m] = (h, item[order], off[order], table, np.uint64(64 - bits))

    def find(self, rows: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Verified matches of the length-``m`` keys in ``rows``.

        :param rows: int64 ``(R, L)``.
        :returns: ``(row index in rows, offset, entry)`` int64 arrays, one per verified match; ``entry`` indexes
            ``keys[m]``'s sorted arrays (item ``keys[m][1][entry]``, item offset ``keys[m][2][entry]``), and
            ``rows[r, o:o + m] == content[item][io:io + m]``.
        """
        empty = np.empty(0, np.int64)
        if m > rows.shape[1] or m not in self.keys:
            return empty, empty, empty
        h_sorted, items, offs, table, shift = self.keys[m]
        h = ngram_hashes(rows, m, self.multiplier)
        cand = np.flatnonzero(table[h.ravel() >> shift])
        if cand.size == 0:
            return empty, empty, empty
        hv = h.ravel()[cand]
        lo = np.searchsorted(h_sorted, hv, side="left")
        hi = np.searchsorted(h_sorted, hv, side="right")
        keep = hi > lo
        cand, lo, hi = cand[keep], lo[keep], hi[keep]
        if cand.size == 0:
            return empty, empty, empty
        reps = hi - lo
        cand = np.repeat(cand, reps)
        entry = np.repeat(lo - np.cumsum(reps) + reps, reps) + np.arange(int(reps.sum()))
        width = h.shape[1]
        r, o = cand // width, cand % width
        item, io = items[entry], offs[entry]
        ar = np.arange(m)
        ok = np.ones(r.size, dtype=bool)
        for a in range(0, r.size, 1 << 16):  # exact comparison (rules out hash collisions), bounded memory
            s = slice(a, a + (1 << 16))
            got = rows[r[s, None], o[s, None] + ar]
            want = self.flat[(self.starts[item[s]] + io[s])[:, None] + ar]
            ok[s] = (got == want).all(axis=1)
        return r[ok], o[ok], entry[ok]


@dataclass
class ScanCounts:
    """What one scan (the window or the held-out rows) found, per item (arrays of shape ``(num_items,)``)."""

    exact: np.ndarray  #: int64: exact occurrences
    ngram_hits: np.ndarray  #: int64: distinct n-grams of the item found at least once
    ngram_occurrences: np.ndarray  #: int64: scanned n-grams equal to one of the item's n-grams
    exact_at: Dict[int, List[int]]  #: item -> first global token positions of exact occurrences
    ngram_at: Dict[int, List[int]]  #: item -> first global token positions of n-gram hits
    rows: int = 0  #: rows scanned
    tokens: int = 0  #: tokens scanned
    seconds: float = 0.0
    #: bool per sorted n-gram key of the index: found at least once (merging parts of a parallel scan)
    ngram_found: Optional[np.ndarray] = None


def scan_rows(index: ItemIndex, blocks: Iterator[tuple[np.ndarray, np.ndarray]], sequence_length: int,
              progress: Optional[Callable[[int], None]] = None, max_locations: int = MAX_LOCATIONS) -> ScanCounts:
    """Count the items of ``index`` in row blocks (module docstring).

    :param blocks: ``(q int64 (R,), tokens int64 (R, L))`` per block: training-order rows and their tokens.
    :param progress: called with the rows of each finished block.
    :param max_locations: occurrence positions kept per item (exact and n-gram each).
    """
    k, n, L = index.lengths.size, index.n, sequence_length
    exact = np.zeros(k, np.int64)
    occ = np.zeros(k, np.int64)
    seen = {m: np.zeros(v[0].size, dtype=bool) for m, v in index.keys.items() if m == n}
    exact_at: Dict[int, List[int]] = {}
    ngram_at: Dict[int, List[int]] = {}
    out = ScanCounts(exact, np.zeros(k, np.int64), occ, exact_at, ngram_at)
    t0 = time.perf_counter()
    long_len = index.lengths >= n
    for q, tokens in blocks:
        tokens = np.asarray(tokens, dtype=np.int64)
        out.rows += tokens.shape[0]
        out.tokens += tokens.size
        for m in index.keys:
            r, o, entry = index.find(tokens, m)
            if not r.size:
                continue
            item, io = index.keys[m][1][entry], index.keys[m][2][entry]
            pos = q[r] * L + o
            if m == n:
                occ += np.bincount(item, minlength=k)
                seen[m][entry] = True
                _remember(ngram_at, item, pos, max_locations)
                first = io == 0  # an exact occurrence starts with the item's first n-gram
                cand = np.flatnonzero(first & (o + index.lengths[item] <= L))
                full = np.array([np.array_equal(tokens[r[c], o[c]:o[c] + index.lengths[item[c]]],
                                                index.contents[item[c]]) for c in cand], dtype=bool)
                hit = cand[full] if cand.size else cand
            else:  # short items: the match is the whole item
                hit = np.arange(r.size)
                hit = hit[~long_len[item[hit]]]
            exact += np.bincount(item[hit], minlength=k)
            _remember(exact_at, item[hit], pos[hit], max_locations)
        if progress is not None:
            progress(tokens.shape[0])
    if n in index.keys:  # distinct n-grams found: an n-gram repeated inside an item counts once
        h_sorted, items_sorted = index.keys[n][:2]
        found = seen[n]
        out.ngram_hits = distinct_per_item(items_sorted[found], h_sorted[found], k)
        out.ngram_found = found
    out.seconds = time.perf_counter() - t0
    return out


def merge_counts(index: ItemIndex, parts: Sequence[ScanCounts], max_locations: int = MAX_LOCATIONS) -> ScanCounts:
    """One :class:`ScanCounts` from the scans of consecutive, ascending parts of the rows (in that order): the
    same counts and kept positions as one scan over all of them."""
    k, n = index.lengths.size, index.n
    out = ScanCounts(np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(k, np.int64), {}, {})
    found = np.zeros(index.keys[n][0].size, dtype=bool) if n in index.keys else None
    for part in parts:
        out.exact += part.exact
        out.ngram_occurrences += part.ngram_occurrences
        out.rows += part.rows
        out.tokens += part.tokens
        if found is not None and part.ngram_found is not None:
            found |= part.ngram_found
        for mine, theirs in ((out.exact_at, part.exact_at), (out.ngram_at, part.ngram_at)):
            for item, positions in theirs.items():  # ascending parts: the first positions come first
                lst = mine.setdefault(item, [])
                lst.extend(positions[:max(0, max_locations - len(lst))])
    if found is not None:
        h_sorted, items_sorted = index.keys[n][:2]
        out.ngram_hits = distinct_per_item(items_sorted[found], h_sorted[found], k)
        out.ngram_found = found
    return out


_WORKER: dict = {}  #: a pool worker's index, row reader, L and block size (set once by its initializer)


def _init_worker(index: ItemIndex, read_row: Callable[[int], np.ndarray], sequence_length: int,
                 block_tokens: int) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C stops the run, which stops the pool (no tracebacks)
    _WORKER.update(index=index, read_row=read_row, L=sequence_length, block=block_tokens)


def _scan_part(rows: np.ndarray) -> ScanCounts:
    w = _WORKER
    return scan_rows(w["index"], row_blocks(w["read_row"], rows, w["L"], w["block"]), w["L"])


def scan_parallel(index: ItemIndex, read_row: Callable[[int], np.ndarray], rows: np.ndarray, sequence_length: int,
                  block_tokens: int = BLOCK_TOKENS, workers: int = 1,
                  progress: Optional[Callable[[int], None]] = None) -> ScanCounts:
    """:func:`scan_rows` over the training-order rows ``rows`` (ascending), split into consecutive parts scanned
    by ``workers`` processes (forked; spawned where fork is missing); the counts
    equal one process's (:func:`merge_counts`). ``workers <= 1`` or fewer rows than two blocks: in this process.

    :param progress: called with the rows of each finished part.
    """
    rows = np.asarray(rows, dtype=np.int64)
    per_block = max(1, block_tokens // sequence_length)
    if workers <= 1 or rows.size < 2 * per_block:
        return scan_rows(index, row_blocks(read_row, rows, sequence_length, block_tokens), sequence_length, progress)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.perf_counter()
    num_parts = min(-(-rows.size // per_block), 4 * workers)  # a few parts per worker balance uneven speeds
    parts = np.array_split(rows, num_parts)
    results = []
    # fork where there is one (as torch's DataLoader workers): the workers start at once and inherit the index and
    # the reader; spawn elsewhere (both pickled once per worker)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method), initializer=_init_worker,
                             initargs=(index, read_row, sequence_length, block_tokens)) as pool:
        for part, res in zip(parts, pool.map(_scan_part, parts)):
            results.append(res)
            if progress is not None:
                progress(part.size)
    out = merge_counts(index, results)
    out.seconds = time.perf_counter() - t0
    return out


def default_workers() -> int:
    """The cores this process may use (``os.sched_getaffinity``; ``os.cpu_count`` where that is missing)."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def audit_key(contents: Sequence[np.ndarray], n: int, sequence_length: int, files: Sequence[tuple[str, int]],
              dtype: str, window_rows: np.ndarray, window_instances: np.ndarray, held_rows: np.ndarray,
              held_instances: np.ndarray) -> str:
    """What an audit's counts depend on, as a sha256 hex digest: the items' content tokens (in item order), ``n``,
    ``L``, the token files (``(identity, bytes)``: a URL, or a local path with its modification time), their
    dtype, and the window's and the held-out rows' training-order indices and instance ids. Not the placement of
    the insertions (the audit reads the rows before insertion) nor the seed, except through the instances and
    items it picks: jobs of a sweep that train the same rows with the same items share one audit."""
    import hashlib

    h = hashlib.sha256(json.dumps({"v": 1, "n": int(n), "L": int(sequence_length), "dtype": str(dtype),
                                   "files": [[str(f), int(b)] for f, b in files]}).encode())
    for c in contents:
        h.update(np.int64(c.size).tobytes())
        h.update(np.asarray(c, dtype="<i8").tobytes())
    for a in (window_rows, window_instances, held_rows, held_instances):
        a = np.asarray(a, dtype="<i8")
        h.update(np.int64(a.size).tobytes())
        h.update(a.tobytes())
    return h.hexdigest()


def distinct_per_item(item: np.ndarray, h: np.ndarray, k: int) -> np.ndarray:
    """Number of distinct hashes ``h`` per item (``item``, ``h``: equal-length arrays): int64 ``(k,)``."""
    if item.size == 0:
        return np.zeros(k, np.int64)
    order = np.lexsort((h, item))
    i, v = item[order], h[order]
    new = np.ones(i.size, dtype=bool)
    new[1:] = (i[1:] != i[:-1]) | (v[1:] != v[:-1])
    return np.bincount(i[new], minlength=k).astype(np.int64)


def _remember(where: Dict[int, List[int]], items: np.ndarray, positions: np.ndarray, cap: int) -> None:
    """Append to ``where[item]`` the smallest positions of each item, up to ``cap`` per item."""
    if items.size == 0:
        return
    order = np.lexsort((positions, items))
    i, p = items[order], positions[order]
    rank = np.arange(i.size) - np.searchsorted(i, i, side="left")
    keep = rank < cap
    for item, pos in zip(i[keep].tolist(), p[keep].tolist()):
        lst = where.setdefault(item, [])
        if len(lst) < cap:
            lst.append(int(pos))


def item_contents(plan, strip: Optional[int]) -> List[np.ndarray]:
    """Per plan item its tokens without leading/trailing ``strip`` tokens (``int64``; noise items: empty)."""
    out = []
    for i in range(plan.num_items):
        t = np.asarray(plan.item_tokens(i), dtype=np.int64)
        if plan.item_noise_seed[i] >= 0:
            t = t[:0]
        elif strip is not None and t.size:
            keep = np.flatnonzero(t != strip)
            t = t[keep[0]:keep[-1] + 1] if keep.size else t[:0]
        out.append(t)
    return out


def row_blocks(read_row: Callable[[int], np.ndarray], rows: np.ndarray, sequence_length: int,
               block_tokens: int = BLOCK_TOKENS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(q, tokens (R, L) int64)`` blocks of the training-order rows ``rows``, about ``block_tokens`` tokens each.

    :param read_row: training-order row ``q`` -> its tokens, shape ``(L,)``.
    """
    rows = np.asarray(rows, dtype=np.int64)
    per = max(1, block_tokens // sequence_length)
    for a in range(0, rows.size, per):
        q = rows[a:a + per]
        yield q, np.stack([np.asarray(read_row(int(x)), dtype=np.int64) for x in q])


@dataclass
class AuditResult:
    """The audit of one plan: per-item counts in the window and in the held-out rows (module docstring)."""

    n: int
    window: ScanCounts
    held_out: ScanCounts
    ngrams: np.ndarray  #: int64 ``(num_items,)``: distinct n-grams per item
    lengths: np.ndarray  #: int64 ``(num_items,)``: content tokens per item
    plan_digest: str = ""

    def item_records(self, plan) -> List[dict]:
        """One dict per item: ``natural_exact``, ``natural_ngram_overlap`` (fraction of the item's n-grams found
        in the window; exact occurrence for an item shorter than ``n``), ``held_out_exact``,
        ``held_out_ngram_overlap`` and ``effective_dup_count`` (= dup count + natural exact occurrences)."""
        out = []
        for i in range(plan.num_items):
            out.append({"natural_exact": int(self.window.exact[i]),
                        "natural_ngram_overlap": _overlap(self.window, self.ngrams, i),
                        "held_out_exact": int(self.held_out.exact[i]),
                        "held_out_ngram_overlap": _overlap(self.held_out, self.ngrams, i),
                        "effective_dup_count": int(plan.item_dup_count[i]) + int(self.window.exact[i])})
        return out

    def found_in_window(self, i: int) -> bool:
        """Item ``i`` occurs in the window: an exact occurrence or any n-gram hit (GPT-3's "dirty")."""
        return bool(self.window.exact[i] or self.window.ngram_hits[i])

    def first_location(self, i: int) -> Optional[tuple[str, int]]:
        """``(kind, global token position)`` of item ``i``'s first recorded window occurrence (exact first)."""
        if self.window.exact_at.get(i):
            return "exact occurrence", min(self.window.exact_at[i])
        if self.window.ngram_at.get(i):
            return f"{self.n}-gram overlap", min(self.window.ngram_at[i])
        return None

    def contaminated_controls(self, plan) -> List[int]:
        """Items with dup count 0 (controls) found in the window, ascending."""
        return [i for i in range(plan.num_items) if plan.item_dup_count[i] == 0 and self.found_in_window(i)]

    def describe(self, plan, i: int, labels: Optional[Sequence[str]] = None) -> str:
        """``item <id> (<label>): <kind> at step K, row R, offset O (position p)`` for item ``i``."""
        where = self.first_location(i)
        name = f"item {i}" + (f" ({labels[i]})" if labels is not None else "")
        if where is None:
            return f"{name}: not found"
        kind, p = where
        step, row, off = step_row_offset(p, plan.sequence_length, plan.global_batch_size)
        return (f"{name}: {kind} at step {int(step)}, row {int(row)}, offset {int(off)} (position {p}); "
                f"{int(self.window.exact[i])} exact occurrence(s), {int(self.window.ngram_hits[i])} of "
                f"{int(self.ngrams[i])} {self.n}-grams in the window")

    def report(self, plan, items: Dict[str, Sequence], strict: bool) -> None:
        """Log the controls found in the window (the first 10) and the items in the held-out rows; ``items``:
        experiment -> its items (their labels).

        :raises InsertionError: with ``strict`` (``insertion.audit=strict``), for a control found in the window,
            naming the item and where (step, row, offset).
        """
        labels = [f"{it.experiment}[{it.index}] {it.source}" for name in plan.experiments for it in items[name]]
        bad = self.contaminated_controls(plan)
        if bad and strict:
            more = f"; {len(bad) - 1} more control(s) in {RunDir.AUDIT}" if len(bad) > 1 else ""
            raise InsertionError(f"insertion.audit=strict: control {self.describe(plan, bad[0], labels)}{more}")
        for i in bad[:10]:
            log.warning("audit: control %s", self.describe(plan, i, labels))
        held = [i for i in range(plan.num_items) if self.held_out.exact[i]]
        if held:
            log.warning("audit: %d item(s) occur in the held-out rows (perplexity), e.g. %s", len(held),
                        labels[held[0]])

    def to_json(self, plan, mode: str) -> dict:
        """The ``audit.json`` content: parameters, cost, per-item counts and occurrence positions."""
        L, B = plan.sequence_length, plan.global_batch_size

        def where(positions):
            s, r, o = step_row_offset(np.asarray(positions, np.int64), L, B)
            return [{"position": int(p), "step": int(a), "row": int(b), "offset": int(c)}
                    for p, a, b, c in zip(positions, s, r, o)]

        items = []
        for i, rec in enumerate(self.item_records(plan)):
            items.append({"item_id": i, "experiment": plan.experiments[int(plan.item_experiment[i])],
                          "dup_count": int(plan.item_dup_count[i]), "content_length": int(self.lengths[i]),
                          "ngrams": int(self.ngrams[i]), **rec,
                          "natural_ngram_hits": int(self.window.ngram_hits[i]),
                          "natural_ngram_occurrences": int(self.window.ngram_occurrences[i]),
                          "held_out_ngram_hits": int(self.held_out.ngram_hits[i]),
                          "exact_at": where(self.window.exact_at.get(i, [])),
                          "ngram_at": where(self.window.ngram_at.get(i, [])),
                          "held_out_exact_at": where(self.held_out.exact_at.get(i, []))})
        scanned = self.window.tokens + self.held_out.tokens
        seconds = self.window.seconds + self.held_out.seconds
        return {"mode": mode, "ngram": self.n, "source": SOURCE, "plan_digest": self.plan_digest,
                "window_rows": self.window.rows, "window_tokens": self.window.tokens,
                "held_out_rows": self.held_out.rows, "held_out_tokens": self.held_out.tokens,
                "seconds": seconds, "tokens_per_s": scanned / seconds if seconds >= MEASURABLE_S else None,
                "contaminated_controls": self.contaminated_controls(plan), "items": items}

    def save(self, path: str | Path, plan, mode: str) -> None:
        """Write ``audit.json`` atomically."""
        write_json(Path(path), self.to_json(plan, mode))

    @classmethod
    def load(cls, path: str | Path) -> "AuditResult":
        """Read an ``audit.json`` written by :meth:`save`.

        :raises CheckpointError: naming the file if it is unreadable or incomplete.
        """
        try:
            doc = json.loads(Path(path).read_text())
            items = doc["items"]

            def counts(prefix, rows, tokens, at):
                return ScanCounts(
                    np.array([r[f"{prefix}_exact"] for r in items], np.int64),
                    np.array([r[f"{prefix}_ngram_hits"] for r in items], np.int64),
                    np.array([r.get(f"{prefix}_ngram_occurrences", 0) for r in items], np.int64),
                    {r["item_id"]: [w["position"] for w in r[f"{at}exact_at"]] for r in items if r[f"{at}exact_at"]},
                    {r["item_id"]: [w["position"] for w in r["ngram_at"]] for r in items
                     if at == "" and r["ngram_at"]}, rows, tokens)

            return cls(int(doc["ngram"]), counts("natural", doc["window_rows"], doc["window_tokens"], ""),
                       counts("held_out", doc["held_out_rows"], doc["held_out_tokens"], "held_out_"),
                       np.array([r["ngrams"] for r in items], np.int64),
                       np.array([r["content_length"] for r in items], np.int64), doc.get("plan_digest", ""))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: not a readable audit ({e})") from None


def _overlap(counts: ScanCounts, ngrams: np.ndarray, i: int) -> float:
    if ngrams[i] == 0:  # shorter than n: the whole item is the unit
        return float(counts.exact[i] > 0)
    return float(counts.ngram_hits[i]) / float(ngrams[i])


def audit_plan(plan, read_row: Callable[[int], np.ndarray], window_rows: np.ndarray, held_out_rows: np.ndarray,
               n: int = DEFAULT_NGRAM, strip: Optional[int] = None, block_tokens: int = BLOCK_TOKENS,
               progress: Optional[Callable[[int], None]] = None, workers: int = 1) -> AuditResult:
    """Audit every item of ``plan`` against the window rows and the held-out rows (module docstring).

    :param read_row: training-order row ``q`` -> its tokens from the files, **no insertions**, shape ``(L,)``.
    :param window_rows: int64 training-order rows the run trains; ``held_out_rows`` likewise (may be empty).
    :param n: n-gram length in tokens (``>= 1``).
    :param strip: token id dropped from both ends of every item before matching (the EOS), or None.
    :param block_tokens: tokens read and hashed at once (memory ~40 B per token, per worker).
    :param workers: processes scanning the window (:func:`scan_parallel`; the counts do not depend on it).
    :returns: the :class:`AuditResult`; its ``tokens_per_s`` is logged.
    """
    if n < 1:
        raise ValueError(f"n-gram length must be >= 1, got {n}")
    L = plan.sequence_length
    index = ItemIndex(item_contents(plan, strip), n)
    window = scan_parallel(index, read_row, window_rows, L, block_tokens, workers, progress)
    held = scan_rows(index, row_blocks(read_row, held_out_rows, L, block_tokens), L)
    res = AuditResult(n, window, held, index.ngrams, index.lengths, plan.digest())
    secs = window.seconds + held.seconds
    log.info("audit: %d items against %d window + %d held-out tokens (%d-grams) in %.1f s%s, %d process(es); %d "
             "items occur in the window, %d controls among them", plan.num_items, window.tokens,
             held.tokens, n, secs, rate(window.tokens + held.tokens, secs, "tokens", "{:.2e}"), max(1, workers),
             sum(res.found_in_window(i) for i in range(plan.num_items)), len(res.contaminated_controls(plan)))
    return res

"""The natural-duplicate audit (:mod:`pretrain_exp.insertion.audit`) on a scaled OLMo-2 1B window.

An OLMo-2 1B continuation of 2,000 steps trains 2,000 x 512 rows x 4,096 tokens = 4.19e9 tokens. This script
writes a token file of random ``uint32`` ids (vocab 100,352) holding ``--steps`` such steps (default 4: 8.4M
tokens) plus 64 held-out rows, plants every 10th of ``--items`` items (default 2,000, 40-200 tokens, EOS-wrapped
like benchmark questions) once in the window, runs :func:`~pretrain_exp.insertion.audit.audit_plan` over the
window in OLMo's data order (rows read through :class:`~pretrain_exp.data.order.DataOrder`, as a run does) and
reports:

- throughput in tokens/s (read + hash + lookup + verification), and the hashing/lookup alone on rows in memory;
- peak memory of the scan (tracemalloc; numpy registers its buffers there) and the process's peak RSS;
- the time and memory extrapolated to the 2,000-step window (time linear in tokens; memory does not grow with
  the window: one block of rows plus the items' index).

- the same audit by a pool of ``--workers`` processes (default: the cores given), its speed-up over one process
  and the rate per core (the counts must be equal).

Usage: ``python benchmarks/audit.py [--steps K] [--items N] [--block-tokens T] [--workers W]``. Numbers are
printed, not asserted; the planted counts are checked.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from pretrain_exp.data.order import DataOrder
from pretrain_exp.data.token_files import TokenFiles
from pretrain_exp.insertion.audit import (
    BLOCK_TOKENS,
    ItemIndex,
    audit_plan,
    default_workers,
    item_contents,
    scan_rows,
)
from pretrain_exp.insertion.plan import Plan

L, B, VOCAB, EOS = 4096, 512, 100352, 100257
FULL_STEPS = 2000


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="steps of the scaled window (512 x 4096 tokens each)")
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--block-tokens", type=int, default=BLOCK_TOKENS)
    ap.add_argument("--ngram", type=int, default=13)
    ap.add_argument("--workers", type=int, default=default_workers(), help="processes of the pooled run")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = args.steps * B + 64
    lengths = rng.integers(40, 201, size=args.items)
    contents = [rng.integers(0, 50000, size=int(n)) for n in lengths]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokens.npy"
        data = rng.integers(0, VOCAB, size=rows * L, dtype=np.uint32)  # raw uint32, no header: OLMo's format
        data.tofile(path)
        order = DataOrder(TokenFiles([path], np.uint32), L, B, seed=0)
        window_rows = np.arange(0, args.steps * B, dtype=np.int64)
        held = order.held_out_rows(64)
        planted = np.arange(0, args.items, 10)
        inst = order.instances(0, args.steps * B)
        for k, i in enumerate(planted):  # item i once, at a row of the window
            _, off = order.instance_location(int(inst[(k * 37) % inst.size]))
            data[off + 5:off + 5 + lengths[i]] = contents[i]
        data.tofile(path)
        del data
        order = DataOrder(TokenFiles([path], np.uint32), L, B, seed=0)
        items = [np.concatenate([[EOS], c, [EOS]]) for c in contents]
        plan = Plan(L, B, (0, args.steps * B * L), ["bench"],
                    np.concatenate([[0], np.cumsum([t.size for t in items])]).astype(np.int64),
                    np.concatenate(items).astype(np.uint32), np.zeros(args.items, np.int32),
                    np.zeros(args.items, np.int32), np.empty(0, np.int64), np.empty(0, np.int32),
                    np.empty(0, np.int32))
        tracemalloc.start()
        t0 = time.perf_counter()
        res = audit_plan(plan, order.row_tokens, window_rows, held, args.ngram, strip=EOS,
                         block_tokens=args.block_tokens)
        dt = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        want = np.zeros(args.items, np.int64)
        want[planted] = 1
        assert np.array_equal(res.window.exact, want), "planted counts differ"
        t0 = time.perf_counter()
        pooled = audit_plan(plan, order.row_tokens, window_rows, held, args.ngram, strip=EOS,
                            block_tokens=args.block_tokens, workers=args.workers)
        dt_pool = time.perf_counter() - t0
        assert np.array_equal(pooled.window.exact, res.window.exact) and np.array_equal(
            pooled.window.ngram_hits, res.window.ngram_hits), "pooled counts differ"
        # hashing + lookup + verification alone, on rows already in memory
        block = np.stack([order.row_tokens(int(q)) for q in window_rows[:max(1, args.block_tokens // L)]])
        index = ItemIndex(item_contents(plan, EOS), args.ngram)
        t1 = time.perf_counter()
        reps = 3
        for _ in range(reps):
            scan_rows(index, iter([(window_rows[:block.shape[0]], block)]), L)
        hash_rate = reps * block.size / (time.perf_counter() - t1)
    tokens = res.window.tokens + res.held_out.tokens
    rate = tokens / dt
    full = FULL_STEPS * B * L
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"machine: {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} during the run "
          "(one process, numpy single-threaded)")
    print(f"scaled window: {args.steps} steps x {B} rows x {L} tokens = {res.window.tokens:,} tokens "
          f"(+ {res.held_out.tokens:,} held-out), {args.items:,} items ({int(lengths.sum()):,} tokens), "
          f"{args.ngram}-grams, blocks of {args.block_tokens:,} tokens")
    print(f"audit: {dt:.2f} s = {rate:,.0f} tokens/s (read through DataOrder + hash + lookup + verify); "
          f"planted {planted.size} exact occurrences found: {int(res.window.exact.sum())}")
    print(f"hash + lookup + verify alone (rows in memory): {hash_rate:,.0f} tokens/s")
    speedup = dt / dt_pool
    print(f"pool of {args.workers} processes: {dt_pool:.2f} s = {tokens / dt_pool:,.0f} tokens/s, speed-up "
          f"{speedup:.2f}x over 1 process ({speedup / args.workers:.2f} of linear), "
          f"{tokens / dt_pool / args.workers:,.0f} tokens/s per core; counts equal")
    print(f"peak traced memory of the audit: {peak / 2**20:,.0f} MiB; process peak RSS {rss:,.0f} MiB")
    print(f"extrapolated to a {FULL_STEPS:,}-step OLMo-2 1B window ({full:.2e} tokens): {full / rate / 60:.1f} min "
          f"on one core at the measured rate, peak memory {peak / 2**20:,.0f} MiB (one block + the item index; "
          "independent of the window length)")
    per_core = tokens / dt_pool / args.workers
    print(f"with {args.workers} processes: {full / (tokens / dt_pool) / 60:.1f} min; on a 16-core node, if the "
          f"per-core rate stays linear (extrapolated, not measured): {full / (16 * per_core) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())

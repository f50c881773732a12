"""Plan building and ``Plan.apply`` at pretraining scale.

Places 1,000,000 items of 32-256 tokens (each inserted once) at random over a 100,000-step window of
L=4096, B=512 (209.7e9 tokens, the "Train Once, Answer All" OLMo-2 1B stage-1 budget) and reports:

- plan-building time and peak memory (tracemalloc; numpy registers its buffers there), goals <= 30 s, <= 1 GB;
- ``Plan.apply`` cost per global batch (512 rows of 4096 tokens, the rows' base tokens already in memory), as a
  ratio to a 0.3 s GPU step (goal <= 1%).

Usage: ``python benchmarks/plan_build.py [--items N] [--batches K]`` (``make bench``). Numbers are printed,
not asserted.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from pretrain_exp.insertion.items import ItemSet
from pretrain_exp.insertion.plan import build_plan
from pretrain_exp.insertion.types.tokens import TokensConf


def make_items(n: int, lo: int, hi: int, vocab: int, seed: int) -> ItemSet:
    """``n`` random token sequences with lengths uniform in ``[lo, hi]``, each with dup count 1."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(lo, hi + 1, size=n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(0, vocab, size=int(offsets[-1]), dtype=np.uint32)
    return ItemSet("bench", tokens, offsets, np.ones(n, dtype=np.int64), sources=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--min-len", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=100_352)
    ap.add_argument("--batches", type=int, default=20, help="global batches to time Plan.apply on")
    ap.add_argument("--gpu-step-s", type=float, default=0.3)
    args = ap.parse_args()
    L, B = args.seq_len, args.batch
    window = (0, args.steps * B * L)

    items = make_items(args.items, args.min_len, args.max_len, args.vocab, seed=0)
    conf = {"bench": TokensConf(file="-")}
    item_mb = (items.tokens.nbytes + items.offsets.nbytes) / 2**20
    tracemalloc.start()
    t0 = time.perf_counter()
    plan = build_plan({"bench": items}, conf, window, L, B, seed=0, vocab_size=args.vocab)
    build_s = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    rng = np.random.default_rng(1)
    rows = np.zeros((B, L), dtype=np.int64)
    steps = rng.integers(0, args.steps, size=args.batches)
    t0 = time.perf_counter()
    spans = 0
    for s in steps:
        for r in range(B):
            spans += plan.apply(int(s) * B + r, rows[r])
    apply_s = (time.perf_counter() - t0) / args.batches

    print(f"items: {args.items:,} of {args.min_len}-{args.max_len} tokens ({int(items.offsets[-1]):,} tokens, "
          f"{item_mb:.0f} MiB as input)")
    print(f"window: {window[1]:.4g} tokens = {args.steps:,} steps x {B} rows x {L} tokens")
    print(f"plan build: {build_s:.2f} s (goal <= 30 s, ratio {build_s / 30:.2f}); "
          f"peak memory {(peak + items.tokens.nbytes + items.offsets.nbytes) / 2**30:.3f} GiB "
          f"({peak / 2**30:.3f} GiB for placement and the plan + {item_mb / 1024:.3f} GiB input items; goal <= 1 GiB, "
          f"ratio {(peak + items.tokens.nbytes + items.offsets.nbytes) / 2**30:.2f})")
    print(f"Plan.apply: {apply_s * 1e3:.2f} ms per global batch of {B}x{L} ({spans / args.batches:.1f} spans "
          f"per batch) = {100 * apply_s / args.gpu_step_s:.3f}% of a {args.gpu_step_s} s GPU step (goal <= 1%)")


if __name__ == "__main__":
    main()

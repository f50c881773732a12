"""Data path: rows/s of the run's training rows (our order, a paper-scale insertion plan applied) against OLMo-core's
own ``NumpyFSLDataset.__getitem__`` on the same token files, in one process, one run.

Token files: real dolma2 tokens of the Shakespeare corpus (tokenized once into the cache), copied into ``--files``
uint32 files. Both sides read the same ``--rows`` training-order rows (instances of the run's epoch order) of
``L`` tokens; ours are :class:`~pretrain_exp.data.rows.TrainingRows` with a plan that rewrites ``--fraction`` of the
tokens (items of 32-256 tokens, placed at random), OLMo-core's are the same instance ids through its dataset.
Prints rows/s of each and the ratio (goal >= 1.0). Numbers are printed, not asserted.

Usage: ``python benchmarks/data_path.py [--rows N] [--sequence-length L] [--fraction F]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.io import default_cache_dir
from pretrain_exp.data.order import DataOrder
from pretrain_exp.data.rows import TrainingRows
from pretrain_exp.data.token_files import TokenFiles
from pretrain_exp.data.tokenize import load_tokenizer, tokenize_source
from pretrain_exp.insertion.items import ItemSet
from pretrain_exp.insertion.plan import build_plan
from pretrain_exp.insertion.types.tokens import TokensConf


def token_files(out: Path, n_files: int, tokens_per_file: int, cache_dir: str) -> list:
    """``n_files`` uint32 token files of real dolma2 tokens (the corpus repeated as needed)."""
    src = tokenize_source("shakespeare", load_tokenizer("dolma2", cache_dir), CacheDir(cache_dir).tokens, cache_dir,
                          progress=False)
    corpus = np.concatenate([np.fromfile(p, dtype="<u4") for p in src])
    paths = []
    for k in range(n_files):
        toks = np.resize(np.roll(corpus, 7919 * k), tokens_per_file).astype("<u4")
        paths.append(out / f"part-{k:03d}.npy")
        toks.tofile(paths[-1])
    return paths


def rate(fn, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--sequence-length", type=int, default=4096)
    ap.add_argument("--global-batch-size", type=int, default=512)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--fraction", type=float, default=0.015, help="share of the window's tokens inserted")
    ap.add_argument("--cache-dir", default=str(default_cache_dir()))
    args = ap.parse_args()
    from olmo_core.data import NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig

    L, B, n = args.sequence_length, args.global_batch_size, args.rows
    with tempfile.TemporaryDirectory() as tmp:
        tokens_per_file = -(-n * L * 2 // args.files)  # the epoch holds twice the rows read
        paths = token_files(Path(tmp), args.files, tokens_per_file, args.cache_dir)
        order = DataOrder(TokenFiles(paths, np.uint32), L, B, seed=0, cache_dir=Path(tmp) / "cache")
        window = (0, n * L)
        rng = np.random.default_rng(0)
        lengths = rng.integers(32, 257, size=max(1, int(args.fraction * n * L / 144)))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        items = ItemSet("bench", rng.integers(0, 100_278, size=int(offsets[-1]), dtype=np.uint32), offsets,
                        np.ones(lengths.size, dtype=np.int64), sources=None)
        plan = build_plan({"bench": items}, {"bench": TokensConf(file="-")}, window, L, B, seed=0,
                          vocab_size=100_352)
        rows = TrainingRows(order, plan, 0, n)
        dataset = NumpyFSLDatasetConfig(
            tokenizer=TokenizerConfig.dolma2(), paths=[str(p) for p in paths], sequence_length=L,
            dtype=NumpyDatasetDType.uint32, work_dir=str(Path(tmp) / "work")).build()
        dataset.prepare()
        instances = order.instances(0, n)
        assert np.array_equal(dataset[int(instances[0])]["input_ids"].numpy(), order.row_tokens(0))
        for _ in range(2):  # warm the page cache for both, then time each on the same rows
            ours = rate(lambda i: rows[i], n)
            theirs = rate(lambda i: dataset[int(instances[i])], n)
    inserted = int(plan.affected_rows().size)
    print(f"{n} rows of {L} tokens from {args.files} uint32 files; plan: {lengths.size} items, "
          f"{int(offsets[-1]) / (n * L):.2%} of the tokens, {inserted} rows touched")
    print(f"ours (TrainingRows, plan applied): {ours:,.0f} rows/s; OLMo-core NumpyFSLDataset: {theirs:,.0f} rows/s; "
          f"ratio {ours / theirs:.2f} (goal >= 1.0)")


if __name__ == "__main__":
    main()

"""Tokenizing a corpus into token files: the small-corpus path (``data.text``, :mod:`pretrain_exp.data.tokenize`)
vs the ``datasets`` path (``data.dataset``, :mod:`pretrain_exp.data.hf_dataset`) on the same documents.

The corpus is the Shakespeare asset (43 documents; ``--docs-per-play N`` splits every play into N documents of
consecutive lines, to show per-document overheads), written once as a Parquet file with pyarrow for the
``datasets`` path. Each path tokenizes into a fresh folder; the script prints wall time and tokens/s of each, the
ratio ``datasets`` / small-corpus in this run, and checks that both wrote the same tokens.

Usage: ``python benchmarks/tokenize_corpus.py [--tokenizer smollm2_135m] [--num-proc 1 2] [--docs-per-play 1]``.
Numbers are printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pretrain_exp.core.io import default_cache_dir
from pretrain_exp.data.assets import iter_texts
from pretrain_exp.data.hf_dataset import tokenize_dataset
from pretrain_exp.data.tokenize import load_tokenizer, tokenize_source


def _tokens(paths, dtype) -> np.ndarray:
    return np.concatenate([np.fromfile(p, dtype=dtype) for p in paths])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default="smollm2_135m", help="model or tokenizer asset, or an HF tokenizer dir")
    ap.add_argument("--num-proc", type=int, nargs="+", default=[1, 2], help="datasets map processes to time")
    ap.add_argument("--docs-per-play", type=int, default=1)
    ap.add_argument("--cache-dir", default=os.environ.get("PRETRAIN_EXP_CACHE", str(default_cache_dir())))
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    tok = load_tokenizer(args.tokenizer, args.cache_dir)
    docs = []
    for _, text in iter_texts("shakespeare", args.cache_dir):
        lines = text.splitlines(keepends=True)
        n = max(1, len(lines) // args.docs_per_play)
        docs += ["".join(lines[i:i + n]) for i in range(0, len(lines), n)] if args.docs_per_play > 1 else [text]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        jsonl = tmp / "shakespeare.jsonl"
        jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        pq.write_table(pa.table({"text": docs}), tmp / "shakespeare.parquet")
        t0 = time.perf_counter()
        small = tokenize_source(str(jsonl), tok, tmp / "small", args.cache_dir, progress=False)
        t_small = time.perf_counter() - t0
        meta = json.loads((small[0].parent / "tokens.json").read_text())
        n_tok, dtype = meta["num_tokens"], meta["dtype"]
        ref = _tokens(small, dtype)
        print(f"corpus: shakespeare, {len(docs)} documents, {n_tok:,} tokens ({dtype}), tokenizer {args.tokenizer}")
        print(f"small-corpus path (data.text, .jsonl):   {t_small:7.2f} s  {n_tok / t_small:12,.0f} tokens/s")
        for n in args.num_proc:
            t0 = time.perf_counter()
            got = tokenize_dataset(str(tmp / "shakespeare.parquet"), tok, tmp / f"ds{n}", num_proc=n, progress=False)
            t_ds = time.perf_counter() - t0
            same = np.array_equal(_tokens(got, dtype), ref)
            print(f"datasets path (data.dataset, .parquet, num_proc={n}): {t_ds:7.2f} s  {n_tok / t_ds:12,.0f} "
                  f"tokens/s  ratio datasets/small = {t_small / t_ds:.2f}x  same tokens: {same}")


if __name__ == "__main__":
    main()

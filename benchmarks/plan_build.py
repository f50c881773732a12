"""Plan building and ``Plan.apply`` at pretraining scale.

Places 1,000,000 items of 32-256 tokens (each inserted once) at random over a 100,000-step window of
L=4096, B=512 (209.7e9 tokens, the "Train Once, Answer All" OLMo-2 1B stage-1 budget) and reports:

- plan-building time and peak memory (tracemalloc; numpy registers its buffers there), goals <= 30 s, <= 1 GB;
- ``Plan.apply`` cost per global batch (512 rows of 4096 tokens, the rows' base tokens already in memory), as a
  ratio to a 0.3 s GPU step (goal <= 1%).

Usage: ``python benchmarks/plan_build.py [--items N] [--batches K]`` (``make bench``). Numbers are printed,
not asserted.

JSONL mode: items read from a file through the public path of a run (``insertion.types.load_items``, then
``build_plan``), timed from the file to the plan, with the process's peak RSS (``ru_maxrss``) and the ratios to
the anchor tool's builder on the same spec (92.6 s, 7.09 GiB)::

    python benchmarks/plan_build.py --make-jsonl 1000000 /tmp/items.jsonl      # the spec file (seeded, 851 MB)
    python benchmarks/plan_build.py --jsonl /tmp/items.jsonl --type tokens --num-steps 100000 \
        --global-batch-size 512 --sequence-length 4096 --vocab-size 100352 --json out.json
    python benchmarks/plan_build.py --jsonl /tmp/texts.jsonl --type texts --tokenizer dolma2 --cache-dir EMPTY_DIR

``out.json``: ``{"load_build_s", "peak_rss_mib", "num_items", "num_insertions", "inserted_tokens"}``.

Texts tokenization, the path before and the run's path in one run (``--compare-encode``: the texts of the file
encoded by the HF tokenizer's own call, ``tokenizer(batch, add_special_tokens=False)``, 10,000 texts per call, and
by :func:`~pretrain_exp.insertion.items.encode_texts`, alternating, each with a freshly loaded tokenizer;
prints tokens/s of each, their ratio, and checks the ids are the same)::

    python benchmarks/plan_build.py --make-texts 100000 /tmp/texts.jsonl    # Shakespeare, ~140 tokens a text
    python benchmarks/plan_build.py --jsonl /tmp/texts.jsonl --type texts --tokenizer dolma2 --compare-encode
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import resource
import sys
import tempfile
import time
import tracemalloc

import numpy as np

from pretrain_exp.insertion.items import ItemSet, LoadContext
from pretrain_exp.insertion.plan import build_plan
from pretrain_exp.insertion.types import load_items, parse_experiment
from pretrain_exp.insertion.types.tokens import TokensConf

ANCHOR_S, ANCHOR_GIB = 92.6, 7.09  #: the anchor tool's builder on the 1,000,000-item spec file, same machine
OLMO2_EOS = 100257  #: EOS id of the OLMo-2 (dolma2) tokenizer, used for ``--type tokens`` without ``--tokenizer``


def make_items(n: int, lo: int, hi: int, vocab: int, seed: int) -> ItemSet:
    """``n`` random token sequences with lengths uniform in ``[lo, hi]``, each with dup count 1."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(lo, hi + 1, size=n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(0, vocab, size=int(offsets[-1]), dtype=np.uint32)
    return ItemSet("bench", tokens, offsets, np.ones(n, dtype=np.int64), sources=None)


def make_jsonl(n: int, path: str, lo: int = 32, hi: int = 256, vocab: int = 100_352, seed: int = 0,
               chunk: int = 50_000) -> int:
    """Write ``n`` lines ``[id,id,...]`` (compact JSON, lengths uniform in ``[lo, hi]``, ids uniform in
    ``[0, vocab)``, seeded), formatted with array operations ``chunk`` lines at a time.

    :returns: bytes written.
    """
    rng = np.random.default_rng(seed)
    lengths = rng.integers(lo, hi + 1, size=n)
    pow10 = 10 ** np.arange(20, dtype=np.int64)
    written = 0
    with open(path, "wb") as f:
        for a in range(0, n, chunk):
            ln = lengths[a:a + chunk]
            ids = rng.integers(0, vocab, size=int(ln.sum()), dtype=np.int64)
            ndig = 1 + np.searchsorted(pow10[1:], ids, side="right")
            line_bytes = 2 + np.add.reduceat(ndig + 1, np.cumsum(ln) - ln)
            line_start = np.cumsum(line_bytes) - line_bytes
            out = np.empty(int(line_bytes.sum()), dtype=np.uint8)
            first = np.cumsum(ln) - ln
            before = np.cumsum(ndig + 1) - (ndig + 1)  # token bytes before each token, from the chunk start
            tok_start = before + np.repeat(line_start + 1 - before[first], ln)
            for k in range(int(ndig.max())):
                m = ndig > k
                out[tok_start[m] + k] = 48 + (ids[m] // pow10[ndig[m] - 1 - k]) % 10
            sep = np.full(ids.size, ord(","), dtype=np.uint8)
            sep[first + ln - 1] = ord("]")
            out[tok_start + ndig] = sep
            out[line_start] = ord("[")
            out[line_start + line_bytes - 1] = ord("\n")
            f.write(out.tobytes())
            written += out.size
    return written


def make_texts(n: int, path: str, cache_dir: str, min_chars: int = 470) -> int:
    """Write ``n`` lines ``{"text": ...}``: runs of consecutive lines of the Shakespeare asset of at least
    ``min_chars`` characters (about 140 dolma2 tokens); pass ``k`` over the plays starts ``k`` lines into each,
    so every text differs.

    :returns: bytes written.
    """
    from pretrain_exp.data.assets import iter_texts

    plays = [text.splitlines(keepends=True) for _, text in iter_texts("shakespeare", cache_dir)]
    texts: list = []
    k = 0
    while len(texts) < n:
        for lines in plays:
            cur = ""
            for line in lines[k:]:
                cur += line
                if len(cur) >= min_chars:
                    texts.append(cur)
                    cur = ""
        k += 1
    data = "".join(json.dumps({"text": t}) + "\n" for t in texts[:n]).encode()
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def _encode_before(texts, tokenizer, batch: int = 10_000):
    """The texts' ids as the loader got them before :func:`encode_texts` called the backend: the HF
    tokenizer's own call, ``batch`` texts at a time. :returns: ``(ids int64, lengths int64)``."""
    parts, lengths = [], []
    for a in range(0, len(texts), batch):
        enc = tokenizer(texts[a:a + batch], add_special_tokens=False, verbose=False)["input_ids"]
        lengths += [len(e) for e in enc]
        parts.append(np.fromiter(itertools.chain.from_iterable(enc), dtype=np.int64,
                                 count=sum(lengths[-len(enc):])))
    return np.concatenate(parts), np.asarray(lengths, dtype=np.int64)


def compare_encode(args) -> None:
    """Tokens/s of the path before and of :func:`encode_texts` on the texts of ``args.jsonl``, alternating
    ``args.repeat`` times, a freshly loaded tokenizer each time; the ratio of the medians; same ids checked."""
    from pretrain_exp.core.io import default_cache_dir, read_jsonl
    from pretrain_exp.data.tokenize import load_tokenizer
    from pretrain_exp.insertion.items import encode_texts

    cache_dir = args.cache_dir or str(default_cache_dir())
    texts = [obj["text"] for _, obj in read_jsonl(args.jsonl)]
    times: dict = {"before": [], "now": []}
    ref = None
    for r in range(args.repeat):
        for name, fn in (("before", _encode_before), ("now", lambda t, tok: encode_texts(t, tok, "bench"))):
            tok = load_tokenizer(args.tokenizer, cache_dir)
            t0, c0 = time.perf_counter(), time.process_time()
            ids, lengths = fn(texts, tok)
            times[name].append((time.perf_counter() - t0, time.process_time() - c0))
            if ref is None:
                ref = (ids, lengths)
            elif not (np.array_equal(ids, ref[0]) and np.array_equal(lengths, ref[1])):
                sys.exit(f"{name}: the ids differ from the first run's")
            del ids, lengths, tok
    n = int(ref[0].size)
    med = {k: float(np.median([w for w, _ in v])) for k, v in times.items()}
    cpu = {k: float(np.median([c for _, c in v])) for k, v in times.items()}
    print(f"{len(texts):,} texts of {args.jsonl}, {n:,} tokens ({n / len(texts):.0f} a text), tokenizer "
          f"{args.tokenizer}, {args.repeat} runs each, alternating; load average {os.getloadavg()[0]:.1f}")
    for k, label in (("before", "before (tokenizer(batch) call)"), ("now", "now (encode_texts)")):
        walls = ", ".join(f"{w:.2f} s ({c:.1f} s CPU)" for w, c in times[k])
        print(f"{label:32s} {n / med[k]:12,.0f} tokens/s (median); runs: {walls}")
    print(f"ratio now / before: {med['before'] / med['now']:.2f}x in wall time, {cpu['before'] / cpu['now']:.2f}x in "
          "CPU time (goal >= 2x); same ids: True")


class _EosOnly:
    """What ``tokens`` items need of a tokenizer: the EOS id (for the EOS policy)."""

    def __init__(self, eos_token_id: int):
        self.eos_token_id = eos_token_id


def jsonl_main(args) -> None:
    """Items file -> plan through ``load_items`` + ``build_plan``; prints wall, peak RSS, ratios; writes
    ``--json``."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    L, B = args.sequence_length, args.global_batch_size
    if args.tokenizer:
        from pretrain_exp.data.tokenize import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer, args.cache_dir or tempfile.gettempdir())
        vocab = args.vocab_size or len(tokenizer)
    else:
        if args.type == "texts":
            sys.exit("--type texts needs --tokenizer DIR")
        tokenizer, vocab = _EosOnly(args.eos_id), args.vocab_size
    exp = parse_experiment("insertion.experiments.bench", {"type": args.type, "file": args.jsonl})
    ctx = LoadContext(tokenizer, vocab, L, args.seed, args.cache_dir)
    window = (0, args.num_steps * B * L)
    t0, c0 = time.perf_counter(), time.process_time()
    items = load_items("bench", exp, ctx)
    t1 = time.perf_counter()
    plan = build_plan({"bench": items}, {"bench": exp}, window, L, B, seed=args.seed, vocab_size=vocab)
    t2, c2 = time.perf_counter(), time.process_time()
    wall, rss_mib = t2 - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"load_build_s": round(wall, 3), "peak_rss_mib": round(rss_mib, 1), "num_items": len(items),
           "num_insertions": plan.num_insertions, "inserted_tokens": int(plan.lengths.sum())}
    print(f"{args.type} items: {len(items):,} from {args.jsonl} ({os.path.getsize(args.jsonl) / 1e6:.0f} MB), "
          f"{plan.num_insertions:,} insertions, {out['inserted_tokens']:,} tokens; window {args.num_steps:,} steps "
          f"x {B} rows x {L} tokens")
    print(f"load + validate + place + build: {wall:.2f} s wall (load {t1 - t0:.2f} s, place + build "
          f"{t2 - t1:.2f} s; {c2 - c0:.2f} s CPU; load average {os.getloadavg()[0]:.1f}); peak RSS "
          f"{rss_mib / 1024:.3f} GiB")
    print(f"vs the anchor ({ANCHOR_S} s, {ANCHOR_GIB} GiB on 1,000,000 tokens items): {ANCHOR_S / wall:.1f}x faster, "
          f"{ANCHOR_GIB * 1024 / rss_mib:.1f}x less memory (goals at 1,000,000 tokens items: <= 6 s, <= 1.2 GiB; "
          "100,000: <= 1 s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--make-jsonl", nargs=2, metavar=("N", "FILE"), help="write the spec file of N items and exit")
    ap.add_argument("--make-texts", nargs=2, metavar=("N", "FILE"),
                    help="write N texts of the Shakespeare asset (~140 tokens each) and exit")
    ap.add_argument("--jsonl", help="JSONL mode: the items file")
    ap.add_argument("--compare-encode", action="store_true",
                    help="texts: time the tokenizer's own call against encode_texts on the file's texts")
    ap.add_argument("--repeat", type=int, default=2, help="--compare-encode: runs of each path")
    ap.add_argument("--type", choices=["tokens", "texts"], default="tokens")
    ap.add_argument("--tokenizer", help="HF tokenizer dir (texts; tokens: its EOS id)")
    ap.add_argument("--eos-id", type=int, default=OLMO2_EOS, help="EOS id for tokens items without --tokenizer")
    ap.add_argument("--cache-dir", help="the run's cache_dir (texts: tokenization cache)")
    ap.add_argument("--num-steps", type=int, default=100_000)
    ap.add_argument("--global-batch-size", type=int, default=512)
    ap.add_argument("--sequence-length", type=int, default=4096)
    ap.add_argument("--vocab-size", type=int, default=None, help="default: 100,352, or the tokenizer's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="JSONL mode: write the figures here")
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
    if args.make_jsonl:
        n, path = int(args.make_jsonl[0]), args.make_jsonl[1]
        t0 = time.perf_counter()
        size = make_jsonl(n, path)
        print(f"wrote {path}: {n:,} items, {size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")
        return
    if args.make_texts:
        from pretrain_exp.core.io import default_cache_dir

        n, path = int(args.make_texts[0]), args.make_texts[1]
        size = make_texts(n, path, args.cache_dir or str(default_cache_dir()))
        print(f"wrote {path}: {n:,} texts, {size / 1e6:.0f} MB")
        return
    if args.jsonl and args.compare_encode:
        if not args.tokenizer:
            sys.exit("--compare-encode needs --tokenizer")
        compare_encode(args)
        return
    if args.jsonl:
        if args.vocab_size is None and not args.tokenizer:
            args.vocab_size = 100_352
        jsonl_main(args)
        return
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

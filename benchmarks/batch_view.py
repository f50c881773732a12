"""The batch viewer of an official run (``pretrain-exp-inspect <config> step=K``) beside a bare read of the same rows.

Two data sets, one run of this script:

- **remote, official size** (the OLMo-2 1B shape of ``benchmarks/first_step.py``, whose server and virtual mix it
  reuses: ``--files`` uint32 token files at the official ``http://olmo-data.org/preprocessed/...`` URL paths, about
  ``--instances`` instances of ``L`` = 4096 tokens each, ``B`` = 512 rows per step, ``--latency-ms`` before each
  answer). The served tokens are real text: token ``t`` of file ``k`` is token ``(t + 7919 k L) mod n`` of the
  project's Shakespeare corpus in dolma2 (``n`` tokens; ``--random-tokens``: first_step's hash of ``(k, t)``, which
  decodes to invalid UTF-8 almost everywhere and so times the worst case of decoding). The run is an OLMo-2
  ``config.yaml`` listing the mix (seed 6198); ``--prefix`` maps the URLs to the server. One step (``--step``) is
  asked for: cold (the size index and the permutation of N instances are built into an empty cache), then warm
  (``--repeat`` times, the median), each as the command (a child process, imports included, ``--out`` JSONL with text
  and ids) and in process (:func:`pretrain_exp.app.official.run` with ``--out``, and :meth:`BatchView.fetch
  <pretrain_exp.app.official.BatchView.fetch>` alone). The bare read fetches the same byte ranges with ``requests``
  and as many threads, given the rows' (file, offset), and views them with ``numpy.frombuffer``.
- **local** (``--local-rows`` rows, 1,000 by default, of ``--local-files`` token files on disk at the same ``L``):
  the viewer's rows of as many steps as hold them (``B`` = ``--local-rows`` / 2, two steps), in process and as the
  command, beside ``numpy.memmap`` slices of the same rows.

- **a run dir** (``--run-dir DIR``, e.g. the demo's): step ``--run-step`` of the run as trained
  (``pretrain-exp-inspect <run dir> step=K``, insertions highlighted), warm, as the command and in process
  (:meth:`RunView.open <pretrain_exp.app.inspect.RunView.open>` and the rendered step), beside ``numpy.memmap`` slices
  of the same rows of its token files.

Prints one table (case x wall seconds, CPU seconds, bytes, requests). Numbers are printed, not asserted.

Usage::

    python benchmarks/batch_view.py                 # 1,000 files, N ~ 1.0e8 instances (400 MB permutation)
    python benchmarks/batch_view.py --quick         # 100 files of 2,000 instances
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmarks.first_step as first_step  # noqa: E402
from benchmarks.first_step import OLMO_DATA, mix  # noqa: E402
from pretrain_exp.app.official import THREADS, BatchView, read_order, run  # noqa: E402
from pretrain_exp.core.cachedir import CacheDir  # noqa: E402
from pretrain_exp.core.io import default_cache_dir  # noqa: E402
from pretrain_exp.data.assets import tokenizer_dir  # noqa: E402
from pretrain_exp.data.token_files import write_token_file  # noqa: E402


def serve(args) -> None:
    """``--serve``: first_step's server, its bytes the corpus's tokens (module docstring) unless ``--random-tokens``."""
    if args.corpus:
        corpus = np.fromfile(args.corpus, dtype="<u4")
        stride = 7919 * args.sequence_length

        def tokens_at(file_index: int, start: int, count: int) -> np.ndarray:
            t = np.arange(start, start + count, dtype=np.int64) + file_index * stride
            return corpus[t % corpus.size]

        first_step.tokens_at = tokens_at
    args.files, args.instances = args.files or 1000, args.instances or 100_000
    first_step.serve(args)


def corpus_tokens(cache: Path) -> Path:
    """The Shakespeare corpus in dolma2 tokens (``uint32``), tokenized once into the project cache."""
    from pretrain_exp.data.tokenize import load_tokenizer, tokenize_source

    return tokenize_source("shakespeare", load_tokenizer("dolma2", cache), CacheDir(cache).tokens, cache,
                           progress=False)[0]


def olmo2_config(paths, L: int, B: int, seed: int) -> dict:
    """An OLMo-2 (old trainer) ``config.yaml`` of the keys the viewer reads, peteish1-style."""
    return {"seed": seed, "global_train_batch_size": B,
            "model": {"max_sequence_length": L, "vocab_size": 100278, "embedding_size": 100352,
                      "eos_token_id": 100257, "pad_token_id": 100277},
            "tokenizer": {"identifier": "tokenizers/allenai_dolma2.json"},
            "data": {"paths": list(paths), "memmap_dtype": "uint32"}}


def measure(fn, repeat: int = 1):
    """``(wall s, CPU s, fn's last result)``: the medians over ``repeat`` calls of ``fn()``; CPU seconds are this
    process's (all threads) plus its finished children's, the figure a loaded machine inflates least."""
    walls, cpus, res = [], [], None
    for _ in range(repeat):
        ru0, c0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time(), time.perf_counter()
        res = fn()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0 + ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime)
    return statistics.median(walls), statistics.median(cpus), res


def command(config: Path, query, cache: Path, tok: str, out: Path, *extra: str) -> None:
    """``python -m pretrain_exp.inspect`` (a child process: imports included)."""
    subprocess.run([sys.executable, "-m", "pretrain_exp.inspect", str(config), *query, "--cache-dir", str(cache),
                    "--tokenizer", tok, "--out", str(out), *extra], check=True, cwd=ROOT, stderr=subprocess.DEVNULL)


def bare_http(base: str, rels, files, offsets, L: int, threads: int) -> np.ndarray:
    """Rows ``(file, token offset)`` fetched by range requests (``requests``, ``threads`` at a time) and viewed with
    ``numpy.frombuffer``: ``int64`` ``(n, L)``."""
    import requests
    from requests.adapters import HTTPAdapter

    session = requests.Session()
    session.mount("http://", HTTPAdapter(pool_maxsize=threads))
    out = np.empty((len(files), L), np.int64)

    def one(i: int) -> None:
        a = int(offsets[i]) * 4
        r = session.get(f"{base}/{rels[int(files[i])]}", headers={"Range": f"bytes={a}-{a + 4 * L - 1}"})
        out[i] = np.frombuffer(r.content, dtype="<u4")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(len(files))))
    return out


def run_dir_rows(run_dir: Path, K: int, repeat: int) -> list:
    """The run-dir cases (module docstring): step ``K`` of ``run_dir`` as the command, in process and as bare
    memmap slices of the same rows; ``(case, wall s, CPU s, bytes, requests)`` rows, medians of ``repeat`` runs."""
    import io

    from rich.console import Console

    from pretrain_exp.app.inspect import RunView, show_step

    cmd = [sys.executable, "-m", "pretrain_exp.inspect", str(run_dir), f"step={K}"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)  # warm: permutation and size index cached
    out = []
    wall, cpu, _ = measure(lambda: subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL), repeat)
    view = RunView.open(run_dir)
    B, L = view.plan.global_batch_size, view.plan.sequence_length
    out.append((f"run dir, step {K} ({B} rows of {L}), command, warm (read, apply the plan, decode, render)",
                wall, cpu, B * L * view.rows.order.files.dtype.itemsize, 0))

    def in_process():
        v = RunView.open(run_dir)
        console = Console(file=io.StringIO(), width=100)
        console.print(*show_step(v, K))
        return v

    wall, cpu, _ = measure(in_process, repeat)
    out.append((f"run dir, step {K}, in process (open the run, render the step)", wall, cpu, 0, 0))
    order = view.rows.order
    files, offsets = order.instance_locations(order.instances((K - 1) * B, B))

    def bare():
        maps = {}
        for f in np.unique(files):
            maps[int(f)] = np.memmap(order.files.paths[int(f)], dtype=order.files.dtype, mode="r")
        return np.stack([maps[int(f)][int(o):int(o) + L] for f, o in zip(files, offsets)]).astype(np.int64)

    wall, cpu, toks = measure(bare, repeat)
    raw = np.stack([order.row_tokens(q) for q in range((K - 1) * B, K * B)])
    assert np.array_equal(toks, raw)
    out.append((f"run dir, step {K}, bare numpy.memmap slices of the same rows (no plan)", wall, cpu,
                toks.size * order.files.dtype.itemsize, 0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 files of 2,000 instances")
    ap.add_argument("--files", type=int, default=None, help="remote files (default 1000, --quick 100)")
    ap.add_argument("--instances", type=int, default=None, help="instances per file (default 100,000, --quick 2000)")
    ap.add_argument("--sequence-length", type=int, default=4096)
    ap.add_argument("--global-batch-size", type=int, default=512)
    ap.add_argument("--step", type=int, default=100_000, help="the step viewed (clamped to the first epoch)")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=6198)
    ap.add_argument("--repeat", type=int, default=3, help="warm runs of each case (the median is shown)")
    ap.add_argument("--local-rows", type=int, default=1000)
    ap.add_argument("--local-files", type=int, default=4)
    ap.add_argument("--keep", default=None, help="work dir to keep")
    ap.add_argument("--run-dir", default=None, help="a run dir whose step --run-step is viewed too")
    ap.add_argument("--run-step", type=int, default=5, help="the step of the run dir viewed")
    ap.add_argument("--random-tokens", action="store_true", help="serve first_step's hashed tokens, not text")
    ap.add_argument("--corpus", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args)
    files = args.files or (100 if args.quick else 1000)
    instances = args.instances or (2000 if args.quick else 100_000)
    L, B = args.sequence_length, args.global_batch_size
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-batch-view-"))
    cache = work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    user_cache = Path(os.environ.get("PRETRAIN_EXP_CACHE") or default_cache_dir())
    tok = str(tokenizer_dir("dolma2", user_cache))
    corpus = [] if args.random_tokens else ["--corpus", str(corpus_tokens(user_cache))]
    rows = []  # (case, seconds, bytes, requests)

    rels, tokens = mix(files, instances, L)
    srv = subprocess.Popen([sys.executable, __file__, "--serve", "--files", str(files), "--instances",
                            str(instances), "--sequence-length", str(L), "--latency-ms", str(args.latency_ms),
                            *corpus], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    base = srv.stdout.readline().strip()
    try:
        config = work / "remote" / "config.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump(olmo2_config([OLMO_DATA + r for r in rels], L, B, args.seed)))
        n = int((tokens // L).sum())
        step = min(args.step, n // B)
        print(f"server {base}: {files} files, {tokens.sum() * 4 / 1e12:.2f} TB, N = {n:,} instances of {L} tokens; "
              f"step {step} of {n // B:,} ({B} rows); latency {args.latency_ms} ms; work dir {work}", flush=True)
        prefix = ["--prefix", f"{OLMO_DATA}={base}/"]
        query, nbytes = [f"step={step}"], B * L * 4
        rows.append(("remote step, command, cold (size index + permutation built)",
                     *measure(lambda: command(config, query, cache, tok, work / "a.jsonl", *prefix))[:2], nbytes, B))
        rows.append(("remote step, command, warm",
                     *measure(lambda: command(config, query, cache, tok, work / "a.jsonl", *prefix),
                              args.repeat)[:2], nbytes, B))
        wall, cpu, res = measure(lambda: run(str(config), {"step": str(step)}, cache_dir=cache, prefixes=prefix[1:],
                                             tokenizer=tok, out=str(work / "b.jsonl")), args.repeat)
        rows.append(("remote step, in process, warm (fetch, decode, write JSONL)", wall, cpu, res["bytes"],
                     res["requests"]))
        view = BatchView(read_order(config), cache, {OLMO_DATA: base + "/"}, tokenizer=tok)
        q = view.rows_of_steps(step, step)
        wall, cpu, (toks, info) = measure(lambda: view.fetch(q), args.repeat)
        rows.append(("remote step, in process, warm (fetch only)", wall, cpu, nbytes, B))
        wall, cpu, bare = measure(lambda: bare_http(base, rels, info["file"], info["file_offset"], L, THREADS),
                                  args.repeat)
        assert np.array_equal(bare, toks)
        rows.append(("remote step, bare requests + numpy.frombuffer of the same ranges", wall, cpu, nbytes, B))
    finally:
        srv.stdin.close()
        srv.wait(timeout=30)

    # local: --local-rows rows of token files on disk
    R = args.local_rows
    local = work / "local"
    paths = []
    rng = np.random.default_rng(0)
    for k in range(args.local_files):
        paths.append(local / f"part-{k}.npy")
        if not paths[-1].is_file():
            n_tok = (R // args.local_files + 50) * L + 17
            if args.random_tokens:
                values = rng.integers(0, 100_000, n_tok - 1)
            else:
                text = np.fromfile(corpus[1], dtype="<u4")
                values = text[(np.arange(n_tok - 1) + k * 7919 * L) % text.size]
            write_token_file(paths[-1], [values.tolist()], np.uint32, 100257)
    lconfig = local / "config.yaml"
    lconfig.write_text(yaml.safe_dump(olmo2_config([str(p) for p in paths], L, R // 2, args.seed)))
    command(lconfig, ["step=1-2"], cache, tok, work / "c.jsonl")  # permutation built
    rows.append((f"local {R} rows, command, warm (fetch, decode, write JSONL)",
                 *measure(lambda: command(lconfig, ["step=1-2"], cache, tok, work / "c.jsonl"), args.repeat)[:2],
                 R * L * 4, 0))
    wall, cpu, res = measure(lambda: run(str(lconfig), {"step": "1-2"}, cache_dir=cache, tokenizer=tok,
                                         out=str(work / "d.jsonl")), args.repeat)
    rows.append((f"local {R} rows, in process (fetch, decode, write JSONL)", wall, cpu, R * L * 4, 0))
    view = BatchView(read_order(lconfig), cache, tokenizer=tok)
    q = view.rows_of_steps(1, 2)
    wall, cpu, (toks, info) = measure(lambda: view.fetch(q), args.repeat)
    rows.append((f"local {R} rows, in process (fetch only)", wall, cpu, R * L * 4, 0))

    def bare_local() -> np.ndarray:
        maps = [np.memmap(p, dtype="<u4", mode="r") for p in paths]
        return np.stack([maps[int(f)][int(o):int(o) + L] for f, o in zip(info["file"], info["file_offset"])]
                        ).astype(np.int64)

    wall, cpu, bare = measure(bare_local, args.repeat)
    assert np.array_equal(bare, toks)
    rows.append((f"local {R} rows, bare numpy.memmap slices of the same rows", wall, cpu, R * L * 4, 0))

    if args.run_dir:
        rows += run_dir_rows(Path(args.run_dir), args.run_step, args.repeat)

    print(f"\nload average before the table: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| case | seconds | CPU seconds | bytes | requests |\n|---|---:|---:|---:|---:|")
    for name, wall, cpu, nbytes, req in rows:
        print(f"| {name} | {wall:.3f} | {cpu:.3f} | {nbytes:,} | {req} |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

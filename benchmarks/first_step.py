"""Time to the first training step at official scale: the real command against a local server of an official-sized
remote mix, every phase before step 1, and the total.

What runs: ``python -m pretrain_exp``'s entry point (:func:`pretrain_exp.app.cli.main`) as a child process,
``framework=olmo_core`` continuing a tiny OLMo-core checkpoint (the ``olmo3_tiny`` preset: the figure is the time
until the trainer starts step 1, not the model's speed) whose ``config.json`` lists the remote mix at the OLMo-2 1B
data shape: ``L`` = 4096 tokens per row, ``B`` = 512 rows per step, ``uint32`` dolma2 token files at the official
``http://olmo-data.org/preprocessed/...`` URL paths (``data.path_prefixes`` maps them to the server). The run
continues ``--steps`` steps (a 2,000-step window by default: 4.2e9 tokens, 16.8 GB), with the default insertion
(``fictional_bios``, ``--items`` texts at dup counts 0/1/4/16), the default evals and W&B offline.

The server (``--serve``, started by the benchmark in its own process: its own GIL, as a real server) is the standard
library's ``ThreadingHTTPServer``. It serves ``--files`` token files that exist nowhere: the bytes of file ``k``
at token ``t`` are a seeded hash of ``(k, t)`` below the dolma2 vocabulary, computed for each request, so any byte
range is the same every time. It answers ``HEAD`` with the size and ``GET`` with ``Range: bytes=a-b`` (``206``,
``Content-Range``), sleeping ``--latency-ms`` before each answer, HTTP/1.1 keep-alive.

The phases come from the run's own record, ``<run dir>/phases.json`` (:mod:`pretrain_exp.core.phases`): startup
(interpreter, imports, Hydra), settings, model resolved, tokenizer, corpus, size index, permutation (cached or
not), prefetch, items, plan, audit, plan saved, verify, tracker (W&B), model build, the engine's data loader (its
dataset over the files and the global indices from the permutation cache), trainer build, checkpoint load, the
engine's pre-train and data order (``reshuffle``), first batch; the total is the run's ``first step`` event
(seconds after the process started). Once step 1 has started the benchmark stops the run (its process group).
OLMo-core's dry-run batch (a forward/backward of a whole mock batch before training: about one step on a GPU,
hours for 512 x 4096 tokens on this CPU) is switched off in the child (``--dry-run-batch`` keeps it).

Cases (one server, one cache; ``permutations/`` and ``size_index/`` of the cache are kept between cases, the
window cache, the audits and the item cache are emptied before each):

- ``cold``: nothing cached (the first job on a cluster: the size index and the permutation are built);
- ``warm``: the permutation and the size index cached (the next job of a sweep on another window or seed);
- ``warm, audit off``: as ``warm`` with ``insertion.audit=off``; ``warm`` minus this is the time the audit adds
  before step 1 (the goal: 0 with ``insertion.audit=on``).

Usage::

    python benchmarks/first_step.py            # full: 1,000 files, N ~ 1.0e8 instances, 2,000 x 512 x 4096
    python benchmarks/first_step.py --quick    # CI-sized: 1,000 files, N ~ 2e5, 100 steps of 64 rows, 64 items
    python benchmarks/first_step.py --report DIR   # the table of the runs kept by an earlier --keep DIR

Prints one table (phase x case, seconds; with ``--repeat N`` the median of N runs of each case, interleaved) and the
ratios. Numbers are printed, not asserted. ``--keep DIR`` keeps
the cache, run dirs and logs there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OLMO_DATA = "http://olmo-data.org/"
VOCAB = 100_278  #: dolma2 ids (the padded model vocabulary is 100,352)
#: folders of OLMo-2's stage-1 mix, as the official config lists them, with their share of the files
SOURCES = (("dclm/text_openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train/allenai/dolma2-tokenizer", 0.75),
           ("starcoder/v1-decon-100_to_20k-2star-top_token_030/allenai/dolma2-tokenizer", 0.1),
           ("proof-pile-2/v0_decontaminated/algebraic-stack/train/allenai/dolma2-tokenizer", 0.04),
           ("proof-pile-2/v0_decontaminated/arxiv/train/allenai/dolma2-tokenizer", 0.03),
           ("proof-pile-2/v0_decontaminated/open-web-math/train/allenai/dolma2-tokenizer", 0.04),
           ("pes2o/allenai/dolma2-tokenizer", 0.03),
           ("olmo-mix/danyh-compiled-v1_7/documents/wiki/allenai/dolma2-tokenizer", 0.01))

# ------------------------------------------------------------------------------------------------ the mix


def mix(num_files: int, instances: int, L: int) -> tuple[List[str], np.ndarray]:
    """URL paths (``preprocessed/...``) and sizes in tokens of the mix: ``num_files`` files of about
    ``instances`` instances of ``L`` tokens each (+-10 %, deterministic), each with a tail shorter than ``L``."""
    counts = [max(1, int(n * num_files)) for _, n in SOURCES]
    counts[0] += num_files - sum(counts)
    rels = [f"preprocessed/{folder}/part-{k:03d}-00000.npy" for (folder, _), n in zip(SOURCES, counts)
            for k in range(n)]
    k = np.arange(num_files, dtype=np.int64)
    per_file = instances + (k * 7919 % (instances // 5 + 1)) - instances // 10
    tokens = per_file * L + (k * 977 % L)
    return rels, tokens


def tokens_at(file_index: int, start: int, count: int) -> np.ndarray:
    """Tokens ``[start, start + count)`` of file ``file_index``: ``uint32`` (little-endian), a splitmix64 hash of
    ``(file, token index)`` modulo the dolma2 vocabulary."""
    x = np.arange(start, start + count, dtype=np.uint64) + np.uint64(file_index << 40)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x % np.uint64(VOCAB)).astype("<u4")


def byte_range(file_index: int, a: int, b: int) -> bytes:
    """Bytes ``[a, b)`` of file ``file_index`` (4 bytes per token)."""
    t0, t1 = a // 4, -(-b // 4)
    return tokens_at(file_index, t0, t1 - t0).tobytes()[a - 4 * t0:b - 4 * t0]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def _empty(self, status: int, headers: Optional[dict] = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        srv = self.server
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        with srv.lock:
            srv.requests += 1
        time.sleep(srv.latency_s)
        k = srv.index.get(path)
        if k is None:
            return self._empty(404)
        size = int(srv.sizes[k])
        start, end = 0, size
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m or int(m.group(1)) >= size:
                return self._empty(416, {"Content-Range": f"bytes */{size}"})
            start = int(m.group(1))
            end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        else:
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if head:
            return
        for a in range(start, end, 8 << 20):
            body = byte_range(k, a, min(end, a + (8 << 20)))
            self.wfile.write(body)
            with srv.lock:
                srv.bytes_served += len(body)


def serve(args) -> None:
    """``--serve``: print ``http://127.0.0.1:<port>``, serve until stdin closes, then print ``<requests> <bytes>``."""
    rels, tokens = mix(args.files, args.instances, args.sequence_length)
    ThreadingHTTPServer.request_queue_size = 512
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.index = {r: k for k, r in enumerate(rels)}
    httpd.sizes = tokens * 4
    httpd.latency_s = args.latency_ms / 1e3
    httpd.lock = threading.Lock()
    httpd.requests = httpd.bytes_served = 0
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    print(f"http://127.0.0.1:{httpd.server_address[1]}", flush=True)
    sys.stdin.read()
    print(httpd.requests, httpd.bytes_served, flush=True)


# ------------------------------------------------------------------------------------------------ the runs

#: the child: the command's entry point, with OLMo-core's dry-run batch switched off unless --dry-run-batch
CHILD = """
import sys
if sys.argv[1] == "0":
    from olmo_core.data.data_loader import NumpyFSLDataLoader

    def no_mock_batch(self):
        raise NotImplementedError  # OLMo-core's Trainer then skips its dry-run batch
    NumpyFSLDataLoader.get_mock_batch = no_mock_batch
sys.argv = ["pretrain_exp", *sys.argv[2:]]
from pretrain_exp.app.cli import main
main()
"""


def checkpoint(out: Path, cache: Path, urls: List[str], L: int, B: int, seed: int) -> Path:
    """The tiny OLMo-3-shaped preset with a ``config.json`` listing ``urls`` at ``L``/``B``/``seed``."""
    sys.path.insert(0, str(ROOT))
    from pretrain_exp.frameworks.olmo_core.presets import tiny_checkpoint

    ckpt = out / "checkpoint"
    if not ckpt.is_dir():
        shutil.copytree(tiny_checkpoint("olmo3_tiny", str(cache)), ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["dataset"].update(paths=urls, sequence_length=L, dtype="uint32")
    config["data_loader"].update(global_batch_size=B * L, seed=seed)
    (ckpt / "config.json").write_text(json.dumps(config, indent=1))
    return ckpt


def run_case(name: str, args, ckpt: Path, base: str, cache: Path, work: Path, extra: List[str]) -> dict:
    """One run of the command until its first step starts; returns its ``phases.json`` plus the benchmark's own
    seconds from launch to seeing the first step (``observed_s``)."""
    from pretrain_exp.core.cachedir import CacheDir
    from pretrain_exp.core.rundir import RunDir

    for sub in (CacheDir.WINDOW, CacheDir.AUDITS, CacheDir.ITEM_TOKENS):
        shutil.rmtree(cache / sub, ignore_errors=True)
    run_dir = work / "runs" / name.replace(" ", "_").replace(",", "")
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [
        "framework=olmo_core", "model=local", f"model.path={ckpt}", "model.checkpoint_step=0",
        "model.tokenizer=dolma2", "++data.path_prefixes={%s: %s/}" % (OLMO_DATA.replace(":", "\\:"), base),
        "insertion=fictional_bios", f"insertion.experiments.fictional_bios.num_items={args.items}",
        f"training.num_steps={args.steps}", f"training.checkpoint_interval={max(1, args.steps // 4)}",
        "training.micro_batch_size=1", f"name=first_step_{run_dir.name}", f"hydra.run.dir={run_dir}", *extra]
    env = dict(os.environ, PRETRAIN_EXP_CACHE=str(cache), PYTHONPATH=str(ROOT), no_proxy="127.0.0.1",
               NO_PROXY="127.0.0.1", WANDB_MODE="offline")
    log = work / f"{run_dir.name}.log"
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, "1" if args.dry_run_batch else "0", *overrides],
                                stdout=f, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)
    phases_file = RunDir(run_dir).phases
    rec = None
    try:
        while time.time() - t0 < args.timeout:
            if proc.poll() is not None:
                raise SystemExit(f"[{name}] the run ended (status {proc.returncode}) before its first step; see {log}")
            if phases_file.is_file():
                try:
                    rec = json.loads(phases_file.read_text())
                except ValueError:
                    rec = None
                if rec and "first step" in rec.get("events", {}):
                    break
            time.sleep(0.2)
        else:
            raise SystemExit(f"[{name}] no first step after {args.timeout} s; see {log}")
    finally:
        observed = time.time() - t0
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    rec["observed_s"] = observed
    rec["launch_to_process_s"] = rec["process_start"] - t0
    print(f"[{name}] first step {rec['events']['first step']['at_s']:.1f} s after its process started "
          f"({observed:.1f} s after launch, seen by polling)", flush=True)
    return rec


#: phases in the order of the table; any other phase a run records is appended
ORDER = ["startup", "settings", "model resolved", "tokenizer", "corpus", "size index", "permutation", "prefetch",
         "items", "plan", "audit", "plan saved", "verify", "tracker", "model build", "engine data loader",
         "trainer build", "checkpoint load", "engine pre-train", "engine dry run and data order", "first batch"]


def phase_table(results: Dict[str, List[dict]]) -> tuple[List[str], Dict[str, Dict[str, float]]]:
    """``(phase names, {case: {phase: seconds}})``, the median over a case's repeats; a phase recorded more than
    once in a run counts its first record (later ones are other segments' trainers)."""
    names = list(ORDER)
    table: Dict[str, Dict[str, float]] = {}
    for case, recs in results.items():
        per: Dict[str, List[float]] = {}
        for rec in recs:
            seen = set()
            for p in rec["phases"]:
                if p["name"] not in seen:
                    seen.add(p["name"])
                    per.setdefault(p["name"], []).append(p["seconds"])
                    if p["name"] not in names:
                        names.append(p["name"])
        table[case] = {k: float(np.median(v)) for k, v in per.items()}
    return [n for n in names if any(n in row for row in table.values())], table


def detail(rec: dict, name: str) -> str:
    p = next((p for p in rec["phases"] if p["name"] == name), None)
    if p is None:
        return ""
    keys = [k for k in p if k not in ("name", "start_s", "seconds", "what")]
    return ", ".join(f"{k}={p[k]}" for k in keys)


def report(results: Dict[str, dict], args, n: int, files: int, served: tuple) -> None:
    names, table = phase_table(results)
    cases = list(results)
    print()
    print(f"time to the first step (seconds), {files} remote files, N = {n:,} instances, L = {args.sequence_length}, "
          f"B = {args.global_batch_size}, {args.steps}-step window ({args.steps * args.global_batch_size:,} rows, "
          f"{args.steps * args.global_batch_size * args.sequence_length * 4 / 1e9:.1f} GB), {args.items} items, "
          f"latency {args.latency_ms:g} ms/request")
    print("| phase | " + " | ".join(cases) + " |")
    print("|---|" + "---:|" * len(cases))
    for name in names:
        cells = []
        for c in cases:
            v = table[c].get(name)
            d = detail(results[c][0], name)
            cells.append("" if v is None else f"{v:.1f}" + (f" ({d})" if d else ""))
        print(f"| {name} | " + " | ".join(cells) + " |")
    totals = {c: [r["events"]["first step"]["at_s"] for r in results[c]] for c in cases}
    firsts = {c: float(np.median(t)) for c, t in totals.items()}
    print("| **total to first step** | " + " | ".join(f"**{firsts[c]:.1f}**" for c in cases) + " |")
    print()
    if any(len(t) > 1 for t in totals.values()):
        print("medians of " + "; ".join(f"{c}: " + ", ".join(f"{x:.1f}" for x in t) for c, t in totals.items()))
    if "cold" in firsts and "warm" in firsts:
        print(f"warm / cold time to first step: {firsts['warm'] / firsts['cold']:.3f}")
    if "warm" in firsts and "warm, audit off" in firsts:
        print(f"audit on / off time to first step (warm): {firsts['warm'] / firsts['warm, audit off']:.3f}; "
              f"seconds the audit adds before step 1: {firsts['warm'] - firsts['warm, audit off']:.1f}")
    if served[0]:
        print(f"server: {served[0]:,} requests, {served[1] / 1e9:.2f} GB served over all cases")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI-sized: N ~ 2e5 instances, 100 steps of 64 rows, "
                    "64 items")
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--instances", type=int, default=None, help="instances per file (mean; default 100,000, "
                    "--quick 200)")
    ap.add_argument("--sequence-length", type=int, default=4096)
    ap.add_argument("--global-batch-size", type=int, default=None, help="rows per step (default 512, --quick 64)")
    ap.add_argument("--steps", type=int, default=None, help="steps of the window (default 2000, --quick 100)")
    ap.add_argument("--items", type=int, default=None, help="inserted texts (default 320, --quick 64)")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=6198)
    ap.add_argument("--cases", default="cold,warm,warm-audit-off",
                    help="comma-separated: cold, warm, warm-audit-off")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the case list; the table shows medians")
    ap.add_argument("--dry-run-batch", action="store_true", help="keep OLMo-core's dry-run batch")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds a run may take to its first step")
    ap.add_argument("--keep", default=None, help="work dir to keep (cache, run dirs, logs)")
    ap.add_argument("--report", default=None, metavar="DIR",
                    help="only print the table of the runs kept in DIR (same size options as the runs)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    quick = args.quick
    args.instances = args.instances or (200 if quick else 100_000)
    args.global_batch_size = args.global_batch_size or (64 if quick else 512)
    args.steps = args.steps or (100 if quick else 2000)
    args.items = args.items or (64 if quick else 320)
    if args.serve:
        return serve(args)
    rels, tokens = mix(args.files, args.instances, args.sequence_length)
    n = int((tokens // args.sequence_length).sum())
    if args.report:
        from pretrain_exp.core.rundir import RunDir

        names = {"cold": "cold", "warm": "warm", "warm_audit_off": "warm, audit off"}
        kept = {names.get(d.name, d.name): json.loads(RunDir(d).phases.read_text())
                for d in sorted(Path(args.report, "runs").iterdir()) if RunDir(d).phases.is_file()}
        done = {k: v for k, v in kept.items() if "first step" in v.get("events", {})}
        return report({k: [v] for k, v in sorted(done.items(), key=lambda kv: list(names.values()).index(kv[0])
                                                 if kv[0] in names.values() else 9)}, args, n, args.files, (0, 0))

    from pretrain_exp.core.cachedir import CacheDir
    from pretrain_exp.core.io import default_cache_dir

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-first-step-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    cache.mkdir(exist_ok=True)
    user_cache = Path(os.environ.get("PRETRAIN_EXP_CACHE") or default_cache_dir())
    # the tokenizer and the tiny model, read only
    for sub in (CacheDir.ASSETS, CacheDir.TOKENIZERS, CacheDir.MODELS, CacheDir.TOKENS):
        if (user_cache / sub).is_dir() and not (cache / sub).exists():
            (cache / sub).symlink_to(user_cache / sub)
    ckpt = checkpoint(work, user_cache, [OLMO_DATA + r for r in rels], args.sequence_length,
                      args.global_batch_size, args.seed)
    srv = subprocess.Popen([sys.executable, __file__, "--serve", "--files", str(args.files), "--instances",
                            str(args.instances), "--sequence-length", str(args.sequence_length), "--latency-ms",
                            str(args.latency_ms)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    base = srv.stdout.readline().strip()
    print(f"server {base}: {args.files} files, {tokens.sum() * 4 / 1e12:.2f} TB, N = {n:,} instances of "
          f"{args.sequence_length} tokens; work dir {work}", flush=True)
    results: Dict[str, List[dict]] = {}
    cases = {"cold": ("cold", []), "warm": ("warm", []), "warm-audit-off": ("warm, audit off", ["insertion.audit=off"])}
    try:
        for _ in range(args.repeat):
            for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
                if case not in cases:
                    raise SystemExit(f"unknown case {case!r}")
                if case == "cold":
                    for sub in (CacheDir.PERMUTATIONS, CacheDir.SIZE_INDEX):
                        shutil.rmtree(cache / sub, ignore_errors=True)
                name, extra = cases[case]
                results.setdefault(name, []).append(run_case(name, args, ckpt, base, cache, work, extra))
                if args.keep:
                    (work / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        out, _ = srv.communicate("", timeout=60)
        served = tuple(int(x) for x in out.split()[:2]) if out.split() else (0, 0)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(results, args, n, args.files, served)


if __name__ == "__main__":
    main()

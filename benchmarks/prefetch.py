"""Remote token files at scale: window prefetch throughput, data wait per step, permutation build cost.

Serves OLMo-like token files (``uint32``, L=4096, so one instance is 16 KiB) from the project's Range-capable test
server (``tests/remote_server.py``) on 127.0.0.1 with a fixed latency added to every request, and reports:

1. **window prefetch**, two windows:

   - *dense*: every instance of a small mix (ranges merge into whole files, requests of ``--chunk-mb``): the
     bandwidth of the transport, goal >= 200 MB/s at 20 ms per request;
   - *scattered*: a window much smaller than the mix, as when continuing an official run (each instance is
     its own 16 KiB range): bounded by ``threads x 16 KiB / latency``; requests/s is the figure that matters.

2. **data wait per step** once prefetched: reading one global batch (B=512 rows of 4096 tokens) through the
   remote :class:`TokenFiles` (served by the window cache) as a fraction of a 0.3 s GPU step (goal <= 1%):
   synchronously in one process (no loader workers; the worst case), and the wait of a training loop whose
   loader thread reads one batch ahead while a simulated GPU step runs.

3. **permutation build** (:func:`pretrain_exp.data.order.cached_permutation`): time to shuffle, write and
   memory-map, and the peak resident memory (``VmHWM``; ``ru_maxrss`` would include the parent's, kept across
   exec) of a fresh process doing it, at N = 1e7, 1e8 and 1e9 (1e9 only if the
   machine has the memory, else extrapolated linearly from 1e8, and printed as extrapolated).

Usage: ``python benchmarks/prefetch.py [--latency-ms 20] [--threads 64] [--skip-1e9]``. Numbers are printed, not
asserted.
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pretrain_exp.data.order import DataOrder  # noqa: E402
from pretrain_exp.data.prefetch import prefetch_window  # noqa: E402
from pretrain_exp.data.token_files import TokenFiles  # noqa: E402
from tests.remote_server import OLMO_DATA, build_mix  # noqa: E402

L, B, GPU_STEP_S = 4096, 512, 0.3

PERM_CHILD = """
import sys, time
import numpy as np
from pretrain_exp.data.order import cached_permutation
n, cache = int(sys.argv[1]), sys.argv[2]
t0 = time.perf_counter()
perm = cached_permutation(cache, n, 12345)
t1 = time.perf_counter()
x = int(perm[n // 2])
t2 = time.perf_counter()
again = cached_permutation(cache, n, 12345)
y = int(again[n // 3])
t3 = time.perf_counter()
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0].split()[1]
print(t1 - t0, t3 - t2, int(hwm) * 1024)
"""


class ServerProcess:
    """``tests/remote_server.py`` in a child process (its own GIL, as a real server would be)."""

    def __init__(self, root: Path, latency_s: float):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.remote_server", str(root), "--latency-ms",
                                      str(latency_s * 1e3)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, cwd=ROOT)
        self.base = self.proc.stdout.readline().strip()

    def stop(self) -> tuple:
        """``(requests, bytes served)``."""
        out, _ = self.proc.communicate("", timeout=30)
        requests, served = out.split()
        return int(requests), int(served)


def bench_window(name: str, root: Path, urls: list, first_row: int, num_rows: int, latency_s: float, threads: int,
                 chunk_mb: int) -> tuple:
    """Prefetch rows ``[first_row, first_row + num_rows)``; returns ``(files, order)`` for the read benchmark."""
    cache = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    srv = ServerProcess(root, latency_s)
    try:
        prefixes = {OLMO_DATA: srv.base + "/"}
        files = TokenFiles(urls, np.uint32, cache_dir=cache, prefixes=prefixes, threads=threads, progress=False)
        order = DataOrder(files, L, B, 0, 1, cache_dir=cache)
        head = files.reader.requests
        stats = prefetch_window(order, first_row, num_rows, threads=threads, chunk_bytes=chunk_mb << 20,
                                progress=False)
    finally:
        requests, served = srv.stop()
    window = num_rows * L * 4
    print(f"[{name}] {len(urls)} files, {files.num_bytes.sum() / 1e6:.0f} MB, N={order.num_instances} "
          f"instances; window {num_rows} rows = {window / 1e6:.1f} MB; latency {latency_s * 1e3:.0f} ms/request, "
          f"{threads} threads; server in its own process")
    print(f"[{name}]   size index: {head} HEAD requests")
    print(f"[{name}]   prefetch: {stats.fetched_bytes / 1e6:.1f} MB in {stats.requests} requests, "
          f"{stats.seconds:.2f} s -> {stats.mb_per_s:.0f} MB/s, {stats.requests / stats.seconds:.0f} requests/s; "
          f"bytes served (size index included) / window bytes = {served / window:.3f} ({requests} requests)")
    return files, order


def bench_reads(files: TokenFiles, order: DataOrder, first_row: int, num_rows: int) -> None:
    """Read the global batches of the prefetched window through ``order.row_tokens`` (the server is gone):
    synchronously, and with one loader thread one batch ahead of a simulated 0.3 s GPU step."""
    steps = num_rows // B

    def batch(s: int) -> np.ndarray:
        return np.stack([order.row_tokens(q) for q in range(first_row + s * B, first_row + (s + 1) * B)])

    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        assert batch(s).shape == (B, L)
        times.append(time.perf_counter() - t0)
    t = np.asarray(times)
    print(f"[read]   synchronous, one process: {B} x {L} tokens per step from the window cache: mean "
          f"{t.mean() * 1e3:.1f} ms, max {t.max() * 1e3:.1f} ms = {t.mean() / GPU_STEP_S:.2%} of a {GPU_STEP_S} s "
          f"step (per rank of 8: {t.mean() / 8 / GPU_STEP_S:.2%})")
    q: queue.Queue = queue.Queue(maxsize=2)
    loader = threading.Thread(target=lambda: [q.put(batch(s)) for s in range(steps)], daemon=True)
    loader.start()
    waits = []
    for s in range(steps):
        t0 = time.perf_counter()
        q.get()
        waits.append(time.perf_counter() - t0)
        time.sleep(GPU_STEP_S)  # the GPU step (releases the GIL, as CUDA kernels do)
    w = np.asarray(waits[1:])
    print(f"[read]   with one loader thread a batch ahead: data wait per step mean {w.mean() * 1e3:.2f} ms, max "
          f"{w.max() * 1e3:.2f} ms = {w.mean() / GPU_STEP_S:.2%} of a {GPU_STEP_S} s step (steps 2-{steps}; the "
          f"first batch: {waits[0] * 1e3:.1f} ms)")


def bench_permutation(n: int) -> tuple:
    with tempfile.TemporaryDirectory(prefix="bench-perm-") as cache:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-c", PERM_CHILD, str(n), cache], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
    build_s, reopen_s, rss = float(out[0]), float(out[1]), int(out[2])
    return build_s, reopen_s, rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--chunk-mb", type=int, default=8)
    ap.add_argument("--skip-1e9", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("no_proxy", "127.0.0.1")
    lat = args.latency_ms / 1e3

    with tempfile.TemporaryDirectory(prefix="bench-srv-") as tmp:
        # dense: 24 files of 16 MiB (4096 instances each), the whole first epoch
        dense = Path(tmp) / "dense"
        urls = build_mix(dense, 4 << 20, sources=(("dclm/bench/allenai/dolma2-tokenizer", 24),))
        rows = 24 * 1024 // B * B
        bench_window("dense", dense, urls, 0, rows, lat, args.threads, args.chunk_mb)
        # scattered: 40 files of 16 MiB (40,960 instances), a window of 8 steps (4,096 rows, 10 % of the mix)
        scattered = Path(tmp) / "scattered"
        urls = build_mix(scattered, 4 << 20, sources=(("dclm/bench/allenai/dolma2-tokenizer", 40),))
        files, order = bench_window("scattered", scattered, urls, 16 * B, 8 * B, lat, args.threads, args.chunk_mb)
        bench_reads(files, order, 16 * B, 8 * B)

    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    results = {}
    for n in (10**7, 10**8, 10**9):
        if n == 10**9 and (args.skip_1e9 or mem_gb < 4 * n / 2**30 * 2.5):
            b7, r7, m7 = results[10**7]
            b8, r8, m8 = results[10**8]
            build = b8 + (b8 - b7) / 9 * 90
            rss = m8 + (m8 - m7) / 9 * 90
            print(f"[perm]   N=1e9: build {build:.1f} s, peak RSS {rss / 2**30:.2f} GiB -- EXTRAPOLATED linearly "
                  f"from 1e7/1e8 (machine has {mem_gb:.0f} GiB{', --skip-1e9' if args.skip_1e9 else ''})")
            continue
        build, reopen, rss = bench_permutation(n)
        results[n] = (build, reopen, rss)
        print(f"[perm]   N={n:.0e}: build + write {build:.2f} s, peak RSS {rss / 2**30:.2f} GiB (array "
              f"{4 * n / 2**30:.2f} GiB); reuse from the cache (memmap) {reopen * 1e3:.2f} ms")


if __name__ == "__main__":
    main()

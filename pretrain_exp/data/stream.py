"""The window stream (``data.prefetch=stream``, the default for remote token files): training starts as soon as
its first rows are in the window cache, and the rest of the window is fetched ahead of the trainer.

A run continuing ``n`` steps from step ``S`` trains rows ``[S*B, (S+n)*B)`` of the data order. The stream fetches
their instances into the window cache (:mod:`pretrain_exp.data.window`: the same sparse files and manifests as the
complete prefetch, :mod:`pretrain_exp.data.prefetch`) in training order, in **blocks** of one step's rows, by
parallel byte-range requests (``threads`` at a time, at most ``2 x threads`` chunks in flight), and runs at most
``ahead_steps`` steps ahead of the step the trainer reads (``None``: as far as the network allows): a trainer-side
reader that has to wait for a row records it in ``<key>.want.json``, and the stream fetches up to ``ahead_steps``
steps past the latest such row, so it never holds back a row somebody waits for. It runs in a process of its own
(``python -m pretrain_exp.data.stream <spec>``), so its requests never take the trainer's interpreter lock.

Its **progress file** ``<cache>/window/.streams/<key>.json`` (written atomically after each block, and at least
every :data:`HEARTBEAT_S` seconds) says how far the window is fetched::

    {"key": ..., "first_row": S*B, "end_row": (S+n)*B, "ready_row": q, "state": "running" | "done" | "failed",
     "error": null, "pid": <stream process>, "host": <host name>, "updated": <unix time>}

Every row before ``ready_row`` is in the cache. Any process reading the window (the trainer, its data-loader
workers, the audit beside training, every rank of the node) waits on that file through a :class:`StreamGate`:
:meth:`StreamGate.wait_row` returns once the row is fetched, logs a wait longer than :data:`STALL_LOG_S` as a data
stall with its seconds, and raises :class:`DataError` if the stream failed, its process died (same host) or the file
stopped moving for :data:`STALE_S` seconds. ``<key>`` hashes the token files, their sizes and dtype, ``L``, ``B``,
the order's seed, first epoch and chunk, and the window's rows, so the ranks of a job (and a re-run) find the same
file; one process streams a window at a time (an exclusive lock on ``.streams/<key>.lock``, held by the stream
process), the others only wait.

Resumable as the complete prefetch is: chunks are recorded in the file manifests (at most every
``MANIFEST_EVERY_S``, and at the end), so a killed stream re-fetches only what was not recorded; a re-run's stream
skips what is present. When the window is complete the stream proves every range present (the manifests,
:func:`~pretrain_exp.data.prefetch.check_window`) before it writes ``done``.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from pretrain_exp.core.commands import stop_process
from pretrain_exp.core.errors import DataError
from pretrain_exp.core.interrupt import OWN_GROUP, track
from pretrain_exp.core.io import write_json
from pretrain_exp.core.logs import child_logging, rate

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0  #: the stream rewrites its progress file at least this often, seconds
STALE_S = 600.0  #: a reader gives up when the progress file has not moved for this long, seconds
STALL_LOG_S = 0.5  #: a reader's wait longer than this is logged as a data stall, seconds
POLL_S = (0.005, 0.1)  #: a waiting reader re-reads the progress file after the first, doubling up to the second
PARENT_CHECK_S = 2.0  #: the stream process checks this often that the run's process is still there, seconds
#: a file's manifest is rewritten at most this often while the stream fills it (a killed stream re-fetches at most
#: this many seconds of chunks; readers of the window wait on the progress file, not on the manifests), seconds
MANIFEST_EVERY_S = 10.0


def stream_key(order, first_row: int, num_rows: int) -> str:
    """The window's identity (module docstring): a sha256 hex digest."""
    f = order.files
    doc = {"v": 1, "files": [[str(p), int(b)] for p, b in zip(f.paths, f.num_bytes)], "dtype": f.dtype.name,
           "L": order.sequence_length, "B": order.global_batch_size, "seed": order.seed,
           "first_epoch": order.first_epoch, "chunk": order.chunk, "rows": [int(first_row), int(num_rows)]}
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


def want_path(progress: Path) -> Path:
    """``<key>.want.json`` beside the progress file ``<key>.json``: the latest row a trainer-side reader waited
    for."""
    return Path(progress).with_suffix(".want.json")


def streams_dir(files) -> Path:
    """``<cache>/window/.streams/``: the progress files and locks of window streams."""
    return files.window.root / ".streams"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StreamGate:
    """Wait for rows of a streamed window (module docstring). Picklable (data-loader workers, the audit job);
    :meth:`to_json` / :meth:`from_json` carry it to another interpreter.

    :param progress: the stream's progress file.
    :param first_row: first training-order row of the window; ``end_row``: one past its last.
    :param global_batch_size: ``B``, rows per step (names the step of a stall in the log).
    :param drives: a trainer-side gate: the rows it waits for move the stream's ``ahead_steps`` bound (the audit's
        gate only follows).
    """

    def __init__(self, progress: str | Path, first_row: int, end_row: int, global_batch_size: int = 1,
                 drives: bool = True):
        self.progress = Path(progress)
        self.first_row, self.end_row = int(first_row), int(end_row)
        self.global_batch_size = max(1, int(global_batch_size))
        self.drives = bool(drives)
        self._wanted = -1  #: the last row this gate recorded as wanted
        self._ready = self.first_row  #: rows before this are known to be fetched
        self._host = socket.gethostname()
        self._inst: Optional[tuple] = None  #: (sorted instance ids of the window, their first rows)
        self._waits: Dict[int, float] = {}  #: step -> the longest wait for one of its rows, seconds
        self._logged: set = set()  #: steps whose stall is logged (readers of one batch wait together)
        self._lock = threading.Lock()
        self.stalls = 0  #: steps with a wait longer than STALL_LOG_S (logged once each)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_inst"] = None  # rebuilt where needed
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def stall_s(self) -> float:
        """Seconds this process's readers waited for the stream: per step the longest wait (the threads reading
        one batch wait side by side), summed."""
        with self._lock:
            return float(sum(self._waits.values()))

    def to_json(self) -> dict:
        """What :meth:`from_json` needs to rebuild the gate in another interpreter."""
        return {"progress": str(self.progress), "first_row": self.first_row, "end_row": self.end_row,
                "global_batch_size": self.global_batch_size}

    @classmethod
    def from_json(cls, doc: dict, drives: bool = False) -> "StreamGate":
        """The gate :meth:`to_json` described; by default one that only follows the stream (``drives``)."""
        return cls(doc["progress"], doc["first_row"], doc["end_row"], doc.get("global_batch_size", 1), drives)

    def want(self, q: int) -> None:
        """Record that a reader waits for row ``q`` (``<key>.want.json``; only a larger row than recorded)."""
        if not self.drives or q <= self._wanted:
            return
        self._wanted = q
        try:
            write_json(want_path(self.progress), {"row": int(q)})
        except OSError:
            pass

    def covers(self, q: int) -> bool:
        """Whether training-order row ``q`` belongs to the streamed window."""
        return self.first_row <= q < self.end_row

    def read(self) -> Optional[dict]:
        """The progress file, or ``None`` while it does not exist (or is being replaced)."""
        try:
            return json.loads(self.progress.read_text())
        except (OSError, ValueError):
            return None

    def wait_row(self, q: int) -> bool:
        """Return once row ``q`` is in the window cache: ``True``; ``False`` at once for a row outside the window
        (the caller reads it as it would without a stream).

        :raises DataError: if the stream failed, its process ended before the window was complete, or its
            progress file has not moved for :data:`STALE_S` seconds.
        """
        q = int(q)
        if not self.covers(q):
            return False
        if q < self._ready:
            return True
        t0 = time.monotonic()
        delay, seen, moved = POLL_S[0], None, t0
        self.want(q)
        while True:
            doc = self.read()
            if doc is not None:
                if doc.get("state") == "failed":
                    raise DataError(f"the window stream failed: {doc.get('error')}; re-run the same command to "
                                    "fetch the rest (or prefetch it: python -m pretrain_exp.app.prefetch)")
                ready = self.end_row if doc.get("state") == "done" else int(doc.get("ready_row", self.first_row))
                self._ready = max(self._ready, ready)
                if q < self._ready:
                    break
                stamp = (doc.get("updated"), doc.get("ready_row"))
                if stamp != seen:
                    seen, moved = stamp, time.monotonic()
                elif (doc.get("host") == self._host and doc.get("pid") and not _alive(int(doc["pid"]))
                      and time.monotonic() - moved > 2 * HEARTBEAT_S):
                    raise DataError(f"the window stream (process {doc['pid']}) ended before row {q} was fetched "
                                    f"({doc.get('ready_row')} of rows [{self.first_row}, {self.end_row}) ready); "
                                    "re-run the same command to fetch the rest")
            if time.monotonic() - moved > STALE_S:
                raise DataError(f"{self.progress}: the window stream has not moved for {STALE_S:.0f} s (row {q} "
                                "not fetched); re-run the same command, or prefetch the window first "
                                "(python -m pretrain_exp.app.prefetch)")
            time.sleep(delay)
            delay = min(2 * delay, POLL_S[1])
        waited = time.monotonic() - t0
        step = q // self.global_batch_size + 1
        with self._lock:
            self._waits[step] = max(self._waits.get(step, 0.0), waited)
            new = waited > STALL_LOG_S and step not in self._logged
            if new:
                self._logged.add(step)
                self.stalls += 1
        if new:
            log.warning("data stall: step %d (row %d) waited %.2f s for the window stream (rows [%d, %d) of [%d, %d) "
                        "fetched)", step, q, waited, self.first_row, self._ready, self.first_row, self.end_row)
        return True

    def wait_instance(self, instance: int, order) -> None:
        """Return once instance ``instance`` of ``order``'s files is in the cache, if it is one of the window's
        (OLMo-core's data loader asks by instance id); other instances return at once."""
        if self._inst is None:
            inst = order.instances(self.first_row, self.end_row - self.first_row)
            idx = np.argsort(inst, kind="stable")  # the first row of an instance the window holds twice first
            self._inst = (inst[idx], np.arange(self.first_row, self.end_row, dtype=np.int64)[idx])
        ids, rows = self._inst
        i = int(np.searchsorted(ids, int(instance)))
        if i < ids.size and ids[i] == instance:
            self.wait_row(int(rows[i]))


class WindowStream:
    """Start (and, at the end, stop) the window stream of rows ``[first_row, first_row + num_rows)`` of ``order``
    (module docstring).

    :param threads: parallel range requests; ``chunk_bytes``: largest request, bytes.
    :param ahead_steps: steps the stream may run past the latest row a trainer-side reader waited for (``None``:
        no limit).
    """

    def __init__(self, order, first_row: int, num_rows: int, *, threads: int = 32, chunk_bytes: int = 8 << 20,
                 ahead_steps: Optional[int] = None):
        self.order = order
        self.first_row, self.num_rows = int(first_row), int(num_rows)
        self.threads, self.chunk_bytes, self.ahead_steps = int(threads), int(chunk_bytes), ahead_steps
        self.key = stream_key(order, first_row, num_rows)
        root = streams_dir(order.files)
        self.progress = root / f"{self.key}.json"
        self.lock_path = root / f"{self.key}.lock"
        self.proc: Optional[subprocess.Popen] = None
        self.streaming = False  #: this process's child streams the window (another process may instead)

    def gate(self) -> StreamGate:
        """The gate of this window (the same file on every rank)."""
        return StreamGate(self.progress, self.first_row, self.first_row + self.num_rows, self.order.global_batch_size)

    def start(self) -> "WindowStream":
        """Create the window's cache files, then start the stream process holding the window's lock, unless another
        process holds it (that one streams; this one only waits on its progress file). Returns ``self``."""
        files = self.order.files
        inst = self.order.instances(self.first_row, self.num_rows)
        for fi in np.unique(self.order.instance_locations(inst)[0]):  # before any reader maps them
            if files.remote[int(fi)]:
                files.window.create(files.paths[int(fi)], int(files.num_bytes[int(fi)]))
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("window stream: another process streams rows [%d, %d) (%s); waiting on it",
                         self.first_row, self.first_row + self.num_rows, self.progress)
                return self
            spec = {"version": 1, "paths": [str(p) for p in files.paths], "dtype": files.dtype.name,
                    "cache_dir": str(files.cache_dir), "sequence_length": self.order.sequence_length,
                    "global_batch_size": self.order.global_batch_size, "seed": self.order.seed,
                    "first_epoch": self.order.first_epoch, "chunk": self.order.chunk, "first_row": self.first_row,
                    "num_rows": self.num_rows, "threads": self.threads, "chunk_bytes": self.chunk_bytes,
                    "ahead_steps": self.ahead_steps, "progress": str(self.progress), "parent": os.getpid()}
            spec_path = self.progress.with_suffix(".spec.json")
            write_json(spec_path, spec)
            env = dict(os.environ)
            root = Path(__file__).resolve().parents[2]
            if (root / "pyproject.toml").is_file():  # a checkout (an installed package is found as it is)
                env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            want_path(self.progress).unlink(missing_ok=True)  # an earlier run's reader
            self.proc = track(subprocess.Popen([sys.executable, "-m", "pretrain_exp.data.stream", str(spec_path)],
                                               stdin=subprocess.DEVNULL, env=env, pass_fds=(fd,), **OWN_GROUP))
            atexit.register(self.close)
            # the first progress record before anyone waits on it (the child rewrites it from here on)
            _write_progress(self.progress, self.key, self.first_row, self.first_row + self.num_rows,
                            self.first_row, "running", None, self.proc.pid)
            self.streaming = True
            log.info("window stream: rows [%d, %d) (%d steps), fetched ahead of the trainer%s by process %d",
                     self.first_row, self.first_row + self.num_rows, self.num_rows // self.order.global_batch_size,
                     f" (at most {self.ahead_steps} steps)" if self.ahead_steps else "", self.proc.pid)
        finally:
            os.close(fd)  # the child holds the lock through its own copy of the descriptor
        return self

    def close(self, wait_s: float = 0.0) -> None:
        """Stop the stream process (after ``wait_s`` seconds for it to finish)."""
        if self.proc is None:
            return
        atexit.unregister(self.close)
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            stop_process(self.proc)


def _write_progress(path: Path, key: str, first_row: int, end_row: int, ready_row: int, state: str,
                    error: Optional[str], pid: int) -> None:
    write_json(path, {"key": key, "first_row": int(first_row), "end_row": int(end_row), "ready_row": int(ready_row),
                      "state": state, "error": error, "pid": int(pid), "host": socket.gethostname(),
                      "updated": time.time()})


class _Streamer:
    """The stream process's work (module docstring)."""

    def __init__(self, spec: dict, files, order):
        self.spec, self.files, self.order = spec, files, order
        self.first_row, self.num_rows = int(spec["first_row"]), int(spec["num_rows"])
        self.end_row = self.first_row + self.num_rows
        self.B = order.global_batch_size
        self.wanted = self.first_row  #: the latest row a trainer-side reader waited for
        self.wanted_read = 0.0
        self.ready_row = self.first_row
        self.last_write = 0.0
        self.error: Optional[str] = None

    def write(self, state: str = "running", force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_write >= 0.2 or state != "running":
            _write_progress(Path(self.spec["progress"]), self.spec.get("key", ""), self.first_row, self.end_row,
                            self.ready_row, state, self.error, os.getpid())
            self.last_write = now

    def allowed_row(self) -> int:
        """The stream may fetch rows before this one: ``ahead_steps`` steps past the step of the latest row a
        trainer-side reader waited for (read from ``<key>.want.json`` at most every 50 ms)."""
        ahead = self.spec.get("ahead_steps")
        if not ahead:
            return self.end_row
        if time.monotonic() - self.wanted_read > 0.05:
            self.wanted_read = time.monotonic()
            try:
                self.wanted = max(self.wanted, int(json.loads(want_path(Path(self.spec["progress"])).read_text())
                                                   ["row"]))
            except (OSError, ValueError, KeyError, TypeError):
                pass
        return min(self.end_row, (self.wanted // self.B + int(ahead)) * self.B)

    def block_chunks(self, a: int, b: int, present: Dict[int, np.ndarray]):
        """The chunks ``(file, start, end)`` of rows ``[a, b)`` not in ``present`` (merged per file)."""
        from pretrain_exp.data.prefetch import window_ranges
        from pretrain_exp.data.window import subtract_ranges

        out = []
        for fi, r in window_ranges(self.order, a, b - a).items():
            if not self.files.remote[fi]:
                continue
            have = present.get(fi)
            for s, e in (subtract_ranges(r, have) if have is not None and have.size else r):
                for c in range(int(s), int(e), int(self.spec["chunk_bytes"])):
                    out.append((fi, c, min(int(e), c + int(self.spec["chunk_bytes"]))))
        return out

    def run(self) -> None:
        from pretrain_exp.data.prefetch import check_window
        from pretrain_exp.data.window import merge_ranges

        files, t0 = self.files, time.monotonic()
        self.write(force=True)
        inst = self.order.instances(self.first_row, self.num_rows)
        window_files = [fi for fi in np.unique(self.order.instance_locations(inst)[0]).tolist() if files.remote[fi]]
        present = {fi: files.present(fi, refresh=True) for fi in window_files}
        finished: Dict[int, list] = {fi: [] for fi in window_files}
        recorded: Dict[int, float] = {}
        fds = {fi: os.open(files.window.create(files.paths[fi], int(files.num_bytes[fi])), os.O_RDWR)
               for fi in window_files}

        def record(fi: int, force: bool) -> None:
            if finished[fi] and (force or time.monotonic() - recorded.get(fi, 0.0) >= MANIFEST_EVERY_S):
                present[fi] = merge_ranges(np.vstack([present[fi], np.asarray(finished[fi], np.int64)]))
                finished[fi].clear()
                present[fi] = files.window.record(files.paths[fi], int(files.num_bytes[fi]), present[fi])
                recorded[fi] = time.monotonic()

        def fetch(fi: int, a: int, b: int) -> int:
            data = files.reader.read(files.paths[fi], a, b - a, int(files.num_bytes[fi]))
            files.window.write(files.window.path_for(files.paths[fi]), fds[fi], a, data)
            return len(data)

        threads = max(1, int(self.spec["threads"]))
        fetched = 0
        blocks: Dict[int, int] = {}  # block start row -> chunks still in flight or queued
        next_row = self.first_row
        queue: list = []  # (block start, fi, a, b) not yet submitted
        try:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                inflight: dict = {}
                while True:
                    # queue the next blocks (one step's rows each) as far as the trainer allows
                    while len(queue) < 2 * threads and next_row < min(self.end_row, self.allowed_row()):
                        a, b = next_row, min(self.end_row, (next_row // self.B + 1) * self.B)
                        chunks = self.block_chunks(a, b, present)
                        blocks[a] = len(chunks)
                        queue.extend((a, *c) for c in chunks)
                        next_row = b
                    while queue and len(inflight) < 2 * threads:
                        item = queue.pop(0)
                        inflight[pool.submit(fetch, *item[1:])] = item
                    # the contiguous prefix of complete blocks is ready
                    while blocks and blocks.get(min(blocks), 1) == 0:
                        a = min(blocks)
                        del blocks[a]
                        self.ready_row = min(self.end_row, (a // self.B + 1) * self.B)
                    self.write()
                    if not inflight:
                        if next_row >= self.end_row and not queue:
                            break
                        time.sleep(0.05)  # held back by ahead_steps: wait for the trainer
                        if time.monotonic() - self.last_write >= HEARTBEAT_S:
                            self.write(force=True)
                        continue
                    done, _ = wait(inflight, timeout=HEARTBEAT_S, return_when=FIRST_COMPLETED)
                    for fut in done:
                        a, fi, s, e = inflight.pop(fut)
                        fetched += fut.result()
                        finished[fi].append((s, e))
                        blocks[a] -= 1
                        record(fi, force=False)
        finally:
            for fd in fds.values():
                os.close(fd)
            for fi in finished:
                record(fi, force=True)
        check_window(files, self.order.byte_ranges(inst))  # every range of the window is recorded
        self.ready_row = self.end_row
        self.write("done")
        secs = time.monotonic() - t0
        log.info("window stream: rows [%d, %d) complete: %.1f MB fetched in %.1f s%s", self.first_row,
                 self.end_row, fetched / 1e6, secs, rate(fetched / 1e6, secs, "MB", "{:.1f}"))


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            os._exit(3)


def main(argv=None) -> None:
    """``python -m pretrain_exp.data.stream SPEC``: stream the window the spec names (module docstring); trainer
    steps arrive as lines on stdin. Exit status 1 (and ``state: failed`` with the error) on an error."""
    from pretrain_exp.data.order import DataOrder
    from pretrain_exp.data.token_files import TokenFiles

    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    child_logging()
    threading.Thread(target=_watch_parent, args=(int(spec["parent"]),), daemon=True).start()
    files = TokenFiles(spec["paths"], np.dtype(spec["dtype"]), cache_dir=spec["cache_dir"], progress=False)
    order = DataOrder(files, spec["sequence_length"], spec["global_batch_size"], spec["seed"], spec["first_epoch"],
                      cache_dir=spec["cache_dir"], chunk=spec["chunk"])
    spec["key"] = stream_key(order, spec["first_row"], spec["num_rows"])
    streamer = _Streamer(spec, files, order)
    try:
        streamer.run()
    except Exception as e:  # noqa: BLE001  (recorded for every reader, then the exit status)
        streamer.error = f"{type(e).__name__}: {e}"
        streamer.write("failed")
        log.error("window stream failed: %s", streamer.error)
        sys.exit(1)


if __name__ == "__main__":
    main()

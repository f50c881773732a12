"""Window prefetch: fetch exactly the instances a run trains from remote token files into the window cache.

A run continuing ``n`` steps from step ``S`` trains rows ``[S*B, (S+n)*B)`` of the data order; each row is one
instance (``L`` tokens of one file). :func:`window_ranges` turns those rows into merged byte ranges per file;
:func:`prefetch_ranges` fetches what the window cache (:mod:`pretrain_exp.data.window`) lacks by parallel
byte-range requests (at most ``threads`` at a time, ranges split into chunks of at most ``chunk_bytes``), writing
each chunk into the sparse cache file and recording it in the file's manifest, so a killed prefetch resumes with
only what is missing. It states the bytes needed and the disk free before it starts, and fails with a
:class:`DataError` if the disk cannot hold them. :func:`check_window` proves every needed range is present before
training; :meth:`TokenFiles.local_paths <pretrain_exp.data.token_files.TokenFiles.local_paths>` gives the files
to train on.

:func:`prefetch` is the whole job from the run's settings (used by ``python -m pretrain_exp.app.prefetch`` and
before training).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional, Sequence

import numpy as np

from pretrain_exp.core.errors import ConfigError, DataError
from pretrain_exp.core.io import file_lock
from pretrain_exp.core.logs import rate
from pretrain_exp.data.order import DataOrder
from pretrain_exp.data.remote import DEFAULT_THREADS, _progress, changed_size_error, redact
from pretrain_exp.data.token_files import TokenFiles
from pretrain_exp.data.window import merge_ranges, subtract_ranges, total_bytes

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 << 20  #: largest byte range of one request, bytes
MANIFEST_EVERY_S = 1.0  #: a file's manifest is rewritten at most this often while its chunks complete, seconds
Ranges = Dict[int, np.ndarray]  #: file index -> merged half-open byte ranges ``int64 (k, 2)``


@dataclass
class PrefetchStats:
    """What one prefetch did. Bytes are bytes of the remote files; ``seconds`` is wall time."""

    needed_bytes: int = 0  #: bytes of the window in remote files
    cached_bytes: int = 0  #: of those, already in the window cache before this call
    fetched_bytes: int = 0  #: bytes received by this call
    requests: int = 0  #: range requests sent by this call (retries included)
    chunks: int = 0  #: chunks completed by this call
    seconds: float = 0.0

    @property
    def mb_per_s(self) -> float:
        """Received megabytes (1e6 B) per second of wall time."""
        return self.fetched_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def window_ranges(order: DataOrder, first_row: int, num_rows: int) -> Ranges:
    """Merged byte ranges of the instances of training-order rows ``[first_row, first_row + num_rows)``
    (:meth:`DataOrder.byte_ranges <pretrain_exp.data.order.DataOrder.byte_ranges>`).

    :returns: ``{file index: int64 array (k, 2) of [start, end) byte offsets}``, only files with rows; touching
        instances are merged into one range.
    """
    instances = order.instances(first_row, num_rows)
    return order.byte_ranges(instances)


def missing_ranges(files: TokenFiles, ranges: Ranges) -> Ranges:
    """The part of ``ranges`` (remote files only) not yet in the window cache; files with nothing missing are
    left out."""
    out: Ranges = {}
    for fi, r in ranges.items():
        if files.remote[fi]:
            miss = subtract_ranges(r, files.present(fi, refresh=True))
            if len(miss):
                out[fi] = miss
    return out


def check_window(files: TokenFiles, ranges: Ranges) -> None:
    """Prove every range of a remote file in ``ranges`` is in the window cache (local files need nothing).

    :raises DataError: naming the first URL with missing bytes, how many, and the command that fetches them.
    """
    miss = missing_ranges(files, ranges)
    if miss:
        fi = min(miss)
        raise DataError(f"{redact(files.paths[fi])}: {total_bytes(miss[fi])} B of the run's window are not in the "
                        f"window cache {files.window.path_for(files.paths[fi])} ({len(miss)} files lack bytes in all);"
                        f" run the prefetch (python -m pretrain_exp.app.prefetch <the run's overrides>)")


def _chunks(miss: Ranges, chunk_bytes: int):
    for fi in sorted(miss):
        for a, b in miss[fi]:
            for s in range(int(a), int(b), chunk_bytes):
                yield fi, s, min(int(b), s + chunk_bytes)


def prefetch_ranges(files: TokenFiles, ranges: Ranges, *, threads: int = DEFAULT_THREADS,
                    chunk_bytes: int = CHUNK_BYTES, progress: bool = True,
                    on_chunk: Optional[Callable[[int, int, int], None]] = None) -> PrefetchStats:
    """Fetch the missing part of ``ranges`` of the remote files into the window cache.

    :param files: the token files (remote ones need ``cache_dir``).
    :param ranges: byte ranges per file index (:func:`window_ranges`); local files are skipped.
    :param threads: parallel range requests.
    :param chunk_bytes: largest request, bytes.
    :param progress: show a progress bar (MB/s, ETA).
    :param on_chunk: called in the calling thread as ``on_chunk(file index, start, end)`` after each chunk is on
        disk and recorded (tests use it to interrupt a prefetch).
    :returns: :class:`PrefetchStats`.
    :raises DataError: if the disk free at the window cache is smaller than the bytes to fetch, a URL answers
        404, a file changed size, or a request fails after its retries; what was fetched is kept and recorded.

    Processes sharing the cache (the ranks of a job) take turns through a file lock: the first fetches, the
    others find the window cached.
    """
    if not any(files.remote[fi] for fi in ranges):
        return PrefetchStats()
    return _prefetch_ranges(files, ranges, threads, chunk_bytes, progress, on_chunk)


def _prefetch_ranges(files: TokenFiles, ranges: Ranges, threads: int, chunk_bytes: int, progress: bool,
                     on_chunk: Optional[Callable[[int, int, int], None]]) -> PrefetchStats:
    with file_lock(files.window.root / ".prefetch.lock"):  # the processes sharing the cache take turns
        t0 = time.monotonic()
        stats = PrefetchStats()
        remote = {fi: merge_ranges(r) for fi, r in ranges.items() if files.remote[fi]}
        stats.needed_bytes = sum(total_bytes(r) for r in remote.values())
        if not remote:
            return stats
        miss = missing_ranges(files, remote)
        to_fetch = sum(total_bytes(r) for r in miss.values())
        stats.cached_bytes = stats.needed_bytes - to_fetch
        root = files.window.root
        root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(root).free
        log.info("window prefetch: %.1f MB needed in %d remote files, %.1f MB already cached, %.1f MB to fetch; "
                 "%.1f MB free at %s", stats.needed_bytes / 1e6, len(remote), stats.cached_bytes / 1e6, to_fetch / 1e6,
                 free / 1e6, root)
        if to_fetch > free:
            raise DataError(f"{root}: the window cache needs {to_fetch / 1e6:.1f} MB more, the disk has "
                            f"{free / 1e6:.1f} MB free; set cache_dir to a larger disk or train fewer steps")
        if not miss:
            stats.seconds = time.monotonic() - t0
            return stats

        for fi in miss:  # http(s) answers carry the size (Content-Range); other schemes are asked once here
            url = files.paths[fi]
            if not url.lower().startswith(("http://", "https://")):
                now = files.reader.size(url)
                if now != int(files.num_bytes[fi]):
                    raise changed_size_error(url, int(files.num_bytes[fi]), now)
        present = {fi: files.present(fi) for fi in miss}
        fds: Dict[int, int] = {}
        dirty: Dict[int, float] = {}  # file index -> time of its last manifest write

        def fetch(fi: int, a: int, b: int) -> int:
            data = files.reader.read(files.paths[fi], a, b - a, int(files.num_bytes[fi]))
            files.window.write(files.window.path_for(files.paths[fi]), fds[fi], a, data)
            return len(data)

        finished: Dict[int, list] = {fi: [] for fi in miss}  # chunks on disk, not yet merged into present[fi]

        def record(fi: int, force: bool) -> None:
            if finished[fi] and (force or time.monotonic() - dirty.get(fi, 0.0) >= MANIFEST_EVERY_S):
                present[fi] = merge_ranges(np.vstack([present[fi], np.asarray(finished[fi], np.int64)]))
                finished[fi].clear()
                files.window.record(files.paths[fi], int(files.num_bytes[fi]), present[fi])
                dirty[fi] = time.monotonic()

        requests_before = files.reader.requests
        try:
            for fi in miss:
                path = files.window.create(files.paths[fi], int(files.num_bytes[fi]))
                fds[fi] = os.open(path, os.O_RDWR)

            pending = _chunks(miss, int(chunk_bytes))
            error: Optional[BaseException] = None
            with _progress(progress, bytes_mode=True) as bar, ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
                task = bar.add_task("window prefetch", total=to_fetch)
                inflight = {}
                while True:
                    while error is None and len(inflight) < 2 * threads:
                        item = next(pending, None)
                        if item is None:
                            break
                        inflight[pool.submit(fetch, *item)] = item
                    if not inflight:
                        break
                    done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                    for fut in done:
                        fi, a, b = inflight.pop(fut)
                        try:
                            n = fut.result()
                        except BaseException as e:  # noqa: B036 - kept to re-raise after the in-flight chunks land
                            error = error or e
                            continue
                        finished[fi].append((a, b))
                        stats.fetched_bytes += n
                        stats.chunks += 1
                        bar.advance(task, n)
                        record(fi, force=False)
                        if on_chunk is not None and error is None:
                            try:
                                on_chunk(fi, a, b)
                            except BaseException as e:  # noqa: B036
                                error = e
                if error is not None:
                    raise error
        finally:
            for fi in list(fds):
                os.close(fds.pop(fi))
            for fi in finished:
                record(fi, force=True)
            for fi in present:
                files._present[fi] = present[fi]
            stats.requests = files.reader.requests - requests_before
            stats.seconds = time.monotonic() - t0
        log.info("window prefetch: %.1f MB in %d requests, %.1f s%s", stats.fetched_bytes / 1e6,
                 stats.requests, stats.seconds, rate(stats.fetched_bytes / 1e6, stats.seconds, "MB", "{:.1f}"))
        return stats


PREFETCH_MODES = ("auto", "stream", "window", "none")


def resolve_prefetch(mode: str, files: TokenFiles) -> str:
    """``data.prefetch`` for these files: ``"stream"`` (:mod:`pretrain_exp.data.stream`), ``"window"`` or ``"none"``
    (``auto`` = stream iff a path is remote).

    :raises ConfigError: (``data.prefetch``) for an unknown mode.
    """
    if mode not in PREFETCH_MODES:
        raise ConfigError("data.prefetch", f"unknown mode {mode!r}; allowed: {', '.join(PREFETCH_MODES)}")
    if mode == "auto":
        return "stream" if any(files.remote) else "none"
    return mode


def prefetch_window(order: DataOrder, first_row: int, num_rows: int, *, threads: int = DEFAULT_THREADS,
                    chunk_bytes: int = CHUNK_BYTES, progress: bool = True) -> PrefetchStats:
    """Fetch the instances of rows ``[first_row, first_row + num_rows)`` of ``order`` into the window cache and
    check that all are present (:func:`window_ranges`, :func:`prefetch_ranges`, :func:`check_window`).

    :returns: :class:`PrefetchStats` (all zero when every file is local).
    :raises DataError: see :func:`prefetch_ranges` and :func:`check_window`.
    """
    ranges = window_ranges(order, first_row, num_rows)
    stats = prefetch_ranges(order.files, ranges, threads=threads, chunk_bytes=chunk_bytes, progress=progress)
    check_window(order.files, ranges)
    return stats


def prefetch_rows(order: DataOrder, rows: np.ndarray, *, threads: int = DEFAULT_THREADS,
                  chunk_bytes: int = CHUNK_BYTES, progress: bool = False) -> PrefetchStats:
    """Fetch the instances of the training-order rows ``rows`` (any, e.g. the rows the verifier reads before a
    window stream reaches them) into the window cache and check that they are there.

    :returns: :class:`PrefetchStats`.
    :raises DataError: see :func:`prefetch_ranges` and :func:`check_window`.
    """
    rows = np.unique(np.asarray(rows, dtype=np.int64))
    ranges = order.byte_ranges(np.array([order.instance(int(q))[1] for q in rows], dtype=np.int64))
    stats = prefetch_ranges(order.files, ranges, threads=threads, chunk_bytes=chunk_bytes, progress=progress)
    check_window(order.files, ranges)
    return stats


def prefetch(paths: Sequence[str | Path], dtype, sequence_length: int, global_batch_size: int, seed: int,
             first_epoch: int, first_row: int, num_rows: int, cache_dir: str | Path,
             prefixes: Optional[Mapping[str, str]] = None, *, threads: int = DEFAULT_THREADS,
             chunk_bytes: int = CHUNK_BYTES, progress: bool = True,
             files: Optional[TokenFiles] = None, chunk: int = 1) -> tuple[TokenFiles, DataOrder, PrefetchStats]:
    """Prefetch the window of a run: rows ``[first_row, first_row + num_rows)`` of its data order.

    Builds the size index (:class:`TokenFiles`), the order (cached permutation under ``cache_dir``), the window's
    byte ranges, fetches what is missing and checks that all of it is present.

    :param paths: ``data.paths`` (local paths or URLs), before the prefix map.
    :param dtype: token dtype of the files (``uint16``/``uint32``).
    :param sequence_length: L, tokens per instance.
    :param global_batch_size: B, rows per step.
    :param seed: data-order seed; :param first_epoch: 1 (OLMo-core) or 0 (OLMo-2).
    :param first_row: first training-order row of the window (``checkpoint_step * B``).
    :param num_rows: rows of the window (``num_steps * B``).
    :param cache_dir: the project cache (size index, permutations, window cache).
    :param prefixes: ``data.path_prefixes``.
    :param files: reuse these token files instead of building them from ``paths``.
    :param chunk: instances shuffled together (see :class:`DataOrder`).
    :returns: ``(files, order, stats)``; ``files.local_paths()`` are the paths to train on.
    :raises DataError: see :func:`prefetch_ranges` and :func:`check_window`.
    """
    if files is None:
        files = TokenFiles(paths, dtype, cache_dir=cache_dir, prefixes=prefixes, threads=threads, progress=progress)
    order = DataOrder(files, sequence_length, global_batch_size, seed, first_epoch, cache_dir=cache_dir,
                      chunk=chunk)
    stats = prefetch_window(order, first_row, num_rows, threads=threads, chunk_bytes=chunk_bytes, progress=progress)
    return files, order, stats

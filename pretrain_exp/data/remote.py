"""Remote token files: URL schemes, the prefix map, sizes and byte ranges, the size index.

A ``data.paths`` entry is a local path or a URL of a scheme OLMo-core's own io layer reads (``http``, ``https``,
``s3``, ``gs``, ``r2``). Paths are first rewritten by the **prefix map** ``data.path_prefixes``
(``{old prefix: new prefix}``, first match wins; :func:`map_prefixes`), so a user with an internal mirror, an
s3 bucket or a local test server keeps the official URL list, e.g.
``{"http://olmo-data.org/": "http://127.0.0.1:8000/"}``.

Transport (:class:`RemoteReader`):

- ``http``/``https`` go through one pooled ``requests`` session with the project's retry policy
  (:mod:`pretrain_exp.core.retry`): ``olmo_core.io``'s HTTP helpers retry a fixed 3 times without jitter (a
  range read only on 502), do not check a HEAD's status (a 404 page's ``Content-Length`` would pass as a size),
  and do not expose the ``Content-Range`` total that tells a changed file apart, so they are not used for HTTP.
- ``s3``/``gs``/``r2`` go through ``olmo_core.io.get_file_size`` / ``get_bytes_range`` (their clients and
  credentials are OLMo-core's), wrapped in the same retry policy.

Sizes of remote files are fetched once, in parallel (bounded by ``threads``), into a **size index**
``<cache_dir>/size_index/<sha256 of the mapped path list>.json`` written atomically (:func:`fetch_sizes`). A
remote file whose size differs from its index entry fails every read with one :class:`DataError` naming it.
Messages never carry credentials: :func:`redact` (:func:`pretrain_exp.core.secrets.redact_url`) drops userinfo and
query strings from URLs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.errors import DataError
from pretrain_exp.core.io import file_lock, write_json
from pretrain_exp.core.retry import RetryPolicy, TransientError
from pretrain_exp.core.secrets import redact_url as redact

log = logging.getLogger(__name__)

REMOTE_SCHEMES = ("http", "https", "s3", "gs", "r2")  #: URL schemes read as remote token files
DEFAULT_THREADS = 32  #: parallel requests of the size index and the window prefetch
DEFAULT_TIMEOUT_S = 60.0  #: socket timeout per connect/read of one HTTP request, seconds
USER_AGENT = "pretrain_exp-remote/1"


def is_remote(path: str | Path) -> bool:
    """True if ``path`` is a URL of one of :data:`REMOTE_SCHEMES` (``Path`` objects are always local)."""
    if not isinstance(path, str):
        return False
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.lower() in REMOTE_SCHEMES


def map_prefixes(paths: Sequence[str | Path], prefixes: Optional[Mapping[str, str]]) -> List[str]:
    """Rewrite each path by the first ``{old: new}`` prefix of ``prefixes`` (insertion order) it starts with.

    Pure: no file or network access. ``Path`` entries are compared as strings.

    :param paths: local paths or URLs, in order.
    :param prefixes: ``{old prefix: new prefix}``; ``None`` or empty keeps the paths.
    :returns: the rewritten paths as strings, same length and order.
    """
    out = []
    for p in paths:
        s = str(p)
        for old, new in (prefixes or {}).items():
            if old and s.startswith(old):
                s = new + s[len(old):]
                break
        out.append(s)
    return out


def _content_range(value: Optional[str]) -> tuple[Optional[int], Optional[int]]:
    """``(first byte, total size)`` of ``Content-Range: bytes a-b/total`` (or ``bytes */total``)."""
    m = re.fullmatch(r"\s*bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)\s*", value or "")
    if not m:
        return None, None
    return (int(m.group(1)) if m.group(1) is not None else None), (int(m.group(2)) if m.group(2) != "*" else None)


def changed_size_error(url: str, indexed: int, now: Optional[int]) -> DataError:
    """The one error for a remote file whose size is not the size index's."""
    return DataError(f"{redact(url)}: remote file changed since its size was indexed ({indexed} B in the size index, "
                     f"{now} B now); the token files of a run must not change (delete the size index under "
                     f"<cache_dir>/size_index/ and the window cache under <cache_dir>/window/ to accept the new file)")


class RemoteReader:
    """Sizes and byte ranges of remote files, retried with the project's backoff policy. Thread-safe.

    :param retry: the retry policy (default :class:`RetryPolicy`: 5 retries, 1 s base delay).
    :param timeout_s: socket timeout of one HTTP connect/read, seconds.
    :param pool_size: pooled HTTP connections per host (at least the number of threads that share the reader).
    """

    def __init__(self, retry: Optional[RetryPolicy] = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 pool_size: int = 64):
        self.retry = retry or RetryPolicy()
        self.timeout_s = float(timeout_s)
        self.pool_size = int(pool_size)
        self.requests = 0  #: requests sent (HEAD and GET), for statistics
        self._lock = threading.Lock()

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_lock")
        state.pop("_shared_session", None)  # a session holds sockets: each process opens its own
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def _session(self):
        import requests
        from requests.adapters import HTTPAdapter

        session = getattr(self, "_shared_session", None)
        if session is None:
            with self._lock:
                session = getattr(self, "_shared_session", None)
                if session is None:
                    session = requests.Session()
                    adapter = HTTPAdapter(pool_connections=8, pool_maxsize=self.pool_size, max_retries=0)
                    session.mount("http://", adapter)
                    session.mount("https://", adapter)
                    session.headers.update({"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
                    self._shared_session = session
        return session

    def _count(self) -> None:
        with self._lock:
            self.requests += 1

    def _retried(self, url: str, attempt: Callable[[], Any]) -> Any:
        """``attempt()`` under the retry policy, its failures named by ``url`` redacted; a :class:`DataError` once
        the retries are spent."""
        shown = redact(url)
        return self.retry.call(attempt, what=shown, give_up=lambda failures, e: DataError(
            f"{shown}: failed after {failures} consecutive attempts: {e}"))

    # -------------------------------------------------------------------------------- size

    def size(self, url: str) -> int:
        """Size of the remote file ``url`` in bytes.

        :raises DataError: naming the URL on 404/410 (at once) or another 4xx, or when retries after connection
            errors, timeouts and 5xx/408/429 answers are exhausted.
        """
        if url.lower().startswith(("http://", "https://")):
            return self._retried(url, lambda: self._http_size(url))
        return self._retried(url, lambda: self._io_call("get_file_size", url))

    def _http_size(self, url: str) -> int:
        import requests

        self._count()
        try:
            r = self._session.head(url, allow_redirects=True, timeout=self.timeout_s)
        except requests.RequestException as e:
            raise TransientError(f"{type(e).__name__}: {redact(str(e))}") from None
        self._check_status(url, r.status_code)
        length = r.headers.get("Content-Length")
        if r.status_code == 200 and length is not None and length.isdigit():
            return int(length)
        # no usable HEAD: ask for the first byte and read the total from Content-Range
        self._count()
        try:
            with self._session.get(url, headers={"Range": "bytes=0-0"}, timeout=self.timeout_s, stream=True) as g:
                self._check_status(url, g.status_code)
                _, total = _content_range(g.headers.get("Content-Range"))
        except requests.RequestException as e:
            raise TransientError(f"{type(e).__name__}: {redact(str(e))}") from None
        if total is None:
            raise DataError(f"{redact(url)}: the server gives no size (no Content-Length, no Content-Range)")
        return total

    @staticmethod
    def _check_status(url: str, status: int) -> None:
        if status in (404, 410):
            raise DataError(f"{redact(url)}: token file not found (HTTP {status})")
        if status >= 500 or status in (408, 429):
            raise TransientError(f"HTTP {status}")
        if status >= 400 and status != 416:
            raise DataError(f"{redact(url)}: HTTP {status}")

    # -------------------------------------------------------------------------------- ranges

    def read(self, url: str, start: int, num_bytes: int, total: int) -> bytes:
        """Bytes ``[start, start + num_bytes)`` of the remote file ``url`` whose indexed size is ``total`` bytes.

        :returns: exactly ``num_bytes`` bytes.
        :raises DataError: naming the URL on 404/410, when the server's size (``Content-Range`` total, or the
            size of a whole-file answer) is not ``total`` (the file changed), or when retries are exhausted
            (connection errors, dropped connections, short reads, 5xx/408/429 are retried).
        """
        if num_bytes <= 0:
            return b""
        if start + num_bytes > total:
            raise DataError(f"{redact(url)}: read of bytes [{start}, {start + num_bytes}) past its end ({total} B)")
        if url.lower().startswith(("http://", "https://")):
            return self._retried(url, lambda: self._http_read(url, start, num_bytes, total))
        data = self._retried(url, lambda: self._io_call("get_bytes_range", url, start, num_bytes))
        if len(data) != num_bytes:
            raise DataError(f"{redact(url)}: asked for {num_bytes} bytes at {start}, got {len(data)}")
        return data

    def _http_read(self, url: str, start: int, num_bytes: int, total: int) -> bytes:
        import requests
        import urllib3

        self._count()
        end = start + num_bytes
        try:
            with self._session.get(url, headers={"Range": f"bytes={start}-{end - 1}"}, timeout=self.timeout_s,
                                   stream=True) as r:
                self._check_status(url, r.status_code)
                if r.status_code == 416:
                    _, now = _content_range(r.headers.get("Content-Range"))
                    raise changed_size_error(url, total, now)
                if r.status_code == 206:
                    first, now = _content_range(r.headers.get("Content-Range"))
                    if now is not None and now != total:
                        raise changed_size_error(url, total, now)
                    if first != start:
                        raise TransientError(f"server answered from byte {first}, not {start}")
                    data = r.raw.read(num_bytes + 1)  # one read (``content`` goes in 10 KiB pieces)
                elif r.status_code == 200:  # a server that ignores Range: the whole file
                    length = r.headers.get("Content-Length")
                    if length is not None and length.isdigit() and int(length) != total:
                        raise changed_size_error(url, total, int(length))
                    data = r.content
                    if len(data) != total:
                        raise TransientError(f"short read: {len(data)} of {total} bytes")
                    data = data[start:end]
                else:
                    raise DataError(f"{redact(url)}: unexpected HTTP {r.status_code}")
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:  # refused, reset, timeout
            # or a connection dropped mid-body (urllib3 IncompleteRead from ``raw.read``)
            raise TransientError(f"{type(e).__name__}: {redact(str(e))}") from None
        if len(data) != num_bytes:
            raise TransientError(f"short read: {len(data)} of {num_bytes} bytes")
        return data

    def _io_call(self, name: str, url: str, *args):
        """``olmo_core.io.<name>(url, *args)``: a missing file is a :class:`DataError`, other failures retried."""
        from olmo_core import io as olmo_io

        self._count()
        try:
            return getattr(olmo_io, name)(url, *args)
        except FileNotFoundError:
            raise DataError(f"{redact(url)}: token file not found") from None
        except (PermissionError, ValueError) as e:  # e.g. a missing R2 endpoint or profile setting
            raise DataError(f"{redact(url)}: {type(e).__name__}: {redact(str(e))}") from None
        except Exception as e:  # the cloud clients' own network errors
            if "NoCredentials" in type(e).__name__ or "AccessDenied" in str(e) or "403" in str(e):
                raise DataError(f"{redact(url)}: access denied ({type(e).__name__})") from None
            raise TransientError(f"{type(e).__name__}: {redact(str(e))}") from None


# ------------------------------------------------------------------------------------------------ size index


def size_index_path(cache_dir: str | Path, paths: Sequence[str]) -> Path:
    """``<cache_dir>/size_index/<sha256 of the newline-joined mapped path list>.json``."""
    digest = hashlib.sha256("\n".join(paths).encode()).hexdigest()
    return CacheDir(cache_dir).size_index / f"{digest}.json"


def fetch_sizes(paths: Sequence[str], cache_dir: str | Path, reader: Optional[RemoteReader] = None, *,
                threads: int = DEFAULT_THREADS, progress: bool = True) -> Dict[str, int]:
    """Sizes in bytes of the remote entries of ``paths``, from the size index or fetched once and indexed.

    The index of a path list (:func:`size_index_path`) is read when present; else every remote size is fetched
    in parallel (at most ``threads`` requests at a time, a progress bar when ``progress``) and the index is written
    atomically, under a file lock (concurrent jobs on one path list: one fetches, the others read its index). Local
    entries are not indexed (their size is a ``stat``).

    :param paths: mapped paths (:func:`map_prefixes`), local and remote, in run order.
    :param cache_dir: the project cache (``cache_dir``).
    :param reader: the transport (default :class:`RemoteReader`).
    :returns: ``{url: size in bytes}`` for each remote entry.
    :raises DataError: naming the URL for a 404 (see :meth:`RemoteReader.size`), or naming the index file if it
        is unreadable.
    """
    urls = [p for p in paths if is_remote(p)]
    if not urls:
        return {}
    index = size_index_path(cache_dir, list(paths))
    with file_lock(index.with_name(f".{index.name}.lock")):  # the jobs of a sweep index a path list once
        if index.is_file():
            try:
                sizes = json.loads(index.read_text())["sizes"]
                if len(sizes) == len(urls):
                    return dict(zip(urls, (int(s) for s in sizes)))
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise DataError(f"{index}: unreadable size index ({e}); delete it to re-index") from None
            raise DataError(f"{index}: size index lists {len(sizes)} files, the path list has {len(urls)}; "
                            "delete it")
        reader = reader or RemoteReader()
        t0 = time.monotonic()
        with _progress(progress) as bar, ThreadPoolExecutor(max_workers=max(1, min(threads, len(urls)))) as pool:
            task = bar.add_task("size index", total=len(urls))
            futures = [pool.submit(reader.size, u) for u in urls]
            sizes = []
            try:
                for fut in futures:
                    sizes.append(fut.result())
                    bar.advance(task)
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise
        write_json(index, {"version": 1, "paths": [redact(u) for u in urls], "sizes": sizes})
    log.info("size index: %d remote files, %.1f GB, in %.1f s -> %s", len(urls), sum(sizes) / 1e9,
             time.monotonic() - t0, index)
    return dict(zip(urls, sizes))


def _progress(enabled: bool, bytes_mode: bool = False):
    """A rich progress bar (to stderr); with ``bytes_mode`` it shows MB/s and the ETA."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = [TextColumn("{task.description}"), BarColumn()]
    columns += [DownloadColumn(), TransferSpeedColumn()] if bytes_mode else [MofNCompleteColumn()]
    columns.append(TimeRemainingColumn())
    return Progress(*columns, console=Console(stderr=True), disable=not enabled, transient=False)

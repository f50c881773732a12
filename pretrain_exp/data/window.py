"""The window cache: the byte ranges of remote token files that a run trains, kept in local sparse files.

Remote file ``<scheme>://<host>/<path>`` is cached at ``<cache_dir>/window/<host>/<path>``: a sparse file with
the **same basename and the same size** as the remote file (so OLMo-core's dataset fingerprint, which hashes each
file's basename and size, is the same whether it reads the URLs or the cached files), holding the remote bytes at
their own offsets wherever they were fetched and holes elsewhere. Beside it, ``<path>.ranges.json`` (the
manifest, written atomically) lists the byte ranges present::

    {"url": "<redacted url>", "size": <bytes>, "ranges": [[start, end), ...]}   # sorted, merged, end exclusive

Bytes are written first and recorded afterwards, so a range in the manifest is always on disk; a killed prefetch
loses at most the chunks finished since the last manifest write and resumes with what is missing.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import urllib.parse
from pathlib import Path
from typing import Optional

import numpy as np

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.errors import DataError
from pretrain_exp.core.io import atomic_path, write_json
from pretrain_exp.data.remote import changed_size_error, redact

MANIFEST_SUFFIX = ".ranges.json"


def merge_ranges(ranges: np.ndarray) -> np.ndarray:
    """Sorted union of half-open ranges: ``int64`` array ``(k, 2)`` of ``[start, end)`` -> ``(m, 2)``, ``m <= k``,
    with touching or overlapping ranges merged and empty ones dropped."""
    r = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    r = r[r[:, 1] > r[:, 0]]
    if len(r) == 0:
        return np.empty((0, 2), np.int64)
    r = r[np.argsort(r[:, 0], kind="stable")]
    ends = np.maximum.accumulate(r[:, 1])
    new = np.ones(len(r), bool)
    new[1:] = r[1:, 0] > ends[:-1]
    starts_idx = np.flatnonzero(new)
    end_idx = np.append(starts_idx[1:], len(r)) - 1
    return np.stack([r[starts_idx, 0], ends[end_idx]], axis=1)


def subtract_ranges(needed: np.ndarray, present: np.ndarray) -> np.ndarray:
    """``needed`` minus ``present`` (both merged ``(k, 2)`` ``int64`` half-open byte ranges) -> merged ``(m, 2)``."""
    needed, present = merge_ranges(needed), merge_ranges(present)
    if len(present) == 0 or len(needed) == 0:
        return needed
    out = []
    for a, b in needed:
        i = int(np.searchsorted(present[:, 1], a, side="right"))  # first present range ending after a
        while a < b and i < len(present) and present[i, 0] < b:
            if present[i, 0] > a:
                out.append((a, int(present[i, 0])))
            a = max(a, int(present[i, 1]))
            i += 1
        if a < b:
            out.append((a, b))
    return np.asarray(out, np.int64).reshape(-1, 2)


def covers(present: np.ndarray, start: int, end: int) -> bool:
    """True if the merged ranges ``present`` contain all of ``[start, end)``."""
    if end <= start:
        return True
    i = int(np.searchsorted(present[:, 0], start, side="right")) - 1
    return i >= 0 and present[i, 1] >= end


def total_bytes(ranges: np.ndarray) -> int:
    """Bytes covered by merged ranges ``(k, 2)``."""
    r = np.asarray(ranges, np.int64).reshape(-1, 2)
    return int((r[:, 1] - r[:, 0]).sum())


class WindowCache:
    """Local sparse copies of parts of remote files, with their manifests (module docstring).

    :param cache_dir: the project cache; files go under ``<cache_dir>/window/``.
    """

    def __init__(self, cache_dir: str | Path):
        self.root = CacheDir(cache_dir).window
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"root": self.root}

    def __setstate__(self, state):
        self.root = state["root"]
        self._lock = threading.Lock()

    def path_for(self, url: str) -> Path:
        """``<root>/<host>/<url path>`` (same basename as the URL).

        :raises DataError: if the URL has no host or file name, or a ``..`` component.
        """
        parts = urllib.parse.urlsplit(url)
        rel = urllib.parse.unquote(parts.path).lstrip("/")
        comps = rel.split("/")
        if not parts.hostname or not rel or rel.endswith("/") or any(c in ("", ".", "..") for c in comps):
            raise DataError(f"{redact(url)}: cannot be cached (needs a host and a plain file path)")
        host = parts.hostname + (f"_{parts.port}" if parts.port else "")
        return self.root / host / Path(*comps)

    def manifest_path(self, url: str) -> Path:
        """The manifest beside :meth:`path_for`: ``<file>.ranges.json``."""
        p = self.path_for(url)
        return p.with_name(p.name + MANIFEST_SUFFIX)

    def present(self, url: str, size: int) -> np.ndarray:
        """Merged byte ranges ``(k, 2)`` of ``url`` present in the cache (empty when nothing is cached).

        :raises DataError: naming the URL if the manifest records a size other than ``size`` (the remote file
            changed between two prefetches), or naming the manifest if it is unreadable.
        """
        m = self.manifest_path(url)
        if not m.is_file() or not self.path_for(url).is_file():
            return np.empty((0, 2), np.int64)
        try:
            doc = json.loads(m.read_text())
            ranges, cached_size = doc["ranges"], int(doc["size"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"{m}: unreadable window-cache manifest ({e}); delete it and its data file") from None
        if cached_size != size or self.path_for(url).stat().st_size != size:
            raise changed_size_error(url, size, cached_size)
        return merge_ranges(np.asarray(ranges, np.int64).reshape(-1, 2))

    def create(self, url: str, size: int) -> Path:
        """The cache file of ``url``, created (sparse, ``size`` bytes, atomically) if absent; returns its path."""
        path, manifest = self.path_for(url), self.manifest_path(url)
        if not path.is_file() or path.stat().st_size != size:
            with atomic_path(path) as tmp:
                with open(tmp, "r+b") as f:
                    f.truncate(size)
            manifest.unlink(missing_ok=True)
        return path

    def record(self, url: str, size: int, ranges: np.ndarray) -> np.ndarray:
        """Write the manifest of ``url`` (atomically): ``ranges`` (byte ranges on disk) joined with those the
        manifest lists already, so that processes filling one cache file at once (a run's window stream and another
        run's prefetch) never drop each other's ranges (an exclusive ``flock`` on the cache file orders them).
        Returns the merged ranges written."""
        with self._lock:
            path = self.path_for(url)
            try:
                f = open(path, "rb")
            except OSError:
                f = None
            try:
                if f is not None:
                    fcntl.flock(f, fcntl.LOCK_EX)
                mine = np.asarray(ranges, np.int64).reshape(-1, 2)
                merged = merge_ranges(np.vstack([self._recorded(url, size), mine]))
                write_json(self.manifest_path(url), {"url": redact(url), "size": int(size),
                                                     "ranges": merged.tolist()})
            finally:
                if f is not None:
                    f.close()  # releases the lock
        return merged

    def _recorded(self, url: str, size: int) -> np.ndarray:
        """The ranges the manifest of ``url`` lists for a file of ``size`` bytes (none if it is missing, unreadable
        or for another size)."""
        try:
            doc = json.loads(self.manifest_path(url).read_text())
            if int(doc["size"]) == int(size):
                return np.asarray(doc["ranges"], np.int64).reshape(-1, 2)
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return np.empty((0, 2), np.int64)

    @staticmethod
    def write(path: Path, fd: Optional[int], offset: int, data: bytes) -> None:
        """Write ``data`` at byte ``offset`` of the open cache file ``fd`` (``path`` names it in errors)."""
        try:
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, offset)
                view, offset = view[n:], offset + n
        except OSError as e:
            raise DataError(f"{path}: cannot write the window cache ({e})") from None

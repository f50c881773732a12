"""OLMo-format token files: raw little-endian ``uint16``/``uint32`` arrays, no header, documents joined with EOS.

Format source: OLMo ``olmo/data/memmap_dataset.py`` and OLMo-core ``olmo_core/data/numpy_dataset.py``. Each
``<name>.npy`` may have a ``<name>.csv.gz`` beside it with one ``start,end`` line per document (token offsets,
end exclusive), as written by Dolma and read by OLMo-core's ``iter_document_indices``.
"""

from __future__ import annotations

import csv
import gzip
import os
import tempfile
from pathlib import Path
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from pretrain_exp.core.errors import ConfigError, DataError
from pretrain_exp.core.io import default_mode
from pretrain_exp.data.remote import DEFAULT_THREADS, RemoteReader, fetch_sizes, is_remote, map_prefixes, redact
from pretrain_exp.data.window import WindowCache, covers

MAX_TOKENS_PER_FILE = 1 << 28  #: a corpus's next token file starts after this many tokens (EOS included)


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """Smallest token dtype for a vocabulary, as OLMo-core infers it (``NumpyDatasetConfig.get_dtype``):
    ``uint8`` up to 256 ids, ``uint16`` up to 65,536, else ``uint32``.

    :raises DataError: if ``vocab_size`` does not fit in ``uint32``.
    """
    if vocab_size <= 2**8:
        return np.dtype(np.uint8)
    if vocab_size <= 2**16:
        return np.dtype(np.uint16)
    if vocab_size <= 2**32:
        return np.dtype(np.uint32)
    raise DataError(f"vocab size {vocab_size} does not fit in uint32 token files")


def token_dtypes(configured: Optional[str], vocab_size: int,
                 tokenizer_size: int) -> Tuple[np.dtype, Optional[np.dtype]]:
    """A run's token-file dtype, one for its order, its plan and its framework's reader: ``configured``
    (``data.dtype``: an OLMo checkpoint's ``data.memmap_dtype`` / ``dataset.dtype``), else what the model's
    vocabulary (``vocab_size``) and the tokenizer's (``tokenizer_size`` ids) need (:func:`dtype_for_vocab`); and
    the dtype a text or ``datasets`` corpus is tokenized into, ``None`` where that is the tokenizer's own (its cache
    key then holds no dtype, as before the dtype was a choice). Returns ``(run dtype, tokenized dtype or None)``.

    :raises ConfigError: (``data.dtype``) for a ``configured`` name that is no unsigned integer dtype.
    """
    try:
        dtype = np.dtype(configured) if configured else dtype_for_vocab(max(vocab_size, tokenizer_size))
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind != "u":
        raise ConfigError("data.dtype", f"{configured!r} is no token-file dtype; give uint16 or uint32 (or leave it "
                                        "unset: the vocabulary's size picks it)")
    return dtype, None if dtype == dtype_for_vocab(tokenizer_size) else dtype


def write_token_file(path: Path, documents: Iterable[Sequence[int]], dtype: np.dtype, eos_id: int) -> int:
    """Write documents as one token file plus its ``.csv.gz`` document offsets, atomically.

    Each document is followed by ``eos_id`` (no BOS), as OLMo packs documents.

    :param path: target ``.npy`` path; written to a temp file in the same folder, then renamed.
    :param documents: token-id sequences, one per document.
    :param dtype: ``uint16`` or ``uint32`` (a dtype or scalar type, see :func:`dtype_for_vocab`).
    :returns: number of tokens written.
    :raises DataError: if a token id does not fit ``dtype``.
    """
    path = Path(path)
    dtype = np.dtype(dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    limit = np.iinfo(dtype).max
    offsets: List[tuple] = []
    n = 0
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    fd_csv, tmp_csv = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.csv.")
    try:
        with os.fdopen(fd, "wb") as f, os.fdopen(fd_csv, "wb") as f_csv:  # both closed on any error
            for doc in documents:
                arr = np.append(np.asarray(doc, dtype=np.int64), np.int64(eos_id))
                if arr.size and (arr.min() < 0 or arr.max() > limit):
                    raise DataError(f"{path}: token id out of range for {dtype} (max {limit})")
                f.write(arr.astype(dtype.newbyteorder("<")).tobytes())
                offsets.append((n, n + arr.size))
                n += arr.size
            with gzip.open(f_csv, "wt", newline="") as g:  # does not close f_csv: the outer `with` does
                csv.writer(g).writerows(offsets)
        for t in (tmp, tmp_csv):
            os.chmod(t, default_mode())
        os.replace(tmp_csv, str(path) + ".csv.gz")
        os.replace(tmp, path)
    except BaseException:
        for t in (tmp, tmp_csv):
            if os.path.exists(t):
                os.unlink(t)
        raise
    return n


def write_token_files(documents: Iterable[Sequence[int]], out: Path, dtype: np.dtype, eos_id: int,
                      max_tokens: int = MAX_TOKENS_PER_FILE) -> Tuple[List[str], int]:
    """Write a corpus's documents as the token files ``<out>/part-00000.npy``, ``part-00001.npy``, ... in order
    (each with its ``.csv.gz``, :func:`write_token_file`), a new file once one holds ``max_tokens`` tokens.

    :param documents: token-id sequences, one per document (read once, as they come).
    :returns: ``(the files' names in order, the number of tokens written)``.
    :raises DataError: as :func:`write_token_file`.
    """
    files: List[str] = []
    batch: List[Sequence[int]] = []
    size = total = 0
    for doc in documents:
        batch.append(doc)
        size += len(doc) + 1
        if size >= max_tokens:
            files.append(f"part-{len(files):05d}.npy")
            total += write_token_file(Path(out) / files[-1], batch, dtype, eos_id)
            batch, size = [], 0
    if batch:
        files.append(f"part-{len(files):05d}.npy")
        total += write_token_file(Path(out) / files[-1], batch, dtype, eos_id)
    return files, total


class TokenFiles:
    """Read-only view of a list of token files, local or remote (safe to pickle to workers).

    Local files are memory-mapped on first use. Remote files (``http(s)://``, ``s3://``, ``gs://``, ``r2://``,
    see :mod:`pretrain_exp.data.remote`) get their sizes from the size index and are read from the window cache
    (:mod:`pretrain_exp.data.window`) where the range was prefetched, else by one byte-range request, so code
    that reads a few rows (plan building, the verifier) fetches only those rows.

    :param paths: token files or URLs, in order (the order fixes global instance ids).
    :param dtype: ``uint16`` or ``uint32`` (see :func:`dtype_for_vocab`).
    :param cache_dir: the project cache, required when a path is remote (size index, window cache).
    :param prefixes: ``{old prefix: new prefix}`` applied to every path first (``data.path_prefixes``,
        :func:`~pretrain_exp.data.remote.map_prefixes`).
    :param reader: transport of remote reads (default :class:`~pretrain_exp.data.remote.RemoteReader`).
    :param threads: parallel requests of the size index.
    :param progress: show a progress bar while the size index is built.
    :raises DataError: if a local file is missing, a remote one answers 404, or a size is not a multiple of
        the item size (the message names the file or URL).
    :raises ConfigError: (``data.paths``) if a path is remote and no ``cache_dir`` is given.
    """

    def __init__(self, paths: Sequence[str | Path], dtype: np.dtype, *, cache_dir: str | Path | None = None,
                 prefixes: Optional[Mapping[str, str]] = None, reader: Optional[RemoteReader] = None,
                 threads: int = DEFAULT_THREADS, progress: bool = True):
        self.dtype = np.dtype(dtype).newbyteorder("<")
        if not paths:
            raise DataError("no token files given")
        #: per file: ``Path`` for a local file, ``str`` URL (after the prefix map) for a remote one
        self.paths: List[Union[Path, str]] = [p if is_remote(p) else Path(p) for p in map_prefixes(paths, prefixes)]
        self.remote = [isinstance(p, str) for p in self.paths]  #: per file: read over the network
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.reader = reader or (RemoteReader() if any(self.remote) else None)
        if any(self.remote) and self.cache_dir is None:
            first = next(p for p in self.paths if isinstance(p, str))
            raise ConfigError("cache_dir", f"remote token files ({redact(first)}, ...) need a cache dir for the size "
                                           "index and the window cache")
        remote_sizes = (fetch_sizes([str(p) for p in self.paths], self.cache_dir, self.reader, threads=threads,
                                    progress=progress) if any(self.remote) else {})
        sizes = []
        for p in self.paths:
            if isinstance(p, str):
                nbytes, name = remote_sizes[p], redact(p)
            else:
                if not p.is_file():
                    raise DataError(f"{p}: token file not found")
                nbytes, name = p.stat().st_size, p
            if nbytes % self.dtype.itemsize:
                raise DataError(f"{name}: size {nbytes} B is not a multiple of {self.dtype} ({self.dtype.itemsize} B)")
            sizes.append(nbytes)
        self.num_bytes = np.asarray(sizes, dtype=np.int64)  #: bytes per file, shape ``(num_files,)``
        self.num_tokens = self.num_bytes // self.dtype.itemsize  #: tokens per file, shape ``(num_files,)``
        self.window = WindowCache(self.cache_dir) if self.cache_dir is not None else None
        self._maps: dict[int, np.memmap] = {}
        self._present: dict[int, np.ndarray] = {}

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_maps"] = {}
        state["_present"] = {}
        return state

    def local_paths(self) -> List[str]:
        """The paths a training framework should read: the window-cache file of each remote file (same basename
        and size as the URL, created sparse where no row of the window lies; holes outside the prefetched
        window), the path itself for a local file."""
        return [str(self.window.create(p, int(n))) if isinstance(p, str) else str(p)
                for p, n in zip(self.paths, self.num_bytes)]

    def present(self, file_index: int, refresh: bool = False) -> np.ndarray:
        """Merged byte ranges ``(k, 2)`` of remote file ``file_index`` in the window cache (read once, again
        with ``refresh``); empty for a local file."""
        p = self.paths[file_index]
        if not isinstance(p, str):
            return np.empty((0, 2), np.int64)
        if refresh or file_index not in self._present:
            self._present[file_index] = self.window.present(p, int(self.num_bytes[file_index]))
        return self._present[file_index]

    def read(self, file_index: int, start: int, length: int, cached: bool = False) -> np.ndarray:
        """Tokens ``[start, start+length)`` of file ``file_index`` as an ``int64`` array of shape ``(length,)``.

        A remote file is read from the window cache when the range is there, else by one byte-range request; with
        ``cached`` the caller knows it is there (a window stream fetched it, :mod:`pretrain_exp.data.stream`) and it
        is read from the cache without consulting the manifest.

        :raises DataError: naming the file or URL for a read past the end, a failed request or a changed file.
        """
        if start < 0 or start + length > self.num_tokens[file_index]:
            raise DataError(f"{self._name(file_index)}: read past the end ({start}+{length} > "
                            f"{self.num_tokens[file_index]})")
        p = self.paths[file_index]
        if isinstance(p, str) and not cached:
            isz = self.dtype.itemsize
            a, b = start * isz, (start + length) * isz
            if not (covers(self.present(file_index), a, b) or covers(self.present(file_index, refresh=True), a, b)):
                data = self.reader.read(p, a, b - a, int(self.num_bytes[file_index]))
                return np.frombuffer(data, dtype=self.dtype).astype(np.int64)
        mm = self._maps.get(file_index)
        if mm is None:
            path = self.window.path_for(p) if isinstance(p, str) else p
            mm = self._maps[file_index] = np.memmap(path, dtype=self.dtype, mode="r")
        out = np.asarray(mm[start:start + length], dtype=np.int64)
        if out.size != length:
            raise DataError(f"{self._name(file_index)}: read past the end ({start}+{length} > {mm.size})")
        return out

    def _name(self, file_index: int) -> str:
        p = self.paths[file_index]
        return redact(p) if isinstance(p, str) else str(p)

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
from typing import Iterable, List, Sequence

import numpy as np

from pretrain_exp.core.errors import DataError


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
                arr = np.asarray(list(doc) + [eos_id], dtype=np.int64)
                if arr.size and (arr.min() < 0 or arr.max() > limit):
                    raise DataError(f"{path}: token id out of range for {dtype} (max {limit})")
                f.write(arr.astype(dtype.newbyteorder("<")).tobytes())
                offsets.append((n, n + arr.size))
                n += arr.size
            with gzip.open(f_csv, "wt", newline="") as g:  # does not close f_csv: the outer `with` does
                csv.writer(g).writerows(offsets)
        os.replace(tmp_csv, str(path) + ".csv.gz")
        os.replace(tmp, path)
    except BaseException:
        for t in (tmp, tmp_csv):
            if os.path.exists(t):
                os.unlink(t)
        raise
    return n


class TokenFiles:
    """Read-only view of a list of token files (memory-mapped on first use, safe to pickle to workers).

    :param paths: token files, in order (the order fixes global instance ids).
    :param dtype: ``uint16`` or ``uint32`` (see :func:`dtype_for_vocab`).
    :raises DataError: if a file is missing or its size is not a multiple of the item size.
    """

    def __init__(self, paths: Sequence[str | Path], dtype: np.dtype):
        self.paths = [Path(p) for p in paths]
        self.dtype = np.dtype(dtype).newbyteorder("<")
        if not self.paths:
            raise DataError("no token files given")
        sizes = []
        for p in self.paths:
            if not p.is_file():
                raise DataError(f"{p}: token file not found")
            nbytes = p.stat().st_size
            if nbytes % self.dtype.itemsize:
                raise DataError(f"{p}: size {nbytes} B is not a multiple of {self.dtype} ({self.dtype.itemsize} B)")
            sizes.append(nbytes // self.dtype.itemsize)
        self.num_tokens = np.asarray(sizes, dtype=np.int64)  #: tokens per file, shape ``(num_files,)``
        self._maps: dict[int, np.memmap] = {}

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_maps"] = {}
        return state

    def read(self, file_index: int, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start+length)`` of file ``file_index`` as an ``int64`` array of shape ``(length,)``."""
        mm = self._maps.get(file_index)
        if mm is None:
            mm = self._maps[file_index] = np.memmap(self.paths[file_index], dtype=self.dtype, mode="r")
        out = np.asarray(mm[start:start + length], dtype=np.int64)
        if out.size != length:
            raise DataError(f"{self.paths[file_index]}: read past the end ({start}+{length} > {mm.size})")
        return out

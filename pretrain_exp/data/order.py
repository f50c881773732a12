"""The data order: global token position <-> (step, row, offset, instance, file, file offset).

This is OLMo's rule (OLMo ``olmo/data/iterable_dataset.py``, OLMo-core ``olmo_core/data/data_loader.py``):

- each token file is cut into ``floor(n_tokens / L)`` **instances** of ``L`` tokens (the tail is dropped;
  instances never span files); instance ids count up file by file, in ``paths`` order;
- epoch ``e`` trains the instances in the order ``perm_e``: ``arange(N, dtype=uint32)`` shuffled in place by
  ``numpy.random.Generator(PCG64(seed + e))``; only the first ``B * floor(N / B)`` entries are used
  (``drop_last``), so an epoch has ``rows_per_epoch`` rows;
- training-order row ``q`` is entry ``q % rows_per_epoch`` of epoch ``first_epoch + q // rows_per_epoch``;
- global token position ``p = q*L + o``; ``step = q // B + 1`` (1-based), ``row = q % B``.

``first_epoch`` is 1 for OLMo-core and 0 for OLMo-2, so OLMo-2 seed S gives OLMo-core seed S-1's order.

With a ``cache_dir`` the permutation is computed once and kept, as OLMo-core keeps its global indices, as a raw
little-endian ``uint32`` file without header, ``<cache_dir>/permutations/<N>-<seed + epoch>.npy`` (it depends
only on N and the PCG64 seed), written atomically under a file lock (ranks on one node build it once) and
memory-mapped read-only afterwards. Building it takes ``4 N`` bytes of memory (``arange`` shuffled in place).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.errors import DataError
from pretrain_exp.core.io import atomic_path, file_lock
from pretrain_exp.data.token_files import TokenFiles
from pretrain_exp.data.window import merge_ranges

log = logging.getLogger(__name__)


def build_permutation(num_instances: int, pcg_seed: int) -> np.ndarray:
    """OLMo's epoch permutation: ``arange(N, uint32)`` shuffled in place by ``Generator(PCG64(pcg_seed))``;
    ``uint32`` array of shape ``(N,)`` (``4 N`` bytes)."""
    perm = np.arange(num_instances, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(pcg_seed)).shuffle(perm)
    return perm


def permutation_path(cache_dir: str | Path, num_instances: int, pcg_seed: int) -> Path:
    """``<cache_dir>/permutations/<N>-<pcg_seed>.npy`` (raw ``uint32``, no header)."""
    return CacheDir(cache_dir).permutations / f"{int(num_instances)}-{int(pcg_seed)}.npy"


def cached_permutation(cache_dir: str | Path, num_instances: int, pcg_seed: int) -> np.ndarray:
    """The permutation of :func:`build_permutation`, built once into :func:`permutation_path` and memory-mapped.

    :returns: a read-only ``uint32`` memmap of shape ``(N,)``, bit-identical to ``build_permutation``.
    :raises DataError: naming the file if it cannot be written or has the wrong size.
    """
    path = permutation_path(cache_dir, num_instances, pcg_seed)
    nbytes = 4 * int(num_instances)
    if not (path.is_file() and path.stat().st_size == nbytes):
        with file_lock(path.with_name(path.name + ".lock")):
            if not (path.is_file() and path.stat().st_size == nbytes):
                t0 = time.monotonic()
                perm = build_permutation(num_instances, pcg_seed)
                try:
                    with atomic_path(path) as tmp:
                        perm.astype("<u4", copy=False).tofile(tmp)
                except OSError as e:
                    raise DataError(f"{path}: cannot write the permutation cache ({e})") from None
                del perm
                log.info("permutation of %d instances (seed %d) built in %.1f s -> %s", num_instances, pcg_seed,
                         time.monotonic() - t0, path)
    if path.stat().st_size != nbytes:
        raise DataError(f"{path}: {path.stat().st_size} B, expected {nbytes} B (4 x {num_instances}); delete it")
    return np.memmap(path, dtype="<u4", mode="r", shape=(int(num_instances),))


@dataclass(frozen=True)
class Location:
    """Where a global token position lives. All fields are plain ints; ``step`` is 1-based."""

    position: int  #: global token position p
    q: int  #: training-order row index (p // L)
    step: int  #: optimizer step that trains it (q // B + 1)
    row: int  #: row within that step's global batch (q % B)
    offset: int  #: token offset within the row (p % L)
    epoch: int
    instance: int  #: instance id in the token files
    file_index: int
    file_offset: int  #: token offset inside that file


def step_row_offset(position: int | np.ndarray, sequence_length: int, global_batch_size: int):
    """``(step, row, offset)`` of global token position(s) ``p``; vectorized over int64 arrays.

    ``q = p // L``, ``step = q // B + 1``, ``row = q % B``, ``offset = p % L``.
    """
    q = position // sequence_length
    return q // global_batch_size + 1, q % global_batch_size, position % sequence_length


def step_window(start_step: int, num_steps: int, sequence_length: int, global_batch_size: int) -> tuple[int, int]:
    """Token positions ``[S*B*L, (S+n)*B*L)`` trained when continuing ``n`` steps from a checkpoint at step S."""
    tokens_per_step = sequence_length * global_batch_size
    return start_step * tokens_per_step, (start_step + num_steps) * tokens_per_step


class DataOrder:
    """Map training-order rows to instances and tokens, following OLMo's order (module docstring).

    :param files: the token files.
    :param sequence_length: L.
    :param global_batch_size: B, rows per optimizer step.
    :param seed: data-order seed.
    :param first_epoch: epoch number of the first epoch (1 = OLMo-core, 0 = OLMo-2).
    :param cache_dir: where to keep permutations on disk (module docstring); ``None`` builds them in memory.
    :param chunk: instances shuffled together (OLMo-core's ``max_target_sequence_length / L``, its data loader's
        ``chunk_size``): each file keeps ``floor(n_tokens / (chunk L)) * chunk`` instances, and an epoch shuffles
        the ``N / chunk`` chunks, each trained as ``chunk`` consecutive instances (OLMo-core
        ``NumpyFSLDataset._get_file_size_and_length``, ``NumpyFSLDataLoader._build_global_indices``); 1 = OLMo-2's
        and OLMo-core's default order.
    :raises DataError: if the files hold fewer than ``B`` instances.
    """

    def __init__(self, files: TokenFiles, sequence_length: int, global_batch_size: int, seed: int,
                 first_epoch: int = 1, cache_dir: Optional[str | Path] = None, chunk: int = 1):
        self.files = files
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.sequence_length = int(sequence_length)
        self.global_batch_size = int(global_batch_size)
        self.seed = int(seed)
        self.first_epoch = int(first_epoch)
        self.chunk = int(chunk)
        if self.chunk < 1:
            raise DataError(f"chunk {chunk}: must be >= 1 (max_target_sequence_length / sequence_length)")
        #: shape ``(num_files,)``; whole chunks only
        self.instances_per_file = files.num_tokens // (self.sequence_length * self.chunk) * self.chunk
        self.file_starts = np.concatenate([[0], np.cumsum(self.instances_per_file)])  #: first instance id per file
        self.num_instances = int(self.file_starts[-1])
        self.rows_per_epoch = self.global_batch_size * (self.num_instances // self.global_batch_size)
        if self.rows_per_epoch == 0:
            raise DataError(
                f"token files {[str(p) for p in files.paths]} hold {self.num_instances} instances of "
                f"{self.sequence_length} tokens, fewer than one global batch of {self.global_batch_size} rows"
            )
        self._perm = lru_cache(maxsize=2)(self._make_perm)
        #: the gate of the run's window stream (:class:`~pretrain_exp.data.stream.StreamGate`), if one runs
        self.gate = None

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_perm"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._perm = lru_cache(maxsize=2)(self._make_perm)

    def prepare(self, first_row: int, num_rows: int) -> bool:
        """Build (or memory-map from the cache) the permutation of every epoch that rows ``[first_row, first_row +
        num_rows)`` fall in, now rather than at the first row read.

        :returns: whether all of them were in the permutation cache already (``False`` without a cache).
        """
        rpe = self.rows_per_epoch
        last = int(first_row) + max(int(num_rows), 1) - 1
        epochs = range(self.first_epoch + int(first_row) // rpe, self.first_epoch + last // rpe + 1)
        n = self.num_instances // self.chunk
        cached = self.cache_dir is not None and all(
            permutation_path(self.cache_dir, n, self.seed + e).is_file()
            and permutation_path(self.cache_dir, n, self.seed + e).stat().st_size == 4 * n for e in epochs)
        for e in epochs:
            self._perm(e)
        return cached

    def _make_perm(self, epoch: int) -> np.ndarray:
        """The shuffled chunk ids of ``epoch`` (instance ids when ``chunk`` is 1), ``(N / chunk,)`` ``uint32``."""
        if self.cache_dir is not None:
            return cached_permutation(self.cache_dir, self.num_instances // self.chunk, self.seed + epoch)
        return build_permutation(self.num_instances // self.chunk, self.seed + epoch)

    def _entries(self, epoch: int, idx):
        """Entries ``idx`` (int or int64 array of positions in the epoch) of ``perm_e``, as int64."""
        perm = self._perm(epoch)
        if self.chunk == 1:
            return np.asarray(perm[idx], dtype=np.int64)
        return np.asarray(perm[idx // self.chunk], dtype=np.int64) * self.chunk + idx % self.chunk

    def permutation(self, epoch: int) -> np.ndarray:
        """``perm_e``: instance ids in training order for epoch ``epoch``, ``uint32`` array of shape ``(N,)``
        (a memory map of the cached file when ``chunk`` is 1)."""
        if self.chunk == 1:
            return self._perm(epoch)
        return self._entries(epoch, np.arange(self.num_instances, dtype=np.int64)).astype(np.uint32)

    def instance(self, q: int) -> tuple[int, int]:
        """``(epoch, instance id)`` of training-order row ``q``."""
        epoch = self.first_epoch + q // self.rows_per_epoch
        return epoch, int(self._entries(epoch, q % self.rows_per_epoch))

    def instances(self, first_row: int, num_rows: int) -> np.ndarray:
        """Instance ids of training-order rows ``[first_row, first_row + num_rows)``: ``int64``, ``(num_rows,)``."""
        q = np.arange(int(first_row), int(first_row) + int(num_rows), dtype=np.int64)
        epochs = self.first_epoch + q // self.rows_per_epoch
        out = np.empty(len(q), np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._entries(int(e), q[sel] % self.rows_per_epoch)
        return out

    def instance_locations(self, instances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorized :meth:`instance_location`: ``(file index, token offset)`` ``int64`` arrays shaped like
        ``instances``."""
        inst = np.asarray(instances, dtype=np.int64)
        f = np.searchsorted(self.file_starts, inst, side="right") - 1
        return f, (inst - self.file_starts[f]) * self.sequence_length

    def byte_ranges(self, instances: np.ndarray) -> Dict[int, np.ndarray]:
        """Where the instances ``instances`` (``int64``) lie in the token files, as merged byte ranges per file
        (one sort by file and offset, not a pass per file; touching instances merged into one range).

        :returns: ``{file index: int64 array (k, 2) of [start, end) byte offsets}``, only files with instances.
        """
        f, off = self.instance_locations(np.asarray(instances, dtype=np.int64))
        isz, L = self.files.dtype.itemsize, self.sequence_length
        by = np.lexsort((off, f))
        f, starts = f[by], off[by] * isz
        files, first = np.unique(f, return_index=True)
        bounds = np.append(first, f.size)
        out: Dict[int, np.ndarray] = {}
        for k, fi in enumerate(files.tolist()):
            s = starts[bounds[k]:bounds[k + 1]]
            out[int(fi)] = merge_ranges(np.stack([s, s + L * isz], axis=1))
        return out

    def instance_location(self, instance: int) -> tuple[int, int]:
        """``(file index, token offset in that file)`` of the first token of an instance."""
        f = int(np.searchsorted(self.file_starts, instance, side="right") - 1)
        return f, int(instance - self.file_starts[f]) * self.sequence_length

    def row_tokens(self, q: int) -> np.ndarray:
        """Tokens of training-order row ``q`` as read from the files (no insertions): ``int64``, shape ``(L,)``.
        A row of a streamed window (:attr:`gate`) is read once the stream has fetched it."""
        _, inst = self.instance(q)
        f, off = self.instance_location(inst)
        ready = self.gate is not None and self.gate.wait_row(q)
        return self.files.read(f, off, self.sequence_length, cached=ready)

    def locate(self, position: int) -> Location:
        """Every coordinate of global token position ``position`` (module docstring)."""
        L, B = self.sequence_length, self.global_batch_size
        q, o = divmod(int(position), L)
        epoch, inst = self.instance(q)
        f, off = self.instance_location(inst)
        return Location(int(position), q, q // B + 1, q % B, o, epoch, inst, f, off + o)

    def held_out_rows(self, n: int) -> np.ndarray:
        """Training-order rows of the last ``n`` entries of the first epoch (never trained by a run that
        stays before them): ``int64`` array of shape ``(n,)``."""
        return np.arange(self.rows_per_epoch - n, self.rows_per_epoch, dtype=np.int64)

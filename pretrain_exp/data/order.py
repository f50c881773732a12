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
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pretrain_exp.core.errors import DataError
from pretrain_exp.data.token_files import TokenFiles


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
    :raises DataError: if the files hold fewer than ``B`` instances.
    """

    def __init__(self, files: TokenFiles, sequence_length: int, global_batch_size: int, seed: int,
                 first_epoch: int = 1):
        self.files = files
        self.sequence_length = int(sequence_length)
        self.global_batch_size = int(global_batch_size)
        self.seed = int(seed)
        self.first_epoch = int(first_epoch)
        self.instances_per_file = files.num_tokens // self.sequence_length  #: shape ``(num_files,)``
        self.file_starts = np.concatenate([[0], np.cumsum(self.instances_per_file)])  #: first instance id per file
        self.num_instances = int(self.file_starts[-1])
        self.rows_per_epoch = self.global_batch_size * (self.num_instances // self.global_batch_size)
        if self.rows_per_epoch == 0:
            raise DataError(
                f"token files {[str(p) for p in files.paths]} hold {self.num_instances} instances of "
                f"{self.sequence_length} tokens, fewer than one global batch of {self.global_batch_size} rows"
            )
        self._perm = lru_cache(maxsize=2)(self._make_perm)

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_perm"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._perm = lru_cache(maxsize=2)(self._make_perm)

    def _make_perm(self, epoch: int) -> np.ndarray:
        perm = np.arange(self.num_instances, dtype=np.uint32)
        np.random.Generator(np.random.PCG64(self.seed + epoch)).shuffle(perm)
        return perm

    def permutation(self, epoch: int) -> np.ndarray:
        """``perm_e``: instance ids in training order for epoch ``epoch``, ``uint32`` array of shape ``(N,)``."""
        return self._perm(epoch)

    def instance(self, q: int) -> tuple[int, int]:
        """``(epoch, instance id)`` of training-order row ``q``."""
        epoch = self.first_epoch + q // self.rows_per_epoch
        return epoch, int(self.permutation(epoch)[q % self.rows_per_epoch])

    def instance_location(self, instance: int) -> tuple[int, int]:
        """``(file index, token offset in that file)`` of the first token of an instance."""
        f = int(np.searchsorted(self.file_starts, instance, side="right") - 1)
        return f, int(instance - self.file_starts[f]) * self.sequence_length

    def row_tokens(self, q: int) -> np.ndarray:
        """Tokens of training-order row ``q`` as read from the files (no insertions): ``int64``, shape ``(L,)``."""
        _, inst = self.instance(q)
        f, off = self.instance_location(inst)
        return self.files.read(f, off, self.sequence_length)

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

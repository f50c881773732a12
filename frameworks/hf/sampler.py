"""The ``hf`` framework's sampler: OLMo's rank layout through ``transformers.Trainer`` and ``accelerate``.

``Trainer`` wraps the train ``DataLoader`` (batches of ``micro_batch_size`` rows from this sampler) with
``accelerate``'s ``BatchSamplerShard`` (``split_batches=False``): with ``W`` processes, process ``p`` gets the
micro-batches ``p, p + W, p + 2W, ...`` of the sampler's sequence, and each optimizer step takes
``G = B / (micro * W)`` consecutive micro-batches per process. :class:`RankLayoutSampler` orders the run's rows so
that, after that sharding, DP rank ``r`` trains at global step ``k`` exactly
:func:`~pretrain_exp.data.schedule.rows_for` ``(k, r, W, B)`` (OLMo's layout, as OLMo-core's data loader gives
it): for each step, for each accumulation round ``j``, for each rank ``r``, the ``j``-th ``micro`` rows of
``rows_for(k, r, W, B)``. With one process this is the sequential order ``[(k-1)*B, k*B)``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.data.schedule import rows_for


class RankLayoutSampler(torch.utils.data.Sampler):
    """Dataset indices (``i = q - first_row`` of :class:`~pretrain_exp.data.rows.TrainingRows`) for global steps
    ``first_step + 1 .. first_step + num_steps`` (module docstring).

    :param first_step: the run's checkpoint step ``S`` (its rows start at ``q = S * B``).
    :param num_steps: steps of the run.
    :param global_batch_size: ``B`` rows per step.
    :param micro_batch_size: rows per forward pass per process.
    :param dp_world: processes ``W``.
    :raises ConfigError: if ``B`` is not a multiple of ``micro_batch_size * W``.
    """

    def __init__(self, first_step: int, num_steps: int, global_batch_size: int, micro_batch_size: int,
                 dp_world: int):
        self.first_step, self.num_steps = int(first_step), int(num_steps)
        self.B, self.micro, self.world = int(global_batch_size), int(micro_batch_size), int(dp_world)
        if self.B % (self.micro * self.world):
            raise ConfigError("training.global_batch_size", f"{self.B} rows is not a multiple of micro_batch_size x "
                              f"processes = {self.micro} x {self.world}")
        self.accumulation = self.B // (self.micro * self.world)  #: ``G``, micro-batches per process and step

    def __len__(self) -> int:
        return self.num_steps * self.B

    def step_order(self, step: int) -> np.ndarray:
        """The sampler's indices for global step ``step``, before sharding: ``int64`` ``(B,)``, micro-batch
        ``j * W + r`` = the ``j``-th ``micro`` rows of rank ``r``."""
        first_row = self.first_step * self.B
        ranks = np.stack([rows_for(step, r, self.world, self.B) for r in range(self.world)])  # (W, B/W)
        per_round = ranks.reshape(self.world, self.accumulation, self.micro).transpose(1, 0, 2)  # (G, W, micro)
        return per_round.reshape(-1) - first_row

    def rank_indices(self, step: int, dp_rank: int) -> np.ndarray:
        """Dataset indices rank ``dp_rank`` trains at global step ``step``, in order: the micro-batches of
        :meth:`step_order` that ``accelerate``'s sharding hands it (``int64`` ``(B / W,)``)."""
        batches = self.step_order(step).reshape(-1, self.micro)  # micro-batch m goes to process m % W
        return batches[dp_rank::self.world].reshape(-1)

    def __iter__(self) -> Iterator[int]:
        for k in range(self.first_step + 1, self.first_step + self.num_steps + 1):
            yield from self.step_order(k).tolist()

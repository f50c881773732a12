"""The one way every framework feeds Gaussian-poisoning noise to the model.

:class:`NoiseFeed` owns the run's :class:`~pretrain_exp.insertion.noise.EmbeddingNoise` hook and a forward
pre-hook on the same input-embedding module. Before the forward passes of a batch the framework calls
:meth:`NoiseFeed.start` with the training-order indices ``q`` of the rows those passes will see, in the order
they are stacked; each forward of the embedding module then takes the next ``b`` of them (``b`` = rows of its
input) and hands them to :meth:`EmbeddingNoise.set_rows`, which adds each planned row's pattern. ``hf`` starts
the feed per micro-batch with the rows the batch carries (``row_index``, put there by the sampler built from
:func:`~pretrain_exp.data.schedule.rows_for`); ``olmo_core`` starts it per step with the rank batch's rows
(:func:`rows_for` again) and OLMo-core's train module splits that batch into consecutive micro-batches. Outside
:meth:`start` / :meth:`stop` (dry-run batches, evaluation forwards) no noise is added. A module whose forward
runs more than once per micro-batch (activation checkpointing of the embeddings) is not supported: the extra
forward would take the next micro-batch's rows and fail loudly when none are left.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from pretrain_exp.insertion.noise import EmbeddingNoise, NoiseSpec


class NoiseFeed:
    """Feeds :class:`EmbeddingNoise` the rows of every forward pass (module docstring).

    :param plan: the run's :class:`~pretrain_exp.insertion.plan.Plan` (its noised rows; see :meth:`for_plan`), or a
        :class:`~pretrain_exp.insertion.noise.NoiseSpec`.
    """

    def __init__(self, plan):
        self.noise = EmbeddingNoise(plan)
        self._rows: Optional[np.ndarray] = None
        self._next = 0
        self._handles: List[torch.utils.hooks.RemovableHandle] = []

    @classmethod
    def for_plan(cls, plan) -> Optional["NoiseFeed"]:
        """A feed for ``plan``, or ``None`` if it has no noised rows (or there is no plan)."""
        if plan is None or NoiseSpec.from_plan(plan).rows.size == 0:
            return None
        return cls(plan)

    def attach(self, embeddings: torch.nn.Module) -> None:
        """Register the noise hook and the feeding pre-hook on ``embeddings`` (the input-embedding module)."""
        self._handles = [self.noise.attach(embeddings), embeddings.register_forward_pre_hook(self._pre_hook)]

    def detach(self) -> None:
        """Remove both hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def start(self, q) -> None:
        """Training-order rows (int array or LongTensor, shape ``(n,)``) of the forward passes to come, in order."""
        self._rows, self._next = np.asarray(torch.as_tensor(q).cpu(), dtype=np.int64).reshape(-1), 0

    def stop(self) -> None:
        """No rows (and so no noise) for later forward passes."""
        self._rows = None
        self.noise.set_rows(None)

    @property
    def rows(self) -> Optional[np.ndarray]:
        """The rows :meth:`start` set (``None`` outside a batch)."""
        return self._rows

    def _pre_hook(self, module, args):
        if self._rows is None:
            self.noise.set_rows(None)
            return
        b = int(args[0].shape[0])
        if self._next + b > self._rows.size:
            raise RuntimeError(f"NoiseFeed: a forward pass of {b} rows, but only {self._rows.size - self._next} of "
                               f"the {self._rows.size} rows given to start() are left")
        self.noise.set_rows(self._rows[self._next:self._next + b])
        self._next += b

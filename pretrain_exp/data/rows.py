"""The training rows of a run: the data order with the insertion plan applied.

:class:`TrainingRows` is the map-style dataset every framework trains on (and the verifier reads back):
item ``i`` is training-order row ``q = first_row + i``, read from the token files through
:class:`~pretrain_exp.data.order.DataOrder`, with :meth:`Plan.apply <pretrain_exp.insertion.plan.Plan.apply>`
writing the planned spans. Optimizer step ``k`` of a run that starts at checkpoint step ``S`` trains rows
``[(S+k-1)*B, (S+k)*B)``; which of them each DP rank trains is :func:`~pretrain_exp.data.schedule.rows_for`.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from pretrain_exp.data.order import DataOrder


class TrainingRows:
    """Rows ``[first_row, first_row + num_rows)`` of the training order, insertions applied.

    ``__getitem__(i)`` returns ``{"input_ids": LongTensor (L,), "labels": LongTensor (L,), "row_index":
    LongTensor ()}`` (labels equal the inputs; the model shifts them, so token 0 of a row is never a target;
    ``row_index`` is the row's training-order index ``q``, which the trainer pops before calling the model and
    hands to the Gaussian-poisoning hook, :mod:`~pretrain_exp.insertion.noise`). Safe in data-loader
    workers (holds only arrays and lazily opened memmaps). A map-style dataset as torch's ``DataLoader`` takes
    one (``__len__`` and ``__getitem__``), without torch's base class: a reader of rows (:meth:`row`, the
    inspector) imports no torch.
    """

    def __init__(self, order: DataOrder, plan: Optional["Plan"], first_row: int, num_rows: int):  # noqa: F821
        self.order, self.plan = order, plan
        self.first_row, self.num_rows = int(first_row), int(num_rows)

    def __len__(self) -> int:
        return self.num_rows

    def row(self, q: int) -> np.ndarray:
        """Training-order row ``q`` with insertions applied: ``int64`` array of shape ``(L,)``."""
        tokens = self.order.row_tokens(q)
        if self.plan is not None:
            self.plan.apply(q, tokens)
        return tokens

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.num_rows:
            raise IndexError(i)
        import torch

        q = self.first_row + i
        ids = torch.from_numpy(self.row(q))
        return {"input_ids": ids, "labels": ids.clone(), "row_index": torch.tensor(q, dtype=torch.long)}

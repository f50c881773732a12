"""The row schedule: which training-order rows each data-parallel rank trains at each optimizer step.

OLMo's rank layout (OLMo-core ``NumpyFSLDataLoader``, OLMo-2's ``IterableDataset``): global step ``k``
(1-based) trains the global batch of rows ``[(k-1)*B, k*B)``; DP rank ``r`` of ``W`` trains rows
``r, r+W, r+2W, ...`` of it, i.e. training-order indices ``q = (k-1)*B + r + i*W`` for ``i`` in
``range(B // W)``, in that order (row ``i`` of the rank batch). Every framework takes its rows from
:func:`rows_for`, and the verifier checks each framework against it.
"""

from __future__ import annotations

import numpy as np

from pretrain_exp.core.errors import ConfigError


def rows_for(step: int, dp_rank: int, dp_world: int, global_batch_size: int) -> np.ndarray:
    """Training-order indices of the rows DP rank ``dp_rank`` of ``dp_world`` trains at global step ``step``.

    :param step: 1-based global optimizer step ``k``.
    :param dp_rank: data-parallel rank ``r``, ``0 <= r < W``.
    :param dp_world: data-parallel world size ``W``; must divide ``global_batch_size``.
    :param global_batch_size: ``B``, rows per optimizer step (all ranks together).
    :returns: ``int64`` array of shape ``(B // W,)``: ``q = (k-1)*B + r + i*W``, ``i = 0 .. B/W - 1``.
    :raises ConfigError: (key ``training.global_batch_size``) for ``step < 1``, a rank outside ``[0, W)`` or a
        batch size that is not a positive multiple of ``W``.
    """
    k, r, w, b = int(step), int(dp_rank), int(dp_world), int(global_batch_size)
    if k < 1 or w < 1 or not 0 <= r < w or b < 1 or b % w:
        raise ConfigError("training.global_batch_size", f"no rows for step {k}, DP rank {r} of {w} with "
                          f"global batch size {b} (needs step >= 1, 0 <= rank < world, batch a multiple of world)")
    return (k - 1) * b + r + w * np.arange(b // w, dtype=np.int64)


def step_and_rank(q, dp_world: int, global_batch_size: int) -> tuple:
    """Inverse of :func:`rows_for`: ``(step, dp_rank, i)`` of training-order row(s) ``q`` (ints or int64 arrays):
    ``step = q // B + 1``, ``dp_rank = (q % B) % W``, ``i = (q % B) // W``."""
    row = q % global_batch_size
    return q // global_batch_size + 1, row % dp_world, row // dp_world

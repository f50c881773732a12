"""Rank, world size and barrier of the current process (torchrun's environment; one process otherwise).

Only rank 0 writes files, logs metrics and runs evals. Data-parallel rank ``r`` of ``W`` trains rows
``r, r + W, ...`` of each global batch (:func:`pretrain_exp.data.schedule.rows_for`).
"""

from __future__ import annotations

import os


def rank() -> int:
    """Global rank of this process (``RANK`` set by torchrun; 0 otherwise)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """Number of processes of the job (``WORLD_SIZE`` set by torchrun; 1 otherwise)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """True on rank 0, the only rank that writes files, logs metrics and runs evals."""
    return rank() == 0


def barrier() -> None:
    """Wait for all ranks (no-op without torch or without an initialized process group)."""
    import sys

    dist = sys.modules.get("torch.distributed")  # a process group exists only if torch is already loaded
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()

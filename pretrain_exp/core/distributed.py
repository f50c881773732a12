"""Rank, world size and barrier of the current process (torchrun's environment; one process otherwise).

Only rank 0 writes files, logs metrics and runs evals. Data-parallel rank ``r`` of ``W`` trains rows
``r, r + W, ...`` of each global batch (:func:`pretrain_exp.data.schedule.rows_for`).
"""

from __future__ import annotations

import os


def rank() -> int:
    """Global rank of this process (``RANK`` set by torchrun; 0 otherwise)."""
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    """Rank of this process on its node (``LOCAL_RANK`` set by torchrun; 0 otherwise)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


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


def init_process_group() -> bool:
    """Join torchrun's process group (gloo on CPU; NCCL for CUDA tensors and gloo for CPU ones on GPUs, each rank
    on GPU ``LOCAL_RANK``) if there is more than one process and it is not joined yet; the engines (accelerate,
    OLMo-core) then use the joined group. Returns whether a process group is initialized."""
    if world_size() == 1:
        return False
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return True

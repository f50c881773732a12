"""Batch-level sharding of the evals' model forwards over the ranks of a ``torch.distributed`` process group.

``eval.mode=distributed`` runs every eval on every rank. The evals cut their inputs into batches exactly as in one
process (same composition, same order) and hand them to :func:`map_batches`: inside :func:`sharded`, batch ``k`` is
scored on rank ``k % W`` and the per-batch results are all-gathered, so every rank holds the full list in batch
order and every reduction (means, intervals, tests, per-dup tables) runs on identical inputs: the numbers equal those
of one process (given the same torch thread count, since CPU kernels may reduce in a thread-dependent order).
Outside :func:`sharded` (``inline``) :func:`map_batches` is a plain loop. The lm-eval-scored evals go through
:func:`simple_evaluate` instead, which inside :func:`sharded` puts lm-eval on its own data-parallel path.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterable, Iterator, List, Optional, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: the active shard: ``(rank, world size, process group)``; None = plain loop
_active: Optional[tuple] = None


@contextlib.contextmanager
def sharded(group: Any = None) -> Iterator[bool]:
    """Shard :func:`map_batches` over ``group`` (default: the default process group) for the ``with`` block.

    Yields whether sharding is on: off (a plain loop) without an initialized process group or with one rank.
    Every rank of the group must run the same evals on the same inputs inside the block, since each
    :func:`map_batches` call is a collective.
    """
    global _active
    import torch.distributed as dist

    prev = _active
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        _active = (dist.get_rank(group), dist.get_world_size(group), group)
    else:
        _active = None
    try:
        yield _active is not None
    finally:
        _active = prev


def map_batches(fn: Callable[[T], R], batches: Iterable[T]) -> List[R]:
    """``[fn(b) for b in batches]``; inside :func:`sharded`, ``fn(batches[k])`` runs on rank ``k % W`` only and
    the results are gathered with ``torch.distributed.all_gather_object`` (pickled: return CPU tensors or numpy
    arrays), the full list in batch order on every rank. Nested calls (``fn`` calling :func:`map_batches`) are
    plain loops.

    :raises RuntimeError: if ``fn`` failed on another rank (this rank re-raises its own error) or the ranks
        disagree on the number of batches; every rank raises, none is left waiting in the collective.
    """
    global _active
    batches = list(batches)
    if _active is None:
        return [fn(b) for b in batches]
    import torch.distributed as dist

    rank, world, group = _active
    _active = None  # fn's own calls run unsharded
    mine, error = [], None
    try:
        for k in range(rank, len(batches), world):
            mine.append((k, fn(batches[k])))
    except Exception as e:  # noqa: BLE001  (the other ranks learn of it in the gather instead of hanging)
        error = e
    finally:
        _active = (rank, world, group)
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, (len(batches), None if error is None else repr(error), mine), group=group)
    if error is not None:
        raise error
    failed = [f"rank {r}: {err}" for r, (_, err, _) in enumerate(gathered) if err is not None]
    if failed:
        raise RuntimeError(f"map_batches: a batch failed on another rank ({'; '.join(failed)})")
    if any(n != len(batches) for n, _, _ in gathered):
        raise RuntimeError(f"map_batches: the ranks have {[n for n, _, _ in gathered]} batches; every rank must "
                           "shard the same batches")
    out: List[Any] = [None] * len(batches)
    for _, _, part in gathered:
        for k, res in part:
            out[k] = res
    return out


def _global_rank(group: Any, r: int) -> int:
    """The default group's rank of rank ``r`` of ``group`` (``None``: the default group)."""
    import torch.distributed as dist

    return dist.get_global_rank(group, r) if group is not None else r


@functools.lru_cache(maxsize=None)
def _rank_hflm() -> type:
    """``lm_eval``'s ``HFLM`` with lm-eval's data-parallel ``LM`` interface (``all_gather``, ``gather_object``,
    ``barrier``) over the active shard's process group (:func:`simple_evaluate`)."""
    import torch
    import torch.distributed as dist
    from lm_eval.models.huggingface import HFLM

    class RankHFLM(HFLM):
        """``HFLM`` on an already loaded model as rank ``shard_rank`` of ``shard_world`` (lm-eval's ``HFLM``
        reports rank 0 of 1 for a model it did not load itself)."""

        shard_rank, shard_world = 0, 1

        def __init__(self, *, shard_rank: int, shard_world: int, **kwargs):
            super().__init__(**kwargs)
            self.shard_rank, self.shard_world = shard_rank, shard_world

        @property
        def rank(self) -> int:  # lm-eval's LM interface
            return self.shard_rank

        @property
        def world_size(self) -> int:
            return self.shard_world

        def all_gather(self, tensor):  # as accelerate's gather: rank-major concatenation along dim 0
            group = _active[2]
            t = tensor.reshape(1) if tensor.ndim == 0 else tensor.contiguous()
            parts = [torch.empty_like(t) for _ in range(self.world_size)]
            dist.all_gather(parts, t, group=group)
            return torch.cat(parts, 0)

        def gather_object(self, obj, dst=0):
            group = _active[2]
            out = [None] * self.world_size if self.rank == dst else None
            dist.gather_object(obj, out, dst=_global_rank(group, dst), group=group)
            return out

        def barrier(self):
            dist.barrier(group=_active[2])

    return RankHFLM


def simple_evaluate(model: Any, tokenizer: Any, batch_size: int, **kwargs: Any) -> dict:
    """``lm_eval.simple_evaluate(model=HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size),
    **kwargs)`` on the already loaded HF model.

    Inside :func:`sharded` it takes lm-eval's own data-parallel path: the ``HFLM`` reports this process's rank and
    the shard's world size and gathers over its process group (lm-eval's ``LM`` interface ``rank``, ``world_size``,
    ``all_gather``, ``gather_object``, ``barrier``, which ``lm_eval.evaluator.evaluate`` uses to give rank ``r``
    every ``W``-th doc, pad the ranks to equal request counts and merge the per-doc results on rank 0); rank 0's
    result is then broadcast, so every rank returns the same dict. (lm-eval's own ``HFLM`` turns this on only for a
    model it loads itself onto several GPUs through ``accelerate``.)

    What lm-eval, datasets and the ``git`` lm-eval runs print to stderr themselves (progress bars, ``fatal: not a
    git repository``) goes to the run's log file unless ``verbose``
    (:func:`~pretrain_exp.core.logs.engine_output_to_log`).

    :returns: ``simple_evaluate``'s result dict.
    """
    import lm_eval

    from pretrain_exp.core.logs import engine_output_to_log

    if _active is None:
        from lm_eval.models.huggingface import HFLM

        with engine_output_to_log():
            return lm_eval.simple_evaluate(model=HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size),
                                           **kwargs)
    import torch.distributed as dist

    rank, world, group = _active
    lm = _rank_hflm()(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, shard_rank=rank, shard_world=world)
    with engine_output_to_log():
        out = [lm_eval.simple_evaluate(model=lm, **kwargs)]  # None on ranks > 0
    dist.broadcast_object_list(out, src=_global_rank(group, 0), group=group)
    return out[0]

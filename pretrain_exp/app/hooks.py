"""The hooks of the segment loop (:meth:`Experiment.run <pretrain_exp.app.experiment.Experiment.run>`).

A run is ``pre_train`` → for each segment ``(a, b]``: ``pre_segment(a, b)`` → training with retries →
``post_segment(ckpt, final)`` → ``post_train`` → ``close``; a segment that an earlier invocation of the same command
trained is announced with ``resumed_segment(step, final)`` instead, and an error leaving the loop with
``on_error(exc)``. The names follow OLMo-core's trainer callbacks (``olmo_core.train.callbacks.Callback``:
``pre_train``, ``post_checkpoint_saved``, ``post_train``, ``on_error``, ``close``), one level up: a segment here is
a stretch of steps between two of our checkpoints.

Every job around training is one :class:`RunHook` in a module of its own, built with only the values it needs:
dynamic insertion (:mod:`~pretrain_exp.app.dynamic_hook`), the kept HF export (:mod:`~pretrain_exp.app.hf_export`),
the evaluator with its inline / distributed / async variants (:mod:`~pretrain_exp.app.evaluator`), the results
(:mod:`~pretrain_exp.app.results`) and the cleanup (:mod:`~pretrain_exp.app.cleanup`). :class:`Hooks` calls them in
the order given. Every rank calls every hook; a hook that only rank 0 runs says so and checks it itself.
"""

from __future__ import annotations

from typing import Iterable, List, Tuple

from pretrain_exp.frameworks.base import Checkpoint


def segments(start_step: int, end_step: int, interval: int) -> List[Tuple[int, int]]:
    """The segments ``(a, b]`` of a run from global step ``start_step`` to ``end_step``: ``interval`` steps each
    (``training.checkpoint_interval``), the last one shorter if need be; one empty segment ``(S, S]`` for a run of 0
    steps. Returned as ``[(a, b), ...]``."""
    ends = list(range(start_step + interval, end_step, interval)) + [end_step]
    return list(zip([start_step] + ends[:-1], ends))


class RunHook:
    """A component of the segment loop: every hook is a no-op here; a component overrides the ones it needs."""

    def pre_train(self) -> None:
        """Once, before the first segment (after the tracker is open and the resume point is known)."""

    def resumed_segment(self, step: int, final: bool) -> None:
        """A segment ending at global step ``step`` that an earlier invocation trained (a re-run resumes after
        it); ``final`` when it is the run's last segment."""

    def pre_segment(self, a: int, b: int) -> None:
        """Before training the segment of steps ``a+1 .. b``."""

    def post_segment(self, ckpt: Checkpoint, final: bool) -> None:
        """After the segment's checkpoint ``ckpt`` is saved (or found saved by an earlier invocation); ``final``
        when it is the run's last segment."""

    def post_train(self) -> None:
        """Once, on rank 0, after the last segment and its checkpoint are written, before the results."""

    def on_error(self, exc: BaseException) -> None:
        """When an exception leaves the loop (before it propagates)."""

    def close(self) -> None:
        """Once, at the very end of a successful run (after the results and the release)."""


class Hooks(RunHook):
    """Several hooks called as one, in the given order."""

    def __init__(self, hooks: Iterable[RunHook]):
        self.hooks: List[RunHook] = [h for h in hooks if h is not None]

    def pre_train(self) -> None:
        for h in self.hooks:
            h.pre_train()

    def resumed_segment(self, step: int, final: bool) -> None:
        for h in self.hooks:
            h.resumed_segment(step, final)

    def pre_segment(self, a: int, b: int) -> None:
        for h in self.hooks:
            h.pre_segment(a, b)

    def post_segment(self, ckpt: Checkpoint, final: bool) -> None:
        for h in self.hooks:
            h.post_segment(ckpt, final)

    def post_train(self) -> None:
        for h in self.hooks:
            h.post_train()

    def on_error(self, exc: BaseException) -> None:
        for h in self.hooks:
            h.on_error(exc)

    def close(self) -> None:
        for h in self.hooks:
            h.close()

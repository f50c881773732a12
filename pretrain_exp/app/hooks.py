"""The hooks of the segment loop (:meth:`Experiment.run <pretrain_exp.app.experiment.Experiment.run>`) and their
contract.

A run is ``pre_train`` → for each segment ``(a, b]``: ``pre_segment(a, b)`` → training with retries →
``post_segment(ckpt, final)`` → ``post_train`` → ``close``; a segment that an earlier invocation of the same command
trained is announced with ``resumed_segment(step, final)`` instead. The names follow OLMo-core's trainer callbacks
(``olmo_core.train.callbacks.Callback``: ``pre_train``, ``post_checkpoint_saved``, ``post_train``, ``on_error``,
``close``), one level up: a segment here is a stretch of steps between two of our checkpoints.

The contract, which the loop keeps:

- **order**: the components' hooks run in the order of the run's component list (:meth:`Experiment.hooks
  <pretrain_exp.app.experiment.Experiment.hooks>`): the window stream, the audit, dynamic insertion, the kept HF
  export, the evaluator, the components named in the config's ``hooks``, the results, the release, the cleanup;
- **ranks**: every rank calls every hook, ``post_train`` and ``close`` included; a component whose work is rank 0's
  (writing files, the results, the cleanup) checks that itself (its ``main``);
- **errors**: an exception that leaves the loop (``post_train`` included: the results, the release) calls
  ``on_error(exc)`` on every component, then ``close``, then propagates; ``close`` runs exactly once per run, after
  ``post_train`` on success, after ``on_error`` on failure. What a component started in ``pre_train`` (the window
  stream, the audit beside training) it stops in ``on_error`` and ``close``, except the background evals, which are
  left to finish their evals for the re-run (:mod:`~pretrain_exp.app.async_eval`); what only a finished run may do
  (the cleanup) it skips after ``on_error``.

Every job around training is one :class:`RunHook` in a module of its own, built with only the values it needs: the
window stream (:mod:`~pretrain_exp.app.stream_hook`), the audit (:mod:`~pretrain_exp.app.audit_hook`), dynamic
insertion (:mod:`~pretrain_exp.app.dynamic_hook`), the kept HF export (:mod:`~pretrain_exp.app.hf_export`), the
evaluator with its inline / distributed / async variants (:mod:`~pretrain_exp.app.evaluator`), the results
(:mod:`~pretrain_exp.app.results`), the release (:mod:`~pretrain_exp.app.release_hook`) and the cleanup
(:mod:`~pretrain_exp.app.cleanup`). A component of one's own is a
:class:`RunHook` subclass named in the config by its import path (``hooks=[my_pkg.my_module:MyHook]``): it is built
with the prepared run (:class:`~pretrain_exp.app.prepare.RunContext`) and its hooks run before the results
(:func:`load_hooks`).
"""

from __future__ import annotations

import importlib
from typing import Any, Iterable, List, Sequence, Tuple

from pretrain_exp.core.errors import ConfigError
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
        """Once, after the last segment and its checkpoint are written (the results are written here, by the last
        component but the cleanup)."""

    def on_error(self, exc: BaseException) -> None:
        """When an exception leaves the loop, ``post_train`` included (then ``close``; then it propagates)."""

    def close(self) -> None:
        """Once, at the very end of the run: after ``post_train`` (the results, the release), or after
        ``on_error``."""


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


def load_hooks(paths: Sequence[str], ctx: Any) -> List[RunHook]:
    """The components named in the config's ``hooks`` (``"package.module:Class"``, or ``"package.module.Class"``),
    each built with the prepared run ``ctx`` (:class:`~pretrain_exp.app.prepare.RunContext`).

    :raises ConfigError: (``hooks[i]``) for a path that does not import or does not name a :class:`RunHook` subclass.
    """
    out = []
    for i, path in enumerate(paths):
        module, _, name = path.rpartition(":") if ":" in path else path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name) if module else None
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"hooks[{i}]", f"{path!r} does not import ({type(e).__name__}: {e}); give "
                              "'package.module:Class' of a RunHook subclass on the Python path") from None
        if not (isinstance(cls, type) and issubclass(cls, RunHook)):
            raise ConfigError(f"hooks[{i}]", f"{path!r} is not a RunHook subclass "
                              "(pretrain_exp.app.hooks.RunHook); give 'package.module:Class'")
        out.append(cls(ctx))
    return out

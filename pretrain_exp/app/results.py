"""The end of a run: ``results.json``, the run's tables and plots, and the tracker's figures, tables and artifacts.

:func:`run_results` composes the summary (:func:`~pretrain_exp.report.summary.summarize`, the one reader of the whole
config here: the audit beside training collected, a continued run's parent, the device layouts, the timings and the
``dynamic`` table) and :func:`write_results` writes and publishes it. A training run writes it in the ``post_train``
hook of :class:`RunResults` (the last component of the loop, after the evaluator has waited for its evals); the
``evaluate`` command after evaluating a run's checkpoints again (:meth:`Experiment.evaluate_checkpoints
<pretrain_exp.app.experiment.Experiment.evaluate_checkpoints>`).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

from pretrain_exp.app.hooks import RunHook
from pretrain_exp.core.io import write_json
from pretrain_exp.core.phases import PHASES
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.frameworks.base import Checkpoint
from pretrain_exp.report.plots import plot_loss_vs_step, plot_per_dup
from pretrain_exp.report.summary import summarize
from pretrain_exp.report.tables import write_run_tables

if TYPE_CHECKING:
    from pretrain_exp.app.dynamic_hook import DynamicInsertion
    from pretrain_exp.app.evaluator import Evaluator
    from pretrain_exp.app.prepare import RunContext

#: the run's plots: ``plots/<name>.png``
PLOTS = {"loss_vs_dup": plot_per_dup, "loss_vs_step": plot_loss_vs_step}


def write_results(rundir: RunDir, tracker, results: dict, all_evaluated: Dict[int, Dict[str, dict]],
                  last: Checkpoint, initial: Checkpoint) -> dict:
    """Write ``results`` (the run's summary, :func:`~pretrain_exp.report.summary.summarize`) as ``results.json``,
    the run's Parquet tables and plots, and log them to the tracker (W&B only) at ``last``'s global step.

    :param all_evaluated: step -> task -> result of every eval in the run dir (:meth:`RunDir.all_evals`), the
        W&B tables' rows.
    :param last: the newest checkpoint (its files are the W&B model artifact unless it is ``initial``).
    :returns: ``results``, with ``pretrain_exp`` (:func:`code_version`) added.
    """
    results["pretrain_exp"] = code_version()
    write_json(rundir.results, results)
    write_run_tables(rundir.path)  # manifest, items and per-item eval rows as Parquet (load_run)
    for name, plot in PLOTS.items():
        plot(results, rundir.plot(name))
    if tracker.wandb_dir is not None:  # figures, tables and artifacts at the run's last global step
        tracker.log_media({f"plots/{name}": _wandb_image(rundir.plot(name)) for name in PLOTS}, last.step)
        tracker.log_results(results, all_evaluated, last.step)
        tracker.log_artifacts(None if last is initial else last.path)
    return results


@dataclass
class LoopTiming:
    """What the loop measured in this invocation (``results.json``'s ``timing``; seconds of
    :func:`time.perf_counter`).

    :param t_start: when the loop started; ``segments``: per trained segment ``{step, train_s, segment_end_s}``.
    :param checkpoint_wait_s: the final wait for the last checkpoint's save; ``post_train_start``: when the
        ``post_train`` hooks started (what the evals held the run for ends where the results begin).
    """

    t_start: float = field(default_factory=time.perf_counter)
    segments: List[dict] = field(default_factory=list)
    checkpoint_wait_s: float = 0.0
    post_train_start: float = 0.0


def run_results(ctx: "RunContext", tracker, evaluated: Dict[int, Dict[str, dict]], t_start: float, last: Checkpoint,
                initial: Checkpoint, timing: Optional[dict], dynamic: Optional["DynamicInsertion"] = None) -> dict:
    """Collect the audit beside training (waiting for it), summarize the run of ``ctx`` (with ``timing`` and the
    ``dynamic`` table) and write it (:func:`write_results`); returns the ``results.json`` content.

    :param evaluated: step -> task -> result evaluated by this invocation.
    :raises InsertionError: if the audit beside training failed (a re-run of the same command audits again).
    """
    ctx.auditor.finish()
    if timing is not None and ctx.auditor.wait_s:
        timing["final_audit_wait_s"] = ctx.auditor.wait_s
    if timing is not None and ctx.order.gate is not None:  # this process's waits for the window stream
        timing["data_stall_s"] = ctx.order.gate.stall_s
    audit = ctx.rundir.read_audit() if ctx.plan.audit is not None else None
    if audit is not None and dynamic is not None:  # audited on the static plan: final dup counts
        audit = dynamic.final_audit(audit)
    all_evaluated = ctx.rundir.all_evals()
    # a continued run: its parent's evaluated steps before its own (one loss-over-steps curve across both)
    joined = all_evaluated if ctx.parent is None else {**ctx.parent.evals(), **all_evaluated}
    results = summarize(ctx.cfg, ctx.plan.current, evaluated, joined, time.perf_counter() - t_start, audit)
    if ctx.parent is not None:
        results["parent"] = ctx.parent.entry()
    layouts = ctx.rundir.read_layouts()
    if layouts:  # the device layout of each trained segment
        results["layouts"] = layouts
    if timing is not None:
        results["timing"] = timing
    if dynamic is not None:
        results["dynamic"] = dynamic.summary(ctx.end_step)
    return write_results(ctx.rundir, tracker, results, all_evaluated, last, initial)


class RunResults(RunHook):
    """The results of a training run, written in :meth:`post_train` on rank 0 (:func:`run_results`); the last
    component of the loop, so ``post_train`` of the evaluator (the wait for background evals) runs before it.

    :param ctx: the prepared run; ``tracker``: where the results are published.
    :param evaluator: the run's evaluator (:attr:`~pretrain_exp.app.evaluator.Evaluator.evaluated`).
    :param timing: the loop's measurements; ``initial``: the initial checkpoint; ``last``: the checkpoint the loop
        resumed from (updated by :meth:`post_segment`).
    :param dynamic: the dynamic insertion hook, if any (``results.json``'s ``dynamic`` table).
    """

    def __init__(self, ctx: "RunContext", tracker, evaluator: "Evaluator", timing: LoopTiming, initial: Checkpoint,
                 last: Checkpoint, dynamic: Optional["DynamicInsertion"] = None):
        self.ctx, self.tracker, self.evaluator, self.timing = ctx, tracker, evaluator, timing
        self.initial, self.last, self.dynamic = initial, last, dynamic
        self.results: dict = {}  #: the ``results.json`` content once written (``{}`` on ranks other than 0)

    def post_segment(self, ckpt: Checkpoint, final: bool) -> None:
        self.last = ckpt

    def post_train(self) -> None:
        """Write the results (rank 0): this invocation's segments (training with the checkpoint save, then what the
        segment's end held the run for: export, evals or their launch) and the final waits."""
        if not self.ctx.main:
            return
        t = self.timing
        self.results = run_results(self.ctx, self.tracker, self.evaluator.evaluated, t.t_start, self.last,
                                   self.initial, {
                                       "eval_mode": self.ctx.cfg.eval.mode.value, "segments": t.segments,
                                       "final_eval_wait_s": time.perf_counter() - t.post_train_start,
                                       "final_checkpoint_wait_s": t.checkpoint_wait_s, "phases": PHASES.summary()},
                                   self.dynamic)


def code_version() -> Dict[str, Optional[str]]:
    """``{"version": pretrain_exp.__version__, "commit": ...}``: the code that ran, as ``results.json`` records it.

    ``commit`` is ``git rev-parse HEAD`` of the checkout this package was imported from (``-dirty`` appended when
    ``git status`` shows changes to tracked files), or None for an installed wheel (no checkout), a checkout that is
    not the top of a git work tree, or when ``git`` is missing or fails (10 s limit per call).
    """
    import pretrain_exp

    return {"version": pretrain_exp.__version__, "commit": _git_commit(pretrain_exp.checkout_root())}


def _git_commit(root: Optional[Path]) -> Optional[str]:
    if root is None:
        return None

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root.resolve():
            return None  # e.g. an unpacked sdist inside another repository
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "") if commit else None


def _wandb_image(path: Path):
    import wandb

    return wandb.Image(str(path)) if path.is_file() else None

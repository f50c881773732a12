"""The experiment loop: prepare -> train in segments -> evaluate each segment -> results.

:func:`run` is the whole run for one validated :class:`~pretrain_exp.app.config.ExperimentConfig`:

1. prepare the run (:func:`~pretrain_exp.app.prepare.prepare`, plain data, no process started): model, tokenizer,
   data order, the window's remote rows, the held-out rows, the plan (saved, verified, audited);
2. build the loop's components from the config (:meth:`Experiment.hooks`) and run them under the hook contract of
   :mod:`~pretrain_exp.app.hooks`: ``pre_train`` starts what runs beside training (the window stream,
   :mod:`~pretrain_exp.app.stream_hook`; the audit, :mod:`~pretrain_exp.app.audit_hook`; the async evals) and
   evaluates the initial checkpoint if ``eval.on_load`` (or if ``training.num_steps=0``);
3. train segment by segment (``training.checkpoint_interval`` steps each), retrying failed segments with
   exponential backoff and jitter (config and data errors are not retried), keep the HF export of the last (or
   every) segment's checkpoint in ``hf/step<N>/`` (``training.export_hf``), and evaluate
   every segment's checkpoint into ``evals/step<N>/<task>.json`` (all evals of a step read one HF export);
4. ``post_train``: the wait for background evals, then ``results.json``, the plot and the tables
   (:class:`~pretrain_exp.app.results.RunResults`), then the release (:mod:`~pretrain_exp.app.release_hook`);
   ``close``: the cleanup
   (:mod:`~pretrain_exp.app.cleanup`) and the end of every process started beside training.

With ``insertion.dynamic`` (:mod:`~pretrain_exp.insertion.dynamic`) each segment ``(a, b]`` starts with a decision
on the insertion losses evaluated at step ``a`` (:mod:`~pretrain_exp.app.dynamic_hook`): its additions are saved to
``dynamic/step<a>.json`` before the segment trains, added to the run's plan
(:class:`~pretrain_exp.insertion.run_plan.RunPlan`: ``plan.npz``, ``manifest.jsonl`` with ``decided_at``/``segment``;
the training rows read it) and verified on the segment's batches; results.json gets a ``dynamic`` table.

Re-running the same command in the same run dir resumes: finished segments and evals are skipped and training
continues from the newest checkpoint (bit-identical to an uninterrupted run on CPU).
"""

from __future__ import annotations

import functools
import json
import logging
import random
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

import torch

from pretrain_exp.app.cleanup import RunDirCleanup
from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.app.console import segment_lines
from pretrain_exp.app.dynamic_hook import DynamicInsertion
from pretrain_exp.app.evaluator import Evaluator, make_evaluator
from pretrain_exp.app.hf_export import HFExport
from pretrain_exp.app.hooks import Hooks, load_hooks, segments
from pretrain_exp.app.prepare import RunContext, prepare
from pretrain_exp.app.release_hook import Release
from pretrain_exp.app.results import LoopTiming, RunResults, run_results
from pretrain_exp.app.run_record import holds_credentials, write_private_config
from pretrain_exp.app.stream_hook import StreamHook
from pretrain_exp.app.tracking import NullTracker, Tracker
from pretrain_exp.core.distributed import is_main_process, world_size
from pretrain_exp.core.errors import ConfigError, PretrainExpError, TrainingError
from pretrain_exp.core.io import disk_full_error, is_disk_full
from pretrain_exp.core.phases import PHASES
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.frameworks.base import Checkpoint
from pretrain_exp.insertion.audit import AuditResult
from pretrain_exp.insertion.audit_job import BackgroundAudit
from pretrain_exp.insertion.plan import Plan
from pretrain_exp.report.summary import print_table

log = logging.getLogger(__name__)
T = TypeVar("T")


def with_retries(fn: Callable[[], T], max_retries: int, base_delay_s: float, what: str,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``fn``; on a runtime failure retry up to ``max_retries`` times, sleeping
    ``base_delay_s * 2**attempt * U(0.5, 1.5)`` (exponential backoff with jitter) in between.

    Errors of the user's making (config, data, insertion, checkpoint: :class:`PretrainExpError` other than
    :class:`TrainingError`) are raised at once.

    :raises TrainingError: after the last failed attempt, chained to the last error.
    """
    for attempt in range(max_retries + 1):
        try:
            return fn()
        except PretrainExpError as e:
            if not isinstance(e, TrainingError):
                raise
            err = e
        except Exception as e:  # noqa: BLE001  (runtime failures of the training engine are retried)
            err = e
        if attempt == max_retries:
            raise TrainingError(f"{what} failed after {attempt + 1} attempt(s): {err}") from err
        delay = base_delay_s * 2 ** attempt * random.uniform(0.5, 1.5)
        log.warning("%s failed (%s: %s); retry %d/%d in %.1f s", what, type(err).__name__, err, attempt + 1,
                    max_retries, delay)
        sleep(delay)
    raise AssertionError("unreachable")


class Experiment:
    """One run's loop over its prepared state (:class:`~pretrain_exp.app.prepare.RunContext`): :meth:`run` trains
    and evaluates segment by segment; :meth:`evaluate_checkpoints` evaluates a run's checkpoints again.

    The prepared state's fields (``framework``, ``tokenizer``, ``order``, ``window``, ``rows``, ``stream``,
    ``auditor``, ``held_out``, ``held_out_rows``, ...) are read through the experiment; :attr:`plan` is the current
    plan (:class:`~pretrain_exp.insertion.run_plan.RunPlan` is ``ctx.plan``). Building one starts no process.
    """

    def __init__(self, cfg: ExperimentConfig, ctx: Optional[RunContext] = None):
        """The loop of ``cfg``, prepared now (:func:`~pretrain_exp.app.prepare.prepare`) unless ``ctx`` is given."""
        self.cfg = cfg
        self.ctx = prepare(cfg) if ctx is None else ctx  #: what the run decided before step 1
        t = cfg.training
        self.hf = HFExport(self.rundir, t.export_hf, self.end_step, self.main)  #: the run's HF exports
        #: ``insertion.dynamic``: the hook that decides each segment's additions
        self.dynamic_insertion = None if cfg.insertion.dynamic is None else DynamicInsertion(
            cfg.insertion.dynamic, self.ctx.plan, self.rundir, cfg.insertion.seed,
            self.ctx.verify_segment if cfg.insertion.verify else None, self.main)

    def __getattr__(self, name: str):
        """The prepared state's fields (class docstring)."""
        if name == "ctx":
            raise AttributeError(name)
        return getattr(self.ctx, name)

    @property
    def run_dir(self) -> Path:
        """The run dir (absolute)."""
        return self.ctx.rundir.path

    @property
    def dynamic(self):
        """``insertion.dynamic``, parsed once by validation (its policy's
        :class:`~pretrain_exp.insertion.policies.base.DynamicConf`)."""
        return self.cfg.insertion.dynamic

    @property
    def num_steps(self) -> int:
        """``training.num_steps``."""
        return self.cfg.training.num_steps

    @property
    def model_dir(self) -> Path:
        """The framework's model dir."""
        return self.ctx.framework.model_dir

    @property
    def plan(self) -> Plan:
        """The current plan (the one the training rows read)."""
        return self.ctx.plan.current

    @property
    def plans(self) -> list:
        """``[(decided_at, plan), ...]``: the static plan (decided at -1), then the plan after each dynamic
        decision."""
        return self.ctx.plan.plans

    @property
    def audit(self) -> Optional[AuditResult]:
        """The natural-duplicate audit of the static plan, once known (``insertion.audit``)."""
        return self.ctx.plan.audit

    @property
    def _audit_job(self) -> Optional[BackgroundAudit]:
        """``insertion.audit=on``: the audit beside training, from its ``pre_train`` hook until it is collected."""
        return self.ctx.auditor.job

    def finish_audit(self, wait: bool = True) -> None:
        """Collect the audit running beside training (:meth:`RunAudit.finish
        <pretrain_exp.app.audit_hook.RunAudit.finish>`): wait for it (without ``wait``: only if it has ended).

        :raises InsertionError: if the audit failed (a re-run of the same command audits again).
        """
        self.ctx.auditor.finish(wait)

    def plan_for_step(self, step: int) -> Plan:
        """The plan as of checkpoint ``step``: static plus the additions decided before ``step``."""
        return self.ctx.plan.as_of(step)

    # --- evaluation -------------------------------------------------------------------------------------
    def evaluator(self, tracker, initial: Optional[Checkpoint] = None) -> Evaluator:
        """The run's evaluator of ``eval.mode`` (:func:`~pretrain_exp.app.evaluator.make_evaluator`), logging to
        ``tracker``; ``initial``: the initial checkpoint, evaluated by its ``pre_train`` if asked."""
        return make_evaluator(self.cfg.eval, self.rundir, self.hf, self.ctx.eval_context, tracker, self.main, initial,
                              self.start_step, self.end_step,
                              worker_config=functools.partial(worker_config, self.cfg, self.rundir),
                              model_dir=self.model_dir)

    def evaluate(self, ckpt: Checkpoint, tracker: Tracker, redo: bool = False) -> Dict[str, dict]:
        """Run every ``eval.tasks`` entry on ``ckpt`` now (skipping tasks already saved for its step, unless
        ``redo``): :meth:`Evaluator.evaluate <pretrain_exp.app.evaluator.Evaluator.evaluate>` (under
        ``eval.mode=distributed`` every rank calls this).

        :returns: task name -> saved result dict (``metrics``, ``per_dup``, ``rows``); ``{}`` on other ranks.
        """
        return self.evaluator(tracker).evaluate(ckpt, redo=redo)

    # --- the loop ---------------------------------------------------------------------------------------
    def run(self) -> dict:
        """Execute the loop (module docstring) under the hook contract of :mod:`~pretrain_exp.app.hooks`:
        ``pre_train`` → per segment ``pre_segment``, training with retries, ``post_segment`` → ``post_train`` (the
        results: :class:`~pretrain_exp.app.results.RunResults`, then the release:
        :class:`~pretrain_exp.app.release_hook.Release`) → ``close``; on an exception ``on_error`` then ``close``.
        Returns the ``results.json`` content (``{}`` on ranks other than 0)."""
        self._check_release()
        timing = LoopTiming()
        with PHASES.phase("tracker"):
            tracker_cm = Tracker(self.cfg) if self.main else NullTracker()
        hooks = Hooks([])
        try:
            with tracker_cm as tracker:
                ckpt, initial = self._resume_point()
                hooks, results = self.hooks(tracker, timing, initial, ckpt)
                self._loop(hooks, ckpt, tracker, timing)
        except BaseException as e:
            hooks.on_error(e)
            hooks.close()
            raise
        hooks.close()
        return results.results

    def _loop(self, hooks: Hooks, ckpt: Checkpoint, tracker, timing: LoopTiming) -> None:
        """The segments (module docstring) from the resume point ``ckpt``, then the ``post_train`` hooks; every
        rank calls every hook."""
        hooks.pre_train()
        for a, b in self.segments():
            final = b == self.end_step
            if b <= self.start_step or b < ckpt.step:  # trained and finished by an earlier invocation
                hooks.resumed_segment(b, final)
                continue
            if b > ckpt.step:  # else: trained, its end not run (a kill after the checkpoint was saved)
                hooks.pre_segment(a, b)
            t0 = time.perf_counter()
            ckpt = self.train_with_retries(ckpt, b, tracker)
            t1 = time.perf_counter()
            hooks.post_segment(ckpt, final)
            timing.segments.append({"step": ckpt.step, "train_s": t1 - t0, "segment_end_s": time.perf_counter() - t1})
        t0 = time.perf_counter()
        self.framework.finish_checkpoints()  # the last segment's checkpoint may still be being written
        timing.checkpoint_wait_s = time.perf_counter() - t0
        timing.post_train_start = time.perf_counter()
        hooks.post_train()  # async: the wait for the background evals; then the results

    def hooks(self, tracker, timing: LoopTiming, initial: Checkpoint, ckpt: Checkpoint
              ) -> Tuple[Hooks, RunResults]:
        """The run's components, built here alone, in the order their hooks run: the window stream, the audit
        beside training, dynamic insertion, the kept HF export, the evaluator (:meth:`evaluator`, logging to
        ``tracker``), the components named in ``hooks`` (:func:`~pretrain_exp.app.hooks.load_hooks`), the results
        (:class:`~pretrain_exp.app.results.RunResults`: ``timing``, the ``initial`` checkpoint and ``ckpt``, the
        one training resumes from), the release, the cleanup. Returns ``(the hooks, the results)``."""
        ctx, evaluator = self.ctx, self.evaluator(tracker, initial)
        results = RunResults(ctx, tracker, evaluator, timing, initial, ckpt, self.dynamic_insertion)
        release = Release(self.rundir, self.cfg.release, self.cfg.run_name, self.main)
        cleanup = RunDirCleanup(self.rundir, self.cfg.training.cleanup, self.framework.latest_checkpoint, self.main)
        named = load_hooks(self.cfg.hooks, ctx)
        return Hooks([StreamHook(ctx.stream, ctx.order), ctx.auditor, self.dynamic_insertion, self.hf, evaluator,
                      *named, results, release, cleanup]), results

    def segments(self) -> List[Tuple[int, int]]:
        """The run's segments ``(a, b]`` of ``training.checkpoint_interval`` steps
        (:func:`~pretrain_exp.app.hooks.segments`)."""
        return segments(self.start_step, self.end_step, self.cfg.training.checkpoint_interval)

    def _check_release(self) -> None:
        """``release.push_to_hub``: refuse before anything is trained when offline or without a token."""
        if self.cfg.release.push_to_hub and self.main:
            from pretrain_exp.report.release import check_push_possible

            check_push_possible()

    def _resume_point(self) -> Tuple[Checkpoint, Checkpoint]:
        """``(the checkpoint training continues from, the initial checkpoint)``: the newest checkpoint of the run
        dir (a re-run resumes), else the initial one."""
        ckpt = self.framework.latest_checkpoint()
        initial = self.framework.initial_checkpoint()
        if ckpt is None:
            ckpt = initial
        else:
            log.info("resuming from %s (step %d)", ckpt.path, ckpt.step)
        return ckpt, initial

    def evaluate_checkpoints(self, steps: Optional[list] = None, redo: bool = False) -> dict:
        """Evaluate the checkpoints this run holds with ``eval.tasks`` (``pretrain-exp-eval``; no training): its
        checkpoints (:meth:`Framework.checkpoints`), the kept HF exports ``hf/step<N>/`` and the initial checkpoint
        if the run evaluated it; ``steps`` picks some of them. Tasks already saved for a step are kept unless
        ``redo``. Rewrites ``results.json``, its tables and plots; returns the ``results.json`` content.

        :raises ConfigError: naming ``--steps`` for a step the run holds no checkpoint of (with the ones it holds).
        """
        t_start = time.perf_counter()
        initial = self.framework.initial_checkpoint()
        held = dict(self.framework.checkpoints())
        for step, d in self.rundir.hf_exports(marker="config.json"):
            held.setdefault(step, Checkpoint(d, step))
        if self.num_steps == 0 or self.rundir.eval_dir(initial.step).is_dir():
            held.setdefault(initial.step, initial)
        chosen = sorted(held) if steps is None else sorted(set(steps))
        missing = [s for s in chosen if s not in held]
        if missing or not chosen:
            raise ConfigError("--steps", f"{self.run_dir} holds no checkpoint of step(s) {missing or chosen} "
                              f"(it holds: {', '.join(map(str, sorted(held))) or 'none'})")
        old = self.rundir.read_results()
        timing = old.get("timing") if old is not None else None
        with Tracker(self.cfg) as tracker:
            evaluator = self.evaluator(tracker)
            evaluated = {s: evaluator.evaluate(held[s], redo=redo) for s in chosen}
            return run_results(self.ctx, tracker, evaluated, t_start, held[chosen[-1]], initial, timing,
                               self.dynamic_insertion)

    def train_with_retries(self, start: Checkpoint, until_step: int, tracker) -> Checkpoint:
        """Train from ``start`` to global step ``until_step`` (:meth:`_train_segment`), retrying runtime failures
        (``training.max_retries``, :func:`with_retries`); ``start`` itself when it is there already."""
        if start.step >= until_step:
            return start
        t = self.cfg.training
        return with_retries(functools.partial(self._train_segment, start, until_step, tracker), t.max_retries,
                            t.retry_base_delay_s, f"training steps {start.step}->{until_step}")

    def _train_segment(self, start: Checkpoint, until_step: int, tracker) -> Checkpoint:
        """One segment of training, one console line per logged step (and a progress bar) on the main process
        (:mod:`pretrain_exp.app.console`); a full disk (which a retry cannot fix) is a :class:`StorageError` naming
        the checkpoint being written."""
        try:
            if not self.main:
                return self.framework.train(start, until_step, self.rows, tracker.log)
            # written before the segment trains: a job killed after its checkpoint and before anything else still
            # leaves the layout that trained it (a line of a segment cut short is superseded when it is trained again)
            record_layout(self.rundir, self.cfg.training, start.step, until_step)
            with segment_lines(tracker.log, start.step, until_step, self.end_step) as log_fn:
                return self.framework.train(start, until_step, self.rows, log_fn)
        except Exception as e:
            if isinstance(e, PretrainExpError) or not is_disk_full(e):
                raise
            named = next((x.filename for x in (e, e.__cause__, e.__context__) if getattr(x, "filename", None)), None)
            ckpts = self.framework.checkpoint_dir
            newest = (max(ckpts.iterdir(), key=lambda p: p.stat().st_mtime_ns, default=ckpts) if ckpts.is_dir()
                      else ckpts)  # the checkpoint being written
            raise disk_full_error(f"training steps {start.step}->{until_step} wrote", named or newest, e) from e


def worker_config(cfg: ExperimentConfig, rundir: RunDir) -> Tuple[Path, bool]:
    """The config file the background eval processes read (``eval.mode=async``): ``config.resolved.yaml``, or, for a
    config with credentials, which that file has redacted, a copy readable by this user only (``private``: removed at
    the end). Returns ``(file, private)``."""
    config, private = rundir.config, holds_credentials(cfg)
    if private:
        config = write_private_config(cfg, rundir.path, prefix=".config-")
    return config, private


def record_layout(rundir: RunDir, t, from_step: int, to_step: int) -> None:
    """Append the device layout (``t``: the ``training`` node) that trains steps ``from_step+1 .. to_step`` to
    ``layouts.jsonl`` as the segment starts (a run may resume on another layout:
    :data:`~pretrain_exp.app.run_name.LAYOUT_KEYS`; :meth:`~pretrain_exp.core.rundir.RunDir.read_layouts` drops what
    a later segment trained again)."""
    rec = {"from_step": from_step, "to_step": to_step, "world_size": world_size(), "nnodes": t.nnodes,
           "nproc_per_node": t.nproc_per_node, "micro_batch_size": t.micro_batch_size,
           "data_parallel": t.data_parallel, "gradient_accumulation": t.global_batch_size // max(
               1, t.micro_batch_size * world_size())}
    with open(rundir.layouts, "a", encoding="utf-8") as f:  # one whole line per segment
        f.write(json.dumps(rec) + "\n")


def run(cfg: ExperimentConfig) -> dict:
    """Run one experiment end to end in this process (one rank of it under torchrun; module docstring), in a run
    dir that :func:`~pretrain_exp.app.launch.launch` recorded (:func:`~pretrain_exp.app.run_record.record_run`:
    ``config.resolved.yaml``, refused if it holds another run) before any process of the run started.

    :returns: the ``results.json`` content (``{}`` on ranks other than 0).
    """
    if cfg.training.num_threads > 0:
        torch.set_num_threads(cfg.training.num_threads)
    run_dir = Path(cfg.run_dir).resolve()
    if is_main_process():
        PHASES.attach(run_dir)
    exp = Experiment(cfg)
    results = exp.run()
    if results:
        print_table(results)
    return results

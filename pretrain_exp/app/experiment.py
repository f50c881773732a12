"""The experiment loop: checkpoint -> plan -> train in segments -> evaluate each segment -> results.

:func:`run` is the whole run for one validated :class:`~pretrain_exp.app.config.ExperimentConfig`:

1. resolve the model (asset or dir) and tokenizer, tokenize the corpus if needed, build the data order; remote
   token files: fetch the window's rows before training (``data.prefetch=window``) or stream them beside training
   (``stream``, the default; :mod:`~pretrain_exp.data.stream`, started once the plan is verified);
2. load the items, place them in the training window ``[S*B*L, (S+n)*B*L)`` and build the
   :class:`~pretrain_exp.insertion.plan.Plan`; save ``plan.npz`` + ``manifest.jsonl`` (or check that the plan
   already in the run dir is identical) and verify it on the batches the framework will train (its
   ``peek_rows`` for every affected step and DP rank, :func:`~pretrain_exp.insertion.verify.verify_batches`);
   audit the items' natural duplicates in the window and the held-out rows (``insertion.audit``,
   :mod:`~pretrain_exp.insertion.audit`; ``audit.json`` and the counts in ``items.jsonl``): with ``on`` in a process
   of its own beside training (:mod:`~pretrain_exp.insertion.audit_job`), collected before the results are
   written;
3. evaluate the initial checkpoint if ``eval.on_load`` (or if ``training.num_steps=0``);
4. train segment by segment (``training.checkpoint_interval`` steps each), retrying failed segments with
   exponential backoff and jitter (config and data errors are not retried), keep the HF export of the last (or
   every) segment's checkpoint in ``hf/step<N>/`` (``training.export_hf``), and evaluate
   every segment's checkpoint into ``evals/step<N>/<task>.json`` (all evals of a step read one HF export);
5. write ``results.json``, the plot, print the table.

Steps 3 to 5 are :meth:`Experiment.run`, a loop over the segments that calls the hooks of its components
(:mod:`~pretrain_exp.app.hooks`): dynamic insertion before a segment (:mod:`~pretrain_exp.app.dynamic_hook`), the
kept HF export and the evaluator after it (:mod:`~pretrain_exp.app.hf_export`, :mod:`~pretrain_exp.app.evaluator`:
``eval.mode`` inline, distributed or async), the results at the end (:mod:`~pretrain_exp.app.results`), then the
cleanup (:mod:`~pretrain_exp.app.cleanup`).

With ``insertion.dynamic`` (:mod:`~pretrain_exp.insertion.dynamic`) each segment ``(a, b]`` starts with a decision
on the insertion losses evaluated at step ``a``: its additions are saved to ``dynamic/step<a>.json`` before the
segment trains, appended to the plan (``plan.npz``, ``manifest.jsonl`` with ``decided_at``/``segment``), handed to
the framework through the rows' plan and verified on the segment's batches; results.json gets a ``dynamic`` table.

Re-running the same command in the same run dir resumes: finished segments and evals are skipped and training
continues from the newest checkpoint (bit-identical to an uninterrupted run on CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

import numpy as np
import torch
from omegaconf import OmegaConf

from pretrain_exp.app.audit_hook import RunAudit
from pretrain_exp.app.cleanup import RunDirCleanup
from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.app.console import segment_lines
from pretrain_exp.app.dynamic_hook import DynamicInsertion, PlanHistory
from pretrain_exp.app.evaluator import Evaluator, make_evaluator
from pretrain_exp.app.hf_export import HFExport
from pretrain_exp.app.hooks import Hooks, segments
from pretrain_exp.app.parent import ParentRun
from pretrain_exp.app.results import write_results
from pretrain_exp.app.run_name import MUTABLE_KEYS  # noqa: F401  (re-exported: the keys a re-run may change)
from pretrain_exp.app.tracking import NullTracker, Tracker, config_dict
from pretrain_exp.core.config import DEFAULT_HELD_OUT_ROWS
from pretrain_exp.core.distributed import is_main_process, local_rank, world_size
from pretrain_exp.core.errors import ConfigError, PretrainExpError, TrainingError
from pretrain_exp.core.io import disk_full_error, is_disk_full, write_text
from pretrain_exp.core.phases import PHASES
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.core.secrets import redact_obj
from pretrain_exp.data.hf_dataset import tokenize_dataset
from pretrain_exp.data.order import DataOrder, step_window
from pretrain_exp.data.prefetch import prefetch_rows, prefetch_window, resolve_prefetch
from pretrain_exp.data.rows import TrainingRows
from pretrain_exp.data.stream import WindowStream
from pretrain_exp.data.token_files import TokenFiles, dtype_for_vocab
from pretrain_exp.data.tokenize import load_tokenizer, tokenize_sources
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.frameworks.base import Checkpoint
from pretrain_exp.frameworks.registry import get_framework_class
from pretrain_exp.insertion import dynamic
from pretrain_exp.insertion.audit import AuditResult
from pretrain_exp.insertion.audit_job import BackgroundAudit
from pretrain_exp.insertion.items import LoadContext
from pretrain_exp.insertion.plan import Plan, build_plan
from pretrain_exp.insertion.schema import InsertionConf
from pretrain_exp.insertion.types import load_items, reserved_rows
from pretrain_exp.insertion.verify import rows_to_verify, verify_batches
from pretrain_exp.report.summary import print_table, summarize

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
    """One run's prepared state (data order, plan, framework); :meth:`run` executes the loop."""

    def __init__(self, cfg: ExperimentConfig, audit_beside: bool = True):
        """Prepare the run of ``cfg`` (module docstring, steps 1 and 2). ``audit_beside=False``: do not start the
        audit beside training (``insertion.audit=on``) here; the torchrun launcher builds an ``Experiment`` only to
        surface config and data errors before the ranks start, and rank 0 runs and collects the audit."""
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rundir = RunDir(self.run_dir)  #: the run dir's paths and readers
        self.main = is_main_process()  #: only rank 0 writes files, logs and evaluates
        t = cfg.training
        self.L, self.B = t.sequence_length, t.global_batch_size
        self.start_step, self.num_steps = cfg.model.checkpoint_step, t.num_steps
        self.end_step = self.start_step + self.num_steps  #: the run's last global step
        self.framework, self.tokenizer, self.vocab_size, self.order = run_data(cfg, progress=self.main)
        self.model_dir = self.framework.model_dir
        files = self.order.files
        self.window = step_window(self.start_step, self.num_steps, self.L, self.B)
        with PHASES.phase("permutation", instances=self.order.num_instances) as rec:
            rec["cached"] = self.order.prepare(self.start_step * self.B, self.num_steps * self.B)
        prefetch = resolve_prefetch(cfg.data.prefetch, files)
        self.window_fetched = prefetch in ("window", "stream") or not any(files.remote)
        self.stream: Optional[WindowStream] = None  #: ``data.prefetch=stream``: the window fetched beside training
        if prefetch == "window":  # remote rows of the run, fetched once
            with PHASES.phase("prefetch", mode="window") as rec:
                rec["fetched_bytes"] = prefetch_window(self.order, self.start_step * self.B, self.num_steps * self.B,
                                                       progress=self.main).fetched_bytes
        elif prefetch == "stream" and self.num_steps:  # started once the plan is verified (below)
            self.stream = WindowStream(self.order, self.start_step * self.B, self.num_steps * self.B,
                                       ahead_steps=cfg.data.prefetch_ahead_steps)
        self._check_held_out()
        self.dynamic: Optional[dynamic.DynamicConf] = cfg.insertion.dynamic  # parsed once, by validate.derive
        #: ``insertion.audit``: the natural-duplicate audit (``on``: beside training)
        self.auditor = RunAudit(cfg.insertion, self.rundir, self.order, self.window, cfg.data.held_out_rows,
                                self.tokenizer.eos_token_id, cfg.cache_dir, self.window_fetched, self._audited)
        self.plan = self._plan()
        self.rows = TrainingRows(self.order, self.plan, self.start_step * self.B, self.num_steps * self.B)
        if self.main and cfg.insertion.verify and self.plan.num_insertions:
            span = (self.rows.first_row, self.rows.first_row + len(self.rows))
            with PHASES.phase("verify", rows=int(self.plan.affected_rows().size)):
                if self.stream is not None:  # the rows the verifier reads, fetched before the stream starts
                    prefetch_rows(self.order, rows_to_verify(self.plan, span, seed=cfg.seed))
                verify_batches(self.plan, functools.partial(self.framework.peek_rows, self.rows),
                               self.order.row_tokens, span, world_size(), seed=cfg.seed)
        if self.stream is not None:  # one stream per node; from here every reader of the window waits for it
            with PHASES.phase("prefetch", mode="stream"):
                if local_rank() == 0:
                    self.stream.start()
                self.order.gate = self.stream.gate()
        if audit_beside:
            self.auditor.start()  # insertion.audit=on, not audited yet: beside training from here
        self.hf = HFExport(self.rundir, t.export_hf, self.end_step, self.main)  #: the run's HF exports
        #: ``insertion.dynamic``: the hook that decides each segment's additions
        self.dynamic_insertion = None if self.dynamic is None else DynamicInsertion(
            self.dynamic, self.history, self.rundir, cfg.insertion.seed, self._set_plan, self._write_plan,
            self._verify_segment if cfg.insertion.verify else None, self.main)

    def _check_held_out(self) -> None:
        """Resolve a null ``data.held_out_rows`` (:func:`fit_held_out`, logged when fewer than the default fit),
        then refuse held-out rows that the run or the checkpoint may train.

        :raises ConfigError: (``data.held_out_rows``) for a set value, or ``corpus_chunks`` rows, that collide.
        """
        reserved = reserved_rows(self.cfg.insertion.experiments)
        span = (self.window[0] // self.L, self.window[1] // self.L, self.order.rows_per_epoch,
                "data.paths" in self.cfg.framework.checkpoint_keys() and self.cfg.model.init != "random")
        if self.cfg.data.held_out_rows is None:
            n = fit_held_out(DEFAULT_HELD_OUT_ROWS, reserved, *span)
            if n < DEFAULT_HELD_OUT_ROWS and self.main:
                log.warning("data.held_out_rows: %d held-out row(s) at the end of the first epoch (not %d): the run%s "
                            "trains the rows before them%s; set data.held_out_rows to choose", n,
                            DEFAULT_HELD_OUT_ROWS, " and the checkpoint" if span[3] else "",
                            " (no held-out perplexity)" if n == 0 else "")
            self.cfg.data.held_out_rows = n
        why = held_out_collision(self.cfg.data.held_out_rows + reserved, *span)
        if why:
            raise ConfigError("data.held_out_rows", f"{why} (perplexity rows and corpus_chunks items); lower "
                              "data.held_out_rows or the corpus_chunks num_items, or train fewer steps")

    def _plan(self) -> Plan:
        cfg = self.cfg
        ctx = LoadContext(self.tokenizer, self.vocab_size, self.L, cfg.insertion.seed, cfg.cache_dir, self.order,
                          cfg.data.held_out_rows)
        with PHASES.phase("items", experiments=len(cfg.insertion.experiments)):
            items = {name: load_items(name, exp, ctx) for name, exp in cfg.insertion.experiments.items()}
        with PHASES.phase("plan") as rec:
            plan = build_plan(items, cfg.insertion.experiments, self.window, self.L, self.B,
                              cfg.insertion.seed, self.vocab_size)
            rec["insertions"] = plan.num_insertions
        if cfg.insertion.withheld:  # placed with the others (same positions), then left out
            plan = plan.without(cfg.insertion.withheld)
            items = {name: s for name, s in items.items() if name not in cfg.insertion.withheld}
        self.items, static = items, plan
        path = self.rundir.plan
        exists = path.is_file()
        saved_plan = Plan.load(path) if exists else None
        if exists:  # a re-run: an input of the plan that changed is named before its saved decisions are re-applied
            check_same_items(saved_plan, static, cfg.insertion.experiments, self.run_dir)
        #: the plan after each decision (``insertion.dynamic``): on a re-run the saved decisions, re-applied
        self.history = PlanHistory.resume(static, self.rundir, self.dynamic is not None)
        plan = self.history.current
        saved = saved_plan.digest() if exists else None
        if exists and saved not in self.history.digests():
            raise RunDirConflict("insertion", f"{path} holds another plan than this config gives, though the "
                                 "config and the items are the same (the corpus, the tokenizer or the program's "
                                 "placement changed since the run started)", "restore them")
        with PHASES.phase("audit", mode=cfg.insertion.audit.value) as rec:
            self.audit, fresh = self.auditor.audit(static, items) if self.main else (None, False)
            rec["computed"] = fresh
        if self.main and (not exists or fresh or saved != plan.digest()):  # items.jsonl carries the audit's counts
            with PHASES.phase("plan saved"):
                self._write_plan(plan)
        log.info("plan: %d items, %d insertions, %d tokens (%.2f%% of the %d-token window)", plan.num_items,
                 plan.num_insertions, int(plan.lengths.sum()),
                 100 * plan.lengths.sum() / max(1, self.window[1] - self.window[0]), self.window[1] - self.window[0])
        if plan.num_items and self.window[1] == self.window[0]:
            log.info("plan: nothing inserted (no steps to train): all %d items are dup-0 controls", plan.num_items)
        if plan.noise_rows.size:
            log.info("plan: %d rows with gaussian noise (%s)", plan.noise_rows.size, plan.noise_sigma)
        return plan

    def _write_plan(self, plan: Plan) -> None:
        """Save ``plan.npz``, ``manifest.jsonl`` and ``items.jsonl`` (dynamic spans with the segment that
        decided them)."""
        fields = {}
        for rec in self.history.additions:
            for p in rec["positions"]:
                fields[int(p)] = {"decided_at": rec["decided_at"], "segment": rec["segment"]}
        plan.write_manifest(self.rundir.manifest, self.items,
                            self.audit.item_records(plan) if self.audit is not None else None, fields,
                            items_path=self.rundir.items)
        plan.save(self.rundir.plan)

    @property
    def plans(self) -> list:
        """``[(decided_at, plan), ...]``: the static plan (decided at -1), then the plan after each dynamic
        decision (:class:`~pretrain_exp.app.dynamic_hook.PlanHistory`)."""
        return self.history.plans

    def plan_for_step(self, step: int) -> Plan:
        """The plan as of checkpoint ``step``: static plus the additions decided before ``step``."""
        return self.history.for_step(step)

    def _set_plan(self, plan: Plan) -> None:
        """A dynamic decision's plan: the one the training rows read from now on."""
        self.plan = self.rows.plan = plan

    def _verify_segment(self, a: int, b: int) -> None:
        """Verify the spans inside steps ``a+1 .. b`` (static and dynamic) on the framework's batches."""
        p, span = self.plan, self.L * self.B
        keep = (p.span_positions >= a * span) & (p.span_positions + p.span_lengths <= b * span)
        sub = Plan(p.sequence_length, p.global_batch_size, p.window, p.experiments, p.token_offsets, p.tokens,
                   p.item_experiment, p.item_dup_count, p.span_positions[keep], p.span_item_ids[keep],
                   p.span_dup_index[keep], p.item_noise_seed, p.noise_sigma)
        verify_batches(sub, functools.partial(self.framework.peek_rows, self.rows), self.order.row_tokens,
                       (a * self.B, b * self.B), world_size(), seed=self.cfg.seed + a)

    @property
    def _audit_job(self) -> Optional[BackgroundAudit]:
        """``insertion.audit=on``: the audit beside training while it runs (:class:`RunAudit`)."""
        return self.auditor.job

    @property
    def audit_wait_s(self) -> float:
        """Seconds the run's end waited for the audit beside training."""
        return self.auditor.wait_s

    def finish_audit(self, wait: bool = True) -> None:
        """Collect the audit running beside training (``insertion.audit=on``, :meth:`RunAudit.finish
        <pretrain_exp.app.audit_hook.RunAudit.finish>`): wait for it (without ``wait``: only if it has ended); the
        run's results then carry it (:meth:`_write_results` calls this).

        :raises InsertionError: if the audit failed (a re-run of the same command audits again).
        """
        self.auditor.finish(wait)

    def _audited(self, res: AuditResult) -> None:
        """The audit beside training is done: ``items.jsonl`` gets its counts."""
        self.audit = res
        self._write_plan(self.plan)

    # --- evaluation -------------------------------------------------------------------------------------
    @functools.cached_property
    def held_out(self) -> np.ndarray:
        """The held-out rows' tokens, read once: ``int64`` array of shape ``(data.held_out_rows, L)``."""
        rows = self.order.held_out_rows(self.cfg.data.held_out_rows)
        return np.stack([self.order.row_tokens(int(q)) for q in rows]) if rows.size else np.empty((0, self.L), np.int64)

    @functools.cached_property
    def parent(self) -> Optional[ParentRun]:
        """The finished run this one continues (``parent=``, :mod:`~pretrain_exp.app.parent`), if any."""
        return ParentRun.open(self.cfg.parent) if self.cfg.parent else None

    @functools.cached_property
    def _parent_measured(self) -> Tuple[Optional[Plan], Optional[InsertionConf]]:
        """A continued run's evals: the parent's plan and its experiments beside this run's."""
        if self.parent is None:
            return None, None
        ins = dataclasses.replace(self.cfg.insertion, experiments={**self.parent.experiments(),
                                                                   **self.cfg.insertion.experiments})
        return self.parent.plan(), ins

    def eval_plan(self, step: int) -> Plan:
        """What the evals of checkpoint ``step`` measure: the plan as of ``step`` (:meth:`plan_for_step`), after a
        continued run's parent's plan (:meth:`Plan.then <pretrain_exp.insertion.plan.Plan.then>`)."""
        plan, (before, _) = self.plan_for_step(step), self._parent_measured
        return plan if before is None else before.then(plan)

    def _eval_context(self, model, step: int) -> EvalContext:
        """What an eval of the checkpoint at global step ``step`` reads besides ``model``."""
        e = self.cfg.eval
        return EvalContext(model, self.tokenizer, self.eval_plan(step), self.held_out, step, e.batch_size,
                           self.cfg.seed, self.cfg.cache_dir, row_tokens=self.rows.row,
                           insertion=self._parent_measured[1] or self.cfg.insertion, permutations=e.permutations,
                           p_adjust=e.p_adjust)

    def _worker_config(self) -> Tuple[Path, bool]:
        """The config file the background eval processes read (``eval.mode=async``): ``config.resolved.yaml``, or,
        for a config with credentials, which that file has redacted, a copy readable by this user only (``private``:
        removed at the end). Returns ``(file, private)``."""
        config, private = self.rundir.config, holds_credentials(self.cfg)
        if private:
            fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".yaml", dir=self.run_dir)  # mode 0600
            with os.fdopen(fd, "w") as f:
                f.write(OmegaConf.to_yaml(OmegaConf.create(config_dict(self.cfg))))
            config = Path(tmp)
        return config, private

    def evaluator(self, tracker, initial: Optional[Checkpoint] = None) -> Evaluator:
        """The run's evaluator of ``eval.mode`` (:func:`~pretrain_exp.app.evaluator.make_evaluator`), logging to
        ``tracker``; ``initial``: the initial checkpoint, evaluated by its ``pre_train`` if asked."""
        return make_evaluator(self.cfg.eval, self.rundir, self.hf, self._eval_context, tracker, self.main, initial,
                              self.start_step, self.end_step, worker_config=self._worker_config,
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
        """Execute the loop (module docstring): prepare → for each segment: ``pre_segment`` hooks → training with
        retries → ``post_segment`` hooks → ``post_train`` hooks, results → release → ``close`` hooks
        (:mod:`~pretrain_exp.app.hooks`). Returns the ``results.json`` content (``{}`` on ranks other than 0)."""
        self._check_release()
        t_start = time.perf_counter()
        timing: list = []  #: per trained segment of this invocation: ``{step, train_s, segment_end_s}``
        with PHASES.phase("tracker"):
            tracker_cm = Tracker(self.cfg) if self.main else NullTracker()
        with tracker_cm as tracker:
            ckpt, initial = self._resume_point()
            evaluator = self.evaluator(tracker, initial)
            hooks = self.hooks(evaluator)
            try:
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
                    timing.append({"step": ckpt.step, "train_s": t1 - t0, "segment_end_s": time.perf_counter() - t1})
                t0 = time.perf_counter()
                self.framework.finish_checkpoints()  # the last segment's checkpoint may still be being written
                checkpoint_wait_s = time.perf_counter() - t0
                if not self.main:
                    return {}
                t0 = time.perf_counter()
                hooks.post_train()  # async: the wait for the background evals
                wait_s = time.perf_counter() - t0
                # this invocation's segments: training (with the checkpoint save), then what the segment's end held
                # the run for (export, evals or their launch); the final wait for background evals
                results = self._write_results(tracker, evaluator.evaluated, t_start, ckpt, initial, {
                    "eval_mode": self.cfg.eval.mode.value, "segments": timing, "final_eval_wait_s": wait_s,
                    "final_checkpoint_wait_s": checkpoint_wait_s, "phases": PHASES.summary()})
            except BaseException as e:
                hooks.on_error(e)
                raise
        if self.cfg.release.push_to_hub:
            self.release()
        hooks.close()
        return results

    def hooks(self, evaluator: Evaluator) -> Hooks:
        """The run's components, in the order their hooks run: dynamic insertion, the kept HF export, the
        evaluator, the audit beside training, the cleanup."""
        return Hooks([self.dynamic_insertion, self.hf, evaluator, self.auditor,
                      RunDirCleanup(self.rundir, self.cfg.training.cleanup, self.framework.latest_checkpoint)])

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

    def release(self) -> dict:
        """Bundle this finished run and push it (``release.*``, :func:`pretrain_exp.report.release.release`);
        returns the bundle's record.

        :raises PushError: if the push fails; the bundle stays in ``release.out_dir`` and the logged
            ``pretrain-exp-release`` command retries it.
        """
        from pretrain_exp.core.errors import PushError
        from pretrain_exp.report.release import release

        r = self.cfg.release
        out = Path(r.out_dir) if r.out_dir else self.rundir.release
        retry = f"pretrain-exp-release {self.run_dir} {out} --push {r.repo_id}" + (" --private" if r.private else "")
        try:
            (rec,) = release(self.run_dir, out, r.repo_id, push=True, private=r.private, revision=r.revision,
                             license_id=r.license)
        except PushError as e:
            raise PushError(f"{e} (retry: {retry})") from None
        log.info("released %s: model and dataset repos %s (bundle %s)", self.cfg.run_name, r.repo_id, out)
        return rec

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
            return self._write_results(tracker, evaluated, t_start, held[chosen[-1]], initial, timing)

    def _write_results(self, tracker, evaluated: Dict[int, Dict[str, dict]], t_start: float, last: Checkpoint,
                       initial: Checkpoint, timing: Optional[dict]) -> dict:
        """Collect the audit beside training (:meth:`finish_audit`), summarize the run (with ``timing`` and the
        ``dynamic`` table) and write ``results.json``, the run's tables and plots
        (:func:`~pretrain_exp.app.results.write_results`)."""
        self.finish_audit()
        if timing is not None and self.audit_wait_s:
            timing["final_audit_wait_s"] = self.audit_wait_s
        if timing is not None and self.order.gate is not None:  # this process's waits for the window stream
            timing["data_stall_s"] = self.order.gate.stall_s
        audit = self.rundir.read_audit() if self.audit is not None else None
        if audit is not None and self.dynamic_insertion is not None:  # audited on the static plan: final dup counts
            audit = self.dynamic_insertion.final_audit(audit)
        all_evaluated = self.rundir.all_evals()
        # a continued run: its parent's evaluated steps before its own (one loss-over-steps curve across both)
        joined = all_evaluated if self.parent is None else {**self.parent.evals(), **all_evaluated}
        results = summarize(self.cfg, self.plan, evaluated, joined, time.perf_counter() - t_start, audit)
        if self.parent is not None:
            results["parent"] = self.parent.entry()
        layouts = self.rundir.read_layouts()
        if layouts:  # the device layout of each trained segment
            results["layouts"] = layouts
        if timing is not None:
            results["timing"] = timing
        if self.dynamic_insertion is not None:
            results["dynamic"] = self.dynamic_insertion.summary(self.end_step)
        return write_results(self.rundir, tracker, results, all_evaluated, last, initial)

    def train_with_retries(self, start: Checkpoint, until_step: int, tracker) -> Checkpoint:
        """Train from ``start`` to global step ``until_step`` (:meth:`_train_segment`), retrying runtime failures
        (``training.max_retries``, :func:`with_retries`); ``start`` itself when it is there already."""
        if start.step >= until_step:
            return start
        t = self.cfg.training
        return with_retries(functools.partial(self._train_segment, start, until_step, tracker), t.max_retries,
                            t.retry_base_delay_s, f"training steps {start.step}->{until_step}")

    def _record_layout(self, from_step: int, to_step: int) -> None:
        """Append the device layout that trained steps ``from_step+1 .. to_step`` to ``layouts.jsonl`` (a run may
        resume on another layout: :data:`~pretrain_exp.app.run_name.LAYOUT_KEYS`)."""
        t = self.cfg.training
        rec = {"from_step": from_step, "to_step": to_step, "world_size": world_size(), "nnodes": t.nnodes,
               "nproc_per_node": t.nproc_per_node, "micro_batch_size": t.micro_batch_size,
               "data_parallel": t.data_parallel, "gradient_accumulation": t.global_batch_size // max(
                   1, t.micro_batch_size * world_size())}
        with open(self.rundir.layouts, "a", encoding="utf-8") as f:  # one whole line per segment
            f.write(json.dumps(rec) + "\n")

    def _train_segment(self, start: Checkpoint, until_step: int, tracker) -> Checkpoint:
        """One segment of training, one console line per logged step (and a progress bar) on the main process
        (:mod:`pretrain_exp.app.console`); a full disk (which a retry cannot fix) is a :class:`StorageError` naming
        the checkpoint being written."""
        try:
            if not self.main:
                return self.framework.train(start, until_step, self.rows, tracker.log)
            with segment_lines(tracker.log, start.step, until_step, self.end_step) as log_fn:
                ckpt = self.framework.train(start, until_step, self.rows, log_fn)
            self._record_layout(start.step, ckpt.step)
            return ckpt
        except Exception as e:
            if isinstance(e, PretrainExpError) or not is_disk_full(e):
                raise
            named = next((x.filename for x in (e, e.__cause__, e.__context__) if getattr(x, "filename", None)), None)
            ckpts = Path(getattr(self.framework, "checkpoint_dir", self.rundir.checkpoints))
            newest = (max(ckpts.iterdir(), key=lambda p: p.stat().st_mtime_ns, default=ckpts) if ckpts.is_dir()
                      else ckpts)  # the checkpoint being written
            raise disk_full_error(f"training steps {start.step}->{until_step} wrote", named or newest, e) from e


def fit_held_out(default: int, reserved: int, first_row: int, end_row: int, rows_per_epoch: int,
                 checkpoint_trained_order: bool) -> int:
    """The most held-out rows, at most ``default``, that together with ``reserved`` rows before them
    (``corpus_chunks`` items) provably stay untrained (:func:`held_out_collision`); 0 when none do."""
    for n in range(default, 0, -1):
        if held_out_collision(n + reserved, first_row, end_row, rows_per_epoch, checkpoint_trained_order) is None:
            return n
    return 0


def held_out_collision(n: int, first_row: int, end_row: int, rows_per_epoch: int,
                       checkpoint_trained_order: bool) -> Optional[str]:
    """Why the ``n`` held-out rows ``[rows_per_epoch - n, rows_per_epoch)`` (the first epoch's last rows,
    :meth:`DataOrder.held_out_rows <pretrain_exp.data.order.DataOrder.held_out_rows>`) may have been trained, or
    ``None`` when they provably were not. The run trains rows ``[first_row, end_row)``; with
    ``checkpoint_trained_order`` (an OLMo checkpoint whose data order the run continues) the checkpoint trained
    ``[0, first_row)`` too, so every row before ``end_row`` counts (past the first epoch, all of it)."""
    if not n:
        return None
    start = rows_per_epoch - n
    if checkpoint_trained_order and end_row > start:
        return (f"the checkpoint and the run train rows [0, {end_row}) of their data order, which reach the {n} "
                f"held-out rows [{start}, {rows_per_epoch}) of the first epoch")
    if first_row < rows_per_epoch and end_row > start:
        return (f"the run trains rows [{first_row}, {end_row}), which reach the {n} held-out rows "
                f"[{start}, {rows_per_epoch}) of the first epoch")
    return None


def run_data(cfg: ExperimentConfig, progress: bool = True):
    """The framework, tokenizer, vocabulary size and data order of a run (what :class:`Experiment` and
    :mod:`~pretrain_exp.app.inspect` build from a config; the corpus is tokenized once into the cache).

    :returns: ``(framework, tokenizer, vocab_size, DataOrder)``.
    """
    framework_class = get_framework_class(cfg.framework.name)
    with PHASES.phase("model resolved", framework=cfg.framework.name):
        framework = framework_class(cfg, framework_class.resolve_model(cfg))
    with PHASES.phase("tokenizer"):
        tokenizer = load_tokenizer(framework.tokenizer_path, cfg.cache_dir)
        vocab_size = framework.vocab_size or len(tokenizer)
    d = cfg.data
    with PHASES.phase("corpus", tokenized=not d.paths):
        paths = d.paths or (tokenize_dataset(d.dataset, tokenizer, d.token_dir, d.split, d.subset, d.text_key,
                                             d.num_proc, progress=progress) if d.dataset else
                            tokenize_sources(d.text, tokenizer, d.token_dir, cfg.cache_dir, d.text_key))
    # one token-file dtype for the order, the plan and the framework's reader: the data config's (an OLMo
    # checkpoint's data.memmap_dtype / dataset.dtype), else the vocabulary's
    with PHASES.phase("size index", files=len(paths)) as rec:
        files = TokenFiles(paths, cfg.data.dtype or dtype_for_vocab(max(vocab_size, len(tokenizer))),
                           cache_dir=cfg.cache_dir, prefixes=cfg.data.path_prefixes, progress=progress)
        rec["remote"] = int(sum(files.remote))
    L = cfg.training.sequence_length
    order = DataOrder(files, L, cfg.training.global_batch_size, cfg.data.seed, cfg.data.first_epoch,
                      cache_dir=cfg.cache_dir, chunk=(cfg.data.max_target_sequence_length or L) // L)
    return framework, tokenizer, vocab_size, order


def save_resolved_config(cfg: ExperimentConfig, run_dir: Path) -> Path:
    """Write ``config.resolved.yaml`` (what re-runs compare with and workers read; no Hydra interpolations left),
    credentials redacted (:func:`~pretrain_exp.core.secrets.redact_obj`: a URL's userinfo and query string, the
    values of secret environment variables)."""
    path = RunDir(run_dir).config
    write_text(path, OmegaConf.to_yaml(OmegaConf.create(redact_obj(config_dict(cfg)))))
    return path


def holds_credentials(cfg: ExperimentConfig) -> bool:
    """Whether redaction changes the config (then ``config.resolved.yaml`` cannot stand in for it)."""
    plain = config_dict(cfg)
    return redact_obj(plain) != plain


def _flatten(d: dict, prefix: str = "") -> Dict[str, object]:
    out: Dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


class RunDirConflict(ConfigError):
    """A refusal to reuse a run dir: ``what`` differs from the run it holds (a config key old -> new, an input file
    whose content changed), ``restore`` what brings that run back (``"restore its content"``); the message ends with
    the one way out, a run dir of its own (:func:`~pretrain_exp.app.run_name.own_run_dir`, ``name=<new name>``)."""

    def __init__(self, key: str, what: str, restore: str, way_out: Optional[str] = None):
        from pretrain_exp.app.run_name import own_run_dir

        self.what, self.restore = what, restore
        super().__init__(key, f"{what}; {restore} to resume that run, or {way_out or own_run_dir()}")


def _experiment_items(plan: Plan, name: str) -> Tuple[np.ndarray, np.ndarray]:
    """The items of experiment ``name`` in ``plan``: their lengths ``int64 (n,)`` and tokens ``int64 (sum,)``."""
    sel = plan.item_experiment == plan.experiments.index(name)
    lengths = np.diff(plan.token_offsets)
    return lengths[sel], plan.tokens[np.repeat(sel, lengths)].astype(np.int64)


def check_same_items(saved: Plan, plan: Plan, experiments: dict, run_dir: Path) -> None:
    """Refuse a re-run whose items differ from those of the plan its run dir holds (``saved``) for an experiment
    of both, though the config is the same: an input changed since the run started.

    :param experiments: ``insertion.experiments`` (name -> its config; ``file``: the items file).
    :raises RunDirConflict: naming the experiment's items file and that its content changed (or, without a file,
        that the items it reads or generates changed).
    """
    changed = [e for e in plan.experiments if e in saved.experiments
               and any(not np.array_equal(a, b) for a, b in zip(_experiment_items(saved, e),
                                                                _experiment_items(plan, e)))]
    if not changed:
        return
    name, more = changed[0], (f" (and the items of {', '.join(changed[1:])})" if changed[1:] else "")
    file = getattr(experiments.get(name), "file", None)
    if file:
        raise RunDirConflict(f"insertion.experiments.{name}.file",
                             f"the items file {Path(file).resolve()} changed content since the run in {run_dir} "
                             f"started{more}", "restore its content")
    raise RunDirConflict(f"insertion.experiments.{name}",
                         f"its items differ from those the run in {run_dir} started with, though the config is the "
                         f"same (what they are read or generated from changed){more}", "restore it")


def check_same_run(cfg: ExperimentConfig, run_dir: Path) -> None:
    """Refuse to continue a run dir that was started with a different training config.

    :raises RunDirConflict: naming the first keys that differ from the run dir's ``config.resolved.yaml`` (old ->
        new).
    """
    path = RunDir(run_dir).config
    if not path.is_file():
        return
    old = _flatten(_as_derived(OmegaConf.to_container(OmegaConf.load(path)), cfg))
    new = _flatten(redact_obj(config_dict(cfg)))  # as the file holds it
    diff = [k for k in sorted(set(old) | set(new))
            if not k.startswith(MUTABLE_KEYS) and old.get(k) != new.get(k)]
    if diff:
        raise RunDirConflict(diff[0], f"run dir {run_dir} holds another run: {describe_difference(old, new, diff)}",
                             "re-run its own command")


def _as_derived(old: dict, cfg: ExperimentConfig) -> dict:
    """A run dir's saved config as :func:`~pretrain_exp.app.validate.derive` leaves it today: a file written before
    ``insertion.dynamic`` was saved parsed holds it as given (its ``task`` unset, newer options missing), so it is
    parsed the same way (against ``cfg``'s experiments and tasks) before the comparison."""
    ins = old.get("insertion")
    if isinstance(ins, dict) and ins.get("dynamic") is not None:
        try:
            parsed = dynamic.parse_dynamic(ins["dynamic"], cfg.insertion.experiments, cfg.eval.tasks)
        except ConfigError:  # not valid today: compared as saved, so the difference is named
            return old
        ins["dynamic"] = None if parsed is None else config_dict(parsed)
    return old


def describe_difference(old: Dict[str, object], new: Dict[str, object], diff: list) -> str:
    """In plain words, what this config changes against a run dir's (flattened configs, ``diff`` their differing
    keys): experiments added or dropped, then up to three changed settings."""
    def experiments(flat):
        return {k.split(".")[2] for k in flat if k.startswith("insertion.experiments.") and k.count(".") >= 3}

    before, after = experiments(old), experiments(new)
    parts = []
    if after - before:
        parts.append("this run adds experiment " + ", ".join(f"`{e}`" for e in sorted(after - before)))
    if before - after:
        parts.append("this run drops experiment " + ", ".join(f"`{e}`" for e in sorted(before - after)))
    moved = {f"insertion.experiments.{e}." for e in before ^ after}
    rest = [k for k in diff if not k.startswith(tuple(moved))]
    shown = [f"{k} {'is new' if k not in old else 'is gone' if k not in new else 'changes'}"
             + (f" ({old.get(k)!r} -> {new.get(k)!r})" if k in old and k in new else "") for k in rest[:3]]
    if len(rest) > 3:
        shown.append(f"{len(rest) - 3} more setting(s)")
    if shown:
        parts.append(("it was started with different settings: " if not parts else "and ") + ", ".join(shown))
    return "; ".join(parts)


def run(cfg: ExperimentConfig) -> dict:
    """Run one experiment end to end in this process (one rank of it under torchrun; module docstring).

    :returns: the ``results.json`` content (``{}`` on ranks other than 0).
    """
    if cfg.training.num_threads > 0:
        torch.set_num_threads(cfg.training.num_threads)
    run_dir = Path(cfg.run_dir).resolve()
    if is_main_process():
        run_dir.mkdir(parents=True, exist_ok=True)
        check_same_run(cfg, run_dir)
        save_resolved_config(cfg, run_dir)
        PHASES.attach(run_dir)
    exp = Experiment(cfg)
    results = exp.run()
    if results:
        print_table(results)
    return results

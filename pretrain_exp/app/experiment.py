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
   every) segment's checkpoint in ``hf/step<N>/`` (``training.export_hf``; OLMo-core checkpoints), and evaluate
   every segment's checkpoint into ``evals/step<N>/<task>.json`` (all evals of a step read one HF export);
5. write ``results.json``, the plot, print the table.

With ``insertion.dynamic`` (:mod:`~pretrain_exp.insertion.dynamic`) each segment ``(a, b]`` starts with a decision
on the insertion losses evaluated at step ``a``: its additions are saved to ``dynamic/step<a>.json`` before the
segment trains, appended to the plan (``plan.npz``, ``manifest.jsonl`` with ``decided_at``/``segment``), handed to
the framework through the rows' plan and verified on the segment's batches; results.json gets a ``dynamic`` table.

Re-running the same command in the same run dir resumes: finished segments and evals are skipped and training
continues from the newest checkpoint (bit-identical to an uninterrupted run on CPU).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, TypeVar

import numpy as np
import torch
from omegaconf import OmegaConf

from pretrain_exp.app import async_eval
from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.app.console import segment_lines
from pretrain_exp.app.run_name import MUTABLE_KEYS  # noqa: F401  (re-exported: the keys a re-run may change)
from pretrain_exp.app.tracking import NullTracker, Tracker, config_dict
from pretrain_exp.core.config import DEFAULT_HELD_OUT_ROWS, Cleanup, EvalMode, ExportHF
from pretrain_exp.core.distributed import barrier, init_process_group, is_main_process, local_rank, world_size
from pretrain_exp.core.errors import CheckpointError, ConfigError, InsertionError, PretrainExpError, TrainingError
from pretrain_exp.core.io import disk_full_error, is_disk_full, write_json, write_text
from pretrain_exp.core.logs import phase_progress
from pretrain_exp.core.phases import PHASES
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.core.secrets import redact_obj
from pretrain_exp.data.hf_dataset import tokenize_dataset
from pretrain_exp.data.order import DataOrder, step_window
from pretrain_exp.data.prefetch import prefetch_rows, prefetch_window, resolve_prefetch
from pretrain_exp.data.rows import TrainingRows
from pretrain_exp.data.stream import WindowStream
from pretrain_exp.data.token_files import TokenFiles, dtype_for_vocab
from pretrain_exp.data.tokenize import load_tokenizer, tokenize_source
from pretrain_exp.evals.base import EvalContext, EvalResult
from pretrain_exp.evals.registry import EVALS, run_eval
from pretrain_exp.evals.shard import sharded
from pretrain_exp.frameworks.base import Checkpoint
from pretrain_exp.frameworks.registry import get_framework_class
from pretrain_exp.insertion import dynamic
from pretrain_exp.insertion.audit import AuditResult, audit_key, audit_plan, default_workers, item_contents
from pretrain_exp.insertion.audit_job import BackgroundAudit
from pretrain_exp.insertion.items import LoadContext
from pretrain_exp.insertion.plan import Plan, build_plan
from pretrain_exp.insertion.schema import AuditMode
from pretrain_exp.insertion.types import load_items, reserved_rows
from pretrain_exp.insertion.verify import rows_to_verify, verify_batches
from pretrain_exp.report.plots import plot_loss_vs_step, plot_per_dup
from pretrain_exp.report.summary import print_table, summarize
from pretrain_exp.report.tables import write_run_tables

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

    def __init__(self, cfg: ExperimentConfig):
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rundir = RunDir(self.run_dir)  #: the run dir's paths and readers
        self.main = is_main_process()  #: only rank 0 writes files, logs and evaluates
        t = cfg.training
        self.L, self.B = t.sequence_length, t.global_batch_size
        self.start_step, self.num_steps = cfg.model.checkpoint_step, t.num_steps
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
        self._audit_job: Optional[BackgroundAudit] = None  #: ``insertion.audit=on``: the audit beside training
        self.audit_wait_s = 0.0  #: seconds the run's end waited for it
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
        if self._audit_job is not None:  # insertion.audit=on, not audited yet: beside training from here
            self._audit_job.start()

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
        #: ``(decided_at, plan after that decision)``, the static plan first (decided_at -1)
        self.plans = [(-1, plan)]
        self.additions = dynamic.load_additions(self.run_dir) if self.dynamic else []
        for rec in self.additions:  # resume: the saved decisions, re-applied in order
            plan = dynamic.apply_additions(plan, rec, dynamic.additions_path(self.run_dir, rec["decided_at"]))
            self.plans.append((rec["decided_at"], plan))
        path = self.rundir.plan
        exists = path.is_file()
        saved = Plan.load(path).digest() if exists else None
        if exists and saved not in {p.digest() for _, p in self.plans}:
            raise ConfigError("insertion", f"{path} holds the plan of a different config; use a new run dir "
                              "(hydra.run.dir=...) or restore the original config")
        with PHASES.phase("audit", mode=cfg.insertion.audit.value) as rec:
            self.audit, fresh = self._audit(static, items) if self.main else (None, False)
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
        for rec in self.additions:
            for p in rec["positions"]:
                fields[int(p)] = {"decided_at": rec["decided_at"], "segment": rec["segment"]}
        plan.write_manifest(self.rundir.manifest, self.items,
                            self.audit.item_records(plan) if self.audit is not None else None, fields,
                            items_path=self.rundir.items)
        plan.save(self.rundir.plan)

    def plan_for_step(self, step: int) -> Plan:
        """The plan as of checkpoint ``step``: static plus the additions decided before ``step``."""
        return [p for at, p in self.plans if at < step][-1]

    # --- closed loop ------------------------------------------------------------------------------------
    def loss_history(self, upto: int) -> Dict[int, dynamic.Losses]:
        """Evaluated step (``<= upto``) -> item losses of the dynamic policy's ``insertion_loss`` task."""
        out = {}
        for step, _ in self.rundir.eval_steps():
            f = self.rundir.evals(step, self.dynamic.task)
            if step <= upto and f.is_file():
                out[step] = dynamic.read_losses(f)
        return out

    def add_dynamic(self, a: int, b: int) -> None:
        """Decide (rank 0; from the losses at step ``a``), save, apply and verify the additions of segment
        ``(a, b]``; a decision saved earlier was applied by :meth:`_plan` and is left alone.

        :raises InsertionError: if the segment cannot hold the copies, or they did not land (verification).
        """
        if any(at == a for at, _ in self.plans):
            return
        path = dynamic.additions_path(self.run_dir, a)
        if self.main:
            history = self.loss_history(a)
            if a in history:
                rec = dynamic.decide(self.plan, self.dynamic, a, b, history, self.cfg.insertion.seed)
                dynamic.save_additions(self.run_dir, rec)
        barrier()
        if not path.is_file():  # no evals at a (the first segment without eval.on_load): static only
            return
        rec = json.loads(path.read_text())
        self.plan = dynamic.apply_additions(self.plan, rec, path)
        self.plans.append((a, self.plan))
        self.additions.append(rec)
        self.rows.plan = self.plan
        log.info("dynamic (%s): decided at step %d: %d item(s), %d copies in steps %d..%d", rec["policy"], a,
                 len(rec["items"]), len(rec["positions"]), a + 1, b)
        if self.main:
            self._write_plan(self.plan)
            if self.cfg.insertion.verify and len(rec["positions"]):
                self._verify_segment(a, b)

    def _verify_segment(self, a: int, b: int) -> None:
        """Verify the spans inside steps ``a+1 .. b`` (static and dynamic) on the framework's batches."""
        p, span = self.plan, self.L * self.B
        keep = (p.span_positions >= a * span) & (p.span_positions + p.span_lengths <= b * span)
        sub = Plan(p.sequence_length, p.global_batch_size, p.window, p.experiments, p.token_offsets, p.tokens,
                   p.item_experiment, p.item_dup_count, p.span_positions[keep], p.span_item_ids[keep],
                   p.span_dup_index[keep], p.item_noise_seed, p.noise_sigma)
        verify_batches(sub, functools.partial(self.framework.peek_rows, self.rows), self.order.row_tokens,
                       (a * self.B, b * self.B), world_size(), seed=self.cfg.seed + a)

    def _audit(self, plan: Plan, items) -> tuple[Optional[AuditResult], bool]:
        """The natural-duplicate audit of ``plan`` (:mod:`~pretrain_exp.insertion.audit`): read from
        ``audit.json`` when it audited this plan with this n, or from the audit cache, else computed and saved:
        here with ``strict``, which raises for a control found in the window; with ``on`` beside training
        (:class:`~pretrain_exp.insertion.audit_job.BackgroundAudit`, started by ``__init__`` once the run is ready
        to train, collected by :meth:`finish_audit`).

        :returns: ``(result or None when off, skipped or beside training, whether it was computed now)``.
        :raises InsertionError: ``insertion.audit=strict`` and a dup-0 control occurs in the window, naming the
            item and where (step, row, offset).
        """
        ins = self.cfg.insertion
        if ins.audit == AuditMode.off or not plan.num_items:
            return None, False
        if ins.audit == AuditMode.on and not self.window_fetched:
            log.warning("audit skipped: the window's token files are remote and not prefetched "
                        "(data.prefetch=window or insertion.audit=strict runs it)")
            return None, False
        path = self.rundir.audit
        res, fresh = None, False
        if path.is_file():
            old = AuditResult.load(path)
            if old.plan_digest == plan.digest() and old.n == ins.audit_ngram:
                res = old
        if res is None:
            window_rows = np.arange(self.window[0] // self.L, self.window[1] // self.L, dtype=np.int64)
            held_rows = self.order.held_out_rows(self.cfg.data.held_out_rows)
            o = self.order
            key = audit_key(item_contents(plan, self.tokenizer.eos_token_id), ins.audit_ngram, self.L,
                            [(f if isinstance(f, str) else f"{f.resolve()}@{f.stat().st_mtime_ns}", int(b))
                             for f, b in zip(o.files.paths, o.files.num_bytes)],
                            o.files.dtype.name, window_rows, o.instances(int(window_rows[0]), window_rows.size)
                            if window_rows.size else window_rows, held_rows,
                            np.array([o.instance(int(q))[1] for q in held_rows], np.int64))
            shared = Path(self.cfg.cache_dir) / "audits" / f"{key}.json"
            if shared.is_file():  # another job of the sweep audited these rows and items
                with contextlib.suppress(CheckpointError):
                    res = AuditResult.load(shared)
                    res.plan_digest = plan.digest()
                    log.info("audit: reused %s (the same window rows, held-out rows and items)", shared)
            if res is None and ins.audit == AuditMode.on:  # beside training: nothing of it before step 1
                self._audit_job = BackgroundAudit(
                    plan, o, (self.window[0] // self.L, self.window[1] // self.L), held_rows, ins.audit_ngram,
                    self.tokenizer.eos_token_id, ins.audit_workers or default_workers(), path, shared, "on")
                return None, False
            if res is None:
                res = audit_plan(plan, o.row_tokens, window_rows, held_rows, ins.audit_ngram,
                                 strip=self.tokenizer.eos_token_id, workers=ins.audit_workers or default_workers())
                res.save(shared, plan, ins.audit.value)
            fresh = True
        if fresh:  # also when strict refuses: the full table of what was found
            res.save(path, plan, ins.audit.value)
        self._report_audit(res, plan, items)
        return res, fresh

    def _report_audit(self, res: AuditResult, plan: Plan, items) -> None:
        """Log the controls found in the window and the items in the held-out rows; ``strict`` refuses a control
        found in the window (:meth:`_audit`)."""
        ins = self.cfg.insertion
        labels = [f"{it.experiment}[{it.index}] {it.source}" for name in plan.experiments for it in items[name]]
        bad = res.contaminated_controls(plan)
        if bad and ins.audit == AuditMode.strict:
            more = f"; {len(bad) - 1} more control(s) in {RunDir.AUDIT}" if len(bad) > 1 else ""
            raise InsertionError(f"insertion.audit=strict: control {res.describe(plan, bad[0], labels)}{more}")
        for i in bad[:10]:
            log.warning("audit: control %s", res.describe(plan, i, labels))
        held = [i for i in range(plan.num_items) if res.held_out.exact[i]]
        if held:
            log.warning("audit: %d item(s) occur in the held-out rows (perplexity), e.g. %s", len(held),
                        labels[held[0]])

    def finish_audit(self, wait: bool = True) -> None:
        """Collect the audit running beside training (``insertion.audit=on``): wait for it (without ``wait``:
        only if it has ended), report it as :meth:`_audit` does and rewrite ``items.jsonl`` with its counts; the
        run's results then carry it (:meth:`_write_results` calls this).

        :raises InsertionError: if the audit failed (a re-run of the same command audits again).
        """
        job = self._audit_job
        res = None if job is None else job.wait() if wait else job.poll()
        if res is None:
            return
        self._audit_job, self.audit, self.audit_wait_s = None, res, job.waited_s
        secs = res.window.seconds + res.held_out.seconds
        log.info("audit: %d items against %d window + %d held-out tokens in %.1f s beside training (%.2e tokens/s)",
                 job.plan.num_items, res.window.tokens, res.held_out.tokens, secs,
                 (res.window.tokens + res.held_out.tokens) / max(secs, 1e-9))
        self._report_audit(res, job.plan, self.items)
        self._write_plan(self.plan)

    # --- evaluation -------------------------------------------------------------------------------------
    @functools.cached_property
    def held_out(self) -> np.ndarray:
        """The held-out rows' tokens, read once: ``int64`` array of shape ``(data.held_out_rows, L)``."""
        rows = self.order.held_out_rows(self.cfg.data.held_out_rows)
        return np.stack([self.order.row_tokens(int(q)) for q in rows]) if rows.size else np.empty((0, self.L), np.int64)

    def evaluate(self, ckpt: Checkpoint, tracker: Tracker, redo: bool = False) -> Dict[str, dict]:
        """Run every ``eval.tasks`` entry on ``ckpt`` (skipping tasks already saved for its step, unless ``redo``).

        Under ``eval.mode=distributed`` (:meth:`distributed_eval`) every rank calls this: rank 0 decides which
        tasks are pending and broadcasts them, every rank loads the model from one HF dir (:meth:`_shared_hf_dir`)
        and runs the evals inside :func:`pretrain_exp.evals.shard.sharded`, scoring its share of the batches (an eval
        registered ``sharded=False`` runs on rank 0 alone, after the others); only rank 0 writes and logs.

        :returns: task name -> saved result dict (``metrics``, ``per_dup``, ``rows``); ``{}`` on other ranks.
        """
        from transformers import AutoModelForCausalLM

        distributed = self.distributed_eval()
        results, pending = {}, {}
        for name, task in self.cfg.eval.tasks.items() if self.main else ():
            f = self.rundir.evals(ckpt.step, name)
            if f.is_file() and not redo:
                results[name] = json.loads(f.read_text())
            else:
                pending[name] = task
        if distributed:  # rank 0's view of the files decides
            names = [list(pending)]
            torch.distributed.broadcast_object_list(names, src=0)
            pending = {name: self.cfg.eval.tasks[name] for name in names[0]}
            pending = dict(sorted(pending.items(), key=lambda kv: not EVALS[kv[1].type].sharded))  # stable
        if pending:
            log.info("evaluating step %d: %s%s", ckpt.step, ", ".join(pending),
                     f" (eval.mode=distributed over {world_size()} ranks)" if distributed else "")
            mine = {n: t for n, t in pending.items() if self.main or EVALS[t.type].sharded}
            with (self._shared_hf_dir(ckpt) if distributed else self._hf_dir(ckpt)) as hf_dir:
                model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval() if mine else None
                if mine and torch.cuda.is_available():  # evals score on the rank's GPU (inputs follow the model)
                    model = model.to(torch.device("cuda", torch.cuda.current_device()))
                ctx = EvalContext(model, self.tokenizer, self.plan_for_step(ckpt.step), self.held_out, ckpt.step,
                                  self.cfg.eval.batch_size,
                                  self.cfg.eval.bootstrap_samples, self.cfg.seed, self.cfg.cache_dir,
                                  row_tokens=self.rows.row, insertion=self.cfg.insertion)
                bar = phase_progress(f"evaluating step {ckpt.step}", len(mine), enabled=None if self.main else False)
                with bar as progress:
                    for done, (name, task) in enumerate(mine.items(), 1):
                        t0 = time.perf_counter()
                        with sharded() if distributed and EVALS[task.type].sharded else contextlib.nullcontext():
                            res: EvalResult = run_eval(task, ctx)
                        if not self.main:
                            continue
                        rec = {"task": name, "type": task.type, "step": ckpt.step, **asdict(res),
                               "seconds": time.perf_counter() - t0}
                        write_json(self.rundir.evals(ckpt.step, name), rec)
                        tracker.log({f"eval/{name}/{k}": v for k, v in res.metrics.items()}, ckpt.step)
                        results[name] = rec
                        progress(done)
                del model, ctx
        return results if self.main else {}

    def distributed_eval(self) -> bool:
        """Whether the evals run on every rank (``eval.mode=distributed`` with more than one process; the process
        group is joined here if the engine has not yet). With one process ``distributed`` is ``inline``."""
        return self.cfg.eval.mode == EvalMode.distributed and init_process_group()

    @contextlib.contextmanager
    def _shared_hf_dir(self, ckpt: Checkpoint) -> Iterator[Path]:
        """The one HF dir every rank reads under ``eval.mode=distributed``: the checkpoint itself (HF) or its kept
        export ``hf/step<N>/``, written by rank 0 before a barrier if ``training.export_hf`` did not keep it, and
        then removed by rank 0 after every rank is done with it."""
        if ckpt.is_hf:
            with self._hf_dir(ckpt) as d:
                yield d
            return
        out, temporary = self.hf_export_dir(ckpt.step), False
        if self.main and not out.is_dir():
            ckpt.export_hf(out)
            temporary = True
        barrier()
        try:
            yield out
        finally:
            barrier()
            if temporary:
                shutil.rmtree(out, ignore_errors=True)

    def hf_export_dir(self, step: int) -> Path:
        """Where the kept HF export of the checkpoint at global step ``step`` lives: ``<run dir>/hf/step<N>/``."""
        return self.rundir.hf_export(step)

    def keep_hf_export(self, ckpt: Checkpoint, final: bool) -> Optional[Path]:
        """Write the kept HF export of a segment's checkpoint if ``training.export_hf`` asks for it (``every``, or
        ``final`` and ``final``) and the checkpoint is not an HF dir already; returns its dir or ``None``. The
        evals of that step then read it instead of a temporary export (one export per segment)."""
        mode = self.cfg.training.export_hf
        if ckpt.is_hf or not (mode == ExportHF.every or (mode == ExportHF.final and final)):
            return None
        out = self.hf_export_dir(ckpt.step)
        if not out.is_dir():
            t0 = time.perf_counter()
            ckpt.export_hf(out)
            log.info("HF export of step %d: %s (%.1f s)", ckpt.step, out, time.perf_counter() - t0)
        return out

    @contextlib.contextmanager
    def _hf_dir(self, ckpt: Checkpoint) -> Iterator[Path]:
        """The kept HF export of ``ckpt`` if there is one, else a temporary one (deleted afterwards)."""
        kept = self.hf_export_dir(ckpt.step)
        if not ckpt.is_hf and kept.is_dir():
            yield kept
        else:
            with ckpt.as_hf_temporary() as tmp:
                yield tmp

    # --- the loop ---------------------------------------------------------------------------------------
    def run(self) -> dict:
        """Execute the loop (module docstring); returns the ``results.json`` content."""
        cfg, t = self.cfg, self.cfg.training
        if cfg.release.push_to_hub and self.main:
            from pretrain_exp.report.release import check_push_possible

            check_push_possible()  # offline or no token: refused before anything is trained
        t_start = time.perf_counter()
        evaluated: Dict[int, Dict[str, dict]] = {}
        timing: list = []  #: per trained segment of this invocation: ``{step, train_s, segment_end_s}``
        with PHASES.phase("tracker"):
            tracker_cm = Tracker(cfg) if self.main else NullTracker()
        with tracker_cm as tracker:
            ckpt = self.framework.latest_checkpoint()
            initial = self.framework.initial_checkpoint()
            if ckpt is None:
                ckpt = initial
            else:
                log.info("resuming from %s (step %d)", ckpt.path, ckpt.step)
            end = self.start_step + self.num_steps
            self.async_evals = self._async_evals() if cfg.eval.mode == EvalMode["async"] and self.main else None
            if cfg.eval.on_load or self.num_steps == 0:
                evaluated[initial.step] = self._evaluate_segment(initial, tracker, final=self.num_steps == 0)
            seg_start = self.start_step
            for seg_end in list(range(self.start_step + t.checkpoint_interval, end, t.checkpoint_interval)) + [end]:
                a, seg_start = seg_start, seg_end
                if seg_end <= self.start_step or seg_end < ckpt.step:
                    if self.async_evals is not None:  # a re-run: evals of earlier segments that never finished
                        self._relaunch_async(seg_end, tracker, final=seg_end == end)
                    continue
                if self.dynamic is not None and seg_end > ckpt.step:
                    self.add_dynamic(a, seg_end)
                t0 = time.perf_counter()
                if seg_end > ckpt.step:
                    start = ckpt
                    ckpt = with_retries(functools.partial(self._train_segment, start, seg_end, tracker),
                                        t.max_retries, t.retry_base_delay_s, f"training steps {start.step}->{seg_end}")
                t1 = time.perf_counter()
                if self.main:
                    self.keep_hf_export(ckpt, final=seg_end == end)
                evaluated[ckpt.step] = self._evaluate_segment(ckpt, tracker, final=seg_end == end)
                self.finish_audit(wait=False)  # the audit beside training, as soon as it has ended
                timing.append({"step": ckpt.step, "train_s": t1 - t0, "segment_end_s": time.perf_counter() - t1})
            t0 = time.perf_counter()
            self.framework.finish_checkpoints()  # the last segment's checkpoint may still be being written
            checkpoint_wait_s = time.perf_counter() - t0
            if not self.main:
                return {}
            t0 = time.perf_counter()
            if self.async_evals is not None:
                self._finish_async(tracker, end)
            wait_s = time.perf_counter() - t0
            # this invocation's segments: training (with the checkpoint save), then what the segment's end held the
            # run for (export, evals or their launch); the final wait for background evals
            results = self._write_results(tracker, evaluated, t_start, ckpt, initial, end, {
                "eval_mode": cfg.eval.mode.value, "segments": timing, "final_eval_wait_s": wait_s,
                "final_checkpoint_wait_s": checkpoint_wait_s, "phases": PHASES.summary()})
        if cfg.release.push_to_hub:
            self.release()
        self._cleanup()
        return results

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
            evaluated = {s: self.evaluate(held[s], tracker, redo=redo) for s in chosen}
            return self._write_results(tracker, evaluated, t_start, held[chosen[-1]], initial,
                                       self.start_step + self.num_steps, timing)

    def _write_results(self, tracker, evaluated: Dict[int, Dict[str, dict]], t_start: float, ckpt: Checkpoint,
                       initial: Checkpoint, end: int, timing: Optional[dict]) -> dict:
        """Write ``results.json`` (with ``timing``), the run's tables and plots, and log them to the tracker."""
        cfg = self.cfg
        self.finish_audit()
        if timing is not None and self.audit_wait_s:
            timing["final_audit_wait_s"] = self.audit_wait_s
        if timing is not None and self.order.gate is not None:  # this process's waits for the window stream
            timing["data_stall_s"] = self.order.gate.stall_s
        audit = self.rundir.read_audit() if self.audit is not None else None
        if audit is not None and self.dynamic is not None:  # audited on the static plan: final dup counts
            for it in audit["items"]:
                d = int(self.plan.item_dup_count[it["item_id"]])
                it["effective_dup_count"] += d - it["dup_count"]
                it["dup_count"] = d
        all_evaluated = self._all_evaluated()
        results = summarize(cfg, self.plan, evaluated, all_evaluated, time.perf_counter() - t_start, audit)
        if timing is not None:
            results["timing"] = timing
        if self.dynamic is not None:
            results["dynamic"] = dynamic.summary(self.dynamic, dynamic.report(
                self.plan, self.dynamic, self.loss_history(end), self.additions))
        write_json(self.rundir.results, results)
        write_run_tables(self.run_dir)  # manifest, items and per-item eval rows as Parquet (load_run)
        plots = {"loss_vs_dup": plot_per_dup, "loss_vs_step": plot_loss_vs_step}
        for name, plot in plots.items():
            plot(results, self.rundir.plot(name))
        if tracker.wandb_dir is not None:  # figures, tables and artifacts at the run's last global step
            tracker.log_media({f"plots/{name}": _wandb_image(self.rundir.plot(name))
                               for name in plots}, ckpt.step)
            tracker.log_results(results, all_evaluated, ckpt.step)
            tracker.log_artifacts(None if ckpt is initial else ckpt.path)
        return results

    def _train_segment(self, start: Checkpoint, until_step: int, tracker) -> Checkpoint:
        """One segment of training, one console line per logged step (and a progress bar) on the main process
        (:mod:`pretrain_exp.app.console`); a full disk (which a retry cannot fix) is a :class:`StorageError` naming
        the checkpoint being written."""
        try:
            if not self.main:
                return self.framework.train(start, until_step, self.rows, tracker.log)
            with segment_lines(tracker.log, start.step, until_step, self.start_step + self.num_steps) as log_fn:
                return self.framework.train(start, until_step, self.rows, log_fn)
        except Exception as e:
            if isinstance(e, PretrainExpError) or not is_disk_full(e):
                raise
            named = next((x.filename for x in (e, e.__cause__, e.__context__) if getattr(x, "filename", None)), None)
            ckpts = Path(getattr(self.framework, "checkpoint_dir", self.rundir.checkpoints))
            newest = (max(ckpts.iterdir(), key=lambda p: p.stat().st_mtime_ns, default=ckpts) if ckpts.is_dir()
                      else ckpts)  # the checkpoint being written
            raise disk_full_error(f"training steps {start.step}->{until_step} wrote", named or newest, e) from e

    def _evaluate_on_main(self, ckpt: Checkpoint, tracker) -> Dict[str, dict]:
        """Evaluate on rank 0 while the other ranks wait (``eval.mode=distributed``: on every rank)."""
        out = self.evaluate(ckpt, tracker) if self.main or self.distributed_eval() else {}
        barrier()
        return out

    def _evaluate_segment(self, ckpt: Checkpoint, tracker, final: bool) -> Dict[str, dict]:
        """The evals of a segment's checkpoint as ``eval.mode`` says: now (``inline``), or started in the
        background (``async``: returns ``{}``; :meth:`_finish_async` collects them)."""
        if self.cfg.eval.mode != EvalMode["async"]:
            return self._evaluate_on_main(ckpt, tracker)
        if self.main:
            self._launch_async(ckpt, tracker, final)
        return {}

    # --- async evals (pretrain_exp.app.async_eval) ------------------------------------------------------
    def _async_evals(self) -> "async_eval.AsyncEvals":
        """The run's background-eval launcher; the eval processes read ``config.resolved.yaml`` (or, for a config
        with credentials, which that file has redacted, a copy readable by this user only, removed at the end)."""
        config, private = self.rundir.config, holds_credentials(self.cfg)
        if private:
            from pretrain_exp.app.tracking import config_dict

            fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".yaml", dir=self.run_dir)  # mode 0600
            with os.fdopen(fd, "w") as f:
                f.write(OmegaConf.to_yaml(OmegaConf.create(config_dict(self.cfg))))
            config = Path(tmp)
        launcher = async_eval.resolve_launcher(self.cfg.eval.async_launcher, self.run_dir)
        return async_eval.AsyncEvals(self.run_dir, config, launcher, private_config=private)

    def _missing_tasks(self, step: int) -> list:
        return self.rundir.missing_evals(step, self.cfg.eval.tasks)

    def _launch_async(self, ckpt: Checkpoint, tracker, final: bool) -> None:
        """Write the HF dir the evals of ``ckpt`` read (kept until they are written) and start them."""
        self._collect_async(tracker)
        tasks = self._missing_tasks(ckpt.step)
        if not tasks:
            return
        if ckpt.path == self.model_dir and ckpt.is_hf:  # the initial model: read where it is
            hf_dir = ckpt.path
        elif ckpt.is_hf:  # an HF checkpoint that keep_last_checkpoints may delete: its model files, linked
            hf_dir = async_eval.link_model_files(ckpt.path, self.hf_export_dir(ckpt.step))
        else:
            hf_dir = self.hf_export_dir(ckpt.step)
            if not hf_dir.is_dir():
                t0 = time.perf_counter()
                ckpt.export_hf(hf_dir)
                log.info("HF export of step %d: %s (%.1f s)", ckpt.step, hf_dir, time.perf_counter() - t0)
        self.async_evals.launch(ckpt.step, hf_dir, tasks)

    def _relaunch_async(self, step: int, tracker, final: bool) -> None:
        """On a re-run: start the evals of an earlier segment's step that are missing (its HF dir is kept until
        they are written)."""
        if step in self.async_evals.jobs or not self._missing_tasks(step):
            return
        hf_dir = self.hf_export_dir(step)
        if not hf_dir.is_dir():
            raise TrainingError(f"the evals of step {step} are missing and its HF model dir {hf_dir} is gone; "
                                "evaluate that checkpoint with a new run (model.path=...) or delete the run dir")
        self._launch_async(Checkpoint(hf_dir, step), tracker, final)

    def _collect_async(self, tracker, wait: bool = False) -> None:
        """Log the finished background evals to the tracker at their step and drop what they no longer need
        (:meth:`_drop_async`)."""
        ae = self.async_evals
        for step in (ae.wait(self.cfg.eval.async_pending_wait_s) if wait else ae.poll()):
            if step in ae.failures():
                continue
            for name in self.cfg.eval.tasks:
                rec = self.rundir.read_eval(step, name)
                if rec is not None:
                    tracker.log({f"eval/{name}/{k}": v for k, v in rec["metrics"].items()}, step)
            self._drop_async(step)

    def _drop_async(self, step: int) -> None:
        """Remove the marker of ``step``'s written background evals and their HF dir, unless
        ``training.export_hf`` keeps it."""
        self.rundir.eval_marker(step).unlink(missing_ok=True)
        mode = self.cfg.training.export_hf
        kept = not self.framework.initial_checkpoint().is_hf and (
            mode == ExportHF.every or (mode == ExportHF.final and step == self.start_step + self.num_steps))
        hf_dir = self.hf_export_dir(step)
        if hf_dir.is_dir() and not kept:
            shutil.rmtree(hf_dir)
            with contextlib.suppress(OSError):  # hf/ itself when it is empty now
                hf_dir.parent.rmdir()

    def _finish_async(self, tracker, end: int) -> None:
        """Wait for the background evals, log them; any that failed is an error naming its step and log."""
        self._collect_async(tracker, wait=True)
        self.async_evals.close()
        failed = self.async_evals.failures()
        if failed:
            step, why = next(iter(sorted(failed.items())))
            raise TrainingError(f"the background evals of step {step} failed: {why}; re-run the same command to "
                                "run the missing evals again")
        missing = {s: self._missing_tasks(s) for s in self.async_evals.jobs if self._missing_tasks(s)}
        if missing:
            raise TrainingError(f"background evals ended without writing {missing}; re-run the same command")
        for step, _ in self.rundir.async_markers():  # evals written before a kill
            if not self._missing_tasks(step):
                self._drop_async(step)

    def _all_evaluated(self) -> Dict[int, Dict[str, dict]]:
        return self.rundir.all_evals()

    def _cleanup(self) -> None:
        mode = self.cfg.training.cleanup
        if mode == Cleanup.all:
            shutil.rmtree(self.run_dir)
        elif mode == Cleanup.bulky:
            last = self.framework.latest_checkpoint()
            ckpts = self.rundir.checkpoints
            for d in sorted(ckpts.iterdir()) if ckpts.is_dir() else []:
                if last is not None and d == last.path:  # HF: drop its optimizer/scheduler/RNG files
                    for f in d.iterdir():  # (OLMo-core keeps optimizer state inside its DCP shards)
                        if f.name.startswith(("optimizer", "scheduler", "rng_state")):
                            f.unlink()
                elif d.is_dir():
                    shutil.rmtree(d)


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
                            tokenize_source(d.text, tokenizer, d.token_dir, cfg.cache_dir, d.text_key))
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


def _wandb_image(path: Path):
    import wandb

    return wandb.Image(str(path)) if path.is_file() else None


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


def check_same_run(cfg: ExperimentConfig, run_dir: Path) -> None:
    """Refuse to continue a run dir that was started with a different training config.

    :raises ConfigError: naming the first keys that differ from the run dir's ``config.resolved.yaml``.
    """
    path = RunDir(run_dir).config
    if not path.is_file():
        return
    old = _flatten(OmegaConf.to_container(OmegaConf.load(path)))
    new = _flatten(redact_obj(config_dict(cfg)))  # as the file holds it
    diff = [k for k in sorted(set(old) | set(new))
            if not k.startswith(MUTABLE_KEYS) and old.get(k) != new.get(k)]
    if diff:
        raise ConfigError(diff[0], f"run dir {run_dir} holds another run: {describe_difference(old, new, diff)}; "
                          "re-run that run's own command to resume it, or give this one its own run dir "
                          "(name=... or hydra.run.dir=...)")


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

"""The natural-duplicate audit of a run's plan (``insertion.audit``, :mod:`~pretrain_exp.insertion.audit`).

:meth:`RunAudit.audit` runs when the run is prepared: the result is read from ``audit.json`` when it audited this
plan with this n, or from the audit cache (``<cache_dir>/audits/<key>.json``, shared by the jobs of a sweep that
audit the same rows and items), else computed and saved: at once with ``strict``, which raises for a control found
in the window; with ``on`` beside training (:class:`~pretrain_exp.insertion.audit_job.BackgroundAudit`, started by
the ``pre_train`` hook and collected by :meth:`RunAudit.finish`: after each segment as soon as it has ended, at the
latest by the results; stopped by ``on_error`` and ``close``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, Optional, Tuple

import numpy as np

from pretrain_exp.app.hooks import RunHook
from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.errors import CheckpointError
from pretrain_exp.core.logs import rate
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.data.order import DataOrder
from pretrain_exp.frameworks.base import Checkpoint
from pretrain_exp.insertion.audit import AuditResult, audit_key, audit_plan, default_workers, item_contents
from pretrain_exp.insertion.audit_job import BackgroundAudit
from pretrain_exp.insertion.plan import Plan
from pretrain_exp.insertion.schema import AuditMode, InsertionConf

log = logging.getLogger(__name__)


class RunAudit(RunHook):
    """The audit of one run (module docstring).

    :param conf: the run's ``insertion`` node (``audit``, ``audit_ngram``, ``audit_workers``).
    :param rundir: the run dir (``audit.json``).
    :param order: the run's data order; ``window``: its training window ``[S*B*L, (S+n)*B*L)`` in global token
        positions; ``held_rows``: the held-out rows (training-order ids, ``int64``;
        :meth:`DataOrder.held_out_rows <pretrain_exp.data.order.DataOrder.held_out_rows>`).
    :param eos: the tokenizer's EOS id (stripped from the items).
    :param cache_dir: the run's cache dir (``audits/``).
    :param window_fetched: whether the window's token files are local or prefetched (``on`` needs it).
    :param on_finish: called with the result of the audit beside training once it is collected.
    """

    def __init__(self, conf: InsertionConf, rundir: RunDir, order: DataOrder, window: Tuple[int, int],
                 held_rows: np.ndarray, eos: int, cache_dir: str, window_fetched: bool,
                 on_finish: Optional[Callable[[AuditResult], None]] = None):
        self.conf, self.rundir, self.order, self.window, self.held_rows = conf, rundir, order, window, held_rows
        self.eos, self.cache_dir, self.window_fetched, self.on_finish = eos, cache_dir, window_fetched, on_finish
        self.job: Optional[BackgroundAudit] = None  #: ``insertion.audit=on``: the audit beside training
        self.wait_s = 0.0  #: seconds the run's end waited for it
        self.items = None  #: the items of the audited plan (labels of the report)

    def audit(self, plan: Plan, items) -> Tuple[Optional[AuditResult], bool]:
        """The audit of ``plan`` (module docstring); ``items``: experiment -> its items (for the report).

        :returns: ``(result or None when off, skipped or beside training, whether it was computed now)``.
        :raises InsertionError: ``insertion.audit=strict`` and a dup-0 control occurs in the window
            (:meth:`AuditResult.report <pretrain_exp.insertion.audit.AuditResult.report>`).
        """
        ins, self.items = self.conf, items
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
            L = self.order.sequence_length
            window_rows = np.arange(self.window[0] // L, self.window[1] // L, dtype=np.int64)
            o = self.order
            key = audit_key(item_contents(plan, self.eos), ins.audit_ngram, L,
                            [(f if isinstance(f, str) else f"{f.resolve()}@{f.stat().st_mtime_ns}", int(b))
                             for f, b in zip(o.files.paths, o.files.num_bytes)],
                            o.files.dtype.name, window_rows, o.instances(int(window_rows[0]), window_rows.size)
                            if window_rows.size else window_rows, self.held_rows,
                            np.array([o.instance(int(q))[1] for q in self.held_rows], np.int64))
            shared = CacheDir(self.cache_dir).audits / f"{key}.json"
            if shared.is_file():  # another job of the sweep audited these rows and items
                with contextlib.suppress(CheckpointError):
                    res = AuditResult.load(shared)
                    res.plan_digest = plan.digest()
                    log.info("audit: reused %s (the same window rows, held-out rows and items)", shared)
            if res is None and ins.audit != AuditMode.on:
                res = audit_plan(plan, o.row_tokens, window_rows, self.held_rows, ins.audit_ngram,
                                 strip=self.eos, workers=ins.audit_workers or default_workers())
                res.save(shared, plan, ins.audit.value)
            elif res is None:  # beside training: nothing of it before step 1
                self.job = BackgroundAudit(
                    plan, o, (self.window[0] // L, self.window[1] // L), self.held_rows, ins.audit_ngram,
                    self.eos, ins.audit_workers or default_workers(), path, shared, "on")
                return None, False
            fresh = True
        if fresh:  # also when strict refuses: the full table of what was found
            res.save(path, plan, ins.audit.value)
        res.report(plan, items, ins.audit == AuditMode.strict)
        return res, fresh

    def start(self) -> None:
        """Start the audit beside training, if there is one to run."""
        if self.job is not None:
            self.job.start()

    def pre_train(self) -> None:
        """The audit beside training starts here (:meth:`start`), not when the run is prepared."""
        self.start()

    def finish(self, wait: bool = True) -> Optional[AuditResult]:
        """Collect the audit running beside training: wait for it (without ``wait``: only if it has ended; one that
        no loop started, as in the ``evaluate`` command, is started here), report it as :meth:`audit` does and hand
        it to ``on_finish``; returns it (``None`` when there is none or it is still running).

        :raises InsertionError: if the audit failed (a re-run of the same command audits again).
        """
        job = self.job
        if job is not None and job.proc is None and wait:
            job.start()
        res = None if job is None else job.wait() if wait else job.poll()
        if res is None:
            return None
        self.job, self.wait_s = None, job.waited_s
        secs = res.window.seconds + res.held_out.seconds
        log.info("audit: %d items against %d window + %d held-out tokens in %.1f s beside training%s",
                 job.plan.num_items, res.window.tokens, res.held_out.tokens, secs,
                 rate(res.window.tokens + res.held_out.tokens, secs, "tokens", "{:.2e}"))
        res.report(job.plan, self.items, self.conf.audit == AuditMode.strict)
        if self.on_finish is not None:
            self.on_finish(res)
        return res

    def post_segment(self, ckpt: Checkpoint, final: bool) -> None:
        """The audit beside training, collected as soon as it has ended."""
        self.finish(wait=False)

    def on_error(self, exc: BaseException) -> None:
        """A failed run stops its audit beside training now (not at the process's exit: the next job of a local
        sweep runs in the same process) and writes no ``audit.json``; the re-run of the same command audits again
        (or reuses a cached audit of the same rows and items)."""
        job, self.job = self.job, None
        if job is not None:
            if job.running:
                log.info("audit: the run failed; stopping the audit beside training (process %d)", job.proc.pid)
            job.close()

    def close(self) -> None:
        """An audit beside training still held here (the results collect it on success) is stopped."""
        job, self.job = self.job, None
        if job is not None:
            job.close()

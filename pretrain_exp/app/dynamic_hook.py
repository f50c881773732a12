"""Dynamic insertion in the segment loop (``insertion.dynamic``, :mod:`~pretrain_exp.insertion.dynamic`).

:class:`PlanHistory` is the run's plan as decided so far: the static plan, then one entry per decision (re-read from
``dynamic/step<a>.json`` on a re-run). :class:`DynamicInsertion` is the hook: before each segment ``(a, b]``
(:meth:`~DynamicInsertion.pre_segment`) rank 0 decides on the insertion losses evaluated at step ``a``, saves the
additions, and every rank appends them to the plan that the training rows read; rank 0 rewrites the plan files and
verifies the new spans on the segment's batches. The arms (targets and randomized dup-0 controls,
:func:`~pretrain_exp.insertion.dynamic.assign_arms`) are drawn once, from the static plan, when the hook is built.
It also gives ``results.json`` its ``dynamic`` entry (per item, and by arm:
:func:`~pretrain_exp.insertion.dynamic.summary`).
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Dict, List, Optional, Tuple

from pretrain_exp.app.hooks import RunHook
from pretrain_exp.core.distributed import barrier
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.insertion import dynamic
from pretrain_exp.insertion.plan import Plan

log = logging.getLogger(__name__)


class PlanHistory:
    """The plan after each decision: ``plans`` is ``[(decided_at, plan), ...]``, the static plan first (decided at
    -1); ``additions`` the decision records (``dynamic/step<a>.json``), in order."""

    def __init__(self, static: Plan):
        self.plans: List[Tuple[int, Plan]] = [(-1, static)]
        self.additions: List[dict] = []

    @classmethod
    def resume(cls, static: Plan, rundir: RunDir, enabled: bool) -> "PlanHistory":
        """The history of a (re-)run: ``static`` plus the decisions saved in ``rundir`` (when ``enabled``),
        re-applied in order.

        :raises CheckpointError: for an unreadable decision record.
        """
        out = cls(static)
        for rec in dynamic.load_additions(rundir.path) if enabled else []:
            out.add(rec["decided_at"], dynamic.apply_additions(out.current, rec, rundir.additions(rec["decided_at"])),
                    rec)
        return out

    @property
    def current(self) -> Plan:
        """The plan after the newest decision."""
        return self.plans[-1][1]

    def add(self, decided_at: int, plan: Plan, record: dict) -> None:
        """Append the plan after the decision ``record`` taken at step ``decided_at``."""
        self.plans.append((decided_at, plan))
        self.additions.append(record)

    def decided(self, step: int) -> bool:
        """Whether a decision at ``step`` is in the history."""
        return any(at == step for at, _ in self.plans)

    def for_step(self, step: int) -> Plan:
        """The plan as of checkpoint ``step``: static plus the additions decided before ``step``."""
        return [p for at, p in self.plans if at < step][-1]

    def digests(self) -> set:
        """The digests of every plan in the history (a saved ``plan.npz`` must be one of them)."""
        return {p.digest() for _, p in self.plans}


class DynamicInsertion(RunHook):
    """The hook of ``insertion.dynamic`` (module docstring).

    :param policy: the parsed ``insertion.dynamic`` (:class:`~pretrain_exp.insertion.dynamic.DynamicConf`).
    :param history: the run's :class:`PlanHistory` (appended to).
    :param rundir: the run dir (``dynamic/``, ``evals/``).
    :param seed: ``insertion.seed``.
    :param on_plan: called with the new plan on every rank (the training rows read it).
    :param write_plan: called with the new plan on rank 0 (the plan files).
    :param verify: ``(a, b) -> None``: verifies the spans of steps ``a+1 .. b`` on rank 0; ``None`` when
        ``insertion.verify`` is off.
    :param main: whether this process is rank 0.
    :raises ConfigError: (``insertion.dynamic.controls``) when the static plan cannot give the controls asked for
        (:func:`~pretrain_exp.insertion.dynamic.assign_arms`).
    """

    def __init__(self, policy: dynamic.DynamicConf, history: PlanHistory, rundir: RunDir, seed: int,
                 on_plan: Callable[[Plan], None], write_plan: Callable[[Plan], None],
                 verify: Optional[Callable[[int, int], None]] = None, main: bool = True):
        self.policy, self.history, self.rundir, self.seed, self.main = policy, history, rundir, seed, main
        self.on_plan, self.write_plan, self.verify = on_plan, write_plan, verify
        #: targets and controls, drawn on the static plan (its dup counts: the controls' pool)
        self.arms = dynamic.assign_arms(history.plans[0][1], policy, seed)

    def loss_history(self, upto: int) -> Dict[int, dynamic.Losses]:
        """Evaluated step (``<= upto``) -> item losses of the policy's ``insertion_loss`` task."""
        out = {}
        for step, _ in self.rundir.eval_steps():
            f = self.rundir.evals(step, self.policy.task)
            if step <= upto and f.is_file():
                out[step] = dynamic.read_losses(f)
        return out

    def pre_segment(self, a: int, b: int) -> None:
        """Decide (rank 0; from the losses at step ``a``), save, apply and verify the additions of segment
        ``(a, b]``; a decision saved earlier is in the history already and left alone.

        :raises InsertionError: if the segment cannot hold the copies, or they did not land (verification).
        """
        if self.history.decided(a):
            return
        path = self.rundir.additions(a)
        if self.main:
            losses = self.loss_history(a)
            if a in losses:
                rec = dynamic.decide(self.history.current, self.policy, a, b, losses, self.seed, self.arms)
                dynamic.save_additions(self.rundir.path, rec)
        barrier()
        if not path.is_file():  # no evals at a (the first segment without eval.on_load): static only
            return
        rec = json.loads(path.read_text())
        plan = dynamic.apply_additions(self.history.current, rec, path)
        self.history.add(a, plan, rec)
        self.on_plan(plan)
        log.info("dynamic (%s): decided at step %d: %d item(s), %d copies in steps %d..%d", rec["policy"], a,
                 len(rec["items"]), len(rec["positions"]), a + 1, b)
        if self.main:
            self.write_plan(plan)
            if self.verify is not None and len(rec["positions"]):
                self.verify(a, b)

    def final_audit(self, audit: dict) -> dict:
        """``audit.json``'s content (audited on the static plan) with each item's final dup counts."""
        plan = self.history.current
        for it in audit["items"]:
            d = int(plan.item_dup_count[it["item_id"]])
            it["effective_dup_count"] += d - it["dup_count"]
            it["dup_count"] = d
        return audit

    def summary(self, end_step: int) -> dict:
        """``results.json``'s ``dynamic`` entry (:func:`~pretrain_exp.insertion.dynamic.summary`): the options, one
        row per target and control item, and the comparison by arm (the losses up to ``end_step``)."""
        plan, losses = self.history.current, self.loss_history(end_step)
        rows = dynamic.report(plan, self.policy, losses, self.history.additions, self.arms)
        return dynamic.summary(plan, self.policy, losses, rows, seed=self.seed)

"""Dynamic insertion in the segment loop (``insertion.dynamic``, :mod:`~pretrain_exp.insertion.dynamic`).

:class:`DynamicInsertion` is the hook: before each segment ``(a, b]`` (:meth:`~DynamicInsertion.pre_segment`) rank 0
decides on the insertion losses evaluated at step ``a`` and saves the additions; every rank adds them to the run's
plan (:meth:`RunPlan.add <pretrain_exp.insertion.run_plan.RunPlan.add>`: the training rows read it, rank 0 rewrites
the plan files), and rank 0 verifies the new spans on the segment's batches. The arms (targets and randomized dup-0
controls, :func:`~pretrain_exp.insertion.dynamic.assign_arms`) are the plan's (:attr:`RunPlan.arms
<pretrain_exp.insertion.run_plan.RunPlan.arms>`), drawn once, from the static plan, when the run is prepared. It also
gives ``results.json`` its ``dynamic`` entry (per item, and by arm: :func:`~pretrain_exp.insertion.dynamic.summary`).
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Dict, Optional

from pretrain_exp.app.hooks import RunHook
from pretrain_exp.core.distributed import barrier
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.insertion import dynamic
from pretrain_exp.insertion.run_plan import RunPlan

log = logging.getLogger(__name__)


class DynamicInsertion(RunHook):
    """The hook of ``insertion.dynamic`` (module docstring).

    :param policy: the parsed ``insertion.dynamic`` (:class:`~pretrain_exp.insertion.policies.base.DynamicConf`).
    :param plan: the run's plan (:class:`~pretrain_exp.insertion.run_plan.RunPlan`: its arms; decisions are added to
        it).
    :param rundir: the run dir (``dynamic/``, ``evals/``).
    :param seed: ``insertion.seed``.
    :param verify: ``(a, b) -> None``: verifies the spans of steps ``a+1 .. b`` on rank 0; ``None`` when
        ``insertion.verify`` is off.
    :param main: whether this process is rank 0.
    """

    def __init__(self, policy: dynamic.DynamicConf, plan: RunPlan, rundir: RunDir, seed: int,
                 verify: Optional[Callable[[int, int], None]] = None, main: bool = True):
        self.policy, self.plan, self.rundir, self.seed, self.main = policy, plan, rundir, seed, main
        self.verify = verify

    @property
    def arms(self) -> dynamic.Arms:
        """The targets and controls, drawn on the static plan when the run was prepared (:attr:`RunPlan.arms
        <pretrain_exp.insertion.run_plan.RunPlan.arms>`)."""
        return self.plan.arms

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
        if self.plan.decided(a):
            return
        path = self.rundir.additions(a)
        if self.main:
            losses = self.loss_history(a)
            if a in losses:
                rec = dynamic.decide(self.plan.current, self.policy, a, b, losses, self.seed, self.arms)
                dynamic.save_additions(self.rundir.path, rec)
        barrier()
        if not path.is_file():  # no evals at a (the first segment without eval.on_load): static only
            return
        rec = json.loads(path.read_text())
        self.plan.add(a, dynamic.apply_additions(self.plan.current, rec, path), rec)
        log.info("dynamic (%s): decided at step %d: %d item(s), %d copies in steps %d..%d", rec["policy"], a,
                 len(rec["items"]), len(rec["positions"]), a + 1, b)
        if self.main and self.verify is not None and len(rec["positions"]):
            self.verify(a, b)

    def final_audit(self, audit: dict) -> dict:
        """``audit.json``'s content (audited on the static plan) with each item's final dup counts."""
        plan = self.plan.current
        for it in audit["items"]:
            d = int(plan.item_dup_count[it["item_id"]])
            it["effective_dup_count"] += d - it["dup_count"]
            it["dup_count"] = d
        return audit

    def summary(self, end_step: int) -> dict:
        """``results.json``'s ``dynamic`` entry (:func:`~pretrain_exp.insertion.dynamic.summary`): the options, one
        row per target and control item, and the comparison by arm (the losses up to ``end_step``)."""
        plan, losses = self.plan.current, self.loss_history(end_step)
        rows = dynamic.report(plan, self.policy, losses, self.plan.additions, self.arms)
        return dynamic.summary(plan, self.policy, losses, rows, seed=self.seed)

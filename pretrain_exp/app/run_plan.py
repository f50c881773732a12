"""The run's plan and its one owner (:class:`RunPlan`): the plan as of a step, the decisions added to it, and the
plan files.

:class:`PlanHistory` is the run's plan as decided so far: the static plan, then one entry per decision of dynamic
insertion (:mod:`~pretrain_exp.app.dynamic_hook`, re-read from ``dynamic/step<a>.json`` on a re-run).
:class:`RunPlan` owns it: the training rows read its current plan, the evals read the plan as of their step
(:meth:`RunPlan.as_of`), dynamic insertion adds its decisions (:meth:`RunPlan.add`) and the audit its result
(:meth:`RunPlan.set_audit`); it is the only writer of ``plan.npz``, ``manifest.jsonl`` and ``items.jsonl``
(:meth:`RunPlan.write`, rank 0).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from pretrain_exp.core.rundir import RunDir
from pretrain_exp.insertion import dynamic
from pretrain_exp.insertion.audit import AuditResult
from pretrain_exp.insertion.plan import Plan


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


class RunPlan:
    """The owner of a run's plan (module docstring).

    :param history: the plan so far (:class:`PlanHistory`).
    :param items: experiment -> its items (the labels of ``manifest.jsonl`` and ``items.jsonl``).
    :param rundir: the run dir (the plan files).
    :param main: whether this process is rank 0 (the only writer).
    :param audit: the natural-duplicate audit of the static plan, when it is known already.
    """

    def __init__(self, history: PlanHistory, items: dict, rundir: RunDir, main: bool,
                 audit: Optional[AuditResult] = None):
        self.history, self.items, self.rundir, self.main, self.audit = history, items, rundir, main, audit
        self.rows = None  #: the training rows (:class:`~pretrain_exp.data.rows.TrainingRows`), which read ``current``

    @property
    def current(self) -> Plan:
        """The plan after the newest decision (the one the training rows read)."""
        return self.history.current

    @property
    def static(self) -> Plan:
        """The plan the run started with (before any dynamic decision)."""
        return self.history.plans[0][1]

    @property
    def plans(self) -> List[Tuple[int, Plan]]:
        """``[(decided_at, plan), ...]``: the static plan (decided at -1), then the plan after each decision."""
        return self.history.plans

    @property
    def additions(self) -> List[dict]:
        """The decision records of dynamic insertion, in order."""
        return self.history.additions

    def as_of(self, step: int) -> Plan:
        """The plan as of checkpoint ``step``: static plus the additions decided before ``step``."""
        return self.history.for_step(step)

    def decided(self, step: int) -> bool:
        """Whether a decision at ``step`` is in the plan already."""
        return self.history.decided(step)

    def add(self, decided_at: int, plan: Plan, record: dict) -> None:
        """Add the decision ``record`` taken at step ``decided_at`` (``plan``: the plan after it): the training
        rows read it from now on; rank 0 rewrites the plan files."""
        self.history.add(decided_at, plan, record)
        if self.rows is not None:
            self.rows.plan = plan
        if self.main:
            self.write()

    def set_audit(self, res: AuditResult) -> None:
        """The audit beside training is done: ``items.jsonl`` gets its counts (rank 0)."""
        self.audit = res
        if self.main:
            self.write()

    def write(self) -> None:
        """Save the current plan as ``plan.npz``, ``manifest.jsonl`` and ``items.jsonl`` (dynamic spans with the
        segment that decided them, the audit's counts when there is an audit)."""
        plan = self.current
        fields: Dict[int, dict] = {}
        for rec in self.history.additions:
            for p in rec["positions"]:
                fields[int(p)] = {"decided_at": rec["decided_at"], "segment": rec["segment"]}
        plan.write_manifest(self.rundir.manifest, self.items,
                            self.audit.item_records(plan) if self.audit is not None else None, fields,
                            items_path=self.rundir.items)
        plan.save(self.rundir.plan)

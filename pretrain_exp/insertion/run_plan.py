"""The run's plan and its one owner (:class:`RunPlan`): the plan as of a step, the decisions added to it, and the
plan files.

:class:`PlanHistory` is the run's plan as decided so far: the static plan, then one entry per decision of dynamic
insertion (:mod:`~pretrain_exp.app.dynamic_hook`, re-read from ``dynamic/step<a>.json`` on a re-run).
:class:`RunPlan` owns it: the training rows read its current plan, the evals read the plan as of their step
(:meth:`RunPlan.as_of`), dynamic insertion reads its arms (:attr:`RunPlan.arms`, drawn on the static plan when the
run is prepared) and adds its decisions (:meth:`RunPlan.add`), and the audit adds its result
(:meth:`RunPlan.set_audit`); it is the only writer of ``plan.npz``, ``manifest.jsonl`` and ``items.jsonl``
(:meth:`RunPlan.write`, rank 0), and on a re-run the one reader of the saved plan, which it holds against this
config's (:meth:`RunPlan.resume`, :func:`check_same_items`; a difference is a :class:`PlanConflict`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.insertion import dynamic
from pretrain_exp.insertion.audit import AuditResult
from pretrain_exp.insertion.plan import Plan


class PlanConflict(ConfigError):
    """A run dir whose plan or items are not this config's: ``what`` differs, ``restore`` what brings that run back
    (``"restore its content"``). The application adds the other way out, a run dir of its own
    (:class:`~pretrain_exp.app.run_record.RunDirConflict`)."""

    def __init__(self, key: str, what: str, restore: str):
        self.what, self.restore = what, restore
        super().__init__(key, f"{what}; {restore} to resume that run")


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
    :param arms: ``insertion.dynamic``: the targets and randomized dup-0 controls of the closed loop, drawn on the
        static plan (:func:`~pretrain_exp.insertion.dynamic.assign_arms`); ``None`` without dynamic insertion.
    """

    def __init__(self, history: PlanHistory, items: dict, rundir: RunDir, main: bool,
                 audit: Optional[AuditResult] = None, arms: Optional[dynamic.Arms] = None):
        self.history, self.items, self.rundir, self.main, self.audit = history, items, rundir, main, audit
        self.arms = arms  #: ``insertion.dynamic``'s targets and controls (``None`` without dynamic insertion)
        self.rows = None  #: the training rows (:class:`~pretrain_exp.data.rows.TrainingRows`), which read ``current``
        self.saved_digest: Optional[str] = None  #: the digest of the ``plan.npz`` the run dir held, if any

    @classmethod
    def resume(cls, static: Plan, items: dict, rundir: RunDir, experiments: dict,
               policy: Optional[dynamic.DynamicConf], seed: int, main: bool) -> "RunPlan":
        """The plan of a (re-)run in ``rundir``: ``static`` (the items of ``experiments`` placed) with the decisions
        of dynamic insertion (``policy``, the parsed ``insertion.dynamic``; ``None``: none) saved there re-applied
        (:meth:`PlanHistory.resume`), and the closed loop's arms drawn on ``static`` with ``seed``
        (``insertion.seed``). A ``plan.npz`` the run dir holds must be one of its plans.

        :raises PlanConflict: naming the experiment whose items changed (:func:`check_same_items`, before the
            saved decisions are re-applied), or ``insertion`` for a saved plan that is none of this run's.
        :raises ConfigError: (``insertion.dynamic.controls``) when ``static`` cannot give the controls asked for.
        """
        path = rundir.plan
        saved = Plan.load(path) if path.is_file() else None
        if saved is not None:  # a re-run: an input of the plan that changed is named first
            check_same_items(saved, static, experiments, rundir.path)
        history = PlanHistory.resume(static, rundir, policy is not None)
        saved_digest = None if saved is None else saved.digest()
        if saved is not None and saved_digest not in history.digests():
            raise PlanConflict("insertion", f"{path} holds another plan than this config gives, though the "
                               "config and the items are the same (the corpus, the tokenizer or the program's "
                               "placement changed since the run started)", "restore them")
        arms = None if policy is None else dynamic.assign_arms(static, policy, seed)
        owner = cls(history, items, rundir, main, arms=arms)
        owner.saved_digest = saved_digest
        return owner

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


def _experiment_items(plan: Plan, name: str) -> Tuple[np.ndarray, np.ndarray]:
    """The items of experiment ``name`` in ``plan``: their lengths ``int64 (n,)`` and tokens ``int64 (sum,)``."""
    sel = plan.item_experiment == plan.experiments.index(name)
    lengths = np.diff(plan.token_offsets)
    return lengths[sel], plan.tokens[np.repeat(sel, lengths)].astype(np.int64)


def check_same_items(saved: Plan, plan: Plan, experiments: dict, run_dir: Path) -> None:
    """Refuse a re-run whose items differ from those of the plan its run dir holds (``saved``) for an experiment
    of both, though the config is the same: an input changed since the run started.

    :param experiments: ``insertion.experiments`` (name -> its config; ``file``: the items file).
    :raises PlanConflict: naming the experiment's items file and that its content changed (or, without a file,
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
        raise PlanConflict(f"insertion.experiments.{name}.file",
                           f"the items file {Path(file).resolve()} changed content since the run in {run_dir} "
                           f"started{more}", "restore its content")
    raise PlanConflict(f"insertion.experiments.{name}",
                       f"its items differ from those the run in {run_dir} started with, though the config is the "
                       f"same (what they are read or generated from changed){more}", "restore it")

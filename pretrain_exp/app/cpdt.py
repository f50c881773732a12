"""Continual pretraining dependence testing (CPDT): does an experiment's effect change when others share the run?

Bordt & Pawelczyk (2025), *Train Once, Answer All: Many Pretraining Experiments for the Cost of One*
(arXiv:2509.23383, Sec. 5 and Appendix F), call experiments ``E_1..E_n`` independent if the outcome ``Y_i^S`` of
experiment ``i`` in a run performing the experiments ``S`` has the same distribution for ``S = {i}`` and for
every ``S = {i} | T`` (Definition 5.1), and test it with short continual-pretraining runs from a checkpoint: one run
per experiment alone and one with all experiments together (the last row of their dependence matrix). This
module runs that test for the ``K = len(cpdt.experiments)`` experiments of one config and reports, for every
experiment ``i`` and inserted dup count ``d``, the interaction ``Y_i^{[K]} - Y_i^{{i}}``.

Arms. For every seed ``S`` of ``cpdt.seeds``, ``K + 1`` ordinary runs (:func:`pretrain_exp.app.launch.launch` on
derived configs, each in ``<run_dir>/arms/<arm>-seed<S>/`` and resumable like any run): ``together`` (all K
experiments) and ``alone-<name>`` for each experiment. All arms of a seed share ``seed``, ``data.seed`` and
``insertion.seed`` (= S), hence the data order, the items and their dup counts, and train the same steps. An
alone arm places all K experiments exactly as the together arm does and then withholds the others
(``insertion.withheld``, :meth:`~pretrain_exp.insertion.plan.Plan.without`), so every copy of the tested
experiment sits at the same global token position in both arms and the arms differ only by the other
experiments' tokens (those positions keep the corpus' own tokens). Experiments of ``insertion.experiments`` not
listed in ``cpdt.experiments`` are inserted in every arm.

The table is :mod:`pretrain_exp.report.cpdt`'s, read from the arms' run dirs: each experiment's effect together vs
alone and their interaction per seed (intervals over items) and pooled over the seeds (intervals over seeds), the
sign-flip test of an interaction and the equivalence test against ``cpdt.margin`` (both Holm-adjusted), and a
verdict per row at ``cpdt.alpha``; written as ``cpdt.json``, ``cpdt.csv``, ``cpdt.md``, ``plots/cpdt.png`` in the
run dir and as the same table and figure in the run's W&B run; ``python -m pretrain_exp.report <run dir>``
rewrites them from the arms. The config rules of ``cpdt.*`` are :func:`pretrain_exp.app.validate.validate_cpdt`
(which logs a warning when ``cpdt.seeds`` are too few for the sign-flip test to reach ``cpdt.alpha``).
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import List, Optional

from pretrain_exp.app.config import CpdtConf, ExperimentConfig
from pretrain_exp.report.cpdt import TOGETHER, arm_dir, log_cpdt_wandb, print_cpdt, write_cpdt_report

log = logging.getLogger(__name__)


def arm_names(cfg: ExperimentConfig) -> List[str]:
    """``together`` and ``alone-<experiment>`` per tested experiment, in that order."""
    return [TOGETHER] + [f"alone-{n}" for n in cfg.cpdt.experiments]


def arm_config(cfg: ExperimentConfig, arm: str, seed: int) -> ExperimentConfig:
    """The ordinary run of one arm (module docstring): seeds set to ``seed``, the other tested experiments
    withheld for an alone arm (and their experiment-specific eval tasks dropped), its own run dir and name."""
    a = copy.deepcopy(cfg)
    a.cpdt = CpdtConf()
    a.seed = a.data.seed = a.insertion.seed = seed
    for task in a.eval.tasks.values():
        if hasattr(task, "seed"):
            task.seed = seed
    if arm != TOGETHER:
        kept = arm[len("alone-"):]
        a.insertion.withheld = [n for n in cfg.cpdt.experiments if n != kept]
        a.eval.tasks = {k: t for k, t in a.eval.tasks.items()
                        if getattr(t, "experiment", None) not in a.insertion.withheld}
    a.run_name = a.wandb.name = f"{cfg.name}-{cfg.model.name}-step{cfg.model.checkpoint_step}-{arm}-seed{seed}"
    a.wandb.group = cfg.wandb.group or cfg.run_name  # the arms and the CPDT run side by side in W&B
    a.wandb.job_type = cfg.wandb.job_type or "cpdt-arm"
    a.wandb.tags = [*cfg.wandb.tags, "cpdt", arm, f"seed{seed}"]
    a.run_dir = str(arm_dir(Path(cfg.run_dir).resolve(), arm, seed))
    return a


def run_cpdt(cfg: ExperimentConfig, hydra: Optional[dict] = None) -> dict:
    """Run every arm (skipping nothing: a finished arm resumes in seconds), then write and log the table.

    :param hydra: the CPDT run's ``.hydra/`` files, recorded in its run dir (the arms' dirs hold none).
    :returns: the ``cpdt.json`` content.
    """
    from pretrain_exp.app.launch import launch
    from pretrain_exp.app.run_record import record_run
    from pretrain_exp.app.tracking import Tracker

    run_dir = Path(cfg.run_dir).resolve()
    names = arm_names(cfg)
    arms = [(seed, arm, arm_config(cfg, arm, seed)) for seed in cfg.cpdt.seeds for arm in names]
    record_run(cfg, run_dir, hydra)
    for k, (seed, arm, arm_cfg) in enumerate(arms, 1):
        log.info("cpdt arm %d/%d: %s seed %d", k, len(arms), arm, seed)
        launch(arm_cfg)
    table = write_cpdt_report(run_dir)
    table_cfg = copy.deepcopy(cfg)
    table_cfg.wandb.group = cfg.wandb.group or cfg.run_name
    table_cfg.wandb.job_type = cfg.wandb.job_type or "cpdt-table"
    table_cfg.wandb.tags = [*cfg.wandb.tags, "cpdt"]
    with Tracker(table_cfg) as tracker:  # the CPDT run's own W&B run (the arms have theirs)
        log_cpdt_wandb(tracker, table)
    print_cpdt(table)
    return table

"""The end of a run: ``results.json``, the run's tables and plots, and the tracker's figures, tables and artifacts.

The summary itself (:func:`~pretrain_exp.report.summary.summarize`, the one reader of the whole config here) is
composed by the experiment; this module writes and publishes it.

Written by a training run once its last segment is evaluated, and by the ``evaluate`` command after evaluating a
run's checkpoints again (:meth:`Experiment.evaluate_checkpoints
<pretrain_exp.app.experiment.Experiment.evaluate_checkpoints>`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

from pretrain_exp.core.io import write_json
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.frameworks.base import Checkpoint
from pretrain_exp.report.plots import plot_loss_vs_step, plot_per_dup
from pretrain_exp.report.tables import write_run_tables

#: the run's plots: ``plots/<name>.png``
PLOTS = {"loss_vs_dup": plot_per_dup, "loss_vs_step": plot_loss_vs_step}


def write_results(rundir: RunDir, tracker, results: dict, all_evaluated: Dict[int, Dict[str, dict]],
                  last: Checkpoint, initial: Checkpoint) -> dict:
    """Write ``results`` (the run's summary, :func:`~pretrain_exp.report.summary.summarize`) as ``results.json``,
    the run's Parquet tables and plots, and log them to the tracker (W&B only) at ``last``'s global step.

    :param all_evaluated: step -> task -> result of every eval in the run dir (:meth:`RunDir.all_evals`), the
        W&B tables' rows.
    :param last: the newest checkpoint (its files are the W&B model artifact unless it is ``initial``).
    :returns: ``results``.
    """
    write_json(rundir.results, results)
    write_run_tables(rundir.path)  # manifest, items and per-item eval rows as Parquet (load_run)
    for name, plot in PLOTS.items():
        plot(results, rundir.plot(name))
    if tracker.wandb_dir is not None:  # figures, tables and artifacts at the run's last global step
        tracker.log_media({f"plots/{name}": _wandb_image(rundir.plot(name)) for name in PLOTS}, last.step)
        tracker.log_results(results, all_evaluated, last.step)
        tracker.log_artifacts(None if last is initial else last.path)
    return results


def _wandb_image(path: Path):
    import wandb

    return wandb.Image(str(path)) if path.is_file() else None

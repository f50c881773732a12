"""The end of a run: ``results.json``, the run's tables and plots, and the tracker's figures, tables and artifacts.

The summary itself (:func:`~pretrain_exp.report.summary.summarize`, the one reader of the whole config here) is
composed by the experiment; this module writes and publishes it.

Written by a training run once its last segment is evaluated, and by the ``evaluate`` command after evaluating a
run's checkpoints again (:meth:`Experiment.evaluate_checkpoints
<pretrain_exp.app.experiment.Experiment.evaluate_checkpoints>`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Dict, Optional

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
    :returns: ``results``, with ``pretrain_exp`` (:func:`code_version`) added.
    """
    results["pretrain_exp"] = code_version()
    write_json(rundir.results, results)
    write_run_tables(rundir.path)  # manifest, items and per-item eval rows as Parquet (load_run)
    for name, plot in PLOTS.items():
        plot(results, rundir.plot(name))
    if tracker.wandb_dir is not None:  # figures, tables and artifacts at the run's last global step
        tracker.log_media({f"plots/{name}": _wandb_image(rundir.plot(name)) for name in PLOTS}, last.step)
        tracker.log_results(results, all_evaluated, last.step)
        tracker.log_artifacts(None if last is initial else last.path)
    return results


def code_version() -> Dict[str, Optional[str]]:
    """``{"version": pretrain_exp.__version__, "commit": ...}``: the code that ran, as ``results.json`` records it.

    ``commit`` is ``git rev-parse HEAD`` of the checkout this package was imported from (``-dirty`` appended when
    ``git status`` shows changes to tracked files), or None for an installed wheel (no checkout), a checkout that is
    not the top of a git work tree, or when ``git`` is missing or fails (10 s limit per call).
    """
    import pretrain_exp

    return {"version": pretrain_exp.__version__, "commit": _git_commit(pretrain_exp.checkout_root())}


def _git_commit(root: Optional[Path]) -> Optional[str]:
    if root is None:
        return None

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root.resolve():
            return None  # e.g. an unpacked sdist inside another repository
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "") if commit else None


def _wandb_image(path: Path):
    import wandb

    return wandb.Image(str(path)) if path.is_file() else None

"""W&B logging of a report, and the one check whether an API key is configured (also used by the run's tracker)."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Optional


def has_wandb_key() -> bool:
    """Whether a W&B API key is configured (``WANDB_API_KEY`` or ``api.wandb.ai`` in ``~/.netrc``)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def log_report_wandb(rep: dict, out_dir: Path, mode: str, project: str) -> Optional[Path]:
    """Log a report to its own W&B run ``report-<dir name>``: every CSV written as a ``wandb.Table`` (key
    ``report/<name>``) and every PNG as a ``wandb.Image`` (key ``plots/<name>``).

    :param mode: ``offline`` (written under ``<out_dir>/wandb``) or ``online`` (offline without an API key).
    :returns: the W&B run dir, or ``None`` if nothing was logged.
    """
    import wandb

    if mode == "online" and not has_wandb_key():
        mode = "offline"
    out_dir = Path(out_dir)
    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(project=project, name=f"report-{out_dir.resolve().name}", dir=str(out_dir), mode=mode)
    logged = {}
    for name, path in rep["paths"].items():
        path = Path(path)
        if path.suffix == ".png" and path.is_file():
            logged[f"plots/{name}"] = wandb.Image(str(path))
        elif path.suffix == ".csv" and path.is_file():
            with open(path, newline="") as f:
                rows = list(csv.reader(f))
            if rows:
                logged[f"report/{name}"] = wandb.Table(columns=rows[0], data=rows[1:], allow_mixed_types=True)
    if logged:
        run.log(logged)
    run_dir = Path(run.dir).parent
    run.finish()
    return run_dir if logged else None

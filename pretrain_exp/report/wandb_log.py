"""W&B logging of a report, and the one check whether W&B has a usable login (also used by the run's tracker)."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Optional


def has_wandb_login() -> bool:
    """Whether W&B finds credentials for its host, asked through ``wandb.login(prompt=False, verify=False)``:
    ``WANDB_API_KEY``, an identity token file, W&B's settings file, or ``.netrc`` (``NETRC``) for the host of
    ``WANDB_BASE_URL`` (``api.wandb.ai`` by default, a self-hosted server's otherwise). No prompt, no network
    request; the key itself is never read here."""
    import wandb

    try:
        return bool(wandb.login(prompt=False, verify=False))
    except TypeError:  # a wandb without login(prompt=...): its internal API reads the same sources for its host
        return getattr(getattr(wandb, "api", None), "api_key", None) is not None
    except Exception:  # noqa: BLE001  (a malformed key or settings file: no usable login)
        return False


def log_report_wandb(rep: dict, out_dir: Path, mode: str, project: str,
                     group: Optional[str] = None) -> Optional[Path]:
    """Log a report to its own W&B run ``report-<dir name>`` (job type ``report``, in W&B group ``group``: the
    sweep's, so it sits next to the sweep's jobs): every CSV written as a ``wandb.Table`` (key ``report/<name>``)
    and every PNG as a ``wandb.Image`` (key ``plots/<name>``).

    :param mode: ``offline`` (written under ``<out_dir>/wandb``) or ``online`` (offline without an API key).
    :returns: the W&B run dir, or ``None`` if nothing was logged.
    """
    import wandb

    if mode == "online" and not has_wandb_login():
        mode = "offline"
    out_dir = Path(out_dir)
    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(project=project, name=f"report-{out_dir.resolve().name}", dir=str(out_dir), mode=mode,
                     group=group, job_type="report")
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

"""Tracking: every logged scalar goes to ``<run_dir>/metrics.jsonl`` and to a W&B run.

W&B runs offline (``<run_dir>/wandb/offline-run-*``, upload later with ``wandb sync``) unless
``wandb.mode=online`` and an API key is configured (``WANDB_API_KEY`` or ``wandb login``). The W&B run id is kept
in ``<run_dir>/wandb_id.txt`` so a resumed run continues the same W&B run; ``wandb.resume_id`` attaches to a
given run instead (``resume="must"``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import uuid
from enum import Enum
from pathlib import Path
from typing import Any, Dict

from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.core.config import WandbMode
from pretrain_exp.core.io import write_text
from pretrain_exp.core.secrets import redact_obj
from pretrain_exp.report.wandb_log import has_wandb_key

log = logging.getLogger(__name__)


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, Enum):
        return obj.value
    return obj


def config_dict(cfg: ExperimentConfig) -> Dict[str, Any]:
    """The config as plain JSON-able dicts (enums as their values)."""
    return _plain(cfg)


class Tracker:
    """``metrics.jsonl`` + W&B for one run. Use as a context manager (finishes the W&B run)."""

    def __init__(self, cfg: ExperimentConfig):
        import wandb

        self.run_dir = Path(cfg.run_dir)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        w = cfg.wandb
        mode = w.mode
        if mode == WandbMode.online and not has_wandb_key():
            log.warning("wandb.mode=online but no W&B API key is configured; logging offline instead")
            mode = WandbMode.offline
        id_file = self.run_dir / "wandb_id.txt"
        # written atomically below; an empty file (left by an older, non-atomic write) counts as absent
        run_id = w.resume_id or (id_file.read_text().strip() if id_file.is_file() else "") or uuid.uuid4().hex[:8]
        name = f"{w.name}-step{cfg.model.checkpoint_step}" if w.add_step_to_name else w.name
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(project=w.project, entity=w.entity, name=name, id=run_id, dir=str(self.run_dir),
                              mode=mode.value, resume="must" if w.resume_id else "allow",
                              config=redact_obj(config_dict(cfg)),
                              settings=wandb.Settings(x_disable_meta=True))  # no command line (it may hold URLs)
        if mode != WandbMode.disabled:
            write_text(id_file, run_id)
        self.wandb_dir = None if mode == WandbMode.disabled else Path(self.run.dir).parent

    def log(self, metrics: Dict[str, float], step: int) -> None:
        """Record scalars at global optimizer step ``step`` (one ``metrics.jsonl`` line, one ``wandb.log``)."""
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps({"step": int(step), **clean}) + "\n")
        self.run.log(clean | {"global_step": int(step)})

    def finish(self) -> None:
        self.run.finish()

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.finish()


class NullTracker:
    """The tracker of ranks other than 0: logs nothing."""

    wandb_dir = None

    def log(self, metrics: Dict[str, float], step: int) -> None:
        pass

    def __enter__(self) -> "NullTracker":
        return self

    def __exit__(self, *exc) -> None:
        pass

"""Tracking: every logged scalar goes to ``<run_dir>/metrics.jsonl`` and to a W&B run.

W&B runs offline (``<run_dir>/wandb/offline-run-*``, upload later with ``wandb sync``) unless
``wandb.mode=online`` and W&B finds a login for its host (``WANDB_API_KEY``, ``wandb login``, ``~/.netrc``; a
self-hosted ``WANDB_BASE_URL`` counts; :func:`~pretrain_exp.report.wandb_log.has_wandb_login`). The W&B run id is kept
in ``<run_dir>/wandb_id.txt`` so a resumed run continues the same W&B run; ``wandb.resume_id`` attaches to a
given run instead (``resume="must"``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.app.run_record import recorded_form
from pretrain_exp.core.config import WandbMode
from pretrain_exp.core.io import write_text
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.report.wandb_log import has_wandb_login

log = logging.getLogger(__name__)


class Tracker:
    """``metrics.jsonl`` + W&B for one run. Use as a context manager (finishes the W&B run).

    W&B has one step axis: every metric is charted against ``global_step`` (``wandb.define_metric``), the trainer's
    global step, which every :meth:`log` and :meth:`log_media` call carries; W&B's own ``_step`` only counts calls.
    The run is put in ``wandb.group`` (default: the sweep's name in a sweep, set by the CLI; the CPDT run's for its
    arms) with ``wandb.job_type`` (default ``train``, ``eval`` for an evaluation-only run) and tags (framework,
    model, experiment name, ``wandb.tags``).
    """

    def __init__(self, cfg: ExperimentConfig):
        self.run_dir = Path(cfg.run_dir)
        self.rundir = RunDir(self.run_dir)
        self.metrics_path = self.rundir.metrics
        self.cfg = cfg
        w = cfg.wandb
        mode = w.mode
        #: the W&B run; None with ``wandb.mode=disabled`` (W&B is then not even imported: ~1 s of CPU per process)
        self.run = None
        self.wandb_dir: Optional[Path] = None
        if mode == WandbMode.disabled:
            return
        import wandb

        if mode == WandbMode.online and not has_wandb_login():
            log.warning("wandb.mode=online but W&B finds no login for %s (WANDB_API_KEY, `wandb login` or "
                        "~/.netrc); logging offline instead", os.environ.get("WANDB_BASE_URL", "api.wandb.ai"))
            mode = WandbMode.offline
        id_file = self.rundir.wandb_id
        # written atomically below; an empty file (left by an older, non-atomic write) counts as absent
        run_id = w.resume_id or self.rundir.read_wandb_id() or uuid.uuid4().hex[:8]
        name = f"{w.name}-step{cfg.model.checkpoint_step}" if w.add_step_to_name else w.name
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(project=w.project, entity=w.entity, name=name, id=run_id, dir=str(self.run_dir),
                              mode=mode.value, resume="must" if w.resume_id else "allow",
                              config=recorded_form(cfg), group=w.group, job_type=job_type(cfg),
                              tags=run_tags(cfg),
                              settings=wandb.Settings(x_disable_meta=True))  # no command line (it may hold URLs)
        self.run.define_metric("global_step")
        self.run.define_metric("*", step_metric="global_step")
        write_text(id_file, run_id)
        self.wandb_dir = Path(self.run.dir).parent

    def log(self, metrics: Dict[str, float], step: int) -> None:
        """Record scalars at global optimizer step ``step`` (one ``metrics.jsonl`` line, one ``wandb.log``)."""
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps({"step": int(step), **clean}) + "\n")
        if self.run is not None:
            self.run.log(clean | {"global_step": int(step)})

    def log_media(self, items: Dict[str, Any], step: int) -> None:
        """Log W&B objects (``wandb.Table``, ``wandb.Image``; ``None`` values skipped) at global step ``step``;
        nothing when W&B is disabled."""
        items = {k: v for k, v in items.items() if v is not None}
        if self.wandb_dir is not None and items:
            self.run.log(items | {"global_step": int(step)})

    def log_results(self, results: dict, evaluated: Dict[int, Dict[str, dict]], step: int) -> None:
        """Log the run's tables at global step ``step`` as ``wandb.Table``: ``tables/per_dup`` (the results'
        per (experiment, dup count) rows) and, per eval task, ``tables/<task>/per_dup`` and
        ``tables/<task>/items`` (its per-item rows), each row with the ``step`` it was evaluated at."""
        if self.wandb_dir is None:
            return
        tables = {"tables/per_dup": results.get("per_dup") or []}
        for s, tasks in sorted(evaluated.items()):
            for task, rec in tasks.items():
                for kind in ("per_dup", "rows"):
                    key = f"tables/{task}/{'items' if kind == 'rows' else kind}"
                    tables.setdefault(key, []).extend({"step": s, **r} for r in rec.get(kind) or [])
        self.log_media({k: wandb_table(rows) for k, rows in tables.items() if rows}, step)

    def log_artifacts(self, checkpoint: Optional[Path] = None) -> None:
        """Log the run's provenance as W&B artifacts: ``plan-<run id>`` (type ``insertion-plan``: the plan,
        manifest, items, audit and resolved config), the newest HF export ``hf/step<N>/`` as ``hf-<run id>`` (type
        ``model``) if the run dir holds one, and, with ``wandb.log_checkpoints``, ``checkpoint`` as
        ``checkpoint-<run id>`` (type ``checkpoint``). W&B stores an unchanged artifact once."""
        if self.wandb_dir is None:
            return
        import wandb

        rid = self.run.id
        files = [f for f in self.rundir.plan_files() if f.is_file()]
        if files:
            art = wandb.Artifact(f"plan-{rid}", type="insertion-plan",
                                 description=f"insertion plan, manifest and resolved config of {self.cfg.run_name}")
            for f in files:
                art.add_file(str(f))
            self.run.log_artifact(art)
        exports = self.rundir.hf_exports()
        if exports:
            step, last = exports[-1]
            art = wandb.Artifact(f"hf-{rid}", type="model", metadata={"step": step},
                                 description=f"HF export of {self.cfg.run_name} at {last.name}")
            art.add_dir(str(last))
            self.run.log_artifact(art)
        if self.cfg.wandb.log_checkpoints and checkpoint is not None and Path(checkpoint).is_dir():
            art = wandb.Artifact(f"checkpoint-{rid}", type="checkpoint", metadata={"path": str(checkpoint)})
            art.add_dir(str(checkpoint))
            self.run.log_artifact(art)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.finish()


def job_type(cfg: ExperimentConfig) -> str:
    """``wandb.job_type``, else ``train`` (``eval`` for a run with ``training.num_steps=0``)."""
    return cfg.wandb.job_type or ("train" if cfg.training.num_steps else "eval")


def run_tags(cfg: ExperimentConfig) -> List[str]:
    """The run's W&B tags: framework, model and experiment names, then ``wandb.tags`` (no repeats); each cut to
    W&B's limit of 64 characters (a model named after a config path can be longer)."""
    return list(dict.fromkeys(str(t)[:64] for t in [cfg.framework.name, cfg.model.name, cfg.name, *cfg.wandb.tags]
                              if str(t)))


def wandb_table(rows: List[Dict[str, Any]]):
    """``rows`` (dicts) as one ``wandb.Table``: columns in first-seen order, missing cells ``None``, lists and
    dicts as JSON text."""
    import wandb

    columns = list(dict.fromkeys(k for r in rows for k in r))
    cell = (lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
    return wandb.Table(columns=columns, data=[[cell(r.get(c)) for c in columns] for r in rows],
                       allow_mixed_types=True)


class NullTracker:
    """The tracker of ranks other than 0: logs nothing."""

    wandb_dir = None

    def log(self, metrics: Dict[str, float], step: int) -> None:
        pass

    def log_media(self, items: Dict[str, Any], step: int) -> None:
        pass

    def log_results(self, results: dict, evaluated: Dict[int, Dict[str, dict]], step: int) -> None:
        pass

    def log_artifacts(self, checkpoint: Optional[Path] = None) -> None:
        pass

    def __enter__(self) -> "NullTracker":
        return self

    def __exit__(self, *exc) -> None:
        pass

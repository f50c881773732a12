"""The job dirs of a sweep (or one run dir) and what each holds: overrides, Hydra job id, resolved config, results.

A job dir is a dir with ``.hydra/`` or ``config.resolved.yaml``; its ``.hydra/overrides.yaml`` (the overrides of the
command line), ``.hydra/hydra.yaml`` (Hydra's job id and number, the sweeper's params), ``config.resolved.yaml`` and
``results.json`` are read as plain data (no config validation, no training stack).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from pretrain_exp.core.rundir import RunDir

#: folders of a job dir (or a sweep dir) that never hold a job dir
_NOT_JOBS = RunDir.OUTPUTS


@dataclass
class Job:
    """One job dir of a sweep (or a single run dir) and what the report knows about it."""

    path: Path
    name: str  #: path relative to the report root (the dir name for a single run)
    overrides: Dict[str, str] = field(default_factory=dict)  #: ``.hydra/overrides.yaml`` as key -> value
    hydra_job: dict = field(default_factory=dict)  #: ``hydra.job`` of ``.hydra/hydra.yaml`` (id, num)
    sweeper_keys: List[str] = field(default_factory=list)  #: keys of ``hydra.sweeper.params``
    config: dict = field(default_factory=dict)  #: ``config.resolved.yaml``
    results: Optional[dict] = None  #: ``results.json``; None if the job has none (failed or running)
    reason: str = ""  #: why there are no results (the last error line found in the job's logs)


def natural_key(text: str):
    """Sort key of a name in natural order (``2`` before ``10``)."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


def is_job_dir(path: Path) -> bool:
    """Whether ``path`` is a job dir (holds ``.hydra/`` or ``config.resolved.yaml``)."""
    return RunDir(path).is_job_dir()


def walk(root: Path) -> Tuple[List[Path], List[Path]]:
    """(job dirs, ``.submitit`` dirs) under ``root``; job dirs, hidden dirs and run outputs are not entered."""
    jobs, submitit = [], []
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        if here != root and is_job_dir(here):
            jobs.append(here)
            dirnames[:] = []
            continue
        submitit += [here / d for d in dirnames if d == ".submitit"]
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in _NOT_JOBS]
    return sorted(jobs, key=lambda p: natural_key(str(p.relative_to(root)))), sorted(submitit)


def find_job_dirs(root: Path) -> List[Path]:
    """Every job dir under ``root`` (a dir with ``.hydra/`` or ``config.resolved.yaml``; ``root`` itself if it is
    one), in natural order (``2`` before ``10``). Hidden folders (``.submitit``) and run outputs are skipped."""
    root = Path(root)
    return [root] if is_job_dir(root) and not RunDir(root).arms.is_dir() else walk(root)[0]


def _read_yaml(path: Path):
    import yaml

    try:
        return yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return None


def _override_key(override: str) -> Tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _lookup(config: dict, key: str):
    """The value at dotted ``key`` of a nested dict, None where there is none."""
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def load_job(path: Path, root: Path) -> Job:
    """Read one job dir: overrides, Hydra job id/num, resolved config and ``results.json`` (if any). An override
    of a key the resolved config holds as a scalar shows the resolved config's value."""
    path = Path(path)
    name = path.name if path == Path(root) else str(path.relative_to(root))
    job = Job(path=path, name=name)
    rd = RunDir(path)
    job.overrides = dict(_override_key(str(o)) for o in _read_yaml(rd.hydra_file("overrides")) or [])
    hydra_cfg = (_read_yaml(rd.hydra_file("hydra")) or {}).get("hydra", {}) or {}
    job.hydra_job = hydra_cfg.get("job", {}) or {}
    params = (hydra_cfg.get("sweeper", {}) or {}).get("params") or {}
    job.sweeper_keys = [_override_key(str(k))[0] for k in params]
    job.config = _read_yaml(rd.config) or {}
    for key in job.overrides:  # the value the run used: a refused re-run cannot have changed the resolved config
        value = _lookup(job.config, key)
        if value is not None and not isinstance(value, (dict, list)):
            job.overrides[key] = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        job.results = rd.read_results()
    except (OSError, ValueError) as e:
        job.reason = f"unreadable {RunDir.RESULTS} ({e})"
    return job

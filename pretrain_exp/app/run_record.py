"""What a run dir records of its config, and the one check that a re-run is the same run.

:func:`record_run` is called once per run dir before anything of the run is written there: it refuses a config that
trains something else than the run the dir holds (:func:`check_same_run`, keys outside
:data:`~pretrain_exp.app.run_name.MUTABLE_KEYS`) and writes ``config.resolved.yaml`` and, for a run of the command
line, its ``.hydra/`` files (:func:`save_resolved_config`: no Hydra interpolations left, credentials redacted by
:func:`~pretrain_exp.core.secrets.redact_obj`). Both read one form of the config, :func:`recorded_form`. A child
process whose config holds credentials reads an unredacted copy readable by this user only, written by
:func:`write_private_config` alone (:attr:`RunRecord.holds_credentials`, :func:`holds_credentials` say when).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from enum import Enum
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from omegaconf import OmegaConf

from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.app.run_name import MUTABLE_KEYS
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.io import write_text
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.core.secrets import redact_obj
from pretrain_exp.evals.registry import parse_task_configs
from pretrain_exp.insertion import dynamic
from pretrain_exp.insertion.types import parse_experiments


class RunDirConflict(ConfigError):
    """A refusal to reuse a run dir: ``what`` differs from the run it holds (a config key old -> new, an input file
    whose content changed), ``restore`` what brings that run back (``"restore its content"``); the message ends with
    the one way out, a run dir of its own (:func:`~pretrain_exp.app.run_name.own_run_dir`, ``name=<new name>``)."""

    def __init__(self, key: str, what: str, restore: str, way_out: Optional[str] = None):
        from pretrain_exp.app.run_name import own_run_dir

        self.what, self.restore = what, restore
        super().__init__(key, f"{what}; {restore} to resume that run, or {way_out or own_run_dir()}")


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


def recorded_form(cfg: ExperimentConfig) -> Dict[str, Any]:
    """The config as ``config.resolved.yaml`` holds it: :func:`config_dict`, credentials redacted."""
    return redact_obj(config_dict(cfg))


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What :func:`record_run` wrote: ``config`` (``config.resolved.yaml``), and whether the config
    ``holds_credentials`` (redacted in that file: a child process reads :func:`write_private_config`'s copy)."""

    config: Path  #: ``config.resolved.yaml`` of the run dir
    holds_credentials: bool  #: whether redaction changed the config (that file cannot stand in for it)


def record_run(cfg: ExperimentConfig, run_dir: Path, hydra: Optional[Dict[str, Any]] = None) -> RunRecord:
    """Make ``run_dir``, refuse it if it holds another run (:func:`check_same_run`), then write what it records of
    the config (:func:`save_resolved_config`: ``config.resolved.yaml``, and the ``.hydra/`` files ``hydra``, if
    given).

    :raises RunDirConflict: naming the first key that differs (nothing is written then).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    plain, recorded = config_dict(cfg), recorded_form(cfg)
    check_same_run(run_dir, recorded)
    return RunRecord(save_resolved_config(cfg, run_dir, hydra), recorded != plain)


def save_resolved_config(cfg: ExperimentConfig, run_dir: Path, hydra: Optional[Dict[str, Any]] = None) -> Path:
    """Write the ``.hydra/`` files ``hydra`` (:func:`save_hydra_files`), if given, then ``config.resolved.yaml``
    (what re-runs compare with and workers read; no Hydra interpolations left), credentials redacted (a URL's
    userinfo and query string, the values of secret environment variables). Returns the config's path."""
    if hydra is not None:
        save_hydra_files(run_dir, hydra)
    path = RunDir(run_dir).config
    _write_redacted(path, config_dict(cfg))
    return path


def save_hydra_files(run_dir: Path, hydra: Dict[str, Any]) -> None:
    """Write ``<run_dir>/.hydra/<name>.yaml`` for each ``name -> content`` of ``hydra`` (Hydra's ``config``,
    ``hydra`` and ``overrides`` as plain containers), credentials redacted: beside the config
    (:func:`save_resolved_config`), or alone for a job that failed before its run was recorded (the sweep report
    lists it)."""
    rd = RunDir(run_dir)
    for name, node in hydra.items():
        _write_redacted(rd.hydra_file(name), node)


def _write_redacted(path: Path, node: Any) -> None:
    """Write ``node`` (plain containers) to ``path`` as YAML, credentials redacted, atomically."""
    write_text(path, OmegaConf.to_yaml(OmegaConf.create(redact_obj(node))))


def holds_credentials(cfg: ExperimentConfig) -> bool:
    """Whether redaction changes the config (then ``config.resolved.yaml`` cannot stand in for it)."""
    plain = config_dict(cfg)
    return redact_obj(plain) != plain


def write_private_config(cfg: ExperimentConfig, folder: Optional[Path] = None,
                         prefix: str = "pretrain_exp-config-") -> Path:
    """Write the config, credentials included, to a new file ``<folder>/<prefix><random>.yaml`` readable by this
    user only (mode 0600, :func:`tempfile.mkstemp`; ``folder`` default: the system temp dir) and return its path:
    what child processes read when ``config.resolved.yaml`` has credentials redacted. The caller removes it."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".yaml", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(OmegaConf.to_yaml(OmegaConf.create(config_dict(cfg))))
    return Path(tmp)


@contextlib.contextmanager
def worker_config(cfg: ExperimentConfig, record: RunRecord) -> Iterator[Path]:
    """The config file the torchrun workers of a run read: ``config.resolved.yaml`` (``record.config``), or, when
    the config holds credentials (which that file has redacted), an unredacted copy readable by this user only,
    outside the run dir (:func:`write_private_config`), removed when the workers are done."""
    if not record.holds_credentials:
        yield record.config
        return
    tmp = write_private_config(cfg)
    try:
        yield tmp
    finally:
        os.unlink(tmp)


def _flatten(d: dict, prefix: str = "") -> Dict[str, object]:
    out: Dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_same_run(run_dir: Path, recorded: dict) -> None:
    """Refuse to continue a run dir that was started with a different training config (``recorded``:
    :func:`recorded_form` of this run's config, as the run dir's file would hold it).

    :raises RunDirConflict: naming the first keys that differ from the run dir's ``config.resolved.yaml`` (old ->
        new).
    """
    path = RunDir(run_dir).config
    if not path.is_file():
        return
    new = _flatten(recorded)
    old = _flatten(_as_derived(OmegaConf.to_container(OmegaConf.load(path))))
    diff = [k for k in sorted(set(old) | set(new))
            if not k.startswith(MUTABLE_KEYS) and old.get(k) != new.get(k)]
    if diff:
        raise RunDirConflict(diff[0], f"run dir {run_dir} holds another run: {describe_difference(old, new, diff)}",
                             "re-run its own command")


def _as_derived(old: dict) -> dict:
    """A run dir's saved config as :func:`~pretrain_exp.app.validate.derive` leaves it today: a file written before
    ``insertion.dynamic`` was saved parsed holds it as given (its ``task`` unset, newer options missing), and one
    written before each policy had its own schema holds every policy's options
    (:func:`~pretrain_exp.insertion.dynamic.own_options` drops the others), so it is parsed before the comparison,
    against the file's own experiments and eval tasks: an unset ``task`` becomes the ``insertion_loss`` task that
    run read (``eval.*`` may change between re-runs; the task a closed loop decides on may not)."""
    ins = old.get("insertion")
    if isinstance(ins, dict) and ins.get("dynamic") is not None:
        try:
            parsed = dynamic.parse_dynamic(dynamic.own_options(ins["dynamic"]),
                                           parse_experiments(ins.get("experiments") or {}),
                                           parse_task_configs((old.get("eval") or {}).get("tasks") or {}))
        except ConfigError:  # not valid today: compared as saved, so the difference is named
            return old
        ins["dynamic"] = None if parsed is None else config_dict(parsed)
    return old


def describe_difference(old: Dict[str, object], new: Dict[str, object], diff: list) -> str:
    """In plain words, what this config changes against a run dir's (flattened configs, ``diff`` their differing
    keys): experiments added or dropped, then up to three changed settings."""
    def experiments(flat):
        return {k.split(".")[2] for k in flat if k.startswith("insertion.experiments.") and k.count(".") >= 3}

    before, after = experiments(old), experiments(new)
    parts = []
    if after - before:
        parts.append("this run adds experiment " + ", ".join(f"`{e}`" for e in sorted(after - before)))
    if before - after:
        parts.append("this run drops experiment " + ", ".join(f"`{e}`" for e in sorted(before - after)))
    moved = {f"insertion.experiments.{e}." for e in before ^ after}
    rest = [k for k in diff if not k.startswith(tuple(moved))]
    shown = [f"{k} {'is new' if k not in old else 'is gone' if k not in new else 'changes'}"
             + (f" ({old.get(k)!r} -> {new.get(k)!r})" if k in old and k in new else "") for k in rest[:3]]
    if len(rest) > 3:
        shown.append(f"{len(rest) - 3} more setting(s)")
    if shown:
        parts.append(("it was started with different settings: " if not parts else "and ") + ", ".join(shown))
    return "; ".join(parts)

"""Run names that keep experiments apart: ``run_name = <name>-<model>-step<S>-seed<seed>[-<what>-<digest>]``.

The run dir is ``<runs>/<run_name>`` (``conf/config.yaml``), and re-running a command in its run dir resumes it.
So two commands that train different things must get different names, and the same command the same one. The
preset's name, the model, the start step and the seed are in the name; the command line's other overrides that
change what is trained (everything outside :data:`MUTABLE_KEYS`, e.g. ``insertion=texts`` or
``training.num_steps=4``) add a suffix: the chosen group options (readable, e.g. ``texts``) and a 6-hex digest of
those overrides, sorted (so their order does not matter). A command line without such overrides keeps the plain
name (``tiny-tiny_llama-step0-seed0``; ``model=base_series`` reads such a name), and so does one that sets
``name=`` itself: the user named the run. The resolver ``${run_suffix:}`` reads Hydra's task overrides; outside a
Hydra run (the compose API, ``config.resolved.yaml``) it is empty.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import PurePosixPath
from typing import Iterable, List, Optional

#: the device layout: a run resumes on any layout that divides its global batch (every step trains the same global
#: rows), so these keys are not part of a run's identity or name
LAYOUT_KEYS = ("training.nproc_per_node", "training.nnodes", "training.micro_batch_size", "training.data_parallel")
#: config keys that may change between invocations on the same run dir (they don't change what is trained)
MUTABLE_KEYS = ("eval.", "wandb.", "release.", "hooks", "run_dir", "cache_dir", "name", "run_name", "data.token_dir",
                "insertion.verify", "insertion.audit",
                "training.max_retries", "training.retry_base_delay_s", "training.num_threads", "training.cleanup",
                "training.keep_last_checkpoints", "training.export_hf", "training.report_to",
                "training.gradient_checkpointing", "verbose", *LAYOUT_KEYS)
#: override keys already spelled in the plain name, or not about what is trained (groups included)
_NOT_IN_SUFFIX = ("seed", "model.checkpoint_step", "experiment", "eval", "wandb", "release", "hydra", "local",
                  "sweep")
#: groups whose chosen option is shown in the suffix (the model's name is in the plain name already)
_SHOWN_GROUPS = ("framework", "data", "insertion", "training")


def override_key(override: str) -> str:
    """The key or group of an override string (``+a.b=1`` -> ``a.b``, ``hydra/launcher=x`` -> ``hydra/launcher``)."""
    return override.lstrip("+~").split("=", 1)[0].strip()


def _counts(key: str) -> bool:
    """Whether an override of ``key`` changes what is trained and is not spelled in the plain name."""
    if re.split(r"[./]", key, 1)[0] in _NOT_IN_SUFFIX:
        return False
    return not any(key.startswith(m) or key == m[:-1] if m.endswith(".") else key == m or key.startswith(m + ".")
                   for m in MUTABLE_KEYS)


def run_suffix(overrides: Iterable[str]) -> str:
    """The suffix of the run name for a command line's ``overrides`` (module docstring): ``""`` when none of them
    changes what is trained or one of them sets ``name=``, else ``-<group options>-<6 hex>`` (or ``-<6 hex>``)."""
    overrides = [str(o) for o in overrides]
    if any(override_key(o) == "name" for o in overrides):
        return ""
    kept = sorted(o.lstrip("+") for o in overrides if _counts(override_key(o)))
    if not kept:
        return ""
    shown: List[str] = []
    for o in kept:
        key, _, value = o.partition("=")
        if key in _SHOWN_GROUPS:
            shown.append(re.sub(r"[^A-Za-z0-9_]+", "+", value.strip("[]'\" ")).strip("+"))
    digest = hashlib.sha256("\n".join(kept).encode()).hexdigest()[:6]
    what = "_".join(s for s in shown if s)[:40]
    return f"-{what}-{digest}" if what else f"-{digest}"


def _resolve_suffix() -> str:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return ""
    try:
        return run_suffix(HydraConfig.get().overrides.task)
    except Exception:  # noqa: BLE001  (a Hydra config without task overrides: no suffix)
        return ""


def own_run_dir(hydra_overrides: Optional[Iterable[str]] = None, sweep: Optional[bool] = None) -> str:
    """The one way out of a refused run dir: ``give this run its own run dir: name=<new name>`` (in a sweep: ``give
    this sweep its own dir: ...``); where the command line pins the dir (``hydra.run.dir=``, in a sweep
    ``hydra.sweep.dir=``), which ``name=`` does not move, that key is named too.

    :param hydra_overrides: Hydra's own overrides of the command line (``hydra.overrides.hydra``); ``None``: the
        running Hydra job's, if any. ``sweep``: a multirun (``None``: the running job's mode).
    """
    if hydra_overrides is None or sweep is None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        try:
            hc = HydraConfig.get() if HydraConfig.initialized() else None
        except ValueError:  # no Hydra job in this process
            hc = None
        if hydra_overrides is None:
            hydra_overrides = list(hc.overrides.hydra) if hc is not None else []
        if sweep is None:
            sweep = hc is not None and hc.mode == RunMode.MULTIRUN
    key, what = (("hydra.sweep.dir", "this sweep its own dir") if sweep
                 else ("hydra.run.dir", "this run its own run dir"))
    if any(override_key(str(o)) == key for o in hydra_overrides):
        return f"give {what}: {key}=<another dir> (or drop {key} and set name=<new name>)"
    return f"give {what}: name=<new name>"


def name_part(value: str) -> str:
    """A model source as one readable run-name component: a path's or Hub id's last part (a ``config.json``'s
    folder; ``.json`` dropped), other characters than ``[A-Za-z0-9_.+-]`` as ``_``. A builder name such as
    ``olmo2_1B_v2`` stays as it is. ``/m/hf-1B.json`` -> ``hf-1B``; ``/m/ckpt/config.json`` -> ``ckpt``;
    ``allenai/OLMo-2-0425-1B`` -> ``OLMo-2-0425-1B``."""
    path = PurePosixPath(str(value).rstrip("/"))
    if path.name == "config.json" and path.parent.name:
        path = path.parent
    name = path.name[:-5] if path.name.endswith(".json") else path.name
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", name).strip("_.") or "model"


def register_run_name_resolver() -> None:
    """Register ``${run_suffix:}`` and ``${name_part:...}`` (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("run_suffix"):
        OmegaConf.register_new_resolver("run_suffix", _resolve_suffix)
    if not OmegaConf.has_resolver("name_part"):
        OmegaConf.register_new_resolver("name_part", name_part)

"""The ``olmo2`` framework: continue an OLMo-2 (old OLMo trainer) ``step<N>-unsharded/`` checkpoint on OLMo-core.

The checkpoint (a tiny preset, ``model.path``, or ``<model.url>/step<model.checkpoint_step>-unsharded/``
downloaded once) is converted once by :mod:`pretrain_exp.frameworks.olmo2.convert` — weights and AdamW moments un-fused
into OLMo-core's OLMo-2 model — and saved as an OLMo-core checkpoint without trainer state (``config.json`` + torch
DCP shards of model and optimizer) in the cache. Training is then exactly the ``olmo_core`` framework's
(:class:`~pretrain_exp.frameworks.olmo_core.framework.OlmoCoreFramework`): OLMo-core's Trainer, insertions by
``pre_step`` callback, the trainer placed at step ``S`` with its data loader at batch ``S``. Before anything is
converted, the
run's config must reproduce the checkpoint's position and data order (``train.pt``'s step; ``config.yaml``'s
sequence length, global batch size and seed with OLMo-2 seed ``S`` ≡ OLMo-core seed ``S−1``); a mismatch is one
error naming the key to set.

With ``framework.lr_schedule=checkpoint``, the default of ``conf/framework/olmo2.yaml``, the run continues the
checkpoint's optimizer (AdamW betas, eps, weight decay and OLMo-2's decay / no-decay param groups,
:func:`~pretrain_exp.frameworks.olmo2.convert.adamw_config`), its ``max_grad_norm`` and its own schedule and peak LR
(``config.yaml`` ``optimizer`` and ``scheduler``, at the trainer's absolute step and tokens seen);
``framework.lr_schedule=run`` applies ``training.*`` from step S. The checkpoint's ``data.instance_filter`` masks
the loss of repetitive instances through OLMo-core's ``InstanceFilterConfig``.

Not reproduced: token files given by ``s3://`` paths (the run's ``data.paths`` are
read; names are compared and a difference is logged).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.capabilities import SUPPORTS_RANDOM_INIT
from pretrain_exp.core.config import ModelConf, RunConfig
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.data.assets import build_once
from pretrain_exp.data.remote import is_remote
from pretrain_exp.frameworks.olmo_core.framework import OlmoCoreFramework

log = logging.getLogger(__name__)


def olmo2_checkpoint_dir(model: ModelConf, cache_dir: str, settings_only: bool = False) -> Path:
    """The OLMo-2 ``step<N>-unsharded/`` dir of ``model`` (preset built, or URL downloaded, into the cache).

    :param settings_only: for a URL checkpoint, fetch only ``config.yaml`` and ``train.pt`` (what
        :meth:`Olmo2Framework.checkpoint_settings` reads), not the weights.
    :raises CheckpointError: if ``model.path`` has no ``config.yaml``.
    """
    from pretrain_exp.frameworks.download import model_checkpoint_dir
    from pretrain_exp.frameworks.olmo2.presets import tiny_checkpoint

    return model_checkpoint_dir("olmo2", model, cache_dir, tiny_checkpoint, settings_only)


def check_continuation(cfg: RunConfig, source: Path) -> None:
    """Check that the run continues ``source`` where it stopped, in its data order.

    :raises ConfigError: naming ``model.checkpoint_step``, ``training.sequence_length``,
        ``training.global_batch_size`` or ``data.seed`` with the value the checkpoint needs.
    """
    from pretrain_exp.frameworks.olmo2.checkpoint import read_config, read_train_state
    from pretrain_exp.frameworks.olmo2.data_order import data_order, train_position

    position = train_position(read_train_state(source))
    order = data_order(read_config(source), position, remote_ok=True)
    t, d = cfg.training, cfg.data
    needs = [("model.checkpoint_step", cfg.model.checkpoint_step, order.checkpoint_step),
             ("training.sequence_length", t.sequence_length, order.sequence_length),
             ("training.global_batch_size", t.global_batch_size, order.global_batch_size)]
    for key, ours, theirs in needs:
        if ours != theirs:
            raise ConfigError(key, f"{ours}, but {source} needs {key}={theirs} to continue its run")
    if d.seed + d.first_epoch - 1 != order.seed:
        raise ConfigError("data.seed", f"{d.seed} with data.first_epoch={d.first_epoch}, but {source} was shuffled "
                          f"with OLMo-2 seed {order.olmo2_seed}: set data.seed={order.seed} data.first_epoch=1 "
                          f"(or data.seed={order.olmo2_seed} data.first_epoch=0)")
    ours = [Path(p).name for p in d.paths]
    if d.paths and ours != [Path(p).name for p in order.paths]:
        log.warning("data.paths names differ from the checkpoint's config.yaml data paths (%d vs %d files); the run "
                    "reads data.paths", len(ours), len(order.paths))


def run_optim_config(cfg: RunConfig, config: dict):
    """The OLMo-core ``AdamWConfig`` the run trains with. ``framework.lr_schedule=checkpoint``: the checkpoint's
    optimizer (:func:`~pretrain_exp.frameworks.olmo2.convert.adamw_config` of its ``config.yaml``: peak LR, betas, eps,
    weight decay and OLMo-2's decay / no-decay parameter groups); ``run``: ``training.learning_rate``, ``adam_beta1``,
    ``adam_beta2`` and ``weight_decay`` in one group (OLMo-core's default eps).

    :raises ConfigError: naming the ``config.yaml`` key of an optimizer that is not reproduced.
    """
    from olmo_core.optim import AdamWConfig

    from pretrain_exp.frameworks.olmo2.convert import adamw_config

    if cfg.framework.lr_schedule == "checkpoint":
        return adamw_config(config)
    t = cfg.training
    return AdamWConfig(lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay)


def run_max_grad_norm(cfg: RunConfig, config: dict) -> Optional[float]:
    """Gradient clipping of the run: the checkpoint's ``max_grad_norm``
    (:func:`~pretrain_exp.frameworks.olmo2.convert.max_grad_norm`) with ``framework.lr_schedule=checkpoint``, else
    ``training.max_grad_norm``."""
    from pretrain_exp.frameworks.olmo2.convert import max_grad_norm

    if cfg.framework.lr_schedule == "checkpoint":
        return max_grad_norm(config, cfg.model.checkpoint_step)
    return cfg.training.max_grad_norm


def convert_to_olmo_core(cfg: RunConfig, source: Path) -> Path:
    """The OLMo-core checkpoint (``config.json`` + DCP model and optimizer shards) converted from ``source``,
    cached under ``<cache_dir>/models/olmo2-converted/``; the AdamW state is laid out in the param groups of the
    optimizer the run builds (:func:`run_optim_config`, part of the cache key), so OLMo-core's Trainer loads it."""
    import torch
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    from pretrain_exp.frameworks.olmo2.checkpoint import read_config
    from pretrain_exp.frameworks.olmo2.convert import load_converted, optimizer_state_for

    optim_config = run_optim_config(cfg, read_config(source))
    # the source as the converted checkpoint records it, and its cache key: a local dir by its real path (a
    # relative path, or a cache reached through a link, would not lead back to it from another process)
    recorded = str(source) if is_remote(str(source)) else str(Path(source).resolve())
    key = hashlib.sha256(json.dumps([recorded, optim_config.as_config_dict()],
                                    sort_keys=True, default=str).encode()).hexdigest()[:16]
    name = f"{Path(source).parent.name}-{Path(source).name}-{key}"
    out = CacheDir(cfg.cache_dir).model("olmo2-converted") / name

    def build(tmp: Path) -> dict:
        log.info("converting OLMo-2 checkpoint %s to OLMo-core (one time)", source)
        ck = load_converted(source, remote_ok=True)
        model = ck.model_config.build(init_device="cpu")
        model.load_state_dict(ck.model_state)
        optim = optim_config.build(model, strict=True)
        if ck.optim_state is not None:
            optim.load_state_dict(optimizer_state_for(optim, model, ck.optim_state))
        with torch.no_grad():
            save_model_and_optim_state(str(tmp), model, optim)
        (tmp / "config.json").write_text(json.dumps({
            "model": ck.model_config.as_config_dict(), "optimizer_state": ck.optim_state is not None,
            "olmo2": {"source": recorded, "global_step": ck.position.global_step}}, indent=2))
        return {"source": recorded}

    return build_once(out, build)


def checkpoint_scheduler(config: dict, path: Path):
    """OLMo-core's equivalent of the OLMo-2 ``config.yaml`` ``scheduler`` (allenai/OLMo ``olmo/optim.py``:
    ``CosWithWarmup``, ``LinearWithWarmup``, ``InvSqrtWithWarmup``, ``ConstantScheduler``, counted in steps or
    tokens as ``scheduler.units`` says). Evaluated at the trainer's absolute step / tokens seen, so a continued
    run gets the learning rates the original run would have used.

    :raises ConfigError: naming ``scheduler.*`` for a scheduler without an equivalent here.
    """
    from olmo_core.optim import ConstantScheduler, CosWithWarmup, InvSqrtWithWarmup, LinearWithWarmup
    from olmo_core.optim.scheduler import SchedulerUnits

    sch = config.get("scheduler") or {}
    name, units = sch.get("name", "cosine_with_warmup"), sch.get("units", "steps")
    if units not in ("steps", "tokens"):
        raise ConfigError("scheduler.units", f"{path}/config.yaml: {units!r}; allowed: steps, tokens")
    kw = dict(units=SchedulerUnits(units))
    warm = dict(warmup=int(sch.get("t_warmup", 100)), warmup_min_lr=float(sch.get("warmup_min_lr") or 0.0))
    if name in ("cosine_with_warmup", "linear_with_warmup") and sch.get("t_max") is None:
        raise ConfigError("scheduler.t_max", f"{path}/config.yaml: not set; the continued schedule needs it")
    if name == "cosine_with_warmup":
        return CosWithWarmup(t_max=int(float(sch["t_max"])), alpha_f=float(sch.get("alpha_f", 0.1)), **warm, **kw)
    if name == "linear_with_warmup":
        return LinearWithWarmup(t_max=int(float(sch["t_max"])), alpha_f=float(sch.get("alpha_f", 0.1)), **warm, **kw)
    if name == "inverse_sqrt_with_warmup":
        return InvSqrtWithWarmup(alpha_f=float(sch.get("alpha_f", 0.1)), **warm, **kw)
    if name == "constant":
        return ConstantScheduler(**kw)
    raise ConfigError("scheduler.name", f"{path}/config.yaml: {name!r} has no OLMo-core equivalent here; use "
                      "framework.lr_schedule=run")


def masked_rows(order, qs, filt) -> np.ndarray:
    """The training-order rows among ``qs`` whose instance ``filt`` (OLMo-core ``InstanceFilterConfig``) masks,
    decided by OLMo-core's own rule (``NumpyDatasetBase._validate_instance`` on ``find_periodic_sequences``) on the
    rows' original tokens: ``int64`` array."""
    from olmo_core.data.utils import find_periodic_sequences

    out = []
    for q in np.asarray(qs, dtype=np.int64):
        tokens = np.asarray(order.row_tokens(int(q)))
        if any(m.times >= filt.repetition_max_count for m in find_periodic_sequences(
                tokens, max_period=filt.repetition_max_period, min_period=filt.repetition_min_period)):
            out.append(int(q))
    return np.asarray(out, dtype=np.int64)


class Olmo2Framework(OlmoCoreFramework):
    """Continue an OLMo-2 checkpoint on OLMo-core (module docstring)."""

    #: OLMo-core's, less ``supports_random_init``: from scratch on OLMo-core is ``framework=olmo_core`` (no OLMo-2
    #: checkpoint)
    capabilities = OlmoCoreFramework.capabilities.without(SUPPORTS_RANDOM_INIT)

    @functools.cached_property
    def source_dir(self) -> Path:
        """The OLMo-2 checkpoint this run continues (recorded in the converted checkpoint's ``config.json``)."""
        return Path(json.loads((self.model_dir / "config.json").read_text())["olmo2"]["source"])

    @functools.cached_property
    def source_config(self) -> dict:
        """The OLMo-2 ``config.yaml`` of the checkpoint this run continues."""
        from pretrain_exp.frameworks.olmo2.checkpoint import read_config

        return read_config(self.source_dir)

    def recorded_special_ids(self) -> tuple:
        """``(eos, pad)`` of the OLMo-2 checkpoint: ``config.yaml`` ``model.eos_token_id`` / ``model.pad_token_id``
        (a bare ``tokenizer.json`` names neither; :meth:`OlmoCoreFramework.tokenizer_path`)."""
        model = self.source_config.get("model") or {}
        return model.get("eos_token_id"), model.get("pad_token_id")

    def optim_config(self):
        """The run's OLMo-core ``AdamWConfig`` (:func:`run_optim_config`): the checkpoint's optimizer and param
        groups with ``framework.lr_schedule=checkpoint``, else ``training.*``."""
        return run_optim_config(self.cfg, self.source_config)

    @property
    def max_grad_norm(self) -> Optional[float]:
        """The run's gradient clipping (:func:`run_max_grad_norm`)."""
        return run_max_grad_norm(self.cfg, self.source_config)

    def instance_filter_config(self):
        """OLMo-core's ``InstanceFilterConfig`` of the checkpoint's ``data.instance_filter`` (OLMo-2's
        ``MemMapDataset`` and OLMo-core's dataset mask the same instances: periods ``repetition_min_period`` ..
        ``repetition_max_period`` repeated ``repetition_max_count`` times or more), or ``None``."""
        from olmo_core.data import InstanceFilterConfig

        filt = (self.source_config.get("data") or {}).get("instance_filter")
        if not filt:
            return None
        return InstanceFilterConfig(**{k: int(v) for k, v in filt.items() if k in (
            "repetition_max_period", "repetition_min_period", "repetition_max_count")})

    def dataset_config_kwargs(self) -> Dict[str, Any]:
        """The ``olmo_core`` framework's dataset arguments plus the checkpoint's instance filter
        (:meth:`instance_filter_config`): each item carries ``instance_mask``, and OLMo-core's train module
        ignores every label of a masked instance (``olmo_core.data.utils.get_labels``), as OLMo-2 did."""
        out = super().dataset_config_kwargs()
        filt = self.instance_filter_config()
        if filt is not None:
            out["instance_filter_config"] = filt
        return out

    @property
    def z_loss_multiplier(self) -> Optional[float]:
        """``framework.lr_schedule=checkpoint``: OLMo-2's z-loss (``softmax_auxiliary_loss`` with
        ``auxiliary_loss_multiplier``, default 1e-4 as in allenai/OLMo ``olmo/config.py``), else none."""
        c = self.source_config
        if self.cfg.framework.uses_run_lr_schedule() or not c.get("softmax_auxiliary_loss"):
            return None
        return float(c.get("auxiliary_loss_multiplier") or 1e-4)

    def _build_trainer(self, start, until_step: int, rows, log_fn):
        """The ``olmo_core`` trainer (with this class's :meth:`optim_config`, :attr:`max_grad_norm` and
        :attr:`z_loss_multiplier`); with an instance filter, the share of masked instances is logged
        (``train/masked_instances``).

        :raises ConfigError: if an insertion lands in an instance the filter masks (it would not be trained).
        """
        filt = self.instance_filter_config()
        if filt is not None and rows.plan is not None and rows.plan.num_insertions:
            masked = masked_rows(rows.order, rows.plan.affected_rows(), filt)
            if masked.size:
                raise ConfigError("data.instance_filter", f"the checkpoint's config.yaml filter masks the loss of "
                                  f"training row {int(masked[0])} ({masked.size} rows in all), which holds an "
                                  "insertion that would not be trained; choose another insertion.seed or placement")
        trainer = super()._build_trainer(start, until_step, rows, log_fn)
        if filt is not None:
            trainer.callbacks["pretrain_exp_metrics"].names["train/masked instances (%)"] = "train/masked_instances"
        return trainer

    @property
    def peak_lr(self) -> float:
        """``framework.lr_schedule=checkpoint``: the checkpoint's ``optimizer.learning_rate``; else the run's."""
        if self.cfg.framework.lr_schedule == "checkpoint":
            return float(self.source_config["optimizer"]["learning_rate"])
        return super().peak_lr

    def scheduler(self):
        """``framework.lr_schedule=checkpoint``: :func:`checkpoint_scheduler`; else the run's schedule."""
        if self.cfg.framework.lr_schedule == "checkpoint":
            return checkpoint_scheduler(self.source_config, self.source_dir)
        return super().scheduler()

    @classmethod
    def checkpoint_settings(cls, model: ModelConf, cache_dir: str) -> Dict[str, Any]:
        """The run settings of an OLMo-2 checkpoint: :meth:`DataOrderParams.overrides
        <pretrain_exp.frameworks.olmo2.data_order.DataOrderParams.overrides>` of its ``config.yaml`` and ``train.pt``
        (token files, seed with ``first_epoch`` 1, sequence length, global batch size, step), ``data.dtype`` =
        ``data.memmap_dtype`` and ``model.tokenizer`` from ``tokenizer.identifier``
        (:func:`~pretrain_exp.data.assets.tokenizer_for_identifier`). See :meth:`Framework.checkpoint_settings
        <pretrain_exp.frameworks.base.Framework.checkpoint_settings>`."""
        from pretrain_exp.data.assets import tokenizer_for_identifier
        from pretrain_exp.frameworks.olmo2.checkpoint import read_config, read_train_state
        from pretrain_exp.frameworks.olmo2.data_order import data_order, train_position

        source = olmo2_checkpoint_dir(model, cache_dir, settings_only=True)
        config = read_config(source)
        order = data_order(config, train_position(read_train_state(source)), remote_ok=True)
        out = dict(order.overrides())
        out.update({"data.dtype": order.memmap_dtype, "data.max_target_sequence_length": None})  # one by one
        identifier = (config.get("tokenizer") or {}).get("identifier")
        if identifier:
            out["model.tokenizer"] = tokenizer_for_identifier(str(identifier))
        return out

    @classmethod
    def resolve_model(cls, cfg: RunConfig) -> Path:
        """Check the continuation, then return the converted OLMo-core checkpoint dir (converted once)."""
        source = olmo2_checkpoint_dir(cfg.model, cfg.cache_dir)
        check_continuation(cfg, source)
        return convert_to_olmo_core(cfg, source)

"""The ``olmo_core`` framework: continue an OLMo-core checkpoint (OLMo-3, or any OLMo-core ``Transformer``) on
OLMo-core's own ``Trainer`` and ``TransformerTrainModule``, with insertions.

Data: OLMo-core's own ``NumpyFSLDataset`` + ``NumpyDataLoader`` read the run's token files, so the dataset
fingerprint is OLMo-core's and an official checkpoint's trainer state (data-loader position, fingerprint, RNG)
loads unchanged. Insertions are spliced in by the ``pre_step`` callback
:class:`~pretrain_exp.frameworks.olmo_core.callbacks.Insertions`: at global step ``k`` DP rank ``r`` of ``W`` holds
:func:`~pretrain_exp.data.schedule.rows_for` ``(k, r, W, B)`` (OLMo-core's layout, tested against
``NumpyFSLDataLoader`` in ``tests/unit/frameworks/olmo_core/test_order.py``); the callback checks that the batch
holds exactly those rows (instance ids at every step, tokens at the first step of a fit) and overwrites the planned
spans with :meth:`Plan.apply <pretrain_exp.insertion.plan.Plan.apply>`; Gaussian-poisoning rows get their noise through
:class:`~pretrain_exp.frameworks.noise_feed.NoiseFeed` on the embedding module. :meth:`OlmoCoreFramework.peek_rows`
reads the rows of any step and rank through OLMo-core's own dataset and rank slicing with the same function the callback
applies, for the verifier.

Training: the trainer's ``max_duration`` is the run's last step ``S + n`` and ``hard_stop`` the segment's last
step. With ``framework.lr_schedule=checkpoint`` (the default) the optimizer (class, hyper-parameters, parameter
groups), clipping, z-loss and LR schedule are the checkpoint's own (``config.json`` ``train_module``, built with
OLMo-core's config classes), the schedule evaluated at the absolute step against the original run's
``trainer.max_duration``, so step ``k`` trains at the LR the original run used at step ``k``; with ``run`` (or a
checkpoint without ``train_module``) AdamW and ``training.lr_scheduler`` apply, counted from the run's first step
``S``. The dataset takes the checkpoint's tokenizer ids and ``max_target_sequence_length``, so OLMo-core's dataset
fingerprint matches. Checkpoints are OLMo-core's ``<run_dir>/checkpoints/step<N>/``
(its ``CheckpointerCallback``; a re-run continues from the newest one, bit-identical on CPU), and the speed monitor's
tokens/s (and MFU on GPUs) are forwarded to the run's tracker. Evals read an HF export
(:class:`~pretrain_exp.frameworks.olmo_core.checkpoint.OlmoCoreCheckpoint`).

Segment ends: a segment that starts where the last one stopped continues that segment's trainer in memory (one
``Trainer``, ``fit`` again with the next ``hard_stop``), and the segment-end checkpoint is written with OLMo-core's
asynchronous save (``training.checkpoint_async``,
:class:`~pretrain_exp.frameworks.olmo_core.callbacks.SegmentCheckpointer`):
staged to CPU memory, then written in the background while the HF export, the evals and the next segment go on.
Where this process holds the whole model (one process, DDP), the HF export is written from the trainer's weights
(equal to the checkpoint's); under FSDP/HSDP it waits for the save and reads it. Old checkpoints are trimmed once
the new one is complete; a save cut short by a kill leaves ``step<N>/`` without ``.metadata.json``, which the
re-run removes before it resumes from the newest complete checkpoint.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.capabilities import (
    APPLIES_EMBEDDING_NOISE,
    FRAMEWORK,
    READS_PLAN_PER_SEGMENT,
    SAVES_ASYNC,
    SUPPORTS_RANDOM_INIT,
    TRAINS_FP8,
    Capabilities,
)
from pretrain_exp.core.config import DataConf, ModelConf, Precision, RunConfig, TrainingConf
from pretrain_exp.core.distributed import is_main_process, rank, world_size
from pretrain_exp.core.errors import CheckpointError, ConfigError, TrainingError
from pretrain_exp.core.interrupt import signal_handler
from pretrain_exp.core.phases import PHASES
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.data.schedule import rows_for
from pretrain_exp.frameworks.base import Checkpoint, Framework, LogFn
from pretrain_exp.frameworks.noise_feed import NoiseFeed
from pretrain_exp.frameworks.olmo_core import upstream
from pretrain_exp.frameworks.olmo_core.callbacks import (
    ForwardMetrics,
    Insertions,
    SaveModelConfig,
    SegmentCheckpointer,
    StartAt,
    StartupPhases,
    apply_insertions,
)
from pretrain_exp.frameworks.olmo_core.checkpoint import OlmoCoreCheckpoint, check_train_state, model_config
from pretrain_exp.frameworks.olmo_core.global_indices import share_global_indices
from pretrain_exp.frameworks.olmo_core.window_gate import gate_loader

log = logging.getLogger(__name__)

#: the file OLMo-core writes last into a checkpoint folder (a folder without it is an unfinished save)
COMPLETE = ".metadata.json"
#: ``training.lr_scheduler`` values this framework maps onto OLMo-core schedulers
SCHEDULERS = ("constant", "constant_with_warmup", "cosine", "linear")


def run_scheduler(name: str, warmup_steps: int, start_step: int):
    """The OLMo-core LR scheduler for ``training.lr_scheduler`` = ``name``, counted from the run's first step.

    :raises ConfigError: for a name outside :data:`SCHEDULERS`.
    """
    from olmo_core.optim import ConstantScheduler, ConstantWithWarmup, CosWithWarmup, LinearWithWarmup, Scheduler

    if name not in SCHEDULERS:
        raise ConfigError("training.lr_scheduler", f"{name!r} is not available with OLMo-core; allowed: "
                          f"{list(SCHEDULERS)}")
    inner = {"constant": lambda: ConstantScheduler(),
             "constant_with_warmup": lambda: ConstantWithWarmup(warmup=warmup_steps),
             "cosine": lambda: CosWithWarmup(warmup=warmup_steps, alpha_f=0.0),
             "linear": lambda: LinearWithWarmup(warmup=warmup_steps, alpha_f=0.0)}[name]()

    @dataclass
    class _FromRunStart(Scheduler):
        """``inner`` evaluated at ``(step - start_step, max_steps - start_step)``."""

        def get_lr(self, initial_lr, current: int, t_max: int):
            return inner.get_lr(initial_lr, current - start_step, t_max - start_step)

    return _FromRunStart()


def _class_names(node) -> list:
    if isinstance(node, dict):
        own = [str(node["_CLASS_"])] if "_CLASS_" in node else []
        return own + [c for v in node.values() for c in _class_names(v)]
    if isinstance(node, list):
        return [c for v in node for c in _class_names(v)]
    return []


def olmo_core_config(raw: Dict[str, Any], base: type, where: Path, key: str):
    """Deserialize ``raw`` (an entry of an OLMo-core ``config.json``) with OLMo-core's ``Config.from_dict`` as
    an instance of ``base`` (e.g. ``OptimConfig``, ``Scheduler``).

    Only classes of the ``olmo_core`` package are accepted: ``from_dict`` imports the module a ``_CLASS_`` names.

    :raises CheckpointError: naming ``where`` and ``key`` if a class is foreign, or the entry does not build.
    """
    foreign = [c for c in _class_names(raw) if not c.startswith("olmo_core.")]
    if foreign:
        raise CheckpointError(f"{where}: {key} names {foreign[0]!r}; only OLMo-core's own classes are read")
    try:
        out = base.from_dict(raw)
    except Exception as e:  # noqa: BLE001  (TypeError, OLMoConfigurationError, ...)
        raise CheckpointError(f"{where}: {key} does not build with OLMo-core "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    if not isinstance(out, base):
        raise CheckpointError(f"{where}: {key} is a {type(out).__name__}, not a {base.__name__}")
    return out


def dataset_paths(dataset: Dict[str, Any], where: Path) -> list:
    """The token files of an OLMo-core ``config.json`` ``dataset`` entry in OLMo-core's order: ``paths`` (globs
    expanded with ``expand_glob``) or ``mix`` under ``mix_base_dir``, permuted by ``source_permutation_seed``
    (OLMo-core's own ``NumpyDatasetConfig._resolve_paths_metadata``, ``olmo_core/data/numpy_dataset.py``, through
    :func:`~pretrain_exp.frameworks.olmo_core.upstream.resolve_paths`).
    ``[]`` if it names none.

    :raises CheckpointError: naming ``where`` if they cannot be resolved.
    """
    if not dataset.get("paths") and not dataset.get("mix"):
        return []
    if (dataset.get("paths") and not dataset.get("expand_glob") and dataset.get("source_permutation_seed") is None):
        return [str(p) for p in dataset["paths"]]
    from olmo_core.data import NumpyFSLDatasetConfig

    raw = dict(dataset, _CLASS_=dataset.get("_CLASS_", "olmo_core.data.numpy_dataset.NumpyFSLDatasetConfig"))
    raw.setdefault("tokenizer", {"vocab_size": 1})
    config = olmo_core_config(raw, NumpyFSLDatasetConfig, where, "dataset")
    try:
        return upstream.resolve_paths(config)
    except upstream.OlmoCoreChanged:
        raise
    except Exception as e:  # noqa: BLE001  (OLMoConfigurationError, FileNotFoundError, ...)
        raise CheckpointError(f"{where}: dataset paths/mix do not resolve ({' '.join(str(e).split())[:200]})") from None


def at_horizon(inner, max_duration: Optional[Dict[str, Any]], tokens_per_step: int, where: Path):
    """``inner`` (an OLMo-core ``Scheduler``) with the original run's horizon: evaluated at the trainer's step
    (or tokens seen, by ``inner.units``) against the ``t_max`` of ``max_duration`` (``config.json``
    ``trainer.max_duration``, ``{"value", "unit"}``) instead of the continuation's own end.

    :param tokens_per_step: ``B * L`` (converts a duration between steps and tokens).
    :raises CheckpointError: if the duration is missing or in epochs.
    """
    from olmo_core.optim import Scheduler
    from olmo_core.optim.scheduler import SchedulerUnits

    value, unit = (max_duration or {}).get("value"), (max_duration or {}).get("unit")
    if value is None or unit not in ("steps", "tokens"):
        raise CheckpointError(f"{where}: trainer.max_duration={max_duration!r}; the checkpoint's LR schedule needs "
                              "its length in steps or tokens (framework.lr_schedule=run uses training.* instead)")
    value = int(value)
    if inner.units == SchedulerUnits.tokens:
        t_max = value if unit == "tokens" else value * tokens_per_step
    else:
        t_max = value if unit == "steps" else -(-value // tokens_per_step)

    @dataclass
    class _AtHorizon(Scheduler):
        """``inner`` evaluated against the original run's ``t_max``."""

        def get_lr(self, initial_lr, current: int, t_max_now: int):
            return inner.get_lr(initial_lr, current, t_max)

    return _AtHorizon(lr_field=inner.lr_field, initial_lr_field=inner.initial_lr_field, units=inner.units)


def loader_seed(data_seed: int, first_epoch: int) -> int:
    """OLMo-core data-loader seed giving the run's order: OLMo-core shuffles epoch ``e`` with ``PCG64(seed + e)``
    from ``e = 1``, the run's first epoch is ``PCG64(data.seed + data.first_epoch)``."""
    return data_seed + first_epoch - 1


def check_trainer_state(state: Dict[str, Any], where: Path, step: int, sequence_length: int, global_batch_size: int,
                        seed: int, data_seed: int, first_epoch: int) -> None:
    """Refuse an initial checkpoint whose trainer state (``train/rank0.pt``) is not where the run starts: another
    global step, or a data loader with another sequence length, tokens per step or seed (OLMo-core resumes the
    data loader from it).

    :param seed: the run's OLMo-core loader seed (:func:`loader_seed` of ``data_seed``, ``first_epoch``).
    :raises CheckpointError: for another step.
    :raises ConfigError: (``training.sequence_length``, ``training.global_batch_size``, ``data.seed``) for another
        data loader.
    """
    if int(state["global_step"]) != step:
        raise CheckpointError(f"model.checkpoint_step={step}, but {where}/train/rank0.pt is at "
                              f"step {state['global_step']}")
    dl = state.get("data_loader", {})
    if dl.get("sequence_length", sequence_length) != sequence_length:
        raise ConfigError("training.sequence_length", f"{sequence_length}, but the checkpoint's data "
                          f"loader used {dl['sequence_length']}")
    if dl.get("batches_processed") and dl["tokens_processed"] // dl["batches_processed"] != (
            global_batch_size * sequence_length):
        raise ConfigError("training.global_batch_size", f"{global_batch_size} rows, but the checkpoint's "
                          f"data loader took {dl['tokens_processed'] // dl['batches_processed']} tokens "
                          "per step")
    if dl.get("seed", seed) != seed:
        raise ConfigError("data.seed", f"{data_seed} (first_epoch {first_epoch}) gives "
                          f"OLMo-core seed {seed}, but the checkpoint's data loader used "
                          f"seed {dl['seed']}")


def data_parallel_config(data_parallel: str, nproc_per_node: int, world: int, cuda: bool):
    """Data parallelism over the torchrun ranks (OLMo-core's ``TransformerDataParallelConfig``) by
    ``training.data_parallel`` = ``data_parallel``: ``auto`` is FSDP (bf16 params, fp32 reductions) on GPUs, as the
    OLMo recipes shard a 7B model, and DDP on CPUs (gloo); ``hsdp`` shards within a node and replicates across nodes
    (``shard_degree`` = ``nproc_per_node``, ``num_replicas`` = ``world / nproc_per_node``); none for one process,
    except ``fsdp`` on one GPU (over a one-process group, :func:`init_distributed`).

    :raises ConfigError: (``training.data_parallel``) for ``hsdp`` whose shard degree does not divide the world.
    """
    from olmo_core.config import DType
    from olmo_core.distributed.parallel import DataParallelType
    from olmo_core.train.train_module import TransformerDataParallelConfig

    sharded_one = world == 1 and data_parallel == "fsdp" and cuda and torch.distributed.is_initialized()
    if world == 1 and not sharded_one:
        return None
    name = data_parallel if data_parallel != "auto" else ("fsdp" if cuda else "ddp")
    if name == "ddp":
        return TransformerDataParallelConfig(name=DataParallelType.ddp)
    sharded = dict(param_dtype=DType.bfloat16 if cuda else None, reduce_dtype=DType.float32)
    if name == "fsdp":
        return TransformerDataParallelConfig(name=DataParallelType.fsdp, **sharded)
    shard = nproc_per_node
    if world % shard:
        raise ConfigError("training.data_parallel", f"hsdp shards over the {shard} ranks of a node, which does "
                          f"not divide the world size {world}")
    return TransformerDataParallelConfig(name=DataParallelType.hsdp, shard_degree=shard,
                                         num_replicas=world // shard, **sharded)


def float8_config(sharded: bool):
    """OLMo-core's ``Float8Config`` of ``training.precision=fp8``: torchao's float8 training
    (``convert_to_float8_training``) of every linear layer but the output layer (OLMo-core's
    ``Transformer.apply_fp8`` leaves ``lm_head.w_out`` and layers with a dim not divisible by 16 in bf16), dynamic
    tensorwise scaling (torchao's default ``Float8LinearConfig``: e4m3 activations and weights, e5m2 gradients, one
    scale per tensor) with power-of-2 scales. Sharded (FSDP/HSDP) it is OLMo-core's
    ``AOFloat8LinearConfig.recommended()``, the setting of OLMo-core's own fp8 recipes (its
    ``olmo_core/internal/cookbook.py`` and ``src/scripts/official/OLMo3/OLMo-3-1025-7B-long-context.py``:
    ``Float8Config(enabled=True, ao=AOFloat8LinearConfig.recommended())``), which also all-gathers the weights in
    float8; unsharded that all-gather option is left off, so the weights stay plain parameters."""
    from olmo_core.float8 import AOFloat8LinearConfig, Float8Config

    ao = AOFloat8LinearConfig.recommended() if sharded else AOFloat8LinearConfig(round_scales_to_power_of_2=True)
    return Float8Config(enabled=True, ao=ao)


def precision_config(precision: Precision, cuda: bool, sharded: bool = False) -> tuple:
    """``(autocast_precision, float8_config)`` of OLMo-core's ``TransformerTrainModuleConfig`` for
    ``training.precision`` = ``precision``: ``bf16`` and ``fp8`` autocast to ``DType.bfloat16`` (parameters and
    optimizer state stay fp32, as OLMo-core trains), ``auto`` too where ``cuda`` and the device supports bf16,
    ``fp32`` (and ``auto`` elsewhere) to ``None``; the float8 config is :func:`float8_config` of ``sharded`` for
    ``fp8``, else ``None``. Whether the machine can train fp8 is checked before the run starts
    (:func:`pretrain_exp.app.launch.check_machine`)."""
    from olmo_core.config import DType

    bf16 = precision in (Precision.bf16, Precision.fp8) or (
        precision == Precision.auto and cuda and torch.cuda.is_bf16_supported())
    return (DType.bfloat16 if bf16 else None), (float8_config(sharded) if precision == Precision.fp8 else None)


def activation_checkpointing_config(enabled: bool):
    """OLMo-core's full activation checkpointing if ``enabled``, else ``None``."""
    if not enabled:
        return None
    from olmo_core.train.train_module import (
        TransformerActivationCheckpointingConfig,
        TransformerActivationCheckpointingMode,
    )

    return TransformerActivationCheckpointingConfig(mode=TransformerActivationCheckpointingMode.full)


def holds_optim_state(ckpt_dir: Path) -> bool:
    """Whether an OLMo-core checkpoint's DCP state (``model_and_optim/``, or the folder itself for a model-only
    one) holds optimizer state (``optim.*`` keys in its ``.metadata``)."""
    from olmo_core.distributed.checkpoint import get_checkpoint_metadata

    state_dir = ckpt_dir / "model_and_optim" if (ckpt_dir / "model_and_optim").is_dir() else ckpt_dir
    if not (state_dir / ".metadata").is_file():
        return False
    return any(k.startswith("optim.") for k in get_checkpoint_metadata(str(state_dir)).state_dict_metadata)


class OlmoCoreFramework(Framework):
    """Continue an OLMo-core checkpoint with OLMo-core's ``Trainer`` (module docstring)."""

    DEFAULT_TOKENIZER = "dolma2"
    #: ``supports_random_init``: with an OLMo-core builder (:func:`random_init_checkpoint`); ``saves_async``:
    #: ``training.checkpoint_async``, OLMo-core's asynchronous save (on unless ``false``). Not ``loads_hub_models``
    #: (OLMo-core checkpoints come from ``model.path`` dirs or ``model.url``) nor ``checkpoints_are_hf``
    #: (distributed checkpoints: a release needs ``training.export_hf``); ``trains_fp8``: ``training.precision=fp8``,
    #: OLMo-core's float8 training (:func:`float8_config`)
    capabilities = Capabilities(FRAMEWORK, {APPLIES_EMBEDDING_NOISE, SUPPORTS_RANDOM_INIT, READS_PLAN_PER_SEGMENT,
                                            SAVES_ASYNC, TRAINS_FP8})
    lr_schedulers = SCHEDULERS  #: mapped onto OLMo-core schedulers by :func:`run_scheduler`

    def __init__(self, cfg: RunConfig, model_dir: Path):
        super().__init__(cfg, model_dir)
        upstream.check()  # OLMo-core's private members this framework reaches: one clear error before any work
        init_distributed(sharded=cfg.training.data_parallel in ("fsdp", "hsdp"))
        self._trainer = None  #: the last segment's trainer, which the next segment continues in memory
        self._last: Optional[OlmoCoreCheckpoint] = None  #: the checkpoint the last segment returned
        self._rng: Optional[dict] = None  #: the RNG states at the end of the last segment (its checkpoint's)
        self._saving = None  #: the checkpointer callback of the last fit (its save may still be running)

    # --- what this framework reads of the run config, typed (besides these, only model.tokenizer, framework.name
    # and seed are read, where they are used) ---------------------------------------------------------------------
    @property
    def training(self) -> TrainingConf:
        """The run's ``training`` settings."""
        return self.cfg.training

    @property
    def data(self) -> DataConf:
        """The run's ``data`` settings."""
        return self.cfg.data

    @property
    def start_step(self) -> int:
        """``model.checkpoint_step``: the global step of the initial checkpoint."""
        return self.cfg.model.checkpoint_step

    @property
    def cache_dir(self) -> str:
        """The asset, token and tokenizer cache (``cache_dir``)."""
        return self.cfg.cache_dir

    @property
    def run_lr_schedule(self) -> bool:
        """Whether ``training.*`` sets the optimizer and LR schedule (``framework.lr_schedule=run``) rather than the
        checkpoint's ``train_module``."""
        return self.cfg.framework.uses_run_lr_schedule()

    @classmethod
    def resolve_model(cls, cfg: RunConfig) -> Path:
        """The initial OLMo-core checkpoint dir: a tiny preset (``model.asset``), ``model.path``, or
        ``<model.url>/step<model.checkpoint_step>/`` downloaded into ``<cache_dir>/models/<model.name>/``.

        :raises CheckpointError: if the dir holds no OLMo-core checkpoint.
        """
        path = cls.resolve_model_dir(cfg.model, cfg.cache_dir)
        if not (path / "config.json").is_file() or not ((path / ".metadata").is_file()
                                                        or (path / "model_and_optim" / ".metadata").is_file()):
            raise CheckpointError(f"model.path={path}: not an OLMo-core checkpoint (needs config.json and "
                                  "model_and_optim/.metadata, or .metadata for a model-only checkpoint)")
        return path

    @classmethod
    def checkpoint_settings(cls, model: ModelConf, cache_dir: str) -> Dict[str, Any]:
        """The run settings an OLMo-core checkpoint records (see :meth:`Framework.checkpoint_settings
        <pretrain_exp.frameworks.base.Framework.checkpoint_settings>`): from ``config.json`` (OLMo-core's
        ``ExperimentConfig``
        as its ``ConfigSaverCallback`` writes it, ``olmo_core/script_utils.py``) the token files as OLMo-core
        resolves ``dataset.paths`` / ``mix`` + ``mix_base_dir`` / ``expand_glob`` / ``source_permutation_seed``
        (``olmo_core/data/numpy_dataset.py``), ``dataset.sequence_length``, ``dataset.dtype``,
        ``dataset.tokenizer.identifier``, ``dataset.max_target_sequence_length`` and
        ``data_loader.global_batch_size`` (tokens) / ``seed``; from ``train/rank0.pt`` (which wins) the step and the
        data loader's sequence length, ``max_target_sequence_length``, seed and tokens per step.
        OLMo-core's loader seed ``s`` is ``data.seed=s`` with ``data.first_epoch=1``.

        :raises CheckpointError: if ``config.json``'s dataset cannot be read or its files resolved.
        """
        from pretrain_exp.data.assets import tokenizer_for_identifier

        if model.init == "random":  # a from-scratch model records no run (its tokenizer defaults to dolma2)
            return {"model.tokenizer": cls.DEFAULT_TOKENIZER, "data.max_target_sequence_length": None}
        path = cls.resolve_model_dir(model, cache_dir, settings_only=True)
        raw = json.loads((path / "config.json").read_text())
        dataset, loader = raw.get("dataset") or {}, raw.get("data_loader") or {}
        out: Dict[str, Any] = {}
        paths = dataset_paths(dataset, path / "config.json")
        if paths:
            out["data.paths"] = paths
        if dataset.get("dtype"):
            out["data.dtype"] = str(dataset["dtype"])
        identifier = (dataset.get("tokenizer") or {}).get("identifier")
        if identifier:
            out["model.tokenizer"] = tokenizer_for_identifier(str(identifier))
        L = dataset.get("sequence_length")
        seed = loader.get("seed")
        tokens_per_step = loader.get("global_batch_size")
        state = check_train_state(path)
        if state is not None:
            out["model.checkpoint_step"] = int(state["global_step"])
            dl = state.get("data_loader") or {}
            L = dl.get("sequence_length", L)
            seed = dl.get("seed", seed)
            if dl.get("batches_processed"):
                tokens_per_step = int(dl["tokens_processed"]) // int(dl["batches_processed"])
        if L:
            out["training.sequence_length"] = int(L)
            if tokens_per_step:
                out["training.global_batch_size"] = int(tokens_per_step) // int(L)
        if seed is not None:
            out.update({"data.seed": int(seed), "data.first_epoch": 1})
        target = dataset.get("max_target_sequence_length")
        if state is not None:
            target = (state.get("data_loader") or {}).get("max_target_sequence_length", target)
        out["data.max_target_sequence_length"] = None if target is None else int(target)
        return out

    @classmethod
    def missing_setting_hint(cls, key: str) -> str:
        """``model.checkpoint_step``: the checkpoint has no trainer state (``train/rank0.pt``), so its step and
        data-loader position are unknown."""
        if key != "model.checkpoint_step":
            return ("a from-scratch model (model.init=random) records no data, sequence length or batch size; "
                    "choose data=... (e.g. data=shakespeare) and set training.* (see experiment=scratch_olmo_core)")
        if key == "model.checkpoint_step":
            return ("it has no trainer state (train/rank0.pt: step and data-loader position); a model-only "
                    "checkpoint starts at the step you give")
        return ""

    @classmethod
    def resolve_model_dir(cls, model: ModelConf, cache_dir: str, settings_only: bool = False) -> Path:
        """The OLMo-core checkpoint dir of ``model``: a tiny preset (``model.asset``), ``model.path``, or
        ``<model.url>/step<model.checkpoint_step>/`` downloaded into ``<cache_dir>/models/<model.name>/`` (with
        ``settings_only``, only its ``config.json`` and ``train/rank0.pt``), or with ``model.init=random`` the
        seeded OLMo-core initialisation of builder ``model.config`` (:func:`random_init_checkpoint`)."""
        from pretrain_exp.frameworks.download import model_checkpoint_dir
        from pretrain_exp.frameworks.olmo_core.presets import random_init_checkpoint, tiny_checkpoint

        if model.init == "random":
            return random_init_checkpoint(model, cache_dir)

        return model_checkpoint_dir("olmo_core", model, cache_dir, tiny_checkpoint, settings_only)

    @property
    def tokenizer_path(self) -> str:
        """``model.tokenizer``, else the dolma2 tokenizer (OLMo-2 and OLMo-3). A bare ``tokenizer.json`` (a file, or
        a dir holding it without the ``tokenizer_config.json`` that names EOS and pad) becomes an HF tokenizer dir in
        the cache, built once, whose EOS and pad are the ids the checkpoint records (:meth:`recorded_special_ids`)."""
        path = self.cfg.model.tokenizer or self.DEFAULT_TOKENIZER
        given = Path(path).expanduser()
        if given.is_dir() and (given / "tokenizer.json").is_file() and not (given / "tokenizer_config.json").is_file():
            path = str(given / "tokenizer.json")
        elif not (path.endswith(".json") and given.is_file()):
            return path
        import hashlib

        from pretrain_exp.data.assets import build_once
        from pretrain_exp.data.tokenize import load_tokenizer

        path = str(Path(path).expanduser())
        eos, pad = self.recorded_special_ids()
        key = hashlib.sha256(Path(path).read_bytes() + json.dumps([eos, pad]).encode()).hexdigest()[:16]

        def build(tmp: Path) -> dict:
            load_tokenizer(path, self.cache_dir, eos_token_id=eos, pad_token_id=pad).save_pretrained(str(tmp))
            return {"tokenizer_file": path, "eos_token_id": eos, "pad_token_id": pad}

        name = f"{self.cfg.framework.name}-{Path(path).stem}-{key}"
        return str(build_once(CacheDir(self.cache_dir).tokenizer(name), build))

    def recorded_special_ids(self) -> tuple:
        """``(eos, pad)`` token ids the checkpoint's run recorded (``None`` where it records none): OLMo-core's
        ``config.json`` ``dataset.tokenizer.eos_token_id`` / ``pad_token_id``."""
        tok = (self.experiment_config.get("dataset") or {}).get("tokenizer") or {}
        return tok.get("eos_token_id"), tok.get("pad_token_id")

    @property
    def vocab_size(self) -> int:
        """The model's (padded) vocabulary size from its ``config.json``."""
        return int(model_config(self.model_dir).vocab_size)

    @functools.cached_property
    def _tokenizer(self):
        from pretrain_exp.data.tokenize import load_tokenizer

        return load_tokenizer(self.tokenizer_path, self.cache_dir)

    @property
    def loader_seed(self) -> int:
        """OLMo-core data-loader seed giving the run's order (:func:`loader_seed`)."""
        return loader_seed(self.data.seed, self.data.first_epoch)

    def initial_checkpoint(self) -> Checkpoint:
        """The checkpoint at ``model.checkpoint_step``; its trainer state (if any) must match the run's data
        order, since OLMo-core resumes the data loader from it.

        :raises CheckpointError: if its trainer state is at another step (or is refused by the safe loader).
        :raises ConfigError: if its data loader used another sequence length, batch size or seed.
        """
        t, step = self.training, self.start_step
        state = check_train_state(self.model_dir)
        if state is not None:
            check_trainer_state(state, self.model_dir, step, t.sequence_length, t.global_batch_size,
                                self.loader_seed, self.data.seed, self.data.first_epoch)
        return OlmoCoreCheckpoint(self.model_dir, step, self._tokenizer)

    def latest_checkpoint(self) -> Optional[Checkpoint]:
        """Newest complete ``checkpoints/step<N>/`` (OLMo-core writes ``.metadata.json`` last)."""
        found = self.rundir.checkpoint_dirs(RunDir.OLMO_CORE_CHECKPOINT, COMPLETE)
        return OlmoCoreCheckpoint(found[-1][1], found[-1][0], self._tokenizer) if found else None

    def checkpoints(self) -> Dict[int, Checkpoint]:
        """Every complete ``checkpoints/step<N>/``, by global step."""
        return {s: OlmoCoreCheckpoint(d, s, self._tokenizer)
                for s, d in self.rundir.checkpoint_dirs(RunDir.OLMO_CORE_CHECKPOINT, COMPLETE)}

    @functools.cached_property
    def experiment_config(self) -> Dict[str, Any]:
        """The initial checkpoint's ``config.json`` (OLMo-core's serialized ``ExperimentConfig``; ``{}`` if absent)."""
        path = self.model_dir / "config.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def _train_module_entry(self, key: str) -> Optional[Any]:
        """``config.json`` ``train_module.<key>`` if ``framework.lr_schedule=checkpoint`` (else ``None``)."""
        if self.run_lr_schedule:
            return None
        return (self.experiment_config.get("train_module") or {}).get(key)

    @property
    def peak_lr(self) -> float:
        """The learning rate the run's schedule scales (``training.learning_rate``); with the checkpoint's optimizer
        (:meth:`optim_config`) its own ``lr`` is the peak instead."""
        return self.training.learning_rate

    def optim_config(self):
        """The OLMo-core optimizer config: with ``framework.lr_schedule=checkpoint`` the checkpoint's own
        ``train_module.optim`` (class, hyper-parameters and ``group_overrides``, e.g. no weight decay on
        ``embeddings.weight``; deserialized with OLMo-core's ``Config.from_dict``), else (or if the checkpoint has
        none) ``AdamWConfig`` of :attr:`peak_lr` and ``training.adam_beta1/2`` / ``weight_decay``.

        :raises CheckpointError: if ``train_module.optim`` names a class outside OLMo-core or is not an optimizer.
        """
        from olmo_core.optim import AdamWConfig, OptimConfig

        raw = self._train_module_entry("optim")
        if raw is not None:
            return olmo_core_config(raw, OptimConfig, self.model_dir / "config.json", "train_module.optim")
        t = self.training
        return AdamWConfig(lr=self.peak_lr, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay)

    @property
    def max_grad_norm(self) -> Optional[float]:
        """Gradient clipping: the checkpoint's ``train_module.max_grad_norm`` (``framework.lr_schedule=checkpoint``
        and a checkpoint that records a train module), else ``training.max_grad_norm``."""
        if self._train_module_entry("optim") is not None:
            value = self._train_module_entry("max_grad_norm")
            return None if value is None else float(value)
        return self.training.max_grad_norm

    @property
    def z_loss_multiplier(self) -> Optional[float]:
        """The checkpoint's ``train_module.z_loss_multiplier`` (as :attr:`max_grad_norm`), else none."""
        value = self._train_module_entry("z_loss_multiplier")
        return None if value is None else float(value)

    def scheduler(self):
        """The OLMo-core LR scheduler: with ``framework.lr_schedule=checkpoint`` the checkpoint's own
        ``train_module.scheduler`` over the original run's ``trainer.max_duration``, at the trainer's absolute step
        (or tokens seen), so step ``k`` of the continuation trains at the LR the original run used at step ``k``
        (:func:`at_horizon`); else (or, logged, for a checkpoint without one, e.g. a model-only preset)
        :func:`run_scheduler` of ``training.lr_scheduler`` from the run's first step.

        :raises CheckpointError: if the scheduler or the original duration cannot be read.
        """
        from olmo_core.optim import Scheduler

        t = self.training
        raw = self._train_module_entry("scheduler")
        if raw is not None:
            where = self.model_dir / "config.json"
            inner = olmo_core_config(raw, Scheduler, where, "train_module.scheduler")
            duration = (self.experiment_config.get("trainer") or {}).get("max_duration")
            return at_horizon(inner, duration, t.global_batch_size * t.sequence_length, where)
        if not self.run_lr_schedule:
            log.info("the checkpoint records no train_module.scheduler (%s/config.json): LR schedule from "
                     "training.* (%s, peak %g) from step %d", self.model_dir, t.lr_scheduler, self.peak_lr,
                     self.start_step)
        return run_scheduler(t.lr_scheduler, t.warmup_steps, self.start_step)

    def dataset_config_kwargs(self) -> Dict[str, Any]:
        """Extra ``NumpyFSLDatasetConfig`` arguments: ``data.max_target_sequence_length`` (the checkpoint's with
        ``data=checkpoint``; fingerprinted, and OLMo-core then shuffles chunks of ``max_target_sequence_length / L``
        instances, as the run's :class:`~pretrain_exp.data.order.DataOrder` does with ``chunk``), and from the
        checkpoint's ``config.json`` ``dataset`` its ``tokenizer`` (vocab size and EOS/pad/BOS ids: part of
        OLMo-core's dataset fingerprint), ``instance_filter_config`` and ``generate_doc_lengths``. Token files,
        dtype, sequence length and work dir are the run's.

        :raises CheckpointError: for a dataset class other than OLMo-core's ``NumpyFSLDatasetConfig``.
        """
        from olmo_core.data import NumpyFSLDatasetConfig

        out: Dict[str, Any] = {}
        if self.data.max_target_sequence_length is not None:
            out["max_target_sequence_length"] = self.data.max_target_sequence_length
        raw = self.experiment_config.get("dataset")
        if not raw:
            return out
        where = self.model_dir / "config.json"
        raw = dict(raw)
        raw.setdefault("tokenizer", {"vocab_size": self.vocab_size})
        if "_CLASS_" not in raw:
            raw["_CLASS_"] = "olmo_core.data.numpy_dataset.NumpyFSLDatasetConfig"
        ds = olmo_core_config(raw, NumpyFSLDatasetConfig, where, "dataset")
        if type(ds) is not NumpyFSLDatasetConfig:
            raise CheckpointError(f"{where}: dataset is {raw['_CLASS_']}; only NumpyFSLDatasetConfig is reproduced")
        out["generate_doc_lengths"] = bool(ds.generate_doc_lengths)
        if "tokenizer" in self.experiment_config.get("dataset", {}):
            out["tokenizer"] = ds.tokenizer
        if ds.instance_filter_config is not None:
            out["instance_filter_config"] = ds.instance_filter_config
        return out

    def _dp_config(self, world: int, cuda: bool):
        """:func:`data_parallel_config` of ``training.data_parallel`` and ``training.nproc_per_node``."""
        return data_parallel_config(self.training.data_parallel, self.training.nproc_per_node, world, cuda)

    def _ac_config(self):
        """:func:`activation_checkpointing_config` of ``training.activation_checkpointing`` (or its hf-style alias
        ``training.gradient_checkpointing``)."""
        return activation_checkpointing_config(self.training.activation_checkpointing
                                               or self.training.gradient_checkpointing)

    def model_config(self, cuda: bool):
        """The checkpoint's ``TransformerConfig`` with the run's attention backend: on GPUs ``training.attention``
        (``sdpa``: OLMo-core's ``torch`` backend; ``flash``: ``flash_2``, flash-attn 2), on CPUs ``torch``
        (:func:`~pretrain_exp.frameworks.olmo_core.checkpoint.model_config`)."""
        from olmo_core.nn.attention.backend import AttentionBackendName

        config = model_config(self.model_dir, cuda)
        mixer = config.block.sequence_mixer
        if cuda and mixer is not None and hasattr(mixer, "backend"):
            mixer.backend = AttentionBackendName.flash_2 if self.training.attention == "flash" else (
                AttentionBackendName.torch)
            if hasattr(mixer, "use_flash"):
                mixer.use_flash = None
        return config

    def _rows_log(self, rank: int) -> Optional[Path]:
        if not self.training.log_rows:
            return None
        path = self.rundir.rows_log(rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def work_dir(self) -> Path:
        """OLMo-core's data work dir of the run (global-indices files)."""
        return self.rundir.olmo_core_work

    def dataset(self, order):
        """OLMo-core's ``NumpyFSLDataset`` over the run's token files (``order.files``), as training builds it: the
        run's files, dtype and ``L``, plus :meth:`dataset_config_kwargs` (the checkpoint's tokenizer ids,
        ``max_target_sequence_length``, instance filter), so its fingerprint is the checkpoint's."""
        from olmo_core.data import NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig

        tok = self._tokenizer
        kwargs = dict(tokenizer=TokenizerConfig(vocab_size=self.vocab_size, eos_token_id=tok.eos_token_id,
                                                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                                                else tok.eos_token_id))
        kwargs.update(self.dataset_config_kwargs())
        return NumpyFSLDatasetConfig(
            dtype=NumpyDatasetDType(order.files.dtype.name),
            paths=order.files.local_paths(), sequence_length=self.training.sequence_length,
            work_dir=str(self.work_dir), **kwargs,
        ).build()

    @functools.lru_cache(maxsize=4)
    def _peek_loader(self, order, dp_rank: int, dp_world: int):
        from olmo_core.data import DataCollator
        from olmo_core.data.data_loader import NumpyDataLoaderBase

        dataset = self.dataset(order)
        dataset.prepare()
        return NumpyDataLoaderBase.wrap_numpy_dataset(
            dataset, global_batch_size=order.global_batch_size * order.sequence_length,
            collator=DataCollator(pad_token_id=dataset.pad_token_id, vocab_size=dataset.vocab_size),
            work_dir=self.work_dir, seed=self.loader_seed, dp_world_size=dp_world, dp_rank=dp_rank,
            fs_local_rank=0)

    def peek_rows(self, rows, step: int, dp_rank: int, dp_world: int, only=None):
        """The rows DP rank ``dp_rank`` of ``dp_world`` trains at global step ``step`` as OLMo-core hands them
        over: the instance ids come from OLMo-core's ``NumpyFSLDataLoader`` (its global-indices file, linked from
        the run's permutation cache by :func:`~pretrain_exp.frameworks.olmo_core.global_indices.share_global_indices`
        so that nothing shuffles again, else its own epoch shuffle; and its own rank slicing), the tokens from its
        ``NumpyFSLDataset``, and :func:`~pretrain_exp.frameworks.olmo_core.callbacks.apply_insertions` checks and
        writes them as the training callback does. No process group is used (safe on rank 0 alone). See
        :meth:`Framework.peek_rows <pretrain_exp.frameworks.base.Framework.peek_rows>`.

        :raises TrainingError: if OLMo-core's instance for a row is not the run's (another seed, files or ``L``).
        """
        order = rows.order
        B = order.global_batch_size
        loader = self._peek_loader(order, int(dp_rank), int(dp_world))
        batches_per_epoch = order.rows_per_epoch // B
        epoch, batch = 1 + (step - 1) // batches_per_epoch, (step - 1) % batches_per_epoch  # OLMo-core epochs
        if upstream.loader_epoch(loader) != epoch:  # as reshuffle(epoch), without its barrier; the shared cache's
            share_global_indices(loader, order.cache_dir, epoch)
            upstream.set_loader_epoch(loader, epoch)
            upstream.set_global_indices(loader, None if upstream.global_indices_file(loader).is_file() else (
                upstream.build_global_indices(loader)))
        global_batch = np.asarray(loader.get_global_indices()[batch * B:(batch + 1) * B])
        instances = upstream.local_instance_indices(loader, global_batch)
        qs = rows_for(step, dp_rank, dp_world, B)
        keep = np.ones(qs.size, bool) if only is None else np.isin(qs, np.asarray(only, dtype=np.int64))
        if not keep.any():
            return qs[:0], np.empty((0, order.sequence_length), np.int64)
        for q in qs[keep] if order.gate is not None else ():  # a streamed window: rows the stream has fetched
            order.gate.wait_row(int(q))
        batch_dict = loader.collator([upstream.dataset_item(loader, i) for i in instances[keep]])
        apply_insertions(batch_dict, qs[keep], order, rows.plan, where=f"step {step}, rank {dp_rank} (peek)")
        return qs[keep], batch_dict["input_ids"].numpy().astype(np.int64)

    def train_module_config(self, cuda: bool, world: int):
        """OLMo-core's ``TransformerTrainModuleConfig`` of the run on ``world`` ranks (``cuda``: on GPUs): micro-batch
        and sequence length, :meth:`optim_config`, clipping, z-loss, :meth:`scheduler`, data parallelism
        (:func:`data_parallel_config`), ``training.compile``, activation checkpointing, and the autocast and
        float8 settings of ``training.precision`` (:func:`precision_config`)."""
        from olmo_core.distributed.parallel import DataParallelType
        from olmo_core.train.train_module import TransformerTrainModuleConfig

        t = self.training
        dp_config = self._dp_config(world, cuda)
        sharded = dp_config is not None and dp_config.name in (DataParallelType.fsdp, DataParallelType.hsdp)
        autocast, float8 = precision_config(t.precision, cuda, sharded)
        return TransformerTrainModuleConfig(
            rank_microbatch_size=t.micro_batch_size * t.sequence_length,
            max_sequence_length=t.sequence_length,
            optim=self.optim_config(),
            max_grad_norm=self.max_grad_norm,
            z_loss_multiplier=self.z_loss_multiplier,
            scheduler=self.scheduler(),
            autocast_precision=autocast,
            float8_config=float8,
            dp_config=dp_config,
            compile_model=t.compile,
            ac_config=self._ac_config(),
        )

    def _build_trainer(self, start: Checkpoint, until_step: int, rows, log_fn: LogFn):
        from olmo_core.data import NumpyDataLoaderConfig
        from olmo_core.train import Duration, LoadStrategy, TrainerConfig
        from olmo_core.utils import seed_all

        t = self.training
        dp_rank, world = rank(), world_size()
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        L = t.sequence_length
        seed_all(self.cfg.seed)
        upstream.reset_world_mesh()  # one mesh per process in OLMo-core; every segment builds a new train module
        with PHASES.phase("model build"):
            model = self.model_config(cuda).build(init_device="meta" if cuda else "cpu")
            train_module = self.train_module_config(cuda, world).build(model, device=device)
        noise_feed = NoiseFeed.for_plan(rows.plan)
        if noise_feed is not None:
            noise_feed.attach(model.embeddings)
        with PHASES.phase("engine data loader", files=len(rows.order.files.paths)):
            # on GPUs, loader workers read the next batches from the token files (or the window cache) while a step
            # runs (benchmarks/prefetch.py: a 512x4096 batch read in the step costs ~2.5% of a 0.3 s step per rank of
            # 8, read a batch ahead 0.04%); on CPUs in the process, which keeps test runs light
            data_loader = NumpyDataLoaderConfig(global_batch_size=t.global_batch_size * L, seed=self.loader_seed,
                                                work_dir=str(self.work_dir), num_workers=4 if cuda else 0,
                                                prefetch_factor=2 if cuda else None).build(self.dataset(rows.order))
            bpe = data_loader.total_batches  # OLMo-core's epochs of this segment: their orders from the shared cache
            for epoch in range(1 + start.step // bpe, 2 + (until_step - 1) // bpe):
                share_global_indices(data_loader, rows.order.cache_dir, epoch)
            gate_loader(data_loader, rows.order)  # a streamed window: each instance once the stream has it
        initial = start.path == self.model_dir
        has_train_state = (Path(start.path) / "train" / "rank0.pt").is_file()
        has_optim_state = holds_optim_state(Path(start.path))
        callbacks = {
            "pretrain_exp_start": StartAt(self.start_step, t.global_batch_size * L),
            "pretrain_exp_insertions": Insertions(rows, dp_rank, world, self._rows_log(dp_rank), noise_feed),
            "pretrain_exp_metrics": ForwardMetrics(log_fn),
            "pretrain_exp_config": SaveModelConfig(self.model_dir / "config.json", is_main_process()),
            "checkpointer": SegmentCheckpointer(save_interval=t.checkpoint_interval, save_async=self.async_save,
                                                max_checkpoints=None),  # training.keep_last_checkpoints trims
            "pretrain_exp_phases": StartupPhases(),
        }
        with PHASES.phase("trainer build"):
            trainer = TrainerConfig(
                save_folder=str(self.checkpoint_dir),
                load_path=str(start.path) if initial else None,
                load_strategy=LoadStrategy.always,  # never train from scratch silently
                load_trainer_state=has_train_state,
                load_optim_state=has_optim_state,
                max_duration=Duration.steps(self.start_step + t.num_steps),
                hard_stop=Duration.steps(until_step),
                metrics_collect_interval=1,
                device=str(device),
                callbacks=callbacks,
            ).build(train_module, data_loader)
        return trainer

    @property
    def async_save(self) -> bool:
        """Whether segment-end checkpoints use OLMo-core's asynchronous save (``training.checkpoint_async``, on
        unless ``false``): the state is staged to CPU memory and written in the background; the next segment,
        the HF export (:class:`~pretrain_exp.frameworks.olmo_core.checkpoint.OlmoCoreCheckpoint`) and the evals go on
        meanwhile."""
        return self.training.checkpoint_async is not False

    def train(self, start: Checkpoint, until_step: int, rows, log_fn: LogFn) -> Checkpoint:
        """Train from ``start`` to global step ``until_step`` (see :meth:`Framework.train`).

        A segment that starts where the last one stopped continues its trainer in memory (model, optimizer, data
        loader and RNG states are the ones its checkpoint holds), so nothing is read back from disk and OLMo-core's
        dry-run batch is not repeated; any other start (the first segment, a resume, a retry after a failure,
        Gaussian-noise runs) builds a trainer that loads the newest complete checkpoint. With :attr:`async_save`
        the returned checkpoint may still be being written: its ``wait()`` (and :meth:`finish_checkpoints`) join
        the save.

        :raises TrainingError: if OLMo-core's batches are not the run's rows, or training stops elsewhere.
        """
        from olmo_core.train import Duration

        trainer = self._continued_trainer(start, rows, log_fn)
        if trainer is None:
            try:
                self.finish_checkpoints()  # a new trainer reads the newest checkpoint from disk
            except Exception as e:  # noqa: BLE001  (the save of a failed fit; its folder is removed below)
                log.warning("the last checkpoint save failed (%s: %s)", type(e).__name__, e)
            self._drop_incomplete_checkpoints()
            trainer = self._build_trainer(start, until_step, rows, log_fn)
        trainer.hard_stop = Duration.steps(until_step)
        log.info("training steps %d -> %d on OLMo-core", start.step, until_step)
        checkpointer = trainer.callbacks["checkpointer"]
        self._saving = checkpointer
        trainer.callbacks["pretrain_exp_phases"].fit_started()
        if signal_handler() is not None:  # Ctrl-C / SIGTERM stop the run here too (OLMo-core's handler installed by
            trainer._handle_os_signal = signal_handler()  # fit() would cancel the fit, and the segment train on)
        trainer.fit()  # on an error the trainer is dropped: a retry starts from the newest checkpoint on disk
        if trainer.global_step != until_step:
            raise TrainingError(f"OLMo-core stopped at step {trainer.global_step} instead of {until_step}")
        from olmo_core.train.utils import EnvRngStates

        keep = trainer.callbacks["pretrain_exp_insertions"].noise_feed is None  # noise hooks: built per segment
        self._trainer, self._rng = (trainer, EnvRngStates.current_state().as_dict()) if keep else (None, None)
        live = trainer.train_module.model if keep and checkpointer.checkpoint_pending and self._unsharded(
            trainer) else None
        self._last = OlmoCoreCheckpoint(self.rundir.checkpoint(until_step, RunDir.OLMO_CORE_CHECKPOINT), until_step,
                                        self._tokenizer,
                                        live_model=live, wait=self.finish_checkpoints)
        if not checkpointer.checkpoint_pending:
            self._trim_checkpoints(self._last)
        return self._last

    def _continued_trainer(self, start: Checkpoint, rows, log_fn: LogFn):
        """The last segment's trainer, set up for the segment from ``start``, if ``start`` is where it stopped
        (else ``None``)."""
        trainer, last = self._trainer, self._last
        self._trainer = None
        if (trainer is None or last is None or start.step != trainer.global_step or Path(start.path) != last.path
                or NoiseFeed.for_plan(rows.plan) is not None):
            return None
        from olmo_core.train.utils import EnvRngStates

        last.live_model = None  # the model moves on from here
        EnvRngStates.from_dict(self._rng).restore()  # as a trainer loading the checkpoint would
        upstream.skip_dry_run(trainer)  # its first fit ran it
        insertions = trainer.callbacks["pretrain_exp_insertions"]
        insertions.rows, insertions.checked = rows, False
        trainer.callbacks["pretrain_exp_metrics"].log_fn = log_fn
        return trainer

    def _unsharded(self, trainer) -> bool:
        """Whether this process holds the whole model under its checkpoint's parameter names (one process or
        DDP, no activation-checkpointing or compile wrappers), so :meth:`OlmoCoreCheckpoint.to_hf` can export it
        directly."""
        from olmo_core.distributed.parallel import DataParallelType

        dp = self._dp_config(world_size(), torch.cuda.is_available())
        sharded = dp is not None and dp.name != DataParallelType.ddp
        if sharded or self._ac_config() is not None or self.training.compile:
            return False  # wrapped blocks: OLMo-core's HF converter needs the plain module types
        names = set(self.model_config(torch.cuda.is_available()).build(init_device="meta").state_dict())
        return names == set(trainer.train_module.model.state_dict())

    def finish_checkpoints(self) -> None:
        """Wait for the asynchronous save of the last segment's checkpoint (every rank; the main process then sees
        its ``.metadata.json``), then trim old checkpoints (``training.keep_last_checkpoints``)."""
        saving = self._saving
        if saving is not None and saving.checkpoint_pending:
            t0 = time.perf_counter()
            saving.wait()
            path = saving.latest_path
            if is_main_process():  # SaveModelConfig copies it in right after the save
                from olmo_core.utils import wait_for

                wait_for(lambda: (path / "config.json").is_file(), f"{path}/config.json")
            log.info("checkpoint %s written in the background (waited %.2f s for it)", path, time.perf_counter() - t0)
            if self._last is not None:
                self._trim_checkpoints(self._last)

    def _drop_incomplete_checkpoints(self) -> None:
        """Remove ``step<N>/`` folders without ``.metadata.json`` (an asynchronous save cut short by a kill), which
        OLMo-core would refuse to save into again; the main process removes them, then every rank goes on."""
        if is_main_process():
            for _, d in self.rundir.checkpoint_dirs(RunDir.OLMO_CORE_CHECKPOINT):
                if d.is_dir() and not (d / COMPLETE).is_file():
                    log.warning("removing %s: a checkpoint whose save did not finish", d)
                    shutil.rmtree(d, ignore_errors=True)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()

    def _trim_checkpoints(self, last: Checkpoint) -> None:
        keep = self.training.keep_last_checkpoints
        if keep <= 0 or not is_main_process():
            return
        found = self.rundir.checkpoint_dirs(RunDir.OLMO_CORE_CHECKPOINT)
        for _, d in found[:-keep]:
            if d != last.path:
                (d / COMPLETE).unlink(missing_ok=True)  # invalidate first, as OLMo-core does
                shutil.rmtree(d, ignore_errors=True)


def init_distributed(sharded: bool = False) -> None:
    """Join the torchrun process group (gloo on CPU, NCCL + gloo on GPUs) if there is one and it is not joined.
    With ``sharded`` (FSDP / HSDP asked for) on one GPU without torchrun, a one-process group on a free local port,
    since OLMo-core shards over a device mesh of the process group."""
    if torch.distributed.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if world_size() > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        torch.distributed.init_process_group(backend=backend)
    elif sharded and torch.cuda.is_available():
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.distributed.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                             world_size=1)
    else:
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))

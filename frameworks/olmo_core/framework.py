"""The ``olmo_core`` framework: continue an OLMo-core checkpoint (OLMo-3, or any OLMo-core ``Transformer``) on
OLMo-core's own ``Trainer`` and ``TransformerTrainModule``, with insertions.

Data: OLMo-core's own ``NumpyFSLDataset`` + ``NumpyDataLoader`` read the run's token files, so the dataset
fingerprint is OLMo-core's and an official checkpoint's trainer state (data-loader position, fingerprint, RNG)
loads unchanged. Insertions are spliced in by the ``pre_step`` callback
:class:`~frameworks.olmo_core.callbacks.Insertions`: at global step ``k`` DP rank ``r`` of ``W`` holds
:func:`~pretrain_exp.data.schedule.rows_for` ``(k, r, W, B)`` (OLMo-core's layout, tested against
``NumpyFSLDataLoader`` in ``tests/unit/frameworks/olmo_core/test_order.py``); the callback checks that the batch
holds exactly those rows (instance ids at every step, tokens at the first step of a fit) and overwrites the planned
spans with :meth:`Plan.apply <pretrain_exp.insertion.plan.Plan.apply>`; Gaussian-poisoning rows get their noise through
:class:`~frameworks.noise_feed.NoiseFeed` on the embedding module. :meth:`OlmoCoreFramework.peek_rows` reads the
rows of any step and rank through OLMo-core's own dataset and rank slicing with the same function the callback
applies, for the verifier.

Training: the trainer's ``max_duration`` is the run's last step ``S + n`` and ``hard_stop`` the segment's last
step, so the LR schedule spans the whole run whatever the segments; the schedule (``training.lr_scheduler``) is
OLMo-core's, counted from the run's first step ``S``. Checkpoints are OLMo-core's ``<run_dir>/checkpoints/step<N>/``
(its ``CheckpointerCallback``; a re-run continues from the newest one, bit-identical on CPU), and the speed monitor's
tokens/s (and MFU on GPUs) are forwarded to the run's tracker. Evals read an HF export
(:class:`~frameworks.olmo_core.checkpoint.OlmoCoreCheckpoint`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

from frameworks.base import Checkpoint, Framework, LogFn, latest_step_dir
from frameworks.noise_feed import NoiseFeed
from frameworks.olmo_core.callbacks import ForwardMetrics, Insertions, SaveModelConfig, StartAt, apply_insertions
from frameworks.olmo_core.checkpoint import OlmoCoreCheckpoint, check_train_state, model_config
from pretrain_exp.core.config import ModelConf, Precision, RunConfig
from pretrain_exp.core.distributed import is_main_process, rank, world_size
from pretrain_exp.core.errors import CheckpointError, ConfigError, TrainingError
from pretrain_exp.data.schedule import rows_for

log = logging.getLogger(__name__)

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


class OlmoCoreFramework(Framework):
    """Continue an OLMo-core checkpoint with OLMo-core's ``Trainer`` (module docstring)."""

    DEFAULT_TOKENIZER = "dolma2"
    applies_embedding_noise = True
    lr_schedulers = SCHEDULERS  #: mapped onto OLMo-core schedulers by :func:`run_scheduler`

    def __init__(self, cfg: RunConfig, model_dir: Path):
        super().__init__(cfg, model_dir)
        init_distributed()

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
        <frameworks.base.Framework.checkpoint_settings>`): from ``config.json`` (OLMo-core's experiment config)
        ``dataset.paths``, ``dataset.sequence_length``, ``dataset.dtype``, ``dataset.tokenizer.identifier`` and
        ``data_loader.global_batch_size`` (tokens) / ``seed``; from ``train/rank0.pt`` (which wins) the step and
        the data loader's sequence length, seed and tokens per step. OLMo-core's loader seed ``s`` is
        ``data.seed=s`` with ``data.first_epoch=1``."""
        from pretrain_exp.data.assets import tokenizer_for_identifier

        path = cls.resolve_model_dir(model, cache_dir, settings_only=True)
        raw = json.loads((path / "config.json").read_text())
        dataset, loader = raw.get("dataset") or {}, raw.get("data_loader") or {}
        out: Dict[str, Any] = {}
        if dataset.get("paths"):
            out["data.paths"] = [str(p) for p in dataset["paths"]]
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
        return out

    @classmethod
    def resolve_model_dir(cls, model: ModelConf, cache_dir: str, settings_only: bool = False) -> Path:
        """The OLMo-core checkpoint dir of ``model``: a tiny preset (``model.asset``), ``model.path``, or
        ``<model.url>/step<model.checkpoint_step>/`` downloaded into ``<cache_dir>/models/<model.name>/`` (with
        ``settings_only``, only its ``config.json`` and ``train/rank0.pt``)."""
        from frameworks.download import (
            download_checkpoint_files,
            download_olmo_core_checkpoint,
            olmo_core_checkpoint_url,
        )
        from frameworks.olmo_core.presets import tiny_checkpoint

        m = model
        if m.asset is not None:
            return tiny_checkpoint(m.asset, cache_dir)
        if m.url is not None:
            dest = Path(cache_dir) / "models" / m.name
            if settings_only:
                return download_checkpoint_files(olmo_core_checkpoint_url(m.url, m.checkpoint_step),
                                                 dest / f"step{int(m.checkpoint_step)}",
                                                 ["config.json", "train/rank0.pt"])
            return download_olmo_core_checkpoint(m.url, m.checkpoint_step, dest)
        path = Path(m.path)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"model.path={path}: not an OLMo-core checkpoint (no config.json)")
        return path

    @property
    def tokenizer_path(self) -> str:
        """``model.tokenizer``, else the dolma2 tokenizer (OLMo-2 and OLMo-3)."""
        return self.cfg.model.tokenizer or self.DEFAULT_TOKENIZER

    @property
    def vocab_size(self) -> int:
        """The model's (padded) vocabulary size from its ``config.json``."""
        return int(model_config(self.model_dir).vocab_size)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @functools.cached_property
    def _tokenizer(self):
        from pretrain_exp.data.tokenize import load_tokenizer

        return load_tokenizer(self.tokenizer_path, self.cfg.cache_dir)

    @property
    def loader_seed(self) -> int:
        """OLMo-core data-loader seed giving the run's order: OLMo-core shuffles epoch ``e`` with
        ``PCG64(seed + e)`` from ``e = 1``, the run's first epoch is ``PCG64(data.seed + data.first_epoch)``."""
        return self.cfg.data.seed + self.cfg.data.first_epoch - 1

    def initial_checkpoint(self) -> Checkpoint:
        """The checkpoint at ``model.checkpoint_step``; its trainer state (if any) must match the run's data
        order, since OLMo-core resumes the data loader from it.

        :raises CheckpointError: if its trainer state is at another step (or is refused by the safe loader).
        :raises ConfigError: if its data loader used another sequence length, batch size or seed.
        """
        cfg, t = self.cfg, self.cfg.training
        step = cfg.model.checkpoint_step
        state = check_train_state(self.model_dir)
        if state is not None:
            if int(state["global_step"]) != step:
                raise CheckpointError(f"model.checkpoint_step={step}, but {self.model_dir}/train/rank0.pt is at "
                                      f"step {state['global_step']}")
            dl = state.get("data_loader", {})
            if dl.get("sequence_length", t.sequence_length) != t.sequence_length:
                raise ConfigError("training.sequence_length", f"{t.sequence_length}, but the checkpoint's data "
                                  f"loader used {dl['sequence_length']}")
            if dl.get("batches_processed") and dl["tokens_processed"] // dl["batches_processed"] != (
                    t.global_batch_size * t.sequence_length):
                raise ConfigError("training.global_batch_size", f"{t.global_batch_size} rows, but the checkpoint's "
                                  f"data loader took {dl['tokens_processed'] // dl['batches_processed']} tokens "
                                  "per step")
            if dl.get("seed", self.loader_seed) != self.loader_seed:
                raise ConfigError("data.seed", f"{cfg.data.seed} (first_epoch {cfg.data.first_epoch}) gives "
                                  f"OLMo-core seed {self.loader_seed}, but the checkpoint's data loader used "
                                  f"seed {dl['seed']}")
        return OlmoCoreCheckpoint(self.model_dir, step, self._tokenizer)

    def latest_checkpoint(self) -> Optional[Checkpoint]:
        """Newest complete ``checkpoints/step<N>/`` (OLMo-core writes ``.metadata.json`` last)."""
        found = latest_step_dir(self.checkpoint_dir, r"step(\d+)", ".metadata.json")
        return None if found is None else OlmoCoreCheckpoint(found[1], found[0], self._tokenizer)

    @property
    def peak_lr(self) -> float:
        """The learning rate the schedule scales (``training.learning_rate``)."""
        return self.cfg.training.learning_rate

    def scheduler(self):
        """The OLMo-core LR scheduler of the run (:func:`run_scheduler` of ``training.lr_scheduler``)."""
        t = self.cfg.training
        return run_scheduler(t.lr_scheduler, t.warmup_steps, self.cfg.model.checkpoint_step)

    @staticmethod
    def _dp_config(world: int, cuda: bool):
        """Data parallelism over the torchrun ranks: FSDP (bf16 params, fp32 reductions) on GPUs, as the OLMo
        recipes shard a 7B model; DDP on CPUs (gloo); none for one process."""
        from olmo_core.config import DType
        from olmo_core.distributed.parallel import DataParallelType
        from olmo_core.train.train_module import TransformerDataParallelConfig

        if world == 1:
            return None
        if cuda:
            return TransformerDataParallelConfig(name=DataParallelType.fsdp, param_dtype=DType.bfloat16,
                                                 reduce_dtype=DType.float32)
        return TransformerDataParallelConfig(name=DataParallelType.ddp)

    def _rows_log(self, rank: int) -> Optional[Path]:
        if not self.cfg.training.log_rows:
            return None
        (self.run_dir / "rows").mkdir(parents=True, exist_ok=True)
        return self.run_dir / "rows" / f"rank{rank}.jsonl"

    @property
    def work_dir(self) -> Path:
        """OLMo-core's data work dir of the run (global-indices files)."""
        return self.run_dir / "olmo_core_work"

    def dataset(self, order):
        """OLMo-core's ``NumpyFSLDataset`` over the run's token files (``order.files``), as training builds it."""
        from olmo_core.data import NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig

        tok = self._tokenizer
        return NumpyFSLDatasetConfig(
            dtype=NumpyDatasetDType(order.files.dtype.name),
            tokenizer=TokenizerConfig(vocab_size=self.vocab_size, eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                                      else tok.eos_token_id),
            paths=[str(p) for p in order.files.paths], sequence_length=self.cfg.training.sequence_length,
            work_dir=str(self.work_dir),
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
        over: the instance ids come from OLMo-core's ``NumpyFSLDataLoader`` (its epoch shuffle, or the trainer's
        global-indices file when it exists, and its own rank slicing), the tokens from its ``NumpyFSLDataset``,
        and :func:`~frameworks.olmo_core.callbacks.apply_insertions` checks and writes them as the training
        callback does. No process group is used (safe on rank 0 alone). See :meth:`Framework.peek_rows
        <frameworks.base.Framework.peek_rows>`.

        :raises TrainingError: if OLMo-core's instance for a row is not the run's (another seed, files or ``L``).
        """
        order = rows.order
        B = order.global_batch_size
        loader = self._peek_loader(order, int(dp_rank), int(dp_world))
        batches_per_epoch = order.rows_per_epoch // B
        epoch, batch = 1 + (step - 1) // batches_per_epoch, (step - 1) % batches_per_epoch  # OLMo-core epochs
        if loader._epoch != epoch:  # as reshuffle(epoch), without its barrier
            loader._epoch = epoch
            loader._global_indices = None if loader._global_indices_file.is_file() else (
                loader._build_global_indices())
        global_batch = np.asarray(loader.get_global_indices()[batch * B:(batch + 1) * B])
        instances = np.asarray(loader._get_local_instance_indices(global_batch), dtype=np.int64)
        qs = rows_for(step, dp_rank, dp_world, B)
        keep = np.ones(qs.size, bool) if only is None else np.isin(qs, np.asarray(only, dtype=np.int64))
        if not keep.any():
            return qs[:0], np.empty((0, order.sequence_length), np.int64)
        batch_dict = loader.collator([loader._get_dataset_item(int(i)) for i in instances[keep]])
        apply_insertions(batch_dict, qs[keep], order, rows.plan, where=f"step {step}, rank {dp_rank} (peek)")
        return qs[keep], batch_dict["input_ids"].numpy().astype(np.int64)

    def _build_trainer(self, start: Checkpoint, until_step: int, rows, log_fn: LogFn):
        from olmo_core.config import DType
        from olmo_core.data import NumpyDataLoaderConfig
        from olmo_core.optim import AdamWConfig
        from olmo_core.train import Duration, LoadStrategy, TrainerConfig
        from olmo_core.train.callbacks import CheckpointerCallback
        from olmo_core.train.train_module import TransformerTrainModuleConfig
        from olmo_core.utils import seed_all

        cfg, t = self.cfg, self.cfg.training
        dp_rank, world = rank(), world_size()
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        bf16 = t.precision == Precision.bf16 or (
            t.precision == Precision.auto and cuda and torch.cuda.is_bf16_supported())
        L = t.sequence_length
        seed_all(cfg.seed)
        from olmo_core.distributed import parallel

        parallel._WORLD_MESH = None  # one mesh per process in OLMo-core; every segment builds a new train module
        model = model_config(self.model_dir).build(init_device="meta" if cuda else "cpu")
        train_module = TransformerTrainModuleConfig(
            rank_microbatch_size=t.micro_batch_size * L,
            max_sequence_length=L,
            optim=AdamWConfig(lr=self.peak_lr, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay),
            max_grad_norm=t.max_grad_norm,
            scheduler=self.scheduler(),
            autocast_precision=DType.bfloat16 if bf16 else None,
            dp_config=self._dp_config(world, cuda),
        ).build(model, device=device)
        noise_feed = NoiseFeed.for_plan(rows.plan)
        if noise_feed is not None:
            noise_feed.attach(model.embeddings)
        data_loader = NumpyDataLoaderConfig(global_batch_size=t.global_batch_size * L, seed=self.loader_seed,
                                            work_dir=str(self.work_dir)).build(self.dataset(rows.order))
        initial = start.path == self.model_dir
        has_train_state = (Path(start.path) / "train" / "rank0.pt").is_file()
        has_optim_state = (Path(start.path) / "model_and_optim").is_dir() or bool(
            json.loads((Path(start.path) / "config.json").read_text()).get("optimizer_state"))
        callbacks = {
            "pretrain_exp_start": StartAt(cfg.model.checkpoint_step, t.global_batch_size * L),
            "pretrain_exp_insertions": Insertions(rows, dp_rank, world, self._rows_log(dp_rank), noise_feed),
            "pretrain_exp_metrics": ForwardMetrics(log_fn),
            "pretrain_exp_config": SaveModelConfig(self.model_dir / "config.json", is_main_process()),
            "checkpointer": CheckpointerCallback(save_interval=t.checkpoint_interval, save_async=False),
        }
        trainer = TrainerConfig(
            save_folder=str(self.checkpoint_dir),
            load_path=str(start.path) if initial else None,
            load_strategy=LoadStrategy.always,  # never train from scratch silently
            load_trainer_state=has_train_state,
            load_optim_state=has_optim_state,
            max_duration=Duration.steps(cfg.model.checkpoint_step + t.num_steps),
            hard_stop=Duration.steps(until_step),
            metrics_collect_interval=1,
            device=str(device),
            callbacks=callbacks,
        ).build(train_module, data_loader)
        return trainer

    def train(self, start: Checkpoint, until_step: int, rows, log_fn: LogFn) -> Checkpoint:
        """Train from ``start`` to global step ``until_step`` (see :meth:`Framework.train`).

        :raises TrainingError: if OLMo-core's batches are not the run's rows, or training stops elsewhere.
        """
        trainer = self._build_trainer(start, until_step, rows, log_fn)
        log.info("training steps %d -> %d on OLMo-core", start.step, until_step)
        trainer.fit()
        done = self.latest_checkpoint()
        if done is None or done.step != until_step:
            raise TrainingError(f"OLMo-core stopped at step {done and done.step} instead of {until_step}")
        self._trim_checkpoints(done)
        return done

    def _trim_checkpoints(self, last: Checkpoint) -> None:
        keep = self.cfg.training.keep_last_checkpoints
        if keep <= 0 or not is_main_process():
            return
        found = sorted((int(d.name[4:]), d) for d in self.checkpoint_dir.glob("step*") if d.name[4:].isdigit())
        for _, d in found[:-keep]:
            if d != last.path:
                (d / ".metadata.json").unlink(missing_ok=True)  # invalidate first, as OLMo-core does
                shutil.rmtree(d, ignore_errors=True)


def init_distributed() -> None:
    """Join the torchrun process group (gloo on CPU, NCCL + gloo on GPUs) if there is one and it is not joined."""
    if world_size() > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))

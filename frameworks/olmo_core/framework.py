"""The ``olmo_core`` framework: continue an OLMo-core checkpoint (OLMo-3, or any OLMo-core ``Transformer``) on
OLMo-core's own ``Trainer`` and ``TransformerTrainModule``, with insertions.

Data: OLMo-core's own ``NumpyFSLDataset`` + ``NumpyDataLoader`` read the run's token files, so the dataset
fingerprint is OLMo-core's and an official checkpoint's trainer state (data-loader position, fingerprint, RNG)
loads unchanged. Insertions are spliced in by a ``pre_step`` callback: at global step ``k`` DP rank ``r`` of
``W`` holds training-order rows ``q = (k-1)·B + r + i·W`` (``i`` = row of the rank batch; OLMo-core's layout,
tested against ``NumpyFSLDataLoader`` in ``tests/test_olmo_core_order.py``). The callback first checks that the
batch holds exactly those rows (instance ids and tokens, read through :class:`~pretrain_exp.data.order.DataOrder`)
and then overwrites the planned spans with :meth:`Plan.apply <pretrain_exp.insertion.plan.Plan.apply>`;
Gaussian-poisoning rows get their noise through :class:`MicroBatchRows` on the embedding module.

Training: the trainer's ``max_duration`` is the run's last step ``S + n`` and ``hard_stop`` the segment's last
step, so the LR schedule spans the whole run whatever the segments; the schedule (``training.lr_scheduler``) is
OLMo-core's, counted from the run's first step ``S``. Checkpoints are OLMo-core's ``<run_dir>/checkpoints/step<N>/``
(its ``CheckpointerCallback``; a re-run continues from the newest one, bit-identical on CPU), and the speed monitor's
tokens/s (and MFU on GPUs) are forwarded to the run's tracker. Evals read an HF export
(:class:`~frameworks.olmo_core.checkpoint.OlmoCoreCheckpoint`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from frameworks.base import Checkpoint, Framework, LogFn
from frameworks.olmo_core.checkpoint import OlmoCoreCheckpoint, check_train_state, model_config
from pretrain_exp.core.config import Precision, RunConfig
from pretrain_exp.core.errors import CheckpointError, ConfigError, TrainingError
from pretrain_exp.insertion.noise import EmbeddingNoise

log = logging.getLogger(__name__)

#: ``training.lr_scheduler`` values this framework maps onto OLMo-core schedulers
SCHEDULERS = ("constant", "constant_with_warmup", "cosine", "linear")
#: OLMo-core metric -> the run's metric name
METRICS = {
    "train/CE loss": "train/loss",
    "optim/total grad norm": "train/grad_norm",
    "optim/LR (group 0)": "train/learning_rate",
    "throughput/device/TPS": "train/tokens_per_s",
    "throughput/device/MFU": "train/mfu",
}


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


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


class MicroBatchRows:
    """Feeds the Gaussian-poisoning hook (:class:`~pretrain_exp.insertion.gaussian.EmbeddingNoise`) the rows of
    each micro-batch: OLMo-core's train module splits the rank batch into consecutive micro-batches and runs one
    forward pass per micro-batch, so a forward pre-hook on the embedding module hands the next ``b`` rows of the
    step (``b`` = the micro-batch's rows) to the noise hook. Outside a training step (the
    trainer's dry-run batch) no rows are set, so no noise is added."""

    def __init__(self, noise):
        self.noise = noise
        self._rows: Optional[np.ndarray] = None
        self._next = 0

    def attach(self, embeddings: torch.nn.Module) -> None:
        """Register the noise hook and the feeding pre-hook on ``embeddings``."""
        self.noise.attach(embeddings)
        embeddings.register_forward_pre_hook(self._pre_hook)

    def start_step(self, qs: np.ndarray) -> None:
        """The rank batch's training-order rows ``(b,)`` for the step about to be trained."""
        self._rows, self._next = np.asarray(qs, dtype=np.int64), 0

    def end_step(self) -> None:
        self._rows = None
        self.noise.set_rows(None)

    def _pre_hook(self, module, args):
        if self._rows is None:
            self.noise.set_rows(None)
            return
        b = args[0].shape[0]
        self.noise.set_rows(self._rows[self._next:self._next + b])
        self._next += b


def _insertion_callback(rows, rank: int, world: int, rows_log: Optional[Path] = None,
                        noise_feed: Optional[MicroBatchRows] = None):
    from olmo_core.train.callbacks import Callback

    class Insertions(Callback):
        """``pre_step``: check the rank batch holds rows ``(k-1)·B + r + i·W``, apply the plan to them and tell
        ``noise_feed`` (Gaussian poisoning) the step's rows; with ``rows_log``, append ``{"step", "rank",
        "rows": [q, ...], "sha256": [...]}`` (the tokens each row is trained on) to that jsonl file.

        The instance id of every row is checked at every step; the tokens (catching another dtype or other files)
        at the first step of each fit. Only rows holding planned spans are copied and rewritten."""

        checked = False

        def pre_step(self, batch):
            order, plan = rows.order, rows.plan
            ids = batch["input_ids"]
            qs = (self.trainer.global_step - 1) * order.global_batch_size + rank + world * np.arange(ids.shape[0])
            index = batch["index"].tolist() if "index" in batch else None
            check_tokens = not self.checked  # tokens once per fit (dtype, files); instance ids at every step
            self.checked = True
            for i, q in enumerate(qs.tolist()):
                instance = order.instance(q)[1]
                if (index is not None and index[i] != instance) or (
                        check_tokens and not np.array_equal(ids[i].cpu().numpy(), order.row_tokens(q))):
                    raise TrainingError(
                        f"step {self.trainer.global_step}, rank {rank}: OLMo-core's batch row {i} is not "
                        f"training-order row {q} (instance {instance}, got {index[i] if index else '?'}); "
                        "data.seed / data.paths / sequence length differ from the checkpoint's data loader")
                first, end = plan.spans_in_row(q) if plan is not None else (0, 0)
                if end > first:
                    row = ids[i].cpu().numpy().astype(np.int64)
                    plan.apply(q, row)
                    ids[i] = torch.from_numpy(row).to(ids.dtype)
            if rows_log is not None:
                digests = [hashlib.sha256(r.cpu().numpy().astype(np.int64).tobytes()).hexdigest() for r in ids]
                with open(rows_log, "a") as f:
                    f.write(json.dumps({"step": self.trainer.global_step, "rank": rank, "rows": qs.tolist(),
                                        "sha256": digests}) + "\n")
            if noise_feed is not None:
                noise_feed.start_step(qs)

        def post_train_batch(self):
            if noise_feed is not None:
                noise_feed.end_step()

    return Insertions()


def _config_callback(config_json: Path, rank: int):
    from olmo_core.train.callbacks import Callback

    class SaveModelConfig(Callback):
        """``post_checkpoint_saved``: put the model's ``config.json`` into every checkpoint (rank 0), so each
        one is self-describing like the published ones."""

        def post_checkpoint_saved(self, path):
            if rank == 0 and not str(path).startswith(("s3://", "gs://", "http")):
                tmp = Path(path) / ".config.json.tmp"
                shutil.copyfile(config_json, tmp)
                os.replace(tmp, Path(path) / "config.json")

    return SaveModelConfig()


def _start_callback(step: int, tokens_per_step: int):
    from olmo_core.train.callbacks import Callback

    class StartAt(Callback):
        """``post_checkpoint_loaded``: a checkpoint without trainer state (model-only, or converted from
        OLMo-2) leaves the trainer at step 0; put the trainer and its data loader at the run's first step."""

        def post_checkpoint_loaded(self, path):
            trainer = self.trainer
            if trainer.global_step == 0 and step > 0:
                state = trainer.data_loader.state_dict()
                state.update(batches_processed=step, tokens_processed=step * tokens_per_step)
                trainer.data_loader.load_state_dict(state)
                trainer.global_step = step
                trainer.global_train_tokens_seen = step * tokens_per_step

    return StartAt()


def _log_callback(log_fn: LogFn):
    from olmo_core.train.callbacks import Callback

    class Forward(Callback):
        """Forward OLMo-core's training scalars (loss, grad norm, LR, tokens/s, MFU) to the run's tracker."""

        def log_metrics(self, step: int, metrics):
            out = {ours: float(metrics[theirs]) for theirs, ours in METRICS.items() if theirs in metrics}
            if out:
                log_fn(out, step)

    return Forward()


class OlmoCoreFramework(Framework):
    """Continue an OLMo-core checkpoint with OLMo-core's ``Trainer`` (module docstring)."""

    DEFAULT_TOKENIZER = "dolma2"
    applies_embedding_noise = True

    def __init__(self, cfg: RunConfig, model_dir: Path):
        super().__init__(cfg, model_dir)
        init_distributed()

    @classmethod
    def resolve_model(cls, cfg: RunConfig) -> Path:
        """The initial OLMo-core checkpoint dir: a tiny preset (``model.asset``), ``model.path``, or
        ``<model.url>/step<model.checkpoint_step>/`` downloaded into ``<cache_dir>/models/<model.name>/``.

        :raises CheckpointError: if the dir holds no OLMo-core checkpoint.
        """
        from frameworks.download import download_olmo_core_checkpoint
        from frameworks.olmo_core.presets import tiny_checkpoint

        m = cfg.model
        if m.asset is not None:
            return tiny_checkpoint(m.asset, cfg.cache_dir)
        if m.url is not None:
            path = download_olmo_core_checkpoint(m.url, m.checkpoint_step, Path(cfg.cache_dir) / "models" / m.name)
        else:
            path = Path(m.path)
        if not (path / "config.json").is_file() or not ((path / ".metadata").is_file()
                                                        or (path / "model_and_optim" / ".metadata").is_file()):
            raise CheckpointError(f"model.path={path}: not an OLMo-core checkpoint (needs config.json and "
                                  "model_and_optim/.metadata, or .metadata for a model-only checkpoint)")
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
        best = None
        for d in self.checkpoint_dir.glob("step*"):
            m = re.fullmatch(r"step(\d+)", d.name)
            if m and (d / ".metadata.json").is_file() and (best is None or int(m[1]) > best[0]):
                best = (int(m[1]), d)
        return None if best is None else OlmoCoreCheckpoint(best[1], best[0], self._tokenizer)

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

    def _build_trainer(self, start: Checkpoint, until_step: int, rows, log_fn: LogFn):
        from olmo_core.config import DType
        from olmo_core.data import NumpyDataLoaderConfig, NumpyFSLDatasetConfig, TokenizerConfig
        from olmo_core.optim import AdamWConfig
        from olmo_core.train import Duration, LoadStrategy, TrainerConfig
        from olmo_core.train.callbacks import CheckpointerCallback
        from olmo_core.train.train_module import TransformerTrainModuleConfig
        from olmo_core.utils import seed_all

        cfg, t = self.cfg, self.cfg.training
        rank, world = _world()
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
        noise_feed = None
        if rows.plan is not None and rows.plan.noise_rows.size:
            noise_feed = MicroBatchRows(EmbeddingNoise(rows.plan))
            noise_feed.attach(model.embeddings)
        tok = self._tokenizer
        work_dir = self.run_dir / "olmo_core_work"
        dataset = NumpyFSLDatasetConfig(
            tokenizer=TokenizerConfig(vocab_size=self.vocab_size, eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                                      else tok.eos_token_id),
            paths=[str(p) for p in rows.order.files.paths], sequence_length=L, work_dir=str(work_dir),
        ).build()
        data_loader = NumpyDataLoaderConfig(global_batch_size=t.global_batch_size * L, seed=self.loader_seed,
                                            work_dir=str(work_dir)).build(dataset)
        initial = start.path == self.model_dir
        has_train_state = (Path(start.path) / "train" / "rank0.pt").is_file()
        has_optim_state = (Path(start.path) / "model_and_optim").is_dir() or bool(
            json.loads((Path(start.path) / "config.json").read_text()).get("optimizer_state"))
        callbacks = {
            "pretrain_exp_start": _start_callback(cfg.model.checkpoint_step, t.global_batch_size * L),
            "pretrain_exp_insertions": _insertion_callback(rows, rank, world, self._rows_log(rank), noise_feed),
            "pretrain_exp_metrics": _log_callback(log_fn),
            "pretrain_exp_config": _config_callback(self.model_dir / "config.json", rank),
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
        if keep <= 0 or _world()[0] != 0:
            return
        found = sorted((int(d.name[4:]), d) for d in self.checkpoint_dir.glob("step*") if d.name[4:].isdigit())
        for _, d in found[:-keep]:
            if d != last.path:
                (d / ".metadata.json").unlink(missing_ok=True)  # invalidate first, as OLMo-core does
                shutil.rmtree(d, ignore_errors=True)


def init_distributed() -> None:
    """Join the torchrun process group (gloo on CPU, NCCL + gloo on GPUs) if there is one and it is not joined."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))

"""The ``hf`` framework: continual pretraining of any HF causal LM with ``transformers.Trainer``.

Rows come from :class:`~pretrain_exp.data.rows.TrainingRows` through
:class:`~pretrain_exp.frameworks.hf.sampler.RankLayoutSampler`, so global step ``k`` trains rows ``[(k-1)*B, k*B)`` of
the run whatever the micro-batch size and gradient accumulation (``B = micro_batch_size * grad_accum * world_size``),
and
under ``W`` processes DP rank ``r`` trains :func:`~pretrain_exp.data.schedule.rows_for` ``(k, r, W, B)`` (OLMo's
rank layout; :meth:`HFFramework.peek_rows` reads them back for the verifier). Gaussian-poisoning noise goes
through :class:`~pretrain_exp.frameworks.noise_feed.NoiseFeed`, started per micro-batch with the rows the batch carries.

Checkpoints are the Trainer's own
``<run_dir>/checkpoints/checkpoint-<k>`` dirs (model, optimizer, scheduler, RNG states, ``trainer_state.json``);
the global step of ``checkpoint-k`` is ``model.checkpoint_step + k``; ``training.keep_last_checkpoints`` (default 1)
deletes the older ones, and ``training.export_hf=every`` keeps each segment's model, config and tokenizer files in
``<run_dir>/hf/step<N>/`` (hard-linked, :class:`~pretrain_exp.app.hf_export.HFExport`), as the OLMo frameworks keep
their HF exports. The LR schedule spans the whole run
(``max_steps = training.num_steps``), and a segment ends by stopping the Trainer at its last step, so training
in segments, or resuming after a crash, follows the same schedule as one uninterrupted run.
"""

from __future__ import annotations

import csv
import json
import logging
import time
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PrinterCallback,
    SchedulerType,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

from pretrain_exp.core.capabilities import (
    APPLIES_EMBEDDING_NOISE,
    CHECKPOINTS_ARE_HF,
    FRAMEWORK,
    LOADS_HUB_MODELS,
    READS_PLAN_PER_SEGMENT,
    SUPPORTS_RANDOM_INIT,
    Capabilities,
)
from pretrain_exp.core.config import Precision, RunConfig
from pretrain_exp.core.distributed import world_size
from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.core.io import apply_default_modes
from pretrain_exp.core.phases import FIRST_STEP, PHASES
from pretrain_exp.core.rundir import RunDir, step_name
from pretrain_exp.frameworks.base import Checkpoint, Framework, LogFn
from pretrain_exp.frameworks.hf.sampler import RankLayoutSampler
from pretrain_exp.frameworks.noise_feed import NoiseFeed

log = logging.getLogger(__name__)
#: the ``TrainingArguments`` field of ``training.gradient_checkpointing`` (transformers 5 renamed it)
CHECKPOINTING_ARG = ("activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
                     else "gradient_checkpointing")


def bf16_supported() -> bool:
    """Whether bf16 autocast is fast here: a CUDA device with bf16, or a CPU with native bf16 (AVX512-BF16/AMX)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class _OrderedTrainer(Trainer):
    """``Trainer`` that reads the dataset through ``sampler`` (the run's training order in OLMo's rank layout)
    instead of shuffling it, and starts the Gaussian-poisoning feed (``noise``, a :class:`NoiseFeed` or ``None``)
    with the rows of each micro-batch."""

    def __init__(self, *args, sampler: RankLayoutSampler, noise: Optional[NoiseFeed] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampler, self.noise = sampler, noise

    def _get_train_sampler(self, *args, **kwargs):
        return self.sampler

    def _issue_warnings_after_load(self, load_result) -> None:
        """The Trainer's warning about keys missing from a resumed checkpoint, without the ones the model ties
        (:func:`tied_missing_keys`: ``lm_head.weight`` of a model with ``tie_word_embeddings``, which
        ``save_pretrained`` leaves out); those are logged at DEBUG."""
        tied = tied_missing_keys(self.model, load_result.missing_keys)
        if tied:
            log.debug("not in the checkpoint, tied to the input embeddings (tie_word_embeddings): %s", tied)
            load_result = load_result._replace(missing_keys=[k for k in load_result.missing_keys if k not in tied])
        super()._issue_warnings_after_load(load_result)

    def compute_loss(self, model, inputs, *args, **kwargs):
        """Pop the rows' training-order indices (``row_index``, LongTensor ``(b,)``) before the model sees the
        batch, start the noise feed with them, then compute the loss as ``Trainer`` does."""
        q = inputs.pop("row_index", None)
        if self.noise is None:
            return super().compute_loss(model, inputs, *args, **kwargs)
        self.noise.start(q)
        try:
            return super().compute_loss(model, inputs, *args, **kwargs)
        finally:
            self.noise.stop()


def tied_missing_keys(model, missing) -> list:
    """The keys of ``missing`` (parameter names absent from a loaded state dict) whose absence loses nothing: the
    output embeddings' weight (``lm_head.weight``) of a model whose config ties it to the input embeddings
    (``tie_word_embeddings``; ``save_pretrained`` leaves it out) and which is in fact the very tensor of the input
    embeddings.

    :returns: those keys, in ``missing``'s order; ``[]`` for a model that does not tie its embeddings.
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    if (not getattr(config, "tie_word_embeddings", False) or out is None or inp is None
            or out.weight.data_ptr() != inp.weight.data_ptr()):
        return []
    names = {f"{name}.weight" for name, m in model.named_modules(remove_duplicate=False) if m is out}
    return [k for k in missing if k in names]


class _Segment(TrainerCallback):
    """Stops (and saves) at the segment's last step; forwards training scalars with global steps."""

    def __init__(self, stop_at: int, start_step: int, tokens_per_step: int, log_fn: LogFn):
        self.stop_at, self.start_step, self.tokens_per_step, self.log_fn = stop_at, start_step, tokens_per_step, log_fn
        self._t, self._k = time.perf_counter(), None

    def on_train_begin(self, args, state, control, **kw):
        self._t, self._k = time.perf_counter(), state.global_step

    def on_step_begin(self, args, state, control, **kw):
        PHASES.mark(FIRST_STEP, step=state.global_step + 1)  # the first only (pretrain_exp.core.phases)

    def on_step_end(self, args, state, control, **kw):
        if state.global_step >= self.stop_at:
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kw):
        if state.is_world_process_zero:  # safetensors writes model.safetensors with mode 0600
            apply_default_modes(Path(args.output_dir) / step_name(state.global_step, RunDir.HF_CHECKPOINT))

    def on_log(self, args, state, control, logs=None, **kw):
        now = time.perf_counter()
        out = {f"train/{k}": float(v) for k, v in (logs or {}).items()
               if k in ("loss", "grad_norm", "learning_rate") and v is not None}
        if state.global_step > self._k:
            out["train/tokens_per_s"] = (state.global_step - self._k) * self.tokens_per_step / (now - self._t)
        self._t, self._k = now, state.global_step
        if out:
            self.log_fn(out, self.start_step + state.global_step)


class CsvLog(TrainerCallback):
    """``training.report_to=csv``: every scalar the Trainer logs, appended to ``path`` as tidy rows
    ``step,name,value`` (``step``: the run's global step, ``start_step`` + the Trainer's)."""

    def __init__(self, path: Path, start_step: int):
        self.path, self.start_step = Path(path), int(start_step)

    def on_log(self, args, state, control, logs=None, **kw):
        if not state.is_world_process_zero:
            return
        rows = [(self.start_step + state.global_step, k, float(v)) for k, v in (logs or {}).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)]
        new = not self.path.is_file()
        with open(self.path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(("step", "name", "value"))
            w.writerows(rows)


class HFFramework(Framework):
    """Continue an HF causal LM with ``transformers.Trainer`` (module docstring).

    The initial checkpoint is an HF model dir (``model.asset`` converted once, ``model.path`` or a Hub model id)
    that also holds the tokenizer and ``config.json``'s ``vocab_size``; its checkpoints are HF model dirs.
    """

    #: ``supports_random_init``: :func:`~pretrain_exp.frameworks.hf.scratch.random_init_model_dir`;
    #: ``loads_hub_models``: :func:`~pretrain_exp.frameworks.hub.hub_snapshot`
    capabilities = Capabilities(FRAMEWORK, {APPLIES_EMBEDDING_NOISE, SUPPORTS_RANDOM_INIT, READS_PLAN_PER_SEGMENT,
                                            LOADS_HUB_MODELS, CHECKPOINTS_ARE_HF})
    #: ``TrainingArguments.report_to`` integrations (W&B excepted: it is the run's own tracker) and ``csv``
    report_to = tuple(sorted(set(INTEGRATION_TO_CALLBACK) - {"wandb"})) + ("csv",)
    #: every ``transformers`` ``SchedulerType`` (``training.lr_scheduler`` is passed to ``TrainingArguments``)
    lr_schedulers = tuple(s.value for s in SchedulerType)

    @classmethod
    def resolve_model(cls, cfg: RunConfig) -> Path:
        """The initial checkpoint's dir (an asset is fetched and converted once into the cache).

        ``model.path`` is a local HF model dir or a Hub model id (with ``model.revision``), resolved to its
        snapshot in the HF cache by :func:`pretrain_exp.frameworks.hub.hub_snapshot` (which honours ``HF_HOME``,
        ``HF_HUB_OFFLINE`` and ``HF_TOKEN``).

        :raises CheckpointError: if ``model.path`` is neither an HF model dir nor a Hub model that can be found, or
            ``model.url`` is set (HF checkpoints are not downloaded by URL).
        :raises ConfigError: (``model.revision``) for a revision the Hub model lacks, or one set with a local dir.
        """
        from pretrain_exp.data.assets import hf_model_dir
        from pretrain_exp.frameworks.hub import hub_snapshot, is_hub_id

        if cfg.model.init == "random":
            from pretrain_exp.frameworks.hf.scratch import random_init_model_dir

            return random_init_model_dir(cfg.model, cfg.cache_dir)
        if cfg.model.asset is not None:
            return hf_model_dir(cfg.model.asset, cfg.cache_dir)
        if cfg.model.url is not None:
            raise CheckpointError(f"model.url={cfg.model.url}: the {cfg.framework.name} framework loads HF model "
                                  "dirs (model.path or model.asset); URLs are for OLMo checkpoints")
        path = Path(cfg.model.path).expanduser()
        if not path.exists() and is_hub_id(cfg.model.path):
            return hub_snapshot(cfg.model.path, cfg.model.revision)
        if cfg.model.revision is not None:
            raise ConfigError("model.revision", f"{cfg.model.revision!r}: revisions select a Hub model's version; "
                              f"model.path={cfg.model.path} is a local path")
        if not (path / "config.json").is_file():
            raise CheckpointError(f"model.path={path}: missing checkpoint (no config.json in that directory)")
        return path

    @property
    def tokenizer_path(self) -> str:
        """HF tokenizer dir or asset name of the run (``model.tokenizer``, else the model dir)."""
        return self.cfg.model.tokenizer or str(self.model_dir)

    @property
    def vocab_size(self) -> int:
        """Rows of the model's embedding matrix (``config.json``'s ``vocab_size``); 0 if unknown."""
        return int(json.loads((self.model_dir / "config.json").read_text()).get("vocab_size", 0))

    def initial_checkpoint(self) -> Checkpoint:
        """The checkpoint the run starts from: the model dir (an HF dir), at step ``model.checkpoint_step``."""
        return Checkpoint(self.model_dir, self.cfg.model.checkpoint_step)

    def latest_checkpoint(self) -> Optional[Checkpoint]:
        """Newest ``checkpoint-<k>`` with a ``trainer_state.json`` (written last by the Trainer); its global step
        is ``model.checkpoint_step + k``."""
        found = self.rundir.checkpoint_dirs(RunDir.HF_CHECKPOINT, "trainer_state.json")
        return Checkpoint(found[-1][1], self.cfg.model.checkpoint_step + found[-1][0]) if found else None

    def checkpoints(self) -> Dict[int, Checkpoint]:
        """Every ``checkpoint-<k>`` with a ``trainer_state.json``, by global step."""
        s = self.cfg.model.checkpoint_step
        found = self.rundir.checkpoint_dirs(RunDir.HF_CHECKPOINT, "trainer_state.json")
        return {s + k: Checkpoint(d, s + k) for k, d in found}

    def sampler(self, dp_world: int) -> RankLayoutSampler:
        """The sampler of the run's rows for ``dp_world`` processes (:mod:`pretrain_exp.frameworks.hf.sampler`)."""
        t = self.cfg.training
        return RankLayoutSampler(self.cfg.model.checkpoint_step, t.num_steps, t.global_batch_size,
                                 t.micro_batch_size, dp_world)

    def peek_rows(self, rows, step: int, dp_rank: int, dp_world: int, only=None):
        """The rows DP rank ``dp_rank`` of ``dp_world`` trains at global step ``step``, read through the path
        training reads them: :meth:`sampler` indices (as ``accelerate`` shards them) into ``rows`` (the
        :class:`~pretrain_exp.data.rows.TrainingRows` dataset, which applies the plan). See
        :meth:`Framework.peek_rows <pretrain_exp.frameworks.base.Framework.peek_rows>`."""
        idx = self.sampler(dp_world).rank_indices(step, dp_rank)
        if only is not None:
            idx = idx[np.isin(idx + rows.first_row, np.asarray(only, dtype=np.int64))]
        items = [rows[int(i)] for i in idx]
        L = self.cfg.training.sequence_length
        q = np.array([int(it["row_index"]) for it in items], dtype=np.int64)
        tokens = np.stack([it["input_ids"].numpy() for it in items]) if items else np.empty((0, L), np.int64)
        return q, tokens.astype(np.int64)

    def training_arguments(self) -> TrainingArguments:
        """The ``TrainingArguments`` of this run (whole-run schedule, save at every segment end)."""
        t = self.cfg.training
        world = world_size()
        bf16 = t.precision == Precision.bf16 or (t.precision == Precision.auto and bf16_supported())
        keep = self.cfg.training.keep_last_checkpoints
        return TrainingArguments(
            output_dir=str(self.checkpoint_dir),
            max_steps=t.num_steps,
            per_device_train_batch_size=t.micro_batch_size,
            gradient_accumulation_steps=t.global_batch_size // (t.micro_batch_size * world),
            learning_rate=t.learning_rate,
            lr_scheduler_type=t.lr_scheduler,
            warmup_steps=t.warmup_steps,
            weight_decay=t.weight_decay,
            adam_beta1=t.adam_beta1,
            adam_beta2=t.adam_beta2,
            max_grad_norm=t.max_grad_norm,
            bf16=bf16,
            use_cpu=not torch.cuda.is_available(),
            save_strategy="steps",
            save_steps=t.checkpoint_interval,
            save_total_limit=keep if keep > 0 else None,
            logging_steps=1,
            report_to=[r for r in self.cfg.training.report_to if r != "csv"] or "none",
            **{CHECKPOINTING_ARG: t.gradient_checkpointing},
            torch_compile=t.compile,
            seed=self.cfg.seed,
            dataloader_num_workers=0,
            remove_unused_columns=False,
            disable_tqdm=True,  # the run logs one line per step and draws the bar (pretrain_exp.app.console)
        )

    def train(self, start: Checkpoint, until_step: int, rows, log_fn: LogFn) -> Checkpoint:
        """Train from ``start`` to global step ``until_step`` (see :meth:`Framework.train`)."""
        s0 = self.cfg.model.checkpoint_step
        resume = None if start.path == self.model_dir else start.path
        if resume is not None and not (resume / "trainer_state.json").is_file():
            raise CheckpointError(f"{resume}: not a complete trainer checkpoint (no trainer_state.json)")
        model = AutoModelForCausalLM.from_pretrained(
            str(start.path), dtype=getattr(torch, self.cfg.model.dtype),
            attn_implementation=self.cfg.framework.attn_implementation)
        model.config.use_cache = False
        t = self.cfg.training
        noise = NoiseFeed.for_plan(getattr(rows, "plan", None))
        if noise is not None:
            noise.attach(model.get_input_embeddings())
        trainer = _OrderedTrainer(
            model=model, args=self.training_arguments(), train_dataset=rows, data_collator=default_data_collator,
            processing_class=AutoTokenizer.from_pretrained(str(self.model_dir)),  # saved with every checkpoint
            callbacks=[_Segment(until_step - s0, s0, t.global_batch_size * t.sequence_length, log_fn)]
            + ([CsvLog(self.rundir.trainer_log, s0)] if "csv" in t.report_to else []),
            sampler=self.sampler(world_size()), noise=noise)
        trainer.remove_callback(PrinterCallback)  # its raw loss dicts: metrics.jsonl and the run's step lines
        log.info("training steps %d -> %d (%s)", start.step, until_step, "resumed" if resume else "fresh")
        try:
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        finally:
            if noise is not None:
                noise.detach()
        done = self.latest_checkpoint()
        if done is None or done.step != until_step:
            raise CheckpointError(f"training stopped at {done and done.step} instead of step {until_step}")
        return done

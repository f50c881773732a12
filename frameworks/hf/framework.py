"""The ``hf`` framework: continual pretraining of any HF causal LM with ``transformers.Trainer``.

Rows come from :class:`~pretrain_exp.data.rows.TrainingRows` through a sequential sampler, so optimizer step
``k`` (trainer-relative) trains rows ``[(k-1)*B, k*B)`` of the run whatever the micro-batch size and gradient
accumulation (``B = micro_batch_size * grad_accum * world_size``). Checkpoints are the Trainer's own
``<run_dir>/checkpoints/checkpoint-<k>`` dirs (model, optimizer, scheduler, RNG states, ``trainer_state.json``);
the global step of ``checkpoint-k`` is ``model.checkpoint_step + k``. The LR schedule spans the whole run
(``max_steps = training.num_steps``), and a segment ends by stopping the Trainer at its last step, so training
in segments, or resuming after a crash, follows the same schedule as one uninterrupted run.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Optional

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

from frameworks.base import Checkpoint, Framework, LogFn
from pretrain_exp.core.config import Precision
from pretrain_exp.core.errors import CheckpointError
from pretrain_exp.insertion.noise import EmbeddingNoise

log = logging.getLogger(__name__)


def bf16_supported() -> bool:
    """Whether bf16 autocast is fast here: a CUDA device with bf16, or a CPU with native bf16 (AVX512-BF16/AMX)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class _OrderedTrainer(Trainer):
    """``Trainer`` that reads the dataset in order (the run's training order) instead of shuffling it, and tells
    the Gaussian-poisoning hook (``noise``, an :class:`EmbeddingNoise` or ``None``) which rows each
    micro-batch holds."""

    def __init__(self, *args, noise: Optional[EmbeddingNoise] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.noise = noise

    def _get_train_sampler(self, *args, **kwargs):
        return torch.utils.data.SequentialSampler(self.train_dataset)

    def compute_loss(self, model, inputs, *args, **kwargs):
        """Pop the rows' training-order indices (``row_index``, LongTensor ``(b,)``) before the model sees the
        batch, hand them to the noise hook, then compute the loss as ``Trainer`` does."""
        q = inputs.pop("row_index", None)
        if self.noise is not None:
            self.noise.set_rows(q)
        return super().compute_loss(model, inputs, *args, **kwargs)


class _Segment(TrainerCallback):
    """Stops (and saves) at the segment's last step; forwards training scalars with global steps."""

    def __init__(self, stop_at: int, start_step: int, tokens_per_step: int, log_fn: LogFn):
        self.stop_at, self.start_step, self.tokens_per_step, self.log_fn = stop_at, start_step, tokens_per_step, log_fn
        self._t, self._k = time.perf_counter(), None

    def on_train_begin(self, args, state, control, **kw):
        self._t, self._k = time.perf_counter(), state.global_step

    def on_step_end(self, args, state, control, **kw):
        if state.global_step >= self.stop_at:
            control.should_save = True
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kw):
        now = time.perf_counter()
        out = {f"train/{k}": float(v) for k, v in (logs or {}).items()
               if k in ("loss", "grad_norm", "learning_rate") and v is not None}
        if state.global_step > self._k:
            out["train/tokens_per_s"] = (state.global_step - self._k) * self.tokens_per_step / (now - self._t)
        self._t, self._k = now, state.global_step
        if out:
            self.log_fn(out, self.start_step + state.global_step)


class HFFramework(Framework):
    """Continue an HF causal LM with ``transformers.Trainer`` (module docstring)."""

    applies_embedding_noise = True

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def latest_checkpoint(self) -> Optional[Checkpoint]:
        """Newest ``checkpoint-<k>`` with a ``trainer_state.json`` (written last by the Trainer)."""
        best = None
        for d in self.checkpoint_dir.glob("checkpoint-*"):
            m = re.fullmatch(r"checkpoint-(\d+)", d.name)
            if m and (d / "trainer_state.json").is_file() and (best is None or int(m[1]) > best[0]):
                best = (int(m[1]), d)
        return None if best is None else Checkpoint(best[1], self.cfg.model.checkpoint_step + best[0])

    def training_arguments(self) -> TrainingArguments:
        """The ``TrainingArguments`` of this run (whole-run schedule, save at every segment end)."""
        t = self.cfg.training
        world = max(1, torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1)
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
            report_to="none",
            seed=self.cfg.seed,
            dataloader_num_workers=0,
            remove_unused_columns=False,
            disable_tqdm=False,
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
        plan = getattr(rows, "plan", None)
        noise = EmbeddingNoise(plan) if plan is not None and plan.noise_rows.size else None
        handle = noise.attach(model.get_input_embeddings()) if noise is not None else None
        trainer = _OrderedTrainer(
            model=model, args=self.training_arguments(), train_dataset=rows, data_collator=default_data_collator,
            processing_class=AutoTokenizer.from_pretrained(str(self.model_dir)),  # saved with every checkpoint
            callbacks=[_Segment(until_step - s0, s0, t.global_batch_size * t.sequence_length, log_fn)], noise=noise)
        log.info("training steps %d -> %d (%s)", start.step, until_step, "resumed" if resume else "fresh")
        try:
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        finally:
            if handle is not None:
                handle.remove()
        done = self.latest_checkpoint()
        if done is None or done.step != until_step:
            raise CheckpointError(f"training stopped at {done and done.step} instead of step {until_step}")
        return done

"""The ``transformers.Trainer`` side of the ``hf`` framework: the ordered Trainer, its callbacks and arguments.

Imported by :meth:`HFFramework.train <pretrain_exp.frameworks.hf.framework.HFFramework.train>` when it trains, so
composing and validating a config, or reading a run's rows, imports neither torch nor the Trainer (about 4 s).
"""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path
from typing import List, Optional

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

from pretrain_exp.core.config import Precision, RunConfig
from pretrain_exp.core.distributed import world_size
from pretrain_exp.core.io import apply_default_modes
from pretrain_exp.core.phases import FIRST_STEP, PHASES
from pretrain_exp.core.rundir import RunDir, step_name
from pretrain_exp.frameworks.base import LogFn
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


class OrderedTrainer(Trainer):
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


class Segment(TrainerCallback):
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


def training_arguments(cfg: RunConfig, output_dir: Path) -> TrainingArguments:
    """The ``TrainingArguments`` of the run of ``cfg`` writing its checkpoints under ``output_dir`` (whole-run
    schedule, save at every segment end, the gradient accumulation of this process count)."""
    t = cfg.training
    world = world_size()
    bf16 = t.precision == Precision.bf16 or (t.precision == Precision.auto and bf16_supported())
    keep = t.keep_last_checkpoints
    return TrainingArguments(
        output_dir=str(output_dir),
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
        report_to=[r for r in t.report_to if r != "csv"] or "none",
        **{CHECKPOINTING_ARG: t.gradient_checkpointing},
        torch_compile=t.compile,
        seed=cfg.seed,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=True,  # the run logs one line per step and draws the bar (pretrain_exp.app.console)
    )


def load_model(path: Path, dtype: str, attn_implementation: str):
    """The causal LM of HF model dir ``path`` to train: weights in ``dtype`` (a torch dtype name), the attention
    implementation given, no KV cache."""
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype),
                                                 attn_implementation=attn_implementation)
    model.config.use_cache = False
    return model


def ordered_trainer(model, args: TrainingArguments, rows, tokenizer_dir: Path, sampler: RankLayoutSampler,
                    noise: Optional[NoiseFeed], callbacks: List[TrainerCallback]) -> OrderedTrainer:
    """The :class:`OrderedTrainer` of ``model`` on ``rows`` (the run's
    :class:`~pretrain_exp.data.rows.TrainingRows`) through ``sampler``, with the tokenizer of ``tokenizer_dir`` (saved
    with every checkpoint) and ``callbacks``; the Trainer's ``PrinterCallback`` removed (its raw loss dicts:
    ``metrics.jsonl`` and the run's step lines say it)."""
    trainer = OrderedTrainer(model=model, args=args, train_dataset=rows, data_collator=default_data_collator,
                             processing_class=AutoTokenizer.from_pretrained(str(tokenizer_dir)), callbacks=callbacks,
                             sampler=sampler, noise=noise)
    trainer.remove_callback(PrinterCallback)
    return trainer

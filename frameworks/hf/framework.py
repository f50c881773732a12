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

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional

import numpy as np

from pretrain_exp.core.capabilities import (
    APPLIES_EMBEDDING_NOISE,
    CHECKPOINTS_ARE_HF,
    FRAMEWORK,
    LOADS_HUB_MODELS,
    READS_PLAN_PER_SEGMENT,
    SUPPORTS_RANDOM_INIT,
    Capabilities,
)
from pretrain_exp.core.config import RunConfig
from pretrain_exp.core.distributed import world_size
from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.frameworks.base import Checkpoint, Framework, LogFn, class_constant

if TYPE_CHECKING:  # torch and the Trainer come with them: imported where the run trains (frameworks.hf.trainer)
    from transformers import TrainingArguments

    from pretrain_exp.frameworks.hf.sampler import RankLayoutSampler

log = logging.getLogger(__name__)


class HFFramework(Framework):
    """Continue an HF causal LM with ``transformers.Trainer`` (module docstring).

    The initial checkpoint is an HF model dir (``model.asset`` converted once, ``model.path`` or a Hub model id)
    that also holds the tokenizer and ``config.json``'s ``vocab_size``; its checkpoints are HF model dirs.
    """

    #: ``supports_random_init``: :func:`~pretrain_exp.frameworks.hf.scratch.random_init_model_dir`;
    #: ``loads_hub_models``: :func:`~pretrain_exp.frameworks.hub.hub_snapshot`
    capabilities = Capabilities(FRAMEWORK, {APPLIES_EMBEDDING_NOISE, SUPPORTS_RANDOM_INIT, READS_PLAN_PER_SEGMENT,
                                            LOADS_HUB_MODELS, CHECKPOINTS_ARE_HF})

    @class_constant
    def report_to():
        """``TrainingArguments.report_to`` integrations (W&B excepted: it is the run's own tracker) and ``csv``."""
        from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

        return tuple(sorted(set(INTEGRATION_TO_CALLBACK) - {"wandb"})) + ("csv",)

    @class_constant
    def lr_schedulers():
        """Every ``transformers`` ``SchedulerType`` (``training.lr_scheduler`` is passed to ``TrainingArguments``)."""
        from transformers import SchedulerType

        return tuple(s.value for s in SchedulerType)

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
        """Newest complete ``checkpoint-<k>`` (its ``trainer_state.json`` whole: :meth:`RunDir.hf_checkpoint_dirs
        <pretrain_exp.core.rundir.RunDir.hf_checkpoint_dirs>`); its global step is ``model.checkpoint_step + k``."""
        found = self.rundir.hf_checkpoint_dirs()
        return Checkpoint(found[-1][1], self.cfg.model.checkpoint_step + found[-1][0]) if found else None

    def checkpoints(self) -> Dict[int, Checkpoint]:
        """Every complete ``checkpoint-<k>``, by global step."""
        s = self.cfg.model.checkpoint_step
        found = self.rundir.hf_checkpoint_dirs()
        return {s + k: Checkpoint(d, s + k) for k, d in found}

    def sampler(self, dp_world: int) -> RankLayoutSampler:
        """The sampler of the run's rows for ``dp_world`` processes (:mod:`pretrain_exp.frameworks.hf.sampler`)."""
        from pretrain_exp.frameworks.hf.sampler import RankLayoutSampler

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
        """The ``TrainingArguments`` of this run (whole-run schedule, save at every segment end;
        :func:`~pretrain_exp.frameworks.hf.trainer.training_arguments`)."""
        from pretrain_exp.frameworks.hf.trainer import training_arguments

        return training_arguments(self.cfg, self.checkpoint_dir)

    def train(self, start: Checkpoint, until_step: int, rows, log_fn: LogFn) -> Checkpoint:
        """Train from ``start`` to global step ``until_step`` (see :meth:`Framework.train`)."""
        from pretrain_exp.frameworks.hf.trainer import CsvLog, Segment, load_model, ordered_trainer
        from pretrain_exp.frameworks.noise_feed import NoiseFeed

        s0 = self.cfg.model.checkpoint_step
        resume = None if start.path == self.model_dir else start.path
        if resume is not None and not RunDir.hf_checkpoint_complete(resume):
            raise CheckpointError(f"{resume}: not a complete trainer checkpoint (no whole {RunDir.HF_TRAINER_STATE})")
        model = load_model(start.path, self.cfg.model.dtype, self.cfg.framework.attn_implementation)
        t = self.cfg.training
        noise = NoiseFeed.for_plan(getattr(rows, "plan", None))
        if noise is not None:
            noise.attach(model.get_input_embeddings())
        trainer = ordered_trainer(
            model, self.training_arguments(), rows, self.model_dir, self.sampler(world_size()), noise,
            [Segment(until_step - s0, s0, t.global_batch_size * t.sequence_length, log_fn)]
            + ([CsvLog(self.rundir.trainer_log, s0)] if "csv" in t.report_to else []))
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

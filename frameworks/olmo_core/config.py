"""The ``olmo_core`` framework's schema (``conf/framework/olmo_core.yaml`` extends ``schema/framework/olmo_core``).

Light on purpose (dataclasses only): registering the schemas must not import OLMo-core. The checkpoint's own
``config.json`` supplies the model, optimizer and schedule settings; ``lr_schedule`` says whether the optimizer and
LR schedule are the checkpoint's (continued at its position) or the run's ``training.*``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain_exp.core.config import FrameworkConf
from pretrain_exp.core.errors import ConfigError

#: what ``conf/framework/{olmo_core,olmo2}.yaml`` take from the checkpoint (``${checkpoint:<key>}``)
CHECKPOINT_KEYS = ("model.checkpoint_step", "model.tokenizer", "training.sequence_length",
                   "training.global_batch_size", "data.paths", "data.dtype", "data.seed", "data.first_epoch",
                   "data.max_target_sequence_length")

#: ``run``: ``training.*`` from the run's first step; ``checkpoint``: the checkpoint's own optimizer, peak LR and
#: schedule, at its position
LR_SCHEDULES = ("run", "checkpoint")


@dataclass
class OlmoCoreConf(FrameworkConf):
    """``framework=olmo_core``: OLMo-core checkpoints trained with OLMo-core's ``Trainer``."""

    name: str = "olmo_core"
    lr_schedule: str = "checkpoint"  #: ``run``: ``training.*`` from the run's first step; ``checkpoint``: the
    #: checkpoint's own optimizer (class, hyper-parameters, parameter groups), clipping, z-loss, peak LR and
    #: schedule at its position (OLMo-core: ``config.json`` ``train_module``; OLMo-2: ``config.yaml``)

    def validate(self, key: str = "framework") -> None:
        """:raises ConfigError: (``<key>.lr_schedule``) for a value not in :data:`LR_SCHEDULES`."""
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"{key}.lr_schedule", f"unknown {self.lr_schedule!r} with framework {self.name!r}; "
                              f"allowed: {list(LR_SCHEDULES)}")

    def uses_run_lr_schedule(self) -> bool:
        return self.lr_schedule == "run"

    def may_use_run_lr_schedule(self) -> bool:
        """True: a checkpoint without ``train_module`` (a model-only one) trains with ``training.lr_scheduler``."""
        return True

    def checkpoint_keys(self) -> tuple:
        """The run settings an OLMo checkpoint records (:meth:`OlmoCoreFramework.checkpoint_settings
        <pretrain_exp.frameworks.olmo_core.framework.OlmoCoreFramework.checkpoint_settings>`)."""
        return CHECKPOINT_KEYS

"""The ``olmo2`` framework's schema (``conf/framework/olmo2.yaml`` extends ``schema/framework/olmo2``).

Light on purpose (dataclasses only): registering the schemas must not import torch or OLMo-core.
"""

from __future__ import annotations

from dataclasses import dataclass

from frameworks.olmo_core.config import OlmoCoreConf
from pretrain_exp.core.errors import ConfigError

#: ``run``: ``training.*`` from the run's first step; ``checkpoint``: the checkpoint's own optimizer (param groups,
#: clipping), peak LR and schedule
LR_SCHEDULES = ("run", "checkpoint")


@dataclass
class Olmo2Conf(OlmoCoreConf):
    """``framework=olmo2``: OLMo-2 (old trainer) checkpoints, converted once and trained with OLMo-core."""

    name: str = "olmo2"
    lr_schedule: str = "checkpoint"  #: ``run``: ``training.*`` from the run's first step; ``checkpoint``: the
    #: checkpoint's own optimizer, clipping, peak LR and schedule, at its position (``config.yaml`` ``optimizer``,
    #: ``max_grad_norm``, ``scheduler``)

    def validate(self, key: str = "framework") -> None:
        """:raises ConfigError: (``<key>.lr_schedule``) for a value not in :data:`LR_SCHEDULES`."""
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"{key}.lr_schedule", f"unknown {self.lr_schedule!r} with framework {self.name!r}; "
                              f"allowed: {list(LR_SCHEDULES)}")

    def uses_run_lr_schedule(self) -> bool:
        return self.lr_schedule == "run"

"""The ``olmo2`` framework's schema (``conf/framework/olmo2.yaml`` extends ``schema/framework/olmo2``).

Light on purpose (dataclasses only): registering the schemas must not import torch or OLMo-core. ``lr_schedule``
(``run`` / ``checkpoint``, :data:`LR_SCHEDULES`) and its check are :class:`OlmoCoreConf`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain_exp.frameworks.olmo_core.config import LR_SCHEDULES, OlmoCoreConf

__all__ = ["LR_SCHEDULES", "Olmo2Conf"]


@dataclass
class Olmo2Conf(OlmoCoreConf):
    """``framework=olmo2``: OLMo-2 (old trainer) checkpoints, converted once and trained with OLMo-core (the
    checkpoint's peak LR and schedule come from its ``config.yaml`` ``optimizer``/``scheduler``)."""

    name: str = "olmo2"

    def may_use_run_lr_schedule(self) -> bool:
        """Only with ``lr_schedule=run``: an OLMo-2 checkpoint always records its schedule."""
        return self.uses_run_lr_schedule()

"""The ``olmo_core`` framework's schema (``conf/framework/olmo_core.yaml`` extends ``schema/framework/olmo_core``).

Light on purpose (dataclasses only): registering the schemas must not import OLMo-core. It has no field beyond the
base: the checkpoint's own ``config.json`` supplies the model, optimizer and schedule settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain_exp.core.config import FrameworkConf


@dataclass
class OlmoCoreConf(FrameworkConf):
    """``framework=olmo_core``: OLMo-core checkpoints trained with OLMo-core's ``Trainer``."""

    name: str = "olmo_core"

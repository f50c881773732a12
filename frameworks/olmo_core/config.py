"""The ``olmo_core`` framework's schema (``conf/framework/olmo_core.yaml`` extends ``schema/framework/olmo_core``).

Light on purpose (dataclasses only): registering the schemas must not import OLMo-core. It has no field beyond the
base: the checkpoint's own ``config.json`` supplies the model, optimizer and schedule settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain_exp.core.config import FrameworkConf

#: what ``conf/framework/{olmo_core,olmo2}.yaml`` take from the checkpoint (``${checkpoint:<key>}``)
CHECKPOINT_KEYS = ("model.checkpoint_step", "model.tokenizer", "training.sequence_length",
                   "training.global_batch_size", "data.paths", "data.dtype", "data.seed", "data.first_epoch")


@dataclass
class OlmoCoreConf(FrameworkConf):
    """``framework=olmo_core``: OLMo-core checkpoints trained with OLMo-core's ``Trainer``."""

    name: str = "olmo_core"

    def checkpoint_keys(self) -> tuple:
        """The run settings an OLMo checkpoint records (:meth:`OlmoCoreFramework.checkpoint_settings
        <frameworks.olmo_core.framework.OlmoCoreFramework.checkpoint_settings>`)."""
        return CHECKPOINT_KEYS

"""OLMo-2 (old trainer) checkpoints for OLMo-core: read ``step<N>-unsharded/`` folders and convert their model,
AdamW state, trainer position and data order. No dependency on the ``ai2-olmo`` package.

- :mod:`frameworks.olmo2.checkpoint`: read ``config.yaml``, ``model.*``, ``optim.*``, ``train.pt`` safely;
- :mod:`frameworks.olmo2.convert`: OLMo-core ``TransformerConfig``, model and optimizer state, AdamW config,
  HF export, and :func:`~frameworks.olmo2.convert.load_converted` doing all of it;
- :mod:`frameworks.olmo2.data_order`: train position and the project config that continues OLMo-2's data order;
- :mod:`frameworks.olmo2.presets`: writes checkpoints in the OLMo-2 layout (the tiny ``olmo2_tiny`` preset);
- :mod:`frameworks.olmo2.framework`: the ``olmo2`` framework (conversion once, then OLMo-core training);
- :mod:`frameworks.olmo2.config`: its schema (light: registering it imports no torch).

The names below are imported on first access, so importing the package (or its schema) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "frameworks.olmo2.checkpoint": ("OLMo2Checkpoint", "read_checkpoint"),
    "frameworks.olmo2.convert": ("ConvertedCheckpoint", "adamw_config", "convert_model_state", "convert_optim_state",
                                 "export_hf", "load_converted", "optimizer_state_for", "training_overrides",
                                 "transformer_config"),
    "frameworks.olmo2.data_order": ("DataOrderParams", "TrainPosition", "train_position"),  # data_order: the module
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)

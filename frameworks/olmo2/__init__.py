"""OLMo-2 (old trainer) checkpoints for OLMo-core: read ``step<N>-unsharded/`` folders and convert their model,
AdamW state, trainer position and data order. No dependency on the ``ai2-olmo`` package.

- :mod:`pretrain_exp.frameworks.olmo2.checkpoint`: read ``config.yaml``, ``model.*``, ``optim.*``, ``train.pt`` safely;
- :mod:`pretrain_exp.frameworks.olmo2.convert`: OLMo-core ``TransformerConfig``, model and optimizer state, AdamW
  config, HF export, and :func:`~pretrain_exp.frameworks.olmo2.convert.load_converted` doing all of it;
- :mod:`pretrain_exp.frameworks.olmo2.data_order`: train position and the project config that continues OLMo-2's data
  order;
- :mod:`pretrain_exp.frameworks.olmo2.presets`: writes checkpoints in the OLMo-2 layout (the tiny ``olmo2_tiny``
  preset);
- :mod:`pretrain_exp.frameworks.olmo2.framework`: the ``olmo2`` framework (conversion once, then OLMo-core training);
- :mod:`pretrain_exp.frameworks.olmo2.config`: its schema (light: registering it imports no torch).

The package imports nothing itself, so importing its schema stays cheap; import from the modules.
"""

"""pretrain_exp: continual-pretraining experiments with controlled data insertion.

Entry point: ``python -m pretrain_exp`` (Hydra; see README.md). The pieces:

- :mod:`pretrain_exp.config` -- dataclass schemas of every config group.
- :mod:`pretrain_exp.data` -- registry assets, tokenization into OLMo token files, the data order.
- :mod:`pretrain_exp.insertion` -- item sources, placement, the
  :class:`~pretrain_exp.insertion.plan.Plan`, the verifier.
- :mod:`pretrain_exp.app.experiment` -- the loop: checkpoint, plan, train in segments, evaluate, log.
"""

__version__ = "0.1.0"

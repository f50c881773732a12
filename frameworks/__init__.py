"""Training frameworks: each continues a checkpoint on the run's :class:`~pretrain_exp.data.rows.TrainingRows`.

See :mod:`frameworks.base` for the contract and :mod:`frameworks.registry` for the names.
"""

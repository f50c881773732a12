"""Training frameworks: each continues a checkpoint on the run's :class:`~pretrain_exp.data.rows.TrainingRows`.

See :mod:`pretrain_exp.frameworks.base` for the contract and :mod:`pretrain_exp.frameworks.registry` for the names.
"""

# the folder frameworks/ is the package pretrain_exp.frameworks (installed so); never a second copy under another name
if __name__ != "pretrain_exp.frameworks":
    raise ImportError(f"import pretrain_exp.frameworks, not {__name__} (the folder frameworks/ is the package "
                      "pretrain_exp.frameworks)")

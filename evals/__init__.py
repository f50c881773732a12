"""Evaluations run on each segment's checkpoint; see :mod:`pretrain_exp.evals.registry` for the contract."""

# the folder evals/ is the package pretrain_exp.evals (installed so); never a second copy under another name
if __name__ != "pretrain_exp.evals":
    raise ImportError(f"import pretrain_exp.evals, not {__name__} (the folder evals/ is the package "
                      "pretrain_exp.evals)")

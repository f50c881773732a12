"""Evaluations run on each segment's checkpoint; see :mod:`evals.registry` for the contract."""

"""``placement.kind: random``: copies drawn uniformly over the whole training window, never crossing a row boundary."""

from __future__ import annotations

from pretrain_exp.insertion.placements.base import PlacementSpec


class Random(PlacementSpec):
    """Uniform over the training window (every row of it)."""

    name = "random"
    takes = frozenset({"steps", "every_n_steps", "max_per_batch"})  # rows: every row of the window (the default)


KIND = Random()

"""What a placement-kind module provides (:class:`PlacementSpec`)."""

from __future__ import annotations

from typing import Any, ClassVar, FrozenSet, Tuple


class PlacementSpec:
    """One placement kind, as registered in :data:`pretrain_exp.insertion.placements.KINDS`: its schema (the
    ``placement`` fields it takes), its own static checks and what the planner asks of it.

    Two ways to place exist in the planner (:func:`pretrain_exp.insertion.plan.build_plan`): positions given by the
    items (``from_items``: read from each item's ``placement.position_key``, placed first, checked for overlap
    against each other) or positions drawn uniformly in the rows :meth:`row_range` gives (then restricted to
    ``placement.steps`` / ``every_n_steps`` and ``max_per_batch``,
    :func:`~pretrain_exp.insertion.placement.allowed_rows`).
    """

    #: the name it is registered (and configured, ``placement.kind``) as
    name: ClassVar[str] = ""
    #: fields of :class:`~pretrain_exp.insertion.schema.PlacementConf` the kind reads (``kind`` aside); another
    #: field set to a value other than its default is refused
    #: (:func:`pretrain_exp.insertion.placements.check_fields`)
    takes: ClassVar[FrozenSet[str]] = frozenset()
    #: ``True``: the items give their positions (``explicit``); ``False``: positions are drawn in :meth:`row_range`
    from_items: ClassVar[bool] = False

    def check(self, key: str, exp: Any) -> None:
        """The kind's own static checks of ``exp`` (an ``InsertionExperimentConf``; no files read).

        :param key: dotted key of the experiment (``insertion.experiments.<name>``), used in messages.
        :raises ConfigError: naming the offending key.
        """

    def row_range(self, key: str, placement: Any, window: Tuple[int, int], sequence_length: int) -> Tuple[int, int]:
        """Training-order rows ``[lo, hi)`` a drawn copy may use (``placement``: a ``PlacementConf``; ``window``:
        the training window in global token positions, aligned to ``sequence_length``). By default every row of the
        window, ``[window[0] // L, window[1] // L)``; a kind that narrows it overrides this (not read where
        ``from_items``).

        :raises ConfigError: for a placement that selects no row of the window, naming ``<key>.placement``.
        """
        return window[0] // sequence_length, window[1] // sequence_length

"""What a dynamic-policy module provides: its options (a :class:`DynamicConf` subclass, the policy's schema) and
its decision rule (a :class:`Policy` subclass naming that schema as ``schema``); see
:mod:`pretrain_exp.insertion.dynamic` for the closed loop around them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Tuple

import numpy as np

#: losses of one evaluated step: item id -> insertion loss (nats/token)
Losses = Dict[int, float]


@dataclass
class DynamicConf:
    """The options every policy of ``insertion.dynamic`` has; each policy's schema extends it with its own.

    ``controls``: the randomized dup-0 controls (:func:`~pretrain_exp.insertion.dynamic.assign_arms`).
    ``allow_no_controls``: without controls, the dup counts are outcome-selected with nothing randomized to compare
    them with.
    """

    policy: str = "until_memorized"  #: registered policy (:data:`pretrain_exp.insertion.policies.POLICIES`)
    experiments: List[str] = field(default_factory=list)  #: target experiments (empty: all)
    task: Optional[str] = None  #: the insertion_loss eval task read (default: the first one of eval.tasks)
    copies: int = 1  #: copies of a chosen item per segment
    max_per_batch: int = 0  #: at most this many dynamic copies per global batch (0: no limit)
    controls: Optional[int] = None  #: per target experiment, static dup-0 items never inserted (None: half, rounded up)
    allow_no_controls: bool = False  #: accept no controls (controls: 0, or a target without static dup-0 items)

    def validate(self, key: str) -> None:
        """The policy's own checks of its own options (the common ones are checked by
        :func:`~pretrain_exp.insertion.dynamic.parse_dynamic`); none here.

        :param key: the dotted key of the options (``insertion.dynamic``).
        :raises ConfigError: naming ``<key>.<option>``.
        """


def check_nonnegative(key: str, value) -> None:
    """A loss option (nats/token): a finite number >= 0.

    :raises ConfigError: naming ``key``.
    """
    from pretrain_exp.core.errors import ConfigError

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
        raise ConfigError(key, f"must be a finite number >= 0 (nats/token), got {value!r}")


class Policy(ABC):
    """A decision rule: :meth:`choose` gives the items to insert in the next segment."""

    name: ClassVar[str] = ""  #: the name it is registered (and configured, ``insertion.dynamic.policy``) as
    schema: ClassVar[type] = DynamicConf  #: its options' schema (a :class:`DynamicConf` subclass)

    def __init__(self, conf: DynamicConf):
        self.conf = conf

    @abstractmethod
    def choose(self, targets: np.ndarray, step: int, history: Dict[int, Losses], last_copy_step: np.ndarray,
               planned: np.ndarray) -> np.ndarray:
        """Items (sorted ``int64`` ids) to insert ``conf.copies`` times in the segment starting at ``step``.

        :param targets: ``int64`` item ids the policy may insert.
        :param history: evaluated step (``<= step``) -> item losses; ``history[step]`` exists.
        :param last_copy_step: ``int64 (num_items,)``: global step of each item's latest copy trained by ``step``
            (``-1``: none).
        :param planned: ``bool (num_items,)``: the plan holds a copy of the item (trained by ``step`` or later).
        """

    def item_report(self, item: int, history: Dict[int, Losses], copy_steps: np.ndarray, start: Optional[int]) -> dict:
        """Policy-specific columns of the per-item table (``copy_steps``: the item's copies' steps, sorted;
        ``start``: the step of the first decision, else the first evaluated step; ``None``: no eval)."""
        return {}

    def target_groups(self, targets: List[dict]) -> List[Tuple[str, List[dict]]]:
        """Groups of target rows (:func:`~pretrain_exp.insertion.dynamic.report`) defined by what the policy did,
        reported beside ``inserted by the policy`` (not randomized); default: ``never inserted by the policy``."""
        return [("never inserted by the policy", [r for r in targets if not r["dynamic_dups"]])]

    def arm_counts(self, rows: List[dict]) -> dict:
        """Policy-specific counts over an arm's item rows, added to its row of ``arms``; none by default."""
        return {}

    # --- how a saved closed-loop result reads (``results.json``'s ``dynamic``: the summary's tables) ----------
    #: the headers of the per-item table's policy columns (:meth:`item_cells`), in order
    item_columns: ClassVar[Tuple[str, ...]] = ()
    #: the headers of the arms table's policy columns (:meth:`arm_cells`), in order
    arm_columns: ClassVar[Tuple[str, ...]] = ()
    #: what its columns may mislead about, added to the summary's caveat on outcome-selected groups
    caveat: ClassVar[str] = ""

    @classmethod
    def rule(cls, saved: dict) -> str:
        """When the policy inserts, in words, from the saved summary ``saved`` (its options are keys of it)."""
        return ""

    @classmethod
    def item_cells(cls, row: dict) -> List[str]:
        """The cells of :attr:`item_columns` for a saved per-item row (its :meth:`item_report` keys)."""
        return []

    @classmethod
    def arm_cells(cls, row: dict) -> List[str]:
        """The cells of :attr:`arm_columns` for a saved arm row (its :meth:`arm_counts` keys)."""
        return []

    @classmethod
    def arms_note(cls, saved: dict, arms: List[dict]) -> Optional[str]:
        """A line printed under the arms table (what the policy's counts mean), or ``None``."""
        return None

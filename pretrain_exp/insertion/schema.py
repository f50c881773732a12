"""The common schema of insertion experiments (each type extends :class:`InsertionExperimentConf` in
:mod:`pretrain_exp.insertion.types`; ``conf/insertion/<name>.yaml`` extends ``schema/insertion/<type>``) and the
enums of range unit and EOS policy (placement kinds are registered in
:mod:`pretrain_exp.insertion.placements`).

Units: positions and lengths in tokens; ``placement.steps`` are global optimizer steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Dict, List, Optional

from omegaconf import II, MISSING

from pretrain_exp.core.capabilities import INSERTION_TYPE, Capabilities
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.insertion.placements import check_fields, kind_of


class RangeUnit(str, Enum):
    """Unit of ``placement.start``/``placement.end`` for ``range`` placement."""

    fraction = "fraction"  #: fractions of the run's training window, 0.0 = first token, 1.0 = end
    position = "position"  #: absolute global token positions


class EosPolicy(str, Enum):
    """How an inserted item is delimited from the surrounding training text.

    ``wrap``: append EOS unless the item ends with it, then prepend EOS unless it starts with it (an item as
    its own EOS-delimited document, the way OLMo packs documents). ``append``: only the trailing EOS.
    ``none``: the tokens exactly as given.
    """

    wrap = "wrap"
    append = "append"
    none = "none"


class AuditMode(str, Enum):
    """The natural-duplicate audit (:mod:`pretrain_exp.insertion.audit`): ``off``; ``on`` (count, record, warn
    about controls found in the training window); ``strict`` (a control found in the window is an error)."""

    off = "off"
    on = "on"
    strict = "strict"


@dataclass
class PlacementConf:
    """Placement of one insertion experiment: ``kind`` names a registered placement kind
    (:mod:`pretrain_exp.insertion.placements`), which takes some of the other fields (its schema) and refuses the
    rest when set."""

    kind: str = "random"  #: a registered placement kind: random, range, explicit (``placements.KINDS``)
    start: Optional[float] = None  #: ``range`` only: window start, in ``unit``
    end: Optional[float] = None  #: ``range`` only: window end (exclusive), in ``unit``
    unit: RangeUnit = RangeUnit.fraction
    position_key: str = "position"  #: ``explicit`` only: jsonl key holding the global token position
    allow_row_crossing: bool = False  #: ``explicit`` only: let an item span two rows
    steps: List[int] = field(default_factory=list)  #: random/range: only the batches of these global steps
    every_n_steps: int = 0  #: random/range: only the batches of steps S+n, S+2n, ... of the run (0 = all)
    max_per_batch: int = 0  #: random/range: at most this many copies of the experiment per global batch (0 = any)


@dataclass
class InsertionExperimentConf:
    """The fields every insertion experiment has: which type, its items, how often each is inserted, and where.

    Each insertion type (:mod:`pretrain_exp.insertion.types`) extends this with its own fields and checks; its
    YAML options extend ``schema/insertion/<type>``.
    """

    #: what the type can do (:mod:`pretrain_exp.core.capabilities`: ``embedding_noise``, its copies add noise to
    #: the input embeddings instead of inserting tokens); none here
    capabilities: ClassVar[Capabilities] = Capabilities(INSERTION_TYPE)
    type: str = MISSING  #: registered insertion type (:data:`pretrain_exp.insertion.types.TYPES`)
    file: Optional[str] = None  #: jsonl file of items
    key: Optional[str] = None  #: jsonl key of the item's payload (each type documents its default)
    num_items: Optional[int] = None  #: items to use (the first N of ``file``, or how many to generate)
    repetitions: Any = 1  #: dup count: int, float (fractional, see docs) or a list of dup counts per item group
    eos: EosPolicy = EosPolicy.wrap
    placement: PlacementConf = field(default_factory=PlacementConf)

    def validate(self, key: str) -> None:
        """Static checks of the common fields (no files read); types extend it with their own checks first.

        :param key: dotted key of the experiment (``insertion.experiments.<name>``), used in messages.
        :raises ConfigError: naming the offending key.
        """
        if self.num_items is not None and self.num_items <= 0:
            raise ConfigError(f"{key}.num_items", f"must be > 0, got {self.num_items}")
        parse_repetitions(f"{key}.repetitions", self.repetitions)
        validate_placement(key, self)


@dataclass
class InsertionConf:
    """All insertion experiments of a run (``insertion=`` options add entries to ``experiments``)."""

    seed: int = II("seed")  # type: ignore[assignment]
    verify: bool = True  #: read every affected row back through the data path after planning
    #: name -> experiment config (one schema per type: :func:`pretrain_exp.insertion.types.parse_experiments`)
    experiments: Dict[str, Any] = field(default_factory=dict)
    withheld: List[str] = field(default_factory=list)  #: placed like the others but not inserted nor evaluated
    audit: AuditMode = AuditMode.on  #: natural-duplicate audit of the items in the window and held-out rows
    audit_ngram: int = 13  #: n-gram length (tokens) of the audit's overlap count
    audit_workers: int = 0  #: processes scanning the window (0: the cores this process may use)
    #: closed-loop insertion policy: a name or ``{policy: <name>, ...}`` (:mod:`~pretrain_exp.insertion.dynamic`);
    #: the validated config holds it parsed, a ``DynamicConf`` or ``None``
    dynamic: Any = None


def validate_placement(key: str, exp: InsertionExperimentConf) -> None:
    """Static checks of ``exp.placement``: the kind is registered, no field set that the kind does not take
    (:func:`~pretrain_exp.insertion.placements.check_fields`), the kind's own checks, then the step selection.

    :raises ConfigError: naming the offending key (an unknown kind names ``<key>.placement.kind`` and lists the
        registered kinds).
    """
    pl = exp.placement
    spec = kind_of(exp, key)
    check_fields(key, pl, spec)
    spec.check(key, exp)
    if pl.steps and pl.every_n_steps:
        raise ConfigError(f"{key}.placement", "set placement.steps or placement.every_n_steps, not both")
    for name in ("every_n_steps", "max_per_batch"):
        if getattr(pl, name) < 0:
            raise ConfigError(f"{key}.placement.{name}", f"must be >= 0 (0 = no restriction), got {getattr(pl, name)}")
    if any(k < 1 for k in pl.steps):
        raise ConfigError(f"{key}.placement.steps", f"global steps are >= 1, got {list(pl.steps)}")


def parse_repetitions(key: str, value) -> list | int | float:
    """Check a ``repetitions`` value; returns it as int, float or list of ints.

    :raises ConfigError: for negative, NaN/inf, non-numeric values or an empty list.
    """
    if isinstance(value, bool):
        raise ConfigError(key, f"must be a number or a list of dup counts, got {value!r}")
    if isinstance(value, (list, tuple)) or hasattr(value, "__iter__") and not isinstance(value, str):
        vals = list(value)
        if not vals:
            raise ConfigError(key, "empty list of dup counts")
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(key, f"dup counts in a list must be integers >= 0, got {v!r}")
        return vals
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, f"must be >= 0, got {value}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(key, f"must be a finite number >= 0, got {value}")
        return int(value) if value == int(value) else value
    raise ConfigError(key, f"must be a number or a list of dup counts, got {value!r}")

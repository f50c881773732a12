"""What an insertion type module provides (:class:`TypeSpec`) and the effect definition CPDT reads
(:class:`EffectSpec`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

from pretrain_exp.insertion.items import ItemSet, LoadContext
from pretrain_exp.insertion.schema import InsertionExperimentConf


@dataclass(frozen=True)
class EffectSpec:
    """How an experiment's effect is read from the per-item rows of an eval (:mod:`pretrain_exp.app.cpdt`)."""

    eval_type: str  #: the eval whose ``rows`` hold the per-item value
    value: str  #: the per-item row key
    sign: float  #: ``+1``: ``mean(dup d) - mean(dup 0)``; ``-1``: ``mean(dup 0) - mean(dup d)``
    unit: str


#: the effect of inserted texts or tokens: the loss gap to the dup-0 controls (nats/token)
LOSS_GAP = EffectSpec("insertion_loss", "loss", -1.0, "nats/token")


@dataclass(frozen=True)
class TypeSpec:
    """One insertion type, as registered in :data:`pretrain_exp.insertion.types.TYPES`.

    ``schema`` extends :class:`~pretrain_exp.insertion.schema.InsertionExperimentConf` (its ``validate(key)``
    holds the type's one-schema checks); ``load_items(name, exp, ctx)`` returns the experiment's
    :class:`~pretrain_exp.insertion.items.ItemSet`; ``effect`` is its CPDT effect (None: not defined);
    ``reserved_rows(experiments)`` (optional) is the number of first-epoch rows the type's experiments (name ->
    config, all of this type) take before the held-out rows. What the type can do is its schema's
    ``capabilities`` (:mod:`pretrain_exp.core.capabilities`).
    """

    schema: type
    load_items: Callable[[str, InsertionExperimentConf, LoadContext], ItemSet]
    effect: Optional[EffectSpec] = None
    reserved_rows: Optional[Callable[[Dict[str, InsertionExperimentConf]], int]] = None

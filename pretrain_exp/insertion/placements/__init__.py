"""The placement-kind registry: ``placement.kind`` name -> its
:class:`~pretrain_exp.insertion.placements.base.PlacementSpec` as a ``"module:attr"`` string, imported only when the
name is used.

Each kind is one module of this package: a :class:`~pretrain_exp.insertion.placements.base.PlacementSpec` subclass
with its schema (``takes``: the fields of :class:`~pretrain_exp.insertion.schema.PlacementConf` it reads), its own
checks (``check``) and what the planner asks of it (``from_items``, ``row_range``). A new placement kind is that
module, one line in :data:`KINDS` and its tests; ``placement.kind: <name>`` then selects it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.registry import lookup
from pretrain_exp.insertion.placements.base import PlacementSpec

#: placement kind name -> ``"module:attr"`` of its :class:`~pretrain_exp.insertion.placements.base.PlacementSpec`
KINDS: Dict[str, str] = {
    "random": "pretrain_exp.insertion.placements.random:KIND",
    "range": "pretrain_exp.insertion.placements.range:KIND",
    "explicit": "pretrain_exp.insertion.placements.explicit:KIND",
}

#: fields refused together when set for a kind that does not take them: (fields, key suffix under
#: ``<experiment>.placement``, message; ``{takers}``: the kinds that take them, ``{kind}``: the configured one)
_REFUSALS = [
    (("start", "end"), "", "start/end only apply to {takers} placement, not {kind}"),
    (("steps", "every_n_steps", "max_per_batch"), "",
     "steps / every_n_steps / max_per_batch apply to {takers} placement, not {kind}"),
    (("allow_row_crossing",), ".allow_row_crossing", "only {takers} placements may cross rows"),
]


def get_kind(name: Any, key: str = "placement.kind") -> PlacementSpec:
    """The :class:`~pretrain_exp.insertion.placements.base.PlacementSpec` registered as ``name``.

    :param key: dotted config key, for messages (``insertion.experiments.<name>.placement.kind``).
    :raises ConfigError: for an unknown kind, listing the registered ones.
    """
    return lookup(KINDS, getattr(name, "value", name), key, "placement kind")


def kind_of(exp: Any, key: str = "insertion.experiments.<name>") -> PlacementSpec:
    """The placement kind of an experiment config ``exp`` (configured under ``key``), from ``exp.placement.kind``.

    :raises ConfigError: for an unknown kind, naming ``<key>.placement.kind``.
    """
    return get_kind(exp.placement.kind, f"{key}.placement.kind")


def _takers(field: str) -> str:
    """The registered kinds that take ``field``, in words (``random and range``)."""
    names = [n for n in sorted(KINDS) if field in get_kind(n).takes]
    return " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]


def check_fields(key: str, placement: Any, spec: PlacementSpec) -> None:
    """Refuse a field of ``placement`` (a ``PlacementConf``) set to a value other than its default for a kind
    (``spec``) that does not take it.

    :param key: dotted key of the experiment (``insertion.experiments.<name>``).
    :raises ConfigError: naming ``<key>.placement`` (or the field's key) and the kinds that take the field.
    """
    given = []
    for f in dataclasses.fields(placement):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name != "kind" and f.name not in spec.takes and getattr(placement, f.name) != default:
            given.append(f.name)
    for fields, suffix, message in _REFUSALS:
        for f in fields:
            if f in given:
                raise ConfigError(f"{key}.placement{suffix}", message.format(takers=_takers(f), kind=spec.name))
    for f in given:
        raise ConfigError(f"{key}.placement.{f}", f"only for {_takers(f) or 'no'} placement, not {spec.name}")


__all__ = ["KINDS", "PlacementSpec", "check_fields", "get_kind", "kind_of"]

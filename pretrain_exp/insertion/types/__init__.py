"""The insertion-type registry: type name -> its :class:`~pretrain_exp.insertion.types.base.TypeSpec` as a
``"module:attr"`` string, imported only when the name is used.

Each type is one module of this package with its schema (extending
:class:`~pretrain_exp.insertion.schema.InsertionExperimentConf`, with a ``validate(key)`` of its one-schema
checks), its item loading, its CPDT effect and, where it has any, its reserved rows. A new insertion type is that
module, one line in :data:`TYPES`, one ``conf/insertion/<name>.yaml`` (``defaults:
[/schema/insertion/<type>@_here_, _self_]``) and its tests.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, Optional

from omegaconf import DictConfig, OmegaConf

from pretrain_exp.core.config import in_schema
from pretrain_exp.core.config import typed_node as typed
from pretrain_exp.core.errors import ConfigError, InsertionError, PretrainExpError
from pretrain_exp.core.registry import lookup

log = logging.getLogger(__name__)

#: insertion type name -> ``"module:attr"`` of its :class:`~pretrain_exp.insertion.types.base.TypeSpec`
TYPES: Dict[str, str] = {
    "texts": "pretrain_exp.insertion.types.texts:TYPE",
    "tokens": "pretrain_exp.insertion.types.tokens:TYPE",
    "benchmark": "pretrain_exp.insertion.types.benchmark:TYPE",
    "gaussian": "pretrain_exp.insertion.types.gaussian:TYPE",
    "knowledge": "pretrain_exp.insertion.types.knowledge:TYPE",
    "corpus_chunks": "pretrain_exp.insertion.types.corpus_chunks:TYPE",
}


def get_type(name: str, key: str = "type"):
    """The :class:`~pretrain_exp.insertion.types.base.TypeSpec` registered as ``name``.

    :param key: dotted config key, for messages (``insertion.experiments.<name>.type``).
    :raises ConfigError: for an unknown type, listing the registered ones.
    """
    return lookup(TYPES, name, key, "insertion type")


def schema(name: str) -> type:
    """The schema dataclass of insertion type ``name``.

    :raises ConfigError: for an unknown type.
    """
    return get_type(name).schema


def register_insertion_schemas(cs) -> None:
    """Store each type's schema in Hydra's ConfigStore as ``schema/insertion/<type>``."""
    for name in TYPES:
        cs.store(group="schema/insertion", name=name, node=schema(name))


def _foreign_field(key: str, kind: str, fields) -> None:
    """Raise for the first field that the schema of ``kind`` lacks but another type's schema has."""
    own = {f.name for f in dataclasses.fields(schema(kind))}
    for f in fields:
        if f in own:
            continue
        for other in TYPES:
            if other != kind and f in {g.name for g in dataclasses.fields(schema(other))}:
                raise ConfigError(f"{key}.{f}", f"only for type={other}, not {kind}")


def parse_experiment(key: str, node: Any):
    """One experiment config (its type's dataclass, or a dict/``DictConfig`` with ``type``) as its type's schema.

    :param key: dotted key of the experiment (``insertion.experiments.<name>``).
    :raises ConfigError: for an unknown type (listing the registered ones), a field of another type, an unknown
        field or a wrong value, naming the key.
    """
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        kind = getattr(node, "type", None)
        cls = schema(kind) if kind in TYPES else None
        if cls is not None and type(node) is cls:
            return node
        defaults = type(node)()
        node = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)
                if f.name == "type" or getattr(node, f.name) != getattr(defaults, f.name)}
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node)
    kind = node.get("type") if isinstance(node, dict) else None
    if not isinstance(kind, str) or kind not in TYPES:
        raise ConfigError(f"{key}.type", f"unknown insertion type {kind!r}; allowed: {sorted(TYPES)}")
    _foreign_field(key, kind, node)
    return in_schema(schema(kind), node, key, to_object=True)


def typed_node(key: str, node: Any) -> DictConfig:
    """A composed or loaded experiment node (configured under ``key``) as a node of its type's schema (a
    ``DictConfig`` of that dataclass; :func:`pretrain_exp.core.config.typed_node`), so that converting the whole
    config checks its values; interpolations and missing values stay for later.

    :raises ConfigError: for an unknown type, a field of another type, an unknown field or a wrong value, naming
        the key.
    """
    return typed(key, node, "type", TYPES, schema, "insertion type",
                 lambda key, kind, node, cls: _foreign_field(key, kind, list(node.keys())))


def parse_experiments(experiments: Dict[str, Any], prefix: str = "insertion.experiments") -> Dict[str, Any]:
    """``insertion.experiments`` (name -> dataclass, dict or ``DictConfig``) as their types' schemas
    (:func:`parse_experiment`)."""
    return {name: parse_experiment(f"{prefix}.{name}", node) for name, node in experiments.items()}


def validate_experiment(key: str, exp: Any) -> None:
    """Parse (if needed) and check one experiment config: its type's checks, then the common ones (no files read).

    :raises ConfigError: naming the offending key.
    """
    parse_experiment(key, exp).validate(key)


def load_items(name: str, exp: Any, ctx=None, **context):
    """The items of experiment ``name`` (:class:`~pretrain_exp.insertion.items.ItemSet`), loaded by its type with
    ``ctx`` (a :class:`~pretrain_exp.insertion.items.LoadContext`, or its fields as keywords: ``tokenizer``,
    ``vocab_size``, ``sequence_length``, ``seed``, ``cache_dir``, ``order``, ``held_out_rows``).

    :raises ConfigError: for a bad config; :class:`~pretrain_exp.core.errors.DataError` for file problems (naming
        file and line); :class:`~pretrain_exp.core.errors.InsertionError` for a bad item (naming it), and for any
        other exception of the type's loader (naming the experiment and its file; the traceback is logged at
        debug level).
    """
    from pretrain_exp.insertion.items import LoadContext

    ctx = ctx if ctx is not None else LoadContext(**context)
    key = f"insertion.experiments.{name}"
    exp = parse_experiment(key, exp)
    spec = get_type(exp.type, f"{key}.type")
    try:
        return spec.load_items(name, exp, ctx)
    except (PretrainExpError, MemoryError):
        raise
    except Exception as e:  # a failure the type did not foresee still names the experiment and its file
        log.debug("loading the items of %s failed", key, exc_info=True)
        source = f" from {exp.file}" if getattr(exp, "file", None) else ""
        first = (str(e).strip().splitlines() or [""])[0]
        raise InsertionError(f"{key}: loading its items{source} failed: {type(e).__name__}: {first[:200]}") from e


def effect(exp: Any):
    """The CPDT :class:`~pretrain_exp.insertion.types.base.EffectSpec` of an experiment config (None: its type
    defines none)."""
    return get_type(exp.type).effect


def reserved_rows(experiments: Dict[str, Any]) -> int:
    """First-epoch rows the experiments take before the held-out rows (summed over the types that reserve rows).

    :raises ConfigError: for a type's own rule (e.g. one ``corpus_chunks`` experiment per run).
    """
    by_type: Dict[str, Dict[str, Any]] = {}
    for name, exp in experiments.items():
        by_type.setdefault(exp.type, {})[name] = exp
    total = 0
    for kind, exps in by_type.items():
        fn: Optional[Any] = get_type(kind).reserved_rows
        total += int(fn(exps)) if fn is not None else 0
    return total


__all__ = ["TYPES", "effect", "get_type", "load_items", "parse_experiment", "parse_experiments",
           "register_insertion_schemas", "reserved_rows", "schema", "typed_node", "validate_experiment"]

"""The eval registry: each eval type has a config dataclass (its ``conf/eval/<name>.yaml`` extends
``schema/eval/<type>``) and a function ``fn(cfg, ctx) -> EvalResult``.

Contract (DESIGN.md section 7): an eval takes a loaded HF causal LM plus its config node and returns a flat
dict of float metrics and optional per-item rows. Evals that score insertion experiments also return
``per_dup`` rows ``{experiment, dup_count, n_items, mean_loss, ci_low, ci_high}``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pretrain_exp.errors import ConfigError


@dataclass
class EvalContext:
    """What an eval gets besides its config.

    ``model`` is an HF causal LM in eval mode; ``plan`` the run's insertion plan (items, including dup-0
    controls); ``held_out`` the held-out rows of the corpus as an ``int64`` array of shape ``(n, L)``.
    """

    model: Any
    tokenizer: Any
    plan: Any
    held_out: np.ndarray
    step: int
    batch_size: int
    bootstrap_samples: int
    seed: int
    cache_dir: Optional[str] = None  #: the run's asset cache (None: ``$PRETRAIN_EXP_CACHE`` or ``~/.cache/...``)
    row_tokens: Optional[Callable[[int], np.ndarray]] = None  #: training-order row q -> its tokens as trained
    insertion: Any = None  #: the run's :class:`~pretrain_exp.config.InsertionConf` (seed, experiments), if known


@dataclass
class EvalResult:
    """Output of one eval on one checkpoint."""

    metrics: Dict[str, float] = field(default_factory=dict)  #: flat name -> value
    per_dup: List[Dict[str, Any]] = field(default_factory=list)  #: per (experiment, dup count) summary rows
    rows: List[Dict[str, Any]] = field(default_factory=list)  #: optional per-item rows


@dataclass(frozen=True)
class EvalSpec:
    config: type  #: the dataclass schema; must have a ``type: str`` field equal to the registry name
    fn: Callable[[Any, EvalContext], EvalResult]


EVALS: Dict[str, EvalSpec] = {}


def register(name: str, config: type):
    """Decorator registering ``fn(cfg, ctx) -> EvalResult`` as eval type ``name`` with schema ``config``."""

    def wrap(fn):
        EVALS[name] = EvalSpec(config, fn)
        return fn

    return wrap


def _load_all() -> None:
    from evals import (  # noqa: F401  (registration side effect)
        benchmark,
        gaussian,
        insertion_loss,
        knowledge,
        memorization,
        mia,
        perplexity,
    )


def register_eval_schemas(cs) -> None:
    """Store each eval's schema in Hydra's ConfigStore as ``schema/eval/<type>``."""
    _load_all()
    for name, spec in EVALS.items():
        cs.store(group="schema/eval", name=name, node=spec.config)


def parse_task_configs(tasks: Dict[str, Any]) -> Dict[str, Any]:
    """Turn ``eval.tasks`` (dataclasses or plain dicts from presets) into the registered config dataclasses.

    :raises ConfigError: for an unknown eval type (listing the known ones) or a bad field, naming the key.
    """
    _load_all()
    out = {}
    for name, node in tasks.items():
        key = f"eval.tasks.{name}"
        if dataclasses.is_dataclass(node):
            out[name] = node
            continue
        kind = node.get("type") if isinstance(node, (dict, DictConfig)) else None
        if kind not in EVALS:
            raise ConfigError(f"{key}.type", f"unknown eval type {kind!r}; allowed: {sorted(EVALS)}")
        try:
            merged = OmegaConf.merge(OmegaConf.structured(EVALS[kind].config), node)
            out[name] = OmegaConf.to_object(merged)
        except OmegaConfBaseException as e:
            sub = getattr(e, "key", "") or ""
            raise ConfigError(f"{key}.{sub}".rstrip("."), str(e).splitlines()[0]) from None
    return out


def run_eval(cfg: Any, ctx: EvalContext) -> EvalResult:
    """Run one configured eval."""
    _load_all()
    return EVALS[cfg.type].fn(cfg, ctx)

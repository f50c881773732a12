"""The eval registry: eval type name -> its config schema and its function, as ``"module:attr"`` strings.

Each eval is one module of :mod:`pretrain_exp.evals` with a config dataclass (its ``conf/eval/<name>.yaml`` extends
``schema/eval/<type>``) and a function ``fn(cfg, ctx: EvalContext) -> EvalResult`` (:mod:`pretrain_exp.evals.base`). A
new eval is that module, one line in :data:`EVALS`, one YAML and its tests. Looking up a name imports only that eval.

Contract (docs/development/contributing.md): an eval takes a loaded HF causal LM plus its config node and returns a flat
dict of float metrics and optional per-item rows. Evals that score insertion experiments also return
``per_dup`` rows ``{experiment, dup_count, n_items, mean_loss, ci_low, ci_high}``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict

from omegaconf import DictConfig

from pretrain_exp.core.config import typed_node as typed
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.registry import load


@dataclass(frozen=True)
class EvalSpec:
    """One registered eval: ``"module:attr"`` of its schema and of its function, loaded on first use. What the
    eval can do is its schema's ``capabilities`` (:mod:`pretrain_exp.core.capabilities`)."""

    config_target: str
    fn_target: str

    @property
    def config(self) -> type:
        """The dataclass schema; its ``type: str`` field equals the registry name."""
        return load(self.config_target)

    @property
    def fn(self):
        """``fn(cfg, ctx) -> EvalResult``."""
        return load(self.fn_target)


def _spec(module: str, conf: str, fn: str) -> EvalSpec:
    return EvalSpec(f"pretrain_exp.evals.{module}:{conf}", f"pretrain_exp.evals.{module}:{fn}")


#: eval type name -> its :class:`EvalSpec`
EVALS: Dict[str, EvalSpec] = {
    "benchmark": _spec("benchmark", "BenchmarkConf", "benchmark"),
    "gaussian": _spec("gaussian", "GaussianConf", "gaussian"),
    "insertion_loss": _spec("insertion_loss", "InsertionLossConf", "insertion_loss"),
    "knowledge": _spec("knowledge", "KnowledgeConf", "knowledge"),
    "lm_eval": _spec("lm_eval", "LmEvalConf", "lm_eval_tasks"),
    "memorization": _spec("memorization", "MemorizationConf", "memorization"),
    "mia": _spec("mia", "MiaConf", "mia"),
    "perplexity": _spec("perplexity", "PerplexityConf", "perplexity"),
}


def register_eval_schemas(cs) -> None:
    """Store each eval's schema in Hydra's ConfigStore as ``schema/eval/<type>``."""
    for name, spec in EVALS.items():
        cs.store(group="schema/eval", name=name, node=spec.config)


def schema(name: str) -> type:
    """The schema dataclass of eval type ``name``.

    :raises ConfigError: for an unknown type, listing the registered ones.
    """
    if name not in EVALS:
        raise ConfigError("type", f"unknown eval type {name!r}; allowed: {sorted(EVALS)}")
    return EVALS[name].config


def typed_node(key: str, node: Any) -> DictConfig:
    """An eval task node (a dict or ``DictConfig``, configured under ``key``: ``eval.tasks.<name>``) as a node of
    its type's schema (:func:`pretrain_exp.core.config.typed_node`).

    :raises ConfigError: for an unknown eval type (listing the known ones), a field the schema lacks or a wrong
        type, naming the key.
    """
    return typed(key, node, "type", EVALS, schema, "eval type")


def parse_task_configs(tasks: Dict[str, Any]) -> Dict[str, Any]:
    """Turn ``eval.tasks`` (dataclasses or plain dicts from presets) into the registered config dataclasses (not
    validated: each one's ``validate(f"eval.tasks.{name}")`` checks its values).

    :raises ConfigError: for an unknown eval type (listing the known ones) or a bad field, naming the key.
    """
    return {name: node if dataclasses.is_dataclass(node) else
            typed(f"eval.tasks.{name}", node, "type", EVALS, schema, "eval type", to_object=True)
            for name, node in tasks.items()}


def run_eval(cfg: Any, ctx):
    """Run one configured eval."""
    return EVALS[cfg.type].fn(cfg, ctx)

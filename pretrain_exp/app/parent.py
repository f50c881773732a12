"""Train a finished run further: ``python -m pretrain_exp parent=runs/<run> training.num_steps=N``.

A *child* run starts from its parent's final model at the parent's last global step ``S``, on the parent's data
order, so its window ``[S*B*L, (S+N)*B*L)`` continues where the parent's ended. What the parent records is read
from it, as a checkpoint's settings are (:mod:`pretrain_exp.app.settings`); the command line overrides it:

- the model: the parent's final model (``hf/step<S>/``, or its last ``checkpoints/checkpoint-<k>/``) at global step
  ``S``, with the parent's model name, dtype and tokenizer; a ``model`` override is refused;
- the groups ``data``, ``training`` and ``eval``: the parent's; a group option on the command line
  (``training=tiny``) replaces the whole group, a key (``training.num_steps=40``) that key; the sequence length
  and the global batch size stay the parent's (global token positions continue from ``S*B*L``);
- ``name`` and ``seed`` (``${parent:...}`` in ``conf/config.yaml``, so that the run name reads
  ``<name>-<model>-step<S>-seed<seed>-<digest>``);
- insertions: none, so the parent's items are not inserted again; ``insertion=...`` adds new experiments, under
  names other than the parent's.

The child's evals measure the parent's items and controls beside its own (:meth:`Plan.then
<pretrain_exp.insertion.plan.Plan.then>`) at each of its segments, and its ``results.json`` joins the evaluated
steps of the parent (and of the parent's own parents) with its own (``by_step``, ``parent``): the
loss-over-steps figure has one curve per dup count across both runs, the forgetting after the parent's last
insertion, and the change since step ``S`` is tested against the controls (``did_effects``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from pretrain_exp.app.run_name import override_key
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.rundir import RunDir

log = logging.getLogger(__name__)

RESOLVER = "parent"  #: ``${parent:<key>,<default>}``
KEY = "parent"  #: the config key naming the parent run dir
#: the groups a child takes from its parent unless the command line selects another option
INHERITED_GROUPS = ("data", "training", "eval")
#: the training keys a child keeps from its parent whatever the command line says (global positions continue)
FIXED_KEYS = ("training.sequence_length", "training.global_batch_size")
#: the frameworks whose runs can be continued (their final model is an HF model dir the child loads)
FRAMEWORKS = ("hf",)


@dataclass
class ParentRun:
    """A finished run that a child continues: its run dir and saved config (``config.resolved.yaml``)."""

    run_dir: Path
    config: Dict[str, Any]

    @classmethod
    def open(cls, path: str | Path) -> "ParentRun":
        """The finished run at ``path``.

        :raises ConfigError: (``parent``) for a dir that is no run dir, or a run that has not finished
            (no ``results.json``).
        """
        run_dir = Path(path).expanduser().resolve()
        rd = RunDir(run_dir)
        config = rd.read_config()
        if config is None:
            raise ConfigError(KEY, f"{run_dir} is not a run dir (no {rd.config.name}); give the dir of a finished "
                              "run (the last line its command printed: run dir: ...)")
        if not rd.results.is_file():
            raise ConfigError(KEY, f"{run_dir} has not finished (no {rd.results.name}); re-run its own command to "
                              "finish it first")
        return cls(run_dir, config)

    @property
    def rundir(self) -> RunDir:
        return RunDir(self.run_dir)

    @property
    def start_step(self) -> int:
        """The global step the parent started at."""
        return int(self.config["model"].get("checkpoint_step") or 0)

    @property
    def end_step(self) -> int:
        """The parent's last global step: where the child starts."""
        return self.start_step + int(self.config["training"]["num_steps"])

    @property
    def framework(self) -> str:
        return str(self.config["framework"]["name"])

    def model_dir(self) -> Path:
        """The parent's final model: an HF model dir of global step :attr:`end_step`.

        :raises ConfigError: (``parent``) for a framework whose runs cannot be continued, or a run that kept no model
            of its final step.
        """
        if self.framework not in FRAMEWORKS:
            raise ConfigError(KEY, f"{self.run_dir} was trained with framework={self.framework}; continuing a run is "
                              f"built for framework={', '.join(FRAMEWORKS)} runs")
        models = self.rundir.hf_models(self.start_step)
        if self.end_step not in models:
            raise ConfigError(KEY, f"{self.run_dir} keeps no model of its final step {self.end_step} (it keeps: "
                              f"{', '.join(map(str, models)) or 'none'}); training.cleanup=all deleted it, or it was "
                              "removed by hand")
        return models[self.end_step]

    def plan(self):
        """The parent's final insertion plan (:class:`~pretrain_exp.insertion.plan.Plan`), joined after its own
        parent's when it is a child itself."""
        from pretrain_exp.insertion.plan import Plan

        plan = Plan.load(self.rundir.plan)
        grand = self.grandparent
        return plan if grand is None else grand.plan().then(plan)

    @cached_property
    def grandparent(self) -> Optional["ParentRun"]:
        """The run this parent continued, if any."""
        path = self.config.get(KEY)
        return ParentRun.open(path) if path else None

    def experiments(self) -> Dict[str, Any]:
        """The insertion experiments the parent (and its own parents) measured, as their types' schemas."""
        from pretrain_exp.insertion.types import parse_experiments

        own = parse_experiments(self.config["insertion"].get("experiments") or {})
        grand = self.grandparent
        return own if grand is None else {**grand.experiments(), **own}

    def evals(self) -> Dict[int, Dict[str, dict]]:
        """``{step: {task: result}}`` of every step the parent and its own parents evaluated (a run's own
        evaluation of a step wins over its parent's)."""
        grand = self.grandparent
        return {**(grand.evals() if grand is not None else {}), **self.rundir.all_evals()}

    def entry(self) -> Dict[str, Any]:
        """The ``parent`` entry of a child's ``results.json``."""
        return {"run_dir": str(self.run_dir), "run_name": self.config.get("run_name"), "step": self.end_step,
                "start_step": self.start_step}


_NO_DEFAULT = object()


def resolve(key: str, default: Any = _NO_DEFAULT, *, _root_) -> Any:
    """The value of ``${parent:<key>,<default>}``: ``default`` without a parent run, else the parent's ``key``
    (a dotted key of its saved config, or ``end_step``, its last global step).

    :raises ConfigError: (``parent``) as :meth:`ParentRun.open`; (``key``) for a key the parent's config lacks.
    """
    path = _root_.get(KEY)
    if path is None:
        if default is _NO_DEFAULT:
            raise ConfigError(key, "${parent:...} without parent=<run dir> needs a default")
        return default
    parent = ParentRun.open(path)
    if key == "end_step":
        return parent.end_step
    value = OmegaConf.select(OmegaConf.create(parent.config), key, default=_NO_DEFAULT)
    if value is _NO_DEFAULT:
        raise ConfigError(key, f"the parent run {parent.run_dir} does not record it")
    return value


def register_resolver() -> None:
    """Register ``${parent:...}`` with OmegaConf (idempotent)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, resolve)


def _given(overrides: Sequence[str], group: str) -> list:
    """The keys under ``group`` that ``overrides`` set (``group`` itself for a group option)."""
    return [k for k in map(override_key, overrides) if k == group or k.startswith(group + ".")]


def with_parent(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """The composed config ``cfg`` of a child run (``parent=<run dir>``; module docstring) with what it takes
    from its parent; ``cfg`` itself without a parent. ``overrides``: the command line's (Hydra's task overrides).
    Applied once, to the composed config (a child's ``config.resolved.yaml`` holds the result).

    :raises ConfigError: (``parent``) as :meth:`ParentRun.open` / :meth:`ParentRun.model_dir`; (``framework``) for
        another framework than the parent's; (``model``, ``training.sequence_length``,
        ``training.global_batch_size``) for an override of what a continuation keeps; (``insertion.experiments.<name>``)
        for a new experiment under a name the parent measured.
    """
    if cfg.get(KEY) is None:
        return cfg
    parent = ParentRun.open(cfg[KEY])
    if "experiment" in map(override_key, overrides):
        raise ConfigError("experiment", "a preset sets a whole run; continue a run with parent=... and the keys "
                          "to change (training.num_steps=..., insertion=...)")
    if str(cfg.framework.name) != parent.framework:
        raise ConfigError("framework", f"the parent run {parent.run_dir} was trained with framework="
                          f"{parent.framework}; add framework={parent.framework}")
    model_keys = _given(overrides, "model")
    if model_keys:
        raise ConfigError(model_keys[0], f"a continued run starts from its parent's final model ({parent.run_dir}, "
                          f"step {parent.end_step}); drop {model_keys[0]} from the command line")
    for key in FIXED_KEYS:
        ours, theirs = OmegaConf.select(cfg, key), OmegaConf.select(OmegaConf.create(parent.config), key)
        if key in map(override_key, overrides) and ours != theirs:
            raise ConfigError(key, f"a continued run keeps its parent's value {theirs} (global token positions "
                              f"continue from step {parent.end_step}); drop {key}={ours}")
    model = dict(parent.config["model"], path=str(parent.model_dir()), asset=None, url=None, revision=None,
                 checkpoint_step=parent.end_step, init="checkpoint", config=None)
    for key, value in model.items():
        cfg.model[key] = value
    for group in INHERITED_GROUPS:
        keys = _given(overrides, group)
        if group in keys:  # a group option: the composed group as it is
            continue
        given = {key: OmegaConf.select(cfg, key) for key in keys}  # the command line's keys, as composed
        theirs = OmegaConf.create(parent.config[group])
        node = cfg[group]
        for key in list(node.keys()):
            if key in theirs:
                node[key] = theirs[key]
        for key, value in given.items():
            OmegaConf.update(cfg, key, value, merge=False)
            if value != OmegaConf.select(theirs, key[len(group) + 1:]):
                log.warning("override: %s=%s (the parent run has %s)", key, value,
                            OmegaConf.select(theirs, key[len(group) + 1:]))
    if not _given(overrides, "insertion"):  # no new insertions: the parent's items are measured, not inserted
        cfg.insertion.experiments = {}
        cfg.insertion.dynamic = None
        cfg.insertion.withheld = []
    measured = parent.experiments()
    for name in cfg.insertion.experiments:
        if name in measured:
            raise ConfigError(f"insertion.experiments.{name}", f"the parent run {parent.run_dir} measures an "
                              f"experiment of this name; give the new one another name")
    cfg[KEY] = str(parent.run_dir)
    log.info("parent: continuing %s from its final model at step %d", parent.run_dir, parent.end_step)
    return cfg

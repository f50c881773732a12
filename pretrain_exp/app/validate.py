"""The rules of a run's config that span groups and plugins, checked once after composing.

One-group rules of a plugin (an insertion type, an eval, a framework) are that plugin's own; this module asks each
plugin by name through its registry and adds the rules between them: a framework that exists (and is installed),
the LR scheduler the framework supports, CPDT needing an eval, noise needing a framework that applies it.
"""

from __future__ import annotations

import math

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.core.config import ATTN_IMPLEMENTATIONS
from pretrain_exp.core.errors import ConfigError


def validate(cfg: ExperimentConfig) -> ExperimentConfig:
    """Check the cross-field rules of ``cfg``; return it (with ``eval.tasks`` parsed into their schemas).

    :raises ConfigError: naming the dotted key of the first violated rule.
    """
    from evals.registry import parse_task_configs
    from frameworks.registry import get_framework_class
    from pretrain_exp.insertion.sources import validate_experiment

    framework = get_framework_class(cfg.framework.name)  # ConfigError listing the frameworks, or the install hint
    if sum(x is not None for x in (cfg.model.asset, cfg.model.path, cfg.model.url)) != 1:
        raise ConfigError("model", "set exactly one of model.asset, model.path and model.url")
    if cfg.model.dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError("model.dtype", f"unknown dtype {cfg.model.dtype!r}; allowed: float32, bfloat16, float16")
    if cfg.framework.lr_schedule not in ("run", "checkpoint") or (
            cfg.framework.lr_schedule == "checkpoint" and cfg.framework.name != "olmo2"):
        raise ConfigError("framework.lr_schedule", f"{cfg.framework.lr_schedule!r} with framework "
                          f"{cfg.framework.name!r}; allowed: 'run', and 'checkpoint' with framework=olmo2")
    if cfg.framework.attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ConfigError("framework.attn_implementation", f"unknown {cfg.framework.attn_implementation!r}; "
                          f"allowed: {list(ATTN_IMPLEMENTATIONS)}")
    if cfg.model.checkpoint_step < 0:
        raise ConfigError("model.checkpoint_step", f"must be >= 0, got {cfg.model.checkpoint_step}")
    if not cfg.data.paths and not cfg.data.text:
        raise ConfigError("data", "set data.paths (token files) or data.text (a text source to tokenize)")
    if cfg.data.held_out_rows < 0:
        raise ConfigError("data.held_out_rows", f"must be >= 0, got {cfg.data.held_out_rows}")
    t = cfg.training
    for key in ("sequence_length", "global_batch_size", "micro_batch_size", "checkpoint_interval"):
        if getattr(t, key) <= 0:
            raise ConfigError(f"training.{key}", f"must be > 0, got {getattr(t, key)}")
    if t.num_steps < 0:
        raise ConfigError("training.num_steps", f"must be >= 0 (0 = evaluate only), got {t.num_steps}")
    if t.global_batch_size % (t.micro_batch_size * t.nproc_per_node):
        raise ConfigError(
            "training.global_batch_size",
            f"{t.global_batch_size} rows is not a multiple of micro_batch_size x nproc_per_node = "
            f"{t.micro_batch_size} x {t.nproc_per_node}",
        )
    if t.keep_last_checkpoints < 0:
        raise ConfigError("training.keep_last_checkpoints",
                          f"must be >= 0 (0 = all), got {t.keep_last_checkpoints}")
    if t.max_retries < 0:
        raise ConfigError("training.max_retries", f"must be >= 0, got {t.max_retries}")
    if not (t.learning_rate >= 0 and math.isfinite(t.learning_rate)):
        raise ConfigError("training.learning_rate", f"must be a finite number >= 0, got {t.learning_rate}")
    if cfg.framework.lr_schedule == "run" and t.lr_scheduler not in framework.lr_schedulers:
        raise ConfigError("training.lr_scheduler", f"unknown scheduler {t.lr_scheduler!r} for framework "
                          f"{cfg.framework.name!r}; allowed: {sorted(framework.lr_schedulers)}")
    for name, exp in cfg.insertion.experiments.items():
        validate_experiment(f"insertion.experiments.{name}", exp)
    for i, name in enumerate(cfg.insertion.withheld):
        if name not in cfg.insertion.experiments:
            raise ConfigError(f"insertion.withheld[{i}]", f"{name!r} is not an insertion experiment; "
                              f"allowed: {sorted(cfg.insertion.experiments)}")
    cfg.eval.tasks = parse_task_configs(cfg.eval.tasks)
    from evals.knowledge import check_experiments

    for name, task in cfg.eval.tasks.items():
        if task.type == "knowledge":
            check_experiments(f"eval.tasks.{name}", task, cfg.insertion.experiments)
    if cfg.cpdt.experiments:
        from pretrain_exp.app.cpdt import validate_cpdt

        validate_cpdt(cfg)
    if cfg.eval.batch_size <= 0:
        raise ConfigError("eval.batch_size", f"must be > 0, got {cfg.eval.batch_size}")
    return cfg


def to_config(cfg: DictConfig) -> ExperimentConfig:
    """Convert a composed (or loaded ``config.resolved.yaml``) config into a validated :class:`ExperimentConfig`.

    :raises ConfigError: for a missing mandatory value, a wrong type or a violated cross-field rule.
    """
    try:
        if not OmegaConf.is_config(cfg) or OmegaConf.get_type(cfg) is not ExperimentConfig:
            cfg = OmegaConf.merge(OmegaConf.structured(ExperimentConfig), cfg)
        exp = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        msg = str(e).splitlines()[0]
        if "Missing mandatory value" in msg:
            msg = f"missing mandatory value (set {key}=...)"
        raise ConfigError(key, msg) from None
    assert isinstance(exp, ExperimentConfig)
    return validate(exp)


def load_resolved(path: str) -> ExperimentConfig:
    """Load a ``config.resolved.yaml`` written by a run (no Hydra needed) into a validated config.

    :raises ConfigError: as :func:`to_config`.
    """
    return to_config(OmegaConf.load(path))

"""The rules of a run's config, checked once after composing (:func:`to_config`).

:func:`derive` first computes the values taken from what was given (``training.report_to`` as a list, the
insertion experiments and eval tasks as their schemas, ``insertion.dynamic`` parsed); :func:`validate` then changes
nothing: it checks each group's rules, calls each plugin's own ``validate(key)`` (an insertion type, an eval, a
framework) with the key it is configured under, and ends with :func:`check_plugins`, the one place for the rules
between plugins (a framework that applies the noise an insertion type needs, the loggers and LR schedulers it
supports, the experiments an eval scores, dynamic insertion on a framework that reads the plan per segment).

What the composed config shows (``--cfg job --resolve``) is what :func:`derive` returns, except for short forms a
user types: ``training.report_to`` defaults to its list (``[]``) and the dynamic presets' ``task`` is
``${eval_task:insertion_loss}`` (:func:`pretrain_exp.app.config.eval_task`), so those print as the run uses them; a
name given for ``report_to`` (``tensorboard``, ``none``) or ``insertion.dynamic`` (a policy name) is printed as given
and taken as its list or its full options here. Typing the experiments and tasks as their schema dataclasses changes
no value (the composed nodes hold every field already).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Optional, Sequence, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.app.settings import log_overrides
from pretrain_exp.core.capabilities import (
    APPLIES_EMBEDDING_NOISE,
    CHECKPOINTS_ARE_HF,
    EMBEDDING_NOISE,
    LOADS_HUB_MODELS,
    READS_PLAN_PER_SEGMENT,
    SAVES_ASYNC,
    SUPPORTS_RANDOM_INIT,
    TRAINS_FP8,
    has,
)
from pretrain_exp.core.config import Cleanup, EvalMode, ExportHF, Precision, TrainingConf, text_sources
from pretrain_exp.core.errors import ConfigError, project_error
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.core.stats import ADJUST_METHODS

log = logging.getLogger(__name__)

MODEL_INITS = ("checkpoint", "random")  #: ``model.init``
DATA_PARALLEL = ("auto", "fsdp", "hsdp", "ddp")  #: ``training.data_parallel``
ATTENTION = ("sdpa", "flash")  #: ``training.attention`` (olmo_core)
#: the lowest CUDA compute capability with float8 tensor cores (Ada Lovelace 8.9; Hopper 9.0, Blackwell 10.0 too),
#: which ``training.precision=fp8`` needs (torchao's float8 matmuls are ``torch._scaled_mm``)
FP8_MIN_CAPABILITY = (8, 9)
#: the torchao that ``training.precision=fp8`` needs, by torch version: torchao's float8 training (OLMo-core's
#: ``Float8Config`` imports ``torchao.float8``); torchao 0.16.0 is built for torch 2.10, 0.17.0 and later need
#: torch >= 2.11
FP8_TORCHAO = "torchao (0.17.0 for torch 2.11, 0.16.0 for torch 2.10)"


def derive(cfg: ExperimentConfig) -> ExperimentConfig:
    """The values of ``cfg`` computed from what was given, once, before :func:`validate` (which changes nothing):
    ``training.report_to`` as a list of logger names, ``insertion.experiments`` and ``eval.tasks`` as their
    types' schema dataclasses, ``insertion.dynamic`` as its parsed
    :class:`~pretrain_exp.insertion.policies.base.DynamicConf` (or ``None``: off), which the run reads from there.

    :raises ConfigError: for a ``report_to`` that is no name or list of names, an unknown insertion or eval type
        or a bad field, a bad ``insertion.dynamic`` (:func:`~pretrain_exp.insertion.dynamic.parse_dynamic`),
        naming the key.
    """
    from pretrain_exp.evals.registry import parse_task_configs
    from pretrain_exp.insertion.dynamic import parse_dynamic
    from pretrain_exp.insertion.types import parse_experiments

    cfg.training.report_to = report_to_list(cfg.training.report_to)
    cfg.insertion.experiments = parse_experiments(cfg.insertion.experiments)
    cfg.eval.tasks = parse_task_configs(cfg.eval.tasks)
    cfg.insertion.dynamic = parse_dynamic(cfg.insertion.dynamic, cfg.insertion.experiments, cfg.eval.tasks)
    return cfg


def validate(cfg: ExperimentConfig) -> ExperimentConfig:
    """Check ``cfg`` (as :func:`derive` returns it; nothing is changed): each group's rules (:func:`check_model`,
    the framework's own :meth:`validate(key) <validate>`, :func:`check_data`, :func:`check_training`,
    :func:`check_insertion` and :func:`check_eval`, which call the insertion experiments' and eval tasks' own
    ``validate(key)`` with the key each is configured under), then the rules between plugins
    (:func:`check_plugins`); return it.

    :raises ConfigError: naming the dotted key of the first violated rule.
    """
    from pretrain_exp.frameworks.registry import get_framework_class

    framework = get_framework_class(cfg.framework.name)  # ConfigError listing the frameworks, or the install hint
    check_model(cfg)
    cfg.framework.validate("framework")  # the framework's own checks
    check_data(cfg)
    check_training(cfg.training)
    check_insertion(cfg)
    check_eval(cfg)
    check_plugins(cfg, framework)
    return cfg


def check_model(cfg: ExperimentConfig) -> None:
    """The ``model`` rules: a known ``model.init``; for ``random``, a ``model.config`` and no checkpoint
    (``asset``/``path``/``url``, a ``checkpoint_step`` of 0); else exactly one checkpoint source; a known
    ``model.dtype``.

    :raises ConfigError: naming the key.
    """
    if cfg.model.init not in MODEL_INITS:
        raise ConfigError("model.init", f"unknown {cfg.model.init!r}; allowed: {list(MODEL_INITS)}")
    if cfg.model.init == "random":
        if not cfg.model.config:
            raise ConfigError("model.config", "model.init=random needs the model's shape: an OLMo-core builder "
                              "(olmo2_1B_v2, olmo3_7B, ...) for olmo_core, a config.json / model dir / Hub id for hf")
        given = [k for k in ("asset", "path", "url") if getattr(cfg.model, k) is not None]
        if given:
            raise ConfigError(f"model.{given[0]}", "model.init=random builds the model from model.config; unset "
                              f"model.{given[0]} (model.{given[0]}=null)")
        if cfg.model.checkpoint_step != 0:
            raise ConfigError("model.checkpoint_step", f"model.init=random starts at step 0, got "
                              f"{cfg.model.checkpoint_step}")
    elif sum(x is not None for x in (cfg.model.asset, cfg.model.path, cfg.model.url)) != 1:
        raise ConfigError("model", "set exactly one of model.asset, model.path and model.url")
    if cfg.model.dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError("model.dtype", f"unknown dtype {cfg.model.dtype!r}; allowed: float32, bfloat16, float16")


def check_data(cfg: ExperimentConfig) -> None:
    """The rules of the run's data and where it starts: ``data.max_target_sequence_length`` a multiple of
    ``training.sequence_length``, ``run_dir`` set, ``model.checkpoint_step >= 0``, one data source (token files,
    a text source or a ``datasets`` corpus), ``data.num_proc >= 1``, ``data.held_out_rows >= 0``.

    :raises ConfigError: naming the key.
    """
    M, L = cfg.data.max_target_sequence_length, cfg.training.sequence_length
    if M is not None and (M < L or M % L):
        raise ConfigError("data.max_target_sequence_length", f"{M} must be a multiple of training.sequence_length={L}")
    if cfg.run_dir is None:
        raise ConfigError("run_dir", "not set (Hydra sets it to the run's output dir)")
    if cfg.model.checkpoint_step < 0:
        raise ConfigError("model.checkpoint_step", f"must be >= 0, got {cfg.model.checkpoint_step}")
    if not cfg.data.paths and not cfg.data.text and not cfg.data.dataset:
        raise ConfigError("data", "set data.paths (token files), data.text (a text source to tokenize) or "
                          "data.dataset (a datasets corpus to tokenize)")
    if cfg.data.text is not None:
        sources = text_sources(cfg.data.text) if isinstance(cfg.data.text, (str, list, ListConfig)) else [None]
        if not sources or not all(isinstance(x, str) and x for x in sources):
            raise ConfigError("data.text", f"give a text source or a list of them (non-empty strings), "
                              f"got {cfg.data.text!r}")
    if cfg.data.dataset and (cfg.data.paths or cfg.data.text):
        raise ConfigError("data.dataset", "set either data.dataset or data.paths / data.text, not both")
    if cfg.data.num_proc < 1:
        raise ConfigError("data.num_proc", f"must be >= 1, got {cfg.data.num_proc}")
    if cfg.data.held_out_rows is not None and cfg.data.held_out_rows < 0:
        raise ConfigError("data.held_out_rows", f"must be >= 0, got {cfg.data.held_out_rows}")


def check_training(t) -> None:
    """The ``training`` rules (``t``: the ``training`` node): positive sizes and interval, a global batch that
    is a multiple of the micro-batch times the ranks, known ``data_parallel`` and ``attention``, non-negative
    counts, a finite ``learning_rate >= 0``, and W&B left out of ``report_to`` (the run's own tracker).

    :raises ConfigError: naming the key.
    """
    for key in ("sequence_length", "global_batch_size", "micro_batch_size", "checkpoint_interval"):
        if getattr(t, key) <= 0:
            raise ConfigError(f"training.{key}", f"must be > 0, got {getattr(t, key)}")
    if t.num_steps < 0:
        raise ConfigError("training.num_steps", f"must be >= 0 (0 = evaluate only), got {t.num_steps}")
    if t.nnodes < 1 or t.nproc_per_node < 1:
        key = "nnodes" if t.nnodes < 1 else "nproc_per_node"
        raise ConfigError(f"training.{key}", f"must be >= 1, got {getattr(t, key)}")
    if t.global_batch_size % (t.micro_batch_size * t.nproc_per_node * t.nnodes):
        raise ConfigError(
            "training.global_batch_size",
            f"{t.global_batch_size} rows is not a multiple of micro_batch_size x nproc_per_node x nnodes = "
            f"{t.micro_batch_size} x {t.nproc_per_node} x {t.nnodes}",
        )
    if t.data_parallel not in DATA_PARALLEL:
        raise ConfigError("training.data_parallel", f"unknown {t.data_parallel!r}; allowed: {list(DATA_PARALLEL)}")
    if t.attention not in ATTENTION:
        raise ConfigError("training.attention", f"unknown {t.attention!r}; allowed: {list(ATTENTION)}")
    if t.keep_last_checkpoints < 0:
        raise ConfigError("training.keep_last_checkpoints",
                          f"must be >= 0 (0 = all), got {t.keep_last_checkpoints}")
    if t.max_retries < 0:
        raise ConfigError("training.max_retries", f"must be >= 0, got {t.max_retries}")
    if not (t.learning_rate >= 0 and math.isfinite(t.learning_rate)):
        raise ConfigError("training.learning_rate", f"must be a finite number >= 0, got {t.learning_rate}")
    for i, name in enumerate(t.report_to):
        if name == "wandb":
            raise ConfigError(f"training.report_to[{i}]", "W&B is the run's own tracker (wandb=offline|online, "
                              "one W&B run with the global step as its axis); leave wandb out of training.report_to")


def check_insertion(cfg: ExperimentConfig) -> None:
    """The ``insertion`` rules: ``audit_workers >= 0``, ``audit_ngram`` in [1, ``training.sequence_length``],
    each experiment's own ``validate(key)``, and ``withheld`` naming experiments.

    :raises ConfigError: naming the key.
    """
    if cfg.insertion.audit_workers < 0:
        raise ConfigError("insertion.audit_workers", f"must be >= 0 (0: every core this process may use), got "
                          f"{cfg.insertion.audit_workers}")
    L = cfg.training.sequence_length
    if not 1 <= cfg.insertion.audit_ngram <= L:
        raise ConfigError("insertion.audit_ngram", f"must be in [1, training.sequence_length = {L}] "
                          f"tokens, got {cfg.insertion.audit_ngram}")
    for name, exp in cfg.insertion.experiments.items():
        exp.validate(f"insertion.experiments.{name}")
    for i, name in enumerate(cfg.insertion.withheld):
        if name not in cfg.insertion.experiments:
            raise ConfigError(f"insertion.withheld[{i}]", f"{name!r} is not an insertion experiment; "
                              f"allowed: {sorted(cfg.insertion.experiments)}")


def check_eval(cfg: ExperimentConfig) -> None:
    """The ``eval`` rules: each task's own ``validate(key)``, ``batch_size > 0``, a known ``async_launcher``,
    ``permutations >= 1``, a known ``p_adjust``, ``async_pending_wait_s >= 0``.

    :raises ConfigError: naming the key.
    """
    for name, task in cfg.eval.tasks.items():
        task.validate(f"eval.tasks.{name}")
    if cfg.eval.batch_size <= 0:
        raise ConfigError("eval.batch_size", f"must be > 0, got {cfg.eval.batch_size}")
    if cfg.eval.async_launcher not in ("auto", "local", "slurm"):
        raise ConfigError("eval.async_launcher", f"must be one of auto, local, slurm; got {cfg.eval.async_launcher!r}")
    if cfg.eval.permutations < 1:
        raise ConfigError("eval.permutations", f"must be >= 1, got {cfg.eval.permutations}")
    if cfg.eval.p_adjust not in ADJUST_METHODS:
        raise ConfigError("eval.p_adjust", f"must be one of {', '.join(ADJUST_METHODS)}; got {cfg.eval.p_adjust!r}")
    if not cfg.eval.async_pending_wait_s >= 0:
        raise ConfigError("eval.async_pending_wait_s", f"must be >= 0 seconds, got {cfg.eval.async_pending_wait_s}")


def check_plugins(cfg: ExperimentConfig, framework: type) -> None:
    """The rules between plugins, and between a plugin and the run's settings it must support; the only place
    that reads two plugins at once. Each plugin declares what it can in one way, its class's
    :class:`~pretrain_exp.core.capabilities.Capabilities` (a framework's on its
    :class:`~pretrain_exp.frameworks.base.Framework` subclass, an insertion type's and an eval's on its schema),
    read here with :func:`~pretrain_exp.core.capabilities.has`; an eval's rules against the insertion experiments
    are its schema's :meth:`~pretrain_exp.evals.base.EvalTaskConf.check_experiments`.

    :param framework: the class of ``cfg.framework.name``; ``cfg`` as :func:`derive` returns it (experiments, tasks
        and ``insertion.dynamic`` parsed).
    :raises ConfigError: naming the dotted key of the first violated rule.
    """
    name, t = cfg.framework.name, cfg.training
    if cfg.model.init == "random" and not has(framework, SUPPORTS_RANDOM_INIT):
        raise ConfigError("model.init", f"framework {name!r} continues checkpoints only; "
                          "pretrain from scratch with framework=olmo_core or framework=hf")
    if cfg.model.revision is not None and (cfg.model.path is None or not has(framework, LOADS_HUB_MODELS)):
        raise ConfigError("model.revision", f"{cfg.model.revision!r}: a revision selects the version of a Hub model "
                          "id given as model.path, which only the hf framework loads")
    for i, logger in enumerate(t.report_to):
        if logger not in framework.report_to:
            allowed = (f"allowed: {sorted(framework.report_to)}" if framework.report_to else
                       f"it logs to {RunDir.METRICS} and W&B only; set training.report_to=none")
            raise ConfigError(f"training.report_to[{i}]", f"{logger!r} is not a logger of framework {name!r}; "
                              f"{allowed}")
    if t.precision == Precision.fp8 and not has(framework, TRAINS_FP8):
        raise ConfigError("training.precision", f"fp8 is OLMo-core's float8 training (framework=olmo_core or "
                          f"framework=olmo2); framework {name!r} trains in auto, bf16 or fp32")
    if t.checkpoint_async and not has(framework, SAVES_ASYNC):
        raise ConfigError("training.checkpoint_async", f"framework {name!r} saves checkpoints "
                          "synchronously (its engine has no asynchronous save); set it to null or false")
    # the schema's default is a scheduler of every framework (tests/unit/frameworks/test_registry.py); the hf
    # framework's list is transformers' SchedulerType, whose import (2 s) a run refused or only submitted never needs
    if (cfg.framework.may_use_run_lr_schedule() and t.lr_scheduler != TrainingConf.lr_scheduler
            and t.lr_scheduler not in framework.lr_schedulers):
        raise ConfigError("training.lr_scheduler", f"unknown scheduler {t.lr_scheduler!r} for framework "
                          f"{name!r}; allowed: {sorted(framework.lr_schedulers)}")
    experiments = cfg.insertion.experiments
    noised = sorted(n for n, e in experiments.items()
                    if has(e, EMBEDDING_NOISE) and n not in cfg.insertion.withheld)
    if noised and not has(framework, APPLIES_EMBEDDING_NOISE):
        raise ConfigError("framework.name", f"{name!r} does not apply the gaussian noise of {noised}")
    for task_name, task in cfg.eval.tasks.items():
        task.check_experiments(f"eval.tasks.{task_name}", experiments)
    if cfg.cpdt.experiments:
        validate_cpdt(cfg)
    if cfg.insertion.dynamic is not None:  # parsed by derive()
        if not has(framework, READS_PLAN_PER_SEGMENT):
            raise ConfigError("insertion.dynamic", f"framework {name!r} fixes the plan for the "
                              "whole run; it cannot train spans added between segments")
        if cfg.cpdt.experiments or cfg.insertion.withheld:
            raise ConfigError("insertion.dynamic", "not combined with cpdt.* or insertion.withheld")
        if cfg.eval.mode == EvalMode["async"]:
            raise ConfigError("eval.mode", "async evals finish after the next segment has started, but "
                              "insertion.dynamic decides each segment from the evals of the one before; use "
                              "eval.mode=inline or eval.mode=distributed")
    if cfg.release.push_to_hub:
        validate_release(cfg, framework)


def fp8_refusal(capability: Optional[Tuple[int, int]], torchao_error: Optional[str] = None,
                torch_version: str = "") -> Optional[str]:
    """Why ``training.precision=fp8`` cannot train on a machine whose CUDA device has compute capability
    ``capability`` (``(major, minor)``; ``None``: no CUDA device) and where ``import torchao.float8`` failed with
    ``torchao_error`` (``None``: it imports), or ``None`` if it can. Checked in this order: a CUDA device, its
    capability (>= :data:`FP8_MIN_CAPABILITY`), torchao (:data:`FP8_TORCHAO`)."""
    if capability is None:
        return ("fp8 needs a CUDA GPU with float8 tensor cores (compute capability >= 8.9: H100, H200, L4, L40S, "
                "B200, ...) and this machine has no CUDA device; use training.precision=bf16 or fp32")
    if tuple(capability) < FP8_MIN_CAPABILITY:
        return (f"fp8 needs a GPU of compute capability >= 8.9 (float8 tensor cores: Ada, Hopper, Blackwell) and "
                f"this one is {capability[0]}.{capability[1]}; use training.precision=bf16")
    if torchao_error is not None:
        return (f"fp8 trains with OLMo-core's float8 support, which needs the torchao package, and "
                f"'import torchao.float8' fails here ({torchao_error}); install {FP8_TORCHAO}"
                f"{f' (torch here: {torch_version})' if torch_version else ''}")
    return None


def validate_release(cfg: ExperimentConfig, framework: type) -> None:
    """Check ``release.*`` for a run that pushes itself at its end (whether the Hub can be reached and a token is
    set is checked when the run starts, :meth:`Experiment.run <pretrain_exp.app.experiment.Experiment.run>`).

    :raises ConfigError: naming ``release.repo_id``, ``training.cleanup`` or ``training.export_hf``.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    r, t = cfg.release, cfg.training
    if not r.repo_id:
        raise ConfigError("release.repo_id", "release.push_to_hub=true needs the Hub repo, e.g. "
                          "release.repo_id=<org>/<name>")
    try:
        validate_repo_id(r.repo_id)
    except HFValidationError as e:
        raise ConfigError("release.repo_id", f"{r.repo_id!r} is not a Hub repo id ({e})") from None
    if t.cleanup == Cleanup.all:
        raise ConfigError("training.cleanup", "'all' deletes the run dir the release is built from; use bulky or "
                          "none with release.push_to_hub=true")
    if not has(framework, CHECKPOINTS_ARE_HF) and t.export_hf == ExportHF.none:
        raise ConfigError("training.export_hf", "none keeps no HF model of the final step to release; use final or "
                          "every with release.push_to_hub=true")


def validate_cpdt(cfg: ExperimentConfig) -> None:
    """Check ``cpdt.*`` (dependence testing, :mod:`pretrain_exp.app.cpdt`) against the rest of the config.

    :raises ConfigError: for an experiment that is not an insertion experiment, fewer than 2 experiments or
        seeds, repeated names or seeds, an experiment without dup-0 controls and inserted items, no effect
        definition or no eval of its effect (:func:`pretrain_exp.report.cpdt.effect_task`), ``insertion.withheld``
        set by hand, ``training.cleanup=all``, ``cpdt.alpha`` outside ``(0, 1)`` or ``cpdt.margin <= 0``.
        Seeds too few for the sign-flip test to reach ``cpdt.alpha`` (:func:`pretrain_exp.report.cpdt.seeds_warning`)
        are a logged warning, not an error.
    """
    from pretrain_exp.report.cpdt import effect_task, seeds_warning

    c = cfg.cpdt
    for i, name in enumerate(c.experiments):
        if name not in cfg.insertion.experiments:
            raise ConfigError(f"cpdt.experiments[{i}]", f"{name!r} is not an insertion experiment; allowed: "
                              f"{sorted(cfg.insertion.experiments)}")
    if len(set(c.experiments)) != len(c.experiments):
        raise ConfigError("cpdt.experiments", f"names repeat: {list(c.experiments)}")
    if len(c.experiments) < 2:
        raise ConfigError("cpdt.experiments", f"dependence testing needs >= 2 experiments, got {list(c.experiments)}")
    if len(c.seeds) < 2:
        raise ConfigError("cpdt.seeds", f"the permutation test across seeds needs >= 2 seeds, got {list(c.seeds)}")
    if len(set(c.seeds)) != len(c.seeds):
        raise ConfigError("cpdt.seeds", f"seeds repeat: {list(c.seeds)}")
    if c.permutations < 1:
        raise ConfigError("cpdt.permutations", f"must be >= 1, got {c.permutations}")
    if not 0 < c.alpha < 1:
        raise ConfigError("cpdt.alpha", f"must be in (0, 1), got {c.alpha}")
    if c.margin is not None and not c.margin > 0:
        raise ConfigError("cpdt.margin", f"an equivalence margin must be > 0 (in the effects' units), got {c.margin}; "
                          "null declares none")
    if cfg.insertion.withheld:
        raise ConfigError("insertion.withheld", "set by the CPDT arms themselves; leave it empty with cpdt.*")
    if cfg.training.cleanup.value == "all":
        raise ConfigError("training.cleanup", "'all' deletes the arms' run dirs, which the CPDT table is read from; "
                          "use none or bulky")
    tasks = {name: dataclasses.asdict(t) for name, t in cfg.eval.tasks.items()}
    tests = 0  # experiment x inserted dup count rows of the table (a fractional count gives its floor and ceiling)
    for name in c.experiments:
        exp = cfg.insertion.experiments[name]
        reps = list(exp.repetitions) if not isinstance(exp.repetitions, (int, float)) else [exp.repetitions]
        if not (0 in reps and any(r > 0 for r in reps)) and not any(0 < r < 1 for r in reps):
            raise ConfigError(f"insertion.experiments.{name}.repetitions", f"a cpdt experiment needs dup-0 "
                              f"controls and inserted items (e.g. [0, 4]), got {reps}")
        effect_task(name, exp.type, tasks)
        tests += len({d for r in reps for d in (math.floor(r), math.ceil(r)) if d > 0})
    warning = seeds_warning(len(c.seeds), c.alpha, max(1, tests))
    if warning:
        log.warning("cpdt.seeds: %s", warning)


def report_to_list(value) -> list:
    """``training.report_to`` (a name, a comma-separated string or a list; ``none`` or empty: no logger) as a list
    of logger names.

    :raises ConfigError: for a value that is neither a string nor a list of strings.
    """
    if value is None:
        return []
    names = value.split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(n, str) for n in names):
        raise ConfigError("training.report_to", f"must be a logger name or a list of them, got {value!r}")
    names = [n.strip() for n in names if n.strip()]
    return [] if names in ([], ["none"]) else names


def to_config(cfg: DictConfig, overrides: Optional[Sequence[str]] = None, check: bool = True) -> ExperimentConfig:
    """Convert a composed (or loaded ``config.resolved.yaml``) config into a validated :class:`ExperimentConfig`.

    :param overrides: the command line's overrides of a composed config (Hydra's task overrides): a continued run
        (``parent=``) then takes what the command line does not set from its parent
        (:func:`~pretrain_exp.app.parent.with_parent`); ``None`` for a config that holds the result already.
    :param check: run the rules of :func:`validate` (``False``: the schemas' types and keys only, for a config a
        run validated when it recorded it).
    :raises ConfigError: for a missing mandatory value, a wrong type or a violated cross-field rule.
    """
    from pretrain_exp.app.parent import with_parent
    from pretrain_exp.frameworks.registry import typed_node as typed_framework
    from pretrain_exp.insertion.types import typed_node

    try:
        if overrides is not None and OmegaConf.is_config(cfg):
            cfg = with_parent(cfg, overrides)
        if not OmegaConf.is_config(cfg) or OmegaConf.get_type(cfg) is not ExperimentConfig:
            raw = cfg if OmegaConf.is_config(cfg) else OmegaConf.create(cfg)
            base = OmegaConf.structured(ExperimentConfig)
            if isinstance(raw, DictConfig) and "framework" in raw and _has_name(raw.framework):
                base.framework = typed_framework("framework", raw.framework)  # the named framework's fields
            cfg = OmegaConf.merge(base, raw)
        if _has_name(cfg.framework):  # the framework's own schema, chosen by framework.name (unset: reported below)
            framework = typed_framework("framework", cfg.framework)
            if framework is not cfg.framework:
                cfg.framework = framework
        for name, node in cfg.insertion.experiments.items():  # each experiment in its type's schema
            typed = typed_node(f"insertion.experiments.{name}", node)
            if typed is not node:
                cfg.insertion.experiments[name] = typed
        extra = unknown_keys(cfg)
        if extra:
            key, schema = extra[0]
            from pretrain_exp.app.hydra_errors import did_you_mean

            fields = [f.name for f in dataclasses.fields(schema)]
            parent, _, name = key.rpartition(".")
            raise ConfigError(key, f"unknown key: {schema.__name__} has no field {name!r}"
                              + did_you_mean(name, fields, f"{parent}." if parent else "")
                              + f" (fields: {', '.join(fields)})")
        exp = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        cause = project_error(e)  # raised by a ${checkpoint:...} or ${parent:...}
        if cause is not None:
            raise cause from None
        key = getattr(e, "full_key", None) or "config"
        msg = str(e).splitlines()[0]
        if "Missing mandatory value" in msg:
            msg = f"missing mandatory value (set {key}=...)"
        raise ConfigError(key, msg) from None
    assert isinstance(exp, ExperimentConfig)
    exp = derive(exp)
    if check:
        exp = validate(exp)
    log_overrides(exp)
    return exp


def unknown_keys(node, prefix: str = "") -> list:
    """Keys of ``node`` (a composed ``DictConfig``, walked without resolving) that its structured-config schema
    lacks: ``[(dotted key, schema dataclass), ...]`` in document order.

    Hydra's ``+key=value`` adds a key to any node (it opens the struct flag), and ``OmegaConf.to_object`` would set
    such a key as a stray attribute of the dataclass, i.e. drop it; this finds them so they can be refused. Nodes
    without a dataclass schema (``Dict[str, Any]`` fields such as ``eval.tasks``) accept any key; their values are
    walked.
    """
    out: list = []
    if isinstance(node, DictConfig):
        if node._is_none() or node._is_missing() or node._is_interpolation():
            return out
        schema = OmegaConf.get_type(node)
        fields = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
        for k in node.keys():
            key = f"{prefix}{k}"
            if fields is not None and k not in fields:
                out.append((key, schema))
            out += unknown_keys(node._get_node(k), key + ".")
    elif isinstance(node, ListConfig) and not (node._is_none() or node._is_missing() or node._is_interpolation()):
        for i in range(len(node)):
            out += unknown_keys(node._get_node(i), f"{prefix.rstrip('.')}[{i}].")
    return out


def _has_name(node) -> bool:
    return isinstance(node, DictConfig) and "name" in node and not OmegaConf.is_missing(node, "name")


def load_resolved(path: str, check: bool = True) -> ExperimentConfig:
    """Load a ``config.resolved.yaml`` written by a run (no Hydra needed) into a validated config.

    :param check: as :func:`to_config`: ``False`` for a reader of a finished run (the inspector), which then
        imports no framework's engine (the ``hf`` framework's scheduler names come from ``transformers``).
    :raises ConfigError: as :func:`to_config`.
    """
    return to_config(OmegaConf.load(path), check=check)

"""The root config of a run (:class:`ExperimentConfig`), its registration in Hydra's ConfigStore, and loading.

The YAML options in ``conf/<group>/`` extend the group schemas (:mod:`pretrain_exp.core.config`,
:mod:`pretrain_exp.insertion.types`, each framework's and each eval's schema), so Hydra rejects a typo'd key or
a wrong type while composing. :func:`pretrain_exp.app.validate.to_config` converts the composed ``DictConfig``
once into an :class:`ExperimentConfig` and checks the rules that span groups and plugins. Every error names the
dotted key, the bad value and what is allowed (:class:`~pretrain_exp.core.errors.ConfigError`).

Importing this module loads neither a framework nor transformers (a guard test holds it): plugins are looked up
by name when the config is validated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import MISSING

from pretrain_exp.core.config import DataConf, EvalConf, FrameworkConf, ModelConf, ReleaseConf, TrainingConf, WandbConf
from pretrain_exp.insertion.schema import InsertionConf


@dataclass
class CpdtConf:
    """Continual pretraining dependence testing (``experiment=cpdt_demo``; :mod:`pretrain_exp.app.cpdt`)."""

    experiments: List[str] = field(default_factory=list)  #: the K tested insertion experiments (empty: off)
    seeds: List[int] = field(default_factory=list)  #: one together arm and K alone arms per seed
    permutations: int = 10000  #: sign-flip samples when the 2**len(seeds) exact enumeration is larger
    #: level of the sign-flip test, of the equivalence test and of the table's verdicts; a warning is logged when
    #: the seeds cannot reach it (the smallest sign-flip p over S seeds is 2 / 2**S: S >= 6 at 0.05)
    alpha: float = 0.05
    #: equivalence margin in the effects' units (nats/token for loss gaps, acc for benchmarks), declared before the
    #: run: "no interaction" is concluded only when a TOST over seeds puts the absolute interaction below it; None:
    #: no such claim
    margin: Optional[float] = None


@dataclass
class ExperimentConfig:
    """The whole run (root of the composed config)."""

    framework: FrameworkConf = field(default_factory=FrameworkConf)  #: the framework's own schema when composed
    model: ModelConf = field(default_factory=ModelConf)
    data: DataConf = field(default_factory=DataConf)
    insertion: InsertionConf = field(default_factory=InsertionConf)
    eval: EvalConf = field(default_factory=EvalConf)
    training: TrainingConf = field(default_factory=TrainingConf)
    wandb: WandbConf = field(default_factory=WandbConf)
    release: ReleaseConf = field(default_factory=ReleaseConf)
    name: str = "default"  #: experiment name (presets set their own); part of ``run_name``
    seed: int = 0
    run_name: str = MISSING
    run_dir: Optional[str] = MISSING  #: the experiment directory (Hydra's output dir; None only in --cfg)
    cache_dir: str = MISSING  #: asset and token-file cache
    cpdt: CpdtConf = field(default_factory=CpdtConf)
    #: a finished run dir this run continues from its final model (:mod:`pretrain_exp.app.parent`); the
    #: validated config holds its absolute path
    parent: Optional[str] = None
    #: the console shows everything the run dir's ``pretrain_exp.log`` gets (the engines' INFO records, warnings,
    #: progress bars); ``-v`` sets it (:mod:`pretrain_exp.core.logs`)
    verbose: bool = False
    #: components of one's own for the segment loop, by import path (``"package.module:Class"``, a
    #: :class:`~pretrain_exp.app.hooks.RunHook` subclass built with the prepared run); not part of what is trained
    hooks: List[str] = field(default_factory=list)


EVAL_TASK_RESOLVER = "eval_task"


def eval_task(eval_type: str, *, _root_) -> Optional[str]:
    """The value of ``${eval_task:<type>}``: the name of the first ``eval.tasks`` entry of type ``eval_type``, or
    ``None`` if there is none (``insertion.dynamic.task`` in ``conf/insertion/dynamic/``, so that ``--cfg job
    --resolve`` shows the task the run reads)."""
    tasks = _root_.eval.tasks if "eval" in _root_ and "tasks" in _root_.eval else {}
    return next((str(name) for name, node in tasks.items()
                 if hasattr(node, "get") and node.get("type") == eval_type), None)


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore: ``base_config``, ``schema/<group>/base``, ``schema/framework/<name>``,
    ``schema/insertion/<type>`` and ``schema/eval/<type>``; register the resolvers (``${checkpoint:...}``,
    ``${eval_task:...}``, ``${parent:...}``, the run name's).

    Idempotent; called by the entry point and by tests before composing.
    """
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from pretrain_exp.app.help import register_help_resolver
    from pretrain_exp.app.parent import register_resolver as register_parent_resolver
    from pretrain_exp.app.run_name import register_run_name_resolver
    from pretrain_exp.app.settings import register_resolver
    from pretrain_exp.evals.registry import register_eval_schemas
    from pretrain_exp.frameworks.registry import register_framework_schemas
    from pretrain_exp.insertion.types import register_insertion_schemas

    register_resolver()
    register_help_resolver()
    register_run_name_resolver()
    register_parent_resolver()
    if not OmegaConf.has_resolver(EVAL_TASK_RESOLVER):
        OmegaConf.register_new_resolver(EVAL_TASK_RESOLVER, eval_task)
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=ExperimentConfig)
    for group, node in (
        ("framework", FrameworkConf),
        ("model", ModelConf),
        ("data", DataConf),
        ("training", TrainingConf),
        ("wandb", WandbConf),
    ):
        cs.store(group=f"schema/{group}", name="base", node=node)
    register_framework_schemas(cs)
    register_insertion_schemas(cs)
    register_eval_schemas(cs)

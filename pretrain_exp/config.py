"""Dataclass schemas of every config group, and their registration in Hydra's ConfigStore.

The YAML options in ``conf/<group>/`` extend these schemas (``defaults: [/schema/<group>/base@_here_]``), so
Hydra rejects a typo'd key or a wrong type while composing. :func:`to_config` converts the composed
``DictConfig`` once into an :class:`ExperimentConfig` (``OmegaConf.to_object``), which runs each
``__post_init__``; :meth:`ExperimentConfig.validate` then checks the cross-field rules. Every error names the
dotted key, the bad value and what is allowed (:class:`~pretrain_exp.errors.ConfigError`).

Units: token counts and positions are in tokens, ``global_batch_size`` and ``micro_batch_size`` in rows
(sequences of ``sequence_length`` tokens), steps are optimizer steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from omegaconf import II, MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pretrain_exp.errors import ConfigError


class InsertionType(str, Enum):
    """Where the items of an insertion experiment come from."""

    texts = "texts"  #: jsonl lines with a text under ``key`` (or a generator), tokenized with the model's tokenizer
    tokens = "tokens"  #: jsonl lines holding a list of token ids (under ``key``, or the line itself)
    benchmark = "benchmark"  #: multiple-choice questions of a benchmark asset as texts (``benchmark``, ``format``)
    gaussian = "gaussian"  #: seeded Gaussian noise on the input embeddings of whole rows (``sigma``; no tokens)
    knowledge = "knowledge"  #: generated fictional facts as texts (``num_items`` facts, ``repeat``, ``paraphrases``)
    corpus_chunks = "corpus_chunks"  #: token chunks of never-trained rows of the run's own corpus (i.i.d. control)


class KnowledgeRepeat(str, Enum):
    """How a ``knowledge`` fact with dup count ``d`` is inserted (see :mod:`pretrain_exp.insertion.knowledge`)."""

    identical = "identical"  #: the same sentence ``d`` times
    paraphrase = "paraphrase"  #: ``d`` sentences cycling through the fact's ``paraphrases`` training templates


class PlacementKind(str, Enum):
    """How insertion positions are chosen (see :mod:`pretrain_exp.insertion.placement`)."""

    random = "random"  #: uniform over the training window, never crossing a row boundary
    range = "range"  #: uniform over ``[start, end)`` of the window (fractions or token positions)
    explicit = "explicit"  #: global token positions read from each item's ``position_key``


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


class Precision(str, Enum):
    """Training precision: ``bf16`` autocast, ``fp32``, or ``auto`` (bf16 where the device supports it)."""

    auto = "auto"
    bf16 = "bf16"
    fp32 = "fp32"


class WandbMode(str, Enum):
    """W&B mode: ``offline`` writes a local run (``wandb sync`` uploads it later)."""

    offline = "offline"
    online = "online"
    disabled = "disabled"


class Cleanup(str, Enum):
    """What to delete from the run dir after a successful run."""

    none = "none"  #: keep everything
    bulky = "bulky"  #: delete checkpoints except the last one's weights, and optimizer states
    all = "all"  #: delete the whole run dir (results are in W&B only)


ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")


@dataclass
class FrameworkConf:
    """Training framework (``framework=`` option); see :mod:`frameworks`."""

    name: str = MISSING  #: registry name: ``hf``, ``olmo_core`` or ``olmo2`` (the last two need the ``olmo`` extra)
    attn_implementation: str = "sdpa"  #: HF attention kernel (``sdpa``, ``eager``, ``flash_attention_2``)
    lr_schedule: str = "run"  #: ``run``: ``training.*`` from the run's first step; ``checkpoint`` (olmo2): the
    #: checkpoint's own peak LR and schedule, at its position (``config.yaml`` ``optimizer``/``scheduler``)


@dataclass
class ModelConf:
    """The checkpoint to continue (``model=`` option)."""

    name: str = MISSING  #: short name used in run names
    asset: Optional[str] = None  #: registry asset (see ASSETS in :mod:`pretrain_exp.data.assets`)
    path: Optional[str] = None  #: local checkpoint dir in the framework's format (exclusive with ``asset``, ``url``)
    checkpoint_step: int = 0  #: step the checkpoint is at; training continues at positions from S*B*L
    dtype: str = "float32"  #: dtype the weights are loaded in (master weights)
    url: Optional[str] = None  #: base URL holding ``step<N>[-unsharded]/`` checkpoint folders (olmo_core, olmo2)
    tokenizer: Optional[str] = None  #: HF tokenizer dir or asset (e.g. ``dolma2``); default: the model dir's


@dataclass
class DataConf:
    """The training corpus and its order (``data=`` option).

    Either ``paths`` lists OLMo token files, or ``text`` names a text source (a registry asset such as
    ``shakespeare``, a folder of ``.txt`` files, or a ``.jsonl`` file with ``text_key``) that is tokenized with
    the model's tokenizer into token files under ``token_dir``.
    """

    name: str = MISSING
    text: Optional[str] = None
    text_key: str = "text"
    paths: List[str] = field(default_factory=list)
    token_dir: str = II("cache_dir") + "/tokens"  # type: ignore[assignment]
    seed: int = II("seed")  # type: ignore[assignment]  #: data-order seed (PCG64(seed + epoch))
    first_epoch: int = 1  #: 1 = OLMo-core's count (OLMo-2 counts from 0: OLMo-2 seed S = OLMo-core seed S-1)
    held_out_rows: int = 16  #: rows at the end of the first epoch's order, never trained, for perplexity


@dataclass
class PlacementConf:
    """Placement of one insertion experiment (see :class:`PlacementKind`)."""

    kind: PlacementKind = PlacementKind.random
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
    """One named insertion experiment: items, how often each is inserted, and where."""

    type: InsertionType = MISSING
    file: Optional[str] = None  #: jsonl file of items (exclusive with ``generator``)
    key: Optional[str] = None  #: jsonl key of the text / token list (default ``text``; ``tokens``: the line itself)
    generator: Optional[str] = None  #: built-in item generator (``texts`` only), e.g. ``fictional_bios``
    num_items: Optional[int] = None  #: items to generate, the first N items of ``file`` or of a shuffled benchmark
    repetitions: Any = 1  #: dup count: int, float (fractional, see docs) or a list of dup counts per item group
    eos: EosPolicy = EosPolicy.wrap
    placement: PlacementConf = field(default_factory=PlacementConf)
    benchmark: Optional[str] = None  #: ``type=benchmark``: arc_easy, arc_challenge, sciq, piqa, mmlu, mmlu_<subject>
    format: str = "cloze"  #: ``type=benchmark``: ``cloze`` (question + answer text) or ``lettered`` (A/B/C/D)
    sigma: Optional[float] = None  #: ``type=gaussian``: std of the noise per embedding coordinate (> 0)
    repeat: Optional[KnowledgeRepeat] = None  #: ``type=knowledge``: ``identical`` (default) or ``paraphrase``
    paraphrases: Optional[int] = None  #: ``type=knowledge``: training templates per fact in use (default: all)
    chunk_tokens: int = 64  #: ``type=corpus_chunks``: tokens per item (the start of one never-trained row)


@dataclass
class InsertionConf:
    """All insertion experiments of a run (``insertion=`` options add entries to ``experiments``)."""

    seed: int = II("seed")  # type: ignore[assignment]
    verify: bool = True  #: read every affected row back through the data path after planning
    experiments: Dict[str, InsertionExperimentConf] = field(default_factory=dict)
    withheld: List[str] = field(default_factory=list)  #: placed like the others but not inserted nor evaluated


@dataclass
class EvalConf:
    """Evaluations run on each segment's checkpoint (``eval=`` options add entries to ``tasks``)."""

    on_load: bool = False  #: also evaluate the initial checkpoint before training
    batch_size: int = 8  #: sequences per forward pass
    bootstrap_samples: int = 1000  #: resamples for the 95% CIs
    tasks: Dict[str, Any] = field(default_factory=dict)  #: name -> eval config (schema per eval type)


@dataclass
class TrainingConf:
    """Optimization and the segment loop (``training=`` option)."""

    num_steps: int = MISSING  #: optimizer steps to train (0 = evaluate only)
    sequence_length: int = MISSING  #: L, tokens per row
    global_batch_size: int = MISSING  #: B, rows per optimizer step
    micro_batch_size: int = MISSING  #: rows per forward pass per device (grad accumulation = B / (micro*world))
    checkpoint_interval: int = MISSING  #: steps per segment: save + evaluate after each
    learning_rate: float = 1e-4
    lr_scheduler: str = "cosine"  #: a transformers ``SchedulerType`` name
    warmup_steps: int = 0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    max_grad_norm: float = 1.0
    precision: Precision = Precision.auto
    num_threads: int = 0  #: torch intra-op threads (0 = torch's default)
    max_retries: int = 2  #: retries of a failed training segment (exponential backoff with jitter)
    retry_base_delay_s: float = 5.0
    nproc_per_node: int = 1  #: processes per node (torchrun) for frameworks that support it
    keep_last_checkpoints: int = 1  #: checkpoints kept in the run dir (0 = all, e.g. for checkpoint sweeps)
    cleanup: Cleanup = Cleanup.none
    log_rows: bool = False  #: olmo_core/olmo2: write ``rows/rank<r>.jsonl`` (rows and token sha256 trained per step)


@dataclass
class WandbConf:
    """W&B tracking (``wandb=`` option); ``offline`` unless ``mode=online`` and a key is configured."""

    mode: WandbMode = WandbMode.offline
    project: str = "pretrain_exp"
    entity: Optional[str] = None
    name: str = II("run_name")  # type: ignore[assignment]
    resume_id: Optional[str] = None  #: attach to an existing W&B run by id (``resume="must"``)
    add_step_to_name: bool = False  #: append ``-step<checkpoint_step>`` to the run name


@dataclass
class CpdtConf:
    """Continual pretraining dependence testing (``experiment=cpdt_demo``; :mod:`pretrain_exp.cpdt`)."""

    experiments: List[str] = field(default_factory=list)  #: the K tested insertion experiments (empty: off)
    seeds: List[int] = field(default_factory=list)  #: one together arm and K alone arms per seed
    permutations: int = 10000  #: sign-flip samples when the 2**len(seeds) exact enumeration is larger


@dataclass
class ExperimentConfig:
    """The whole run (root of the composed config)."""

    framework: FrameworkConf = field(default_factory=FrameworkConf)
    model: ModelConf = field(default_factory=ModelConf)
    data: DataConf = field(default_factory=DataConf)
    insertion: InsertionConf = field(default_factory=InsertionConf)
    eval: EvalConf = field(default_factory=EvalConf)
    training: TrainingConf = field(default_factory=TrainingConf)
    wandb: WandbConf = field(default_factory=WandbConf)
    name: str = "default"  #: experiment name (presets set their own); part of ``run_name``
    seed: int = 0
    run_name: str = MISSING
    run_dir: str = MISSING  #: the experiment directory (Hydra's output dir)
    cache_dir: str = MISSING  #: asset and token-file cache
    cpdt: CpdtConf = field(default_factory=CpdtConf)

    def validate(self) -> "ExperimentConfig":
        """Check cross-field rules; return ``self``.

        :raises ConfigError: naming the dotted key of the first violated rule.
        """
        from evals.registry import parse_task_configs
        from frameworks.registry import get_framework_class
        from pretrain_exp.insertion.sources import validate_experiment

        get_framework_class(self.framework.name)  # raises ConfigError listing the frameworks
        if sum(x is not None for x in (self.model.asset, self.model.path, self.model.url)) != 1:
            raise ConfigError("model", "set exactly one of model.asset, model.path and model.url")
        if self.model.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError("model.dtype", f"unknown dtype {self.model.dtype!r}; allowed: float32, bfloat16, float16")
        if self.framework.lr_schedule not in ("run", "checkpoint") or (
                self.framework.lr_schedule == "checkpoint" and self.framework.name != "olmo2"):
            raise ConfigError("framework.lr_schedule", f"{self.framework.lr_schedule!r} with framework "
                              f"{self.framework.name!r}; allowed: 'run', and 'checkpoint' with framework=olmo2")
        if self.framework.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ConfigError("framework.attn_implementation", f"unknown {self.framework.attn_implementation!r}; "
                              f"allowed: {list(ATTN_IMPLEMENTATIONS)}")
        if self.model.checkpoint_step < 0:
            raise ConfigError("model.checkpoint_step", f"must be >= 0, got {self.model.checkpoint_step}")
        if not self.data.paths and not self.data.text:
            raise ConfigError("data", "set data.paths (token files) or data.text (a text source to tokenize)")
        if self.data.held_out_rows < 0:
            raise ConfigError("data.held_out_rows", f"must be >= 0, got {self.data.held_out_rows}")
        t = self.training
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
        from transformers import SchedulerType

        allowed = sorted(s.value for s in SchedulerType)
        if t.lr_scheduler not in allowed:
            raise ConfigError("training.lr_scheduler", f"unknown scheduler {t.lr_scheduler!r}; allowed: {allowed}")
        for name, exp in self.insertion.experiments.items():
            validate_experiment(f"insertion.experiments.{name}", exp)
        for i, name in enumerate(self.insertion.withheld):
            if name not in self.insertion.experiments:
                raise ConfigError(f"insertion.withheld[{i}]", f"{name!r} is not an insertion experiment; "
                                  f"allowed: {sorted(self.insertion.experiments)}")
        self.eval.tasks = parse_task_configs(self.eval.tasks)
        from evals.knowledge import check_experiments

        for name, task in self.eval.tasks.items():
            if task.type == "knowledge":
                check_experiments(f"eval.tasks.{name}", task, self.insertion.experiments)
        if self.cpdt.experiments:
            from pretrain_exp.cpdt import validate_cpdt

            validate_cpdt(self)
        if self.eval.batch_size <= 0:
            raise ConfigError("eval.batch_size", f"must be > 0, got {self.eval.batch_size}")
        return self


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore: ``base_config`` and ``schema/<group>/base``.

    Idempotent; called by the entry point and by tests before composing.
    """
    from hydra.core.config_store import ConfigStore

    from evals.registry import register_eval_schemas

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=ExperimentConfig)
    for group, node in (
        ("framework", FrameworkConf),
        ("model", ModelConf),
        ("data", DataConf),
        ("insertion", InsertionExperimentConf),
        ("training", TrainingConf),
        ("wandb", WandbConf),
    ):
        cs.store(group=f"schema/{group}", name="base", node=node)
    register_eval_schemas(cs)


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
    return exp.validate()


def load_resolved(path: str) -> ExperimentConfig:
    """Load a ``config.resolved.yaml`` written by a run (no Hydra needed) into a validated config.

    :raises ConfigError: as :func:`to_config`.
    """
    return to_config(OmegaConf.load(path))

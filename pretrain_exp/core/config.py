"""The run's settings that every layer reads: framework, model, data, training, eval and W&B schemas.

These are Hydra structured-config schemas (plain dataclasses); the app's root config
(:class:`pretrain_exp.app.config.ExperimentConfig`) holds one of each, and each YAML option of a group extends
its schema (``defaults: [/schema/<group>/base@_here_]``), so Hydra rejects a typo'd key or a wrong type while
composing. Rules about one field are checked in ``__post_init__``-free validators of the app
(:mod:`pretrain_exp.app.validate`). Plugins type the whole run as :class:`RunConfig` and never import the app.

Units: token counts and positions are in tokens, ``global_batch_size`` and ``micro_batch_size`` in rows
(sequences of ``sequence_length`` tokens), steps are optimizer steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol

from omegaconf import II, MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.errors import ConfigError


class Precision(str, Enum):
    """Training precision: ``bf16`` autocast, ``fp32``, ``auto`` (bf16 where the device supports it), or ``fp8``
    (olmo_core/olmo2 only: bf16 autocast plus OLMo-core's float8 training of the linear layers through torchao;
    a CUDA GPU of compute capability 8.9 or higher)."""

    auto = "auto"
    bf16 = "bf16"
    fp32 = "fp32"
    fp8 = "fp8"


class WandbMode(str, Enum):
    """W&B mode: ``offline`` writes a local run (``wandb sync`` uploads it later)."""

    offline = "offline"
    online = "online"
    disabled = "disabled"


class ExportHF(str, Enum):
    """Which checkpoints of a run are kept as HF model dirs (``<run dir>/hf/step<N>/``; ``hf``: only ``every``)."""

    none = "none"  #: none (the evals still read a temporary export of every segment's checkpoint)
    final = "final"  #: the last segment's checkpoint
    every = "every"  #: every segment's checkpoint


#: Where a segment's evals run (``eval.mode``): ``inline`` on rank 0 while the other ranks wait; ``distributed`` on
#: every rank of the training job, each scoring a shard of the batches, rank 0 merging (the same numbers as
#: ``inline``); ``async`` in a separate process or SLURM job that reads the segment's HF export while training
#: goes on. (A functional enum: ``async`` is a Python keyword; ``EvalMode["async"]``.)
EvalMode = Enum("EvalMode", [("inline", "inline"), ("distributed", "distributed"), ("async", "async")], type=str,
                module=__name__)


class Cleanup(str, Enum):
    """What to delete from the run dir after a successful run."""

    none = "none"  #: keep everything
    bulky = "bulky"  #: delete checkpoints except the last one's weights, and optimizer states
    all = "all"  #: delete the whole run dir (results are in W&B only)


@dataclass
class FrameworkConf:
    """Training framework (``framework=`` option): the fields every framework reads. Each framework extends it with
    its own schema (``frameworks/<name>/config.py``, registered in :data:`pretrain_exp.frameworks.registry.SCHEMAS`),
    which ``conf/framework/<name>.yaml`` extends, so a field of another framework is refused while composing."""

    name: str = MISSING  #: registry name: ``hf``, ``olmo_core`` or ``olmo2`` (the last two need the ``olmo`` extra)

    def validate(self, key: str = "framework") -> None:
        """The framework's one-schema checks (none here).

        :raises ConfigError: naming the dotted key under ``key``.
        """

    def checkpoint_keys(self) -> tuple:
        """Dotted config keys this framework takes from the checkpoint by default (``${checkpoint:<key>}`` in its
        YAML); a run value that differs is an override, logged by the app. None here."""
        return ()

    def uses_run_lr_schedule(self) -> bool:
        """Whether ``training.*`` sets the LR schedule (``training.lr_scheduler`` must be one the framework
        supports); False where the framework continues the checkpoint's own schedule."""
        return True

    def may_use_run_lr_schedule(self) -> bool:
        """Whether ``training.lr_scheduler`` may set the schedule (checked when the config is validated): where
        :meth:`uses_run_lr_schedule`, or where the framework falls back to it for a checkpoint without one."""
        return self.uses_run_lr_schedule()


@dataclass
class ModelConf:
    """The checkpoint to continue (``model=`` option)."""

    name: str = MISSING  #: short name used in run names
    asset: Optional[str] = None  #: registry asset (see ASSETS in :mod:`pretrain_exp.data.assets`)
    path: Optional[str] = None  #: local checkpoint dir in the framework's format, or (``hf``) a Hub model id
    #: (exclusive with ``asset``, ``url``)
    revision: Optional[str] = None  #: Hub branch, tag or commit of a Hub id ``path`` (default: ``main``)
    checkpoint_step: int = 0  #: step the checkpoint is at; training continues at positions from S*B*L
    dtype: str = "float32"  #: dtype the weights are loaded in (master weights)
    url: Optional[str] = None  #: base URL holding ``step<N>[-unsharded]/`` checkpoint folders (olmo_core, olmo2)
    tokenizer: Optional[str] = None  #: HF tokenizer dir or asset (e.g. ``dolma2``); default: the model dir's
    init: str = "checkpoint"  #: ``checkpoint`` (continue its weights) or ``random`` (pretrain from scratch: the
    #: engine's own initialisation of ``config``, seeded with ``init_seed``, saved as the step-0 checkpoint)
    config: Optional[str] = None  #: with ``init=random``: an OLMo-core ``TransformerConfig`` builder
    #: (``olmo2_1B_v2``, ``olmo3_7B``, ``olmo2_14M``, ...) for olmo_core; an HF ``config.json``, model dir, model asset
    #: or Hub id for hf
    init_seed: int = II("seed")  # type: ignore[assignment]  #: seed of the random initialisation


DEFAULT_HELD_OUT_ROWS = 16  #: held-out rows when ``data.held_out_rows`` is null (and they fit)


def text_sources(text) -> list:
    """The sources of ``data.text``: ``[text]`` for one source (a string), else the list's items in order."""
    return [text] if isinstance(text, str) else list(text)


@dataclass
class DataConf:
    """The training corpus and its order (``data=`` option).

    Either ``paths`` lists OLMo token files, or ``text`` names a text source (a registry asset such as
    ``shakespeare``, a folder of ``.txt`` files, or a ``.jsonl`` file with ``text_key``) or a list of them (their
    documents one after another, e.g. ``[shakespeare, kjv]``), or ``dataset`` a
    ``datasets`` corpus (:mod:`pretrain_exp.data.hf_dataset`); the last two are tokenized with the model's
    tokenizer into token files under ``token_dir``.
    """

    name: str = MISSING
    text: Any = None  #: a text source, or a list of them (str or list of str)
    text_key: str = "text"  #: the document text's key (``.jsonl`` of ``text``) or column (``dataset``)
    dataset: Optional[str] = None  #: a ``datasets`` corpus: Hub id, data file(s) or folder (``data=hf_dataset``)
    subset: Optional[str] = None  #: the ``dataset``'s config name on the Hub (``load_dataset(id, subset)``)
    split: str = "train"  #: the ``dataset``'s split
    num_proc: int = 1  #: processes tokenizing the ``dataset`` (``Dataset.map(num_proc=...)``)
    paths: List[str] = field(default_factory=list)
    token_dir: str = II("cache_dir") + "/" + CacheDir.TOKENS  # type: ignore[assignment]
    seed: int = II("seed")  # type: ignore[assignment]  #: data-order seed (PCG64(seed + epoch))
    first_epoch: int = 1  #: 1 = OLMo-core's count (OLMo-2 counts from 0: OLMo-2 seed S = OLMo-core seed S-1)
    #: rows at the end of the first epoch's order, never trained, for perplexity; null (default): up to
    #: :data:`DEFAULT_HELD_OUT_ROWS`, fewer (logged) where the run or the checkpoint trains the last rows
    held_out_rows: Optional[int] = None
    #: token-file dtype (``uint16``/``uint32``; a text corpus is tokenized into it); None = from the vocabulary size
    dtype: Optional[str] = None
    path_prefixes: Dict[str, str] = field(default_factory=dict)  #: ``{old prefix: new prefix}`` applied to
    #: ``paths`` before reading (first match wins), e.g. ``{"http://olmo-data.org/": "/data/mirror/"}``
    #: remote paths: ``stream`` (fetch the run's rows ahead of the trainer, which starts once its first rows are
    #: local), ``window`` (fetch them all before training), ``none``; ``auto`` = ``stream`` for remote paths
    prefetch: str = "auto"
    #: ``stream``: steps the stream may run ahead of the trainer (null: as far as the network allows)
    prefetch_ahead_steps: Optional[int] = 500
    max_target_sequence_length: Optional[int] = None  #: OLMo-core's: a multiple M of L; instances are then
    #: shuffled in chunks of M / L (``None``: one by one)


@dataclass
class EvalConf:
    """Evaluations run on each segment's checkpoint (``eval=`` options add entries to ``tasks``)."""

    on_load: bool = False  #: also evaluate the initial checkpoint before training
    mode: EvalMode = EvalMode.inline  #: inline | distributed | async (:data:`EvalMode`)
    #: where ``async`` evals run: auto (slurm if the run was launched on SLURM, else local) | local | slurm
    async_launcher: str = "auto"
    #: seconds the run's final wait gives a SLURM eval job that has not started before cancelling it and running
    #: its evals in the run's own allocation (a job pending behind the run itself would never start)
    async_pending_wait_s: float = 60.0
    batch_size: int = 8  #: sequences per forward pass
    #: not used: intervals are t / Welch / Wilson / score intervals and tests are randomization tests
    #: (:mod:`pretrain_exp.core.stats`); the key stays so that the configs of runs written before still load
    bootstrap_samples: int = 1000
    #: random relabellings of a randomization test with more than ``pretrain_exp.core.stats.MAX_EXACT`` distinct
    #: ones (smaller tests enumerate every relabelling: exact)
    permutations: int = 9999
    #: multiplicity adjustment of each eval's dup-vs-control p-values at a step: ``holm`` (family-wise error),
    #: ``bh`` (false discovery rate) or ``none``; the trend test over log(1 + dup), the primary endpoint, is not
    #: adjusted
    p_adjust: str = "holm"
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
    precision: Precision = Precision.auto  #: ``auto`` (bf16 autocast where the device supports it), ``bf16``,
    #: ``fp32``, or ``fp8``: olmo_core/olmo2 only, bf16 autocast plus OLMo-core's float8 training (``Float8Config``:
    #: torchao's float8 matmuls in every linear layer but the output layer), on a CUDA GPU of compute capability
    #: >= 8.9 (H100, L4, ...) with ``torchao`` installed
    num_threads: int = 0  #: torch intra-op threads (0 = torch's default)
    max_retries: int = 2  #: retries of a failed training segment (exponential backoff with jitter)
    retry_base_delay_s: float = 5.0
    nproc_per_node: int = 1  #: processes per node (torchrun) for frameworks that support it
    nnodes: int = 1  #: nodes of the job (``hydra/launcher=slurm_multinode``); world size = nnodes x nproc_per_node
    data_parallel: str = "auto"  #: olmo_core: ``auto`` (FSDP on GPUs, DDP on CPUs), ``fsdp``, ``hsdp`` (shard
    #: within a node, replicate across nodes: OLMo-core's ``DataParallelType.hsdp``, shard degree nproc_per_node),
    #: ``ddp``
    compile: bool = False  #: ``torch.compile`` the model: olmo_core/olmo2: OLMo-core's ``compile_model``; hf:
    #: ``TrainingArguments.torch_compile``
    activation_checkpointing: bool = False  #: olmo_core: OLMo-core's full activation checkpointing
    attention: str = "sdpa"  #: olmo_core attention backend: ``sdpa`` (torch) or ``flash`` (flash-attn 2)
    keep_last_checkpoints: int = 1  #: checkpoints kept in the run dir (0 = all, e.g. for checkpoint sweeps)
    checkpoint_async: Optional[bool] = None  #: write the segment-end checkpoint in the background while the run
    #: goes on (``null``: the engine's way; olmo_core/olmo2: OLMo-core's asynchronous save, on by default; hf: the
    #: HF Trainer saves synchronously, so only ``null``/``false``)
    cleanup: Cleanup = Cleanup.none
    log_rows: bool = False  #: olmo_core/olmo2: write ``rows/rank<r>.jsonl`` (rows and token sha256 trained per step)
    export_hf: ExportHF = ExportHF.final  #: HF models kept in ``hf/step<N>/`` (``none``/``final``/``every``);
    #: hf: checkpoints are HF dirs already (``keep_last_checkpoints`` keeps them), so only ``every`` writes
    #: ``hf/step<N>/`` (each segment's model, config and tokenizer files, hard-linked from its checkpoint)
    gradient_checkpointing: bool = False  #: recompute activations in the backward pass (less memory, ~30% more
    #: compute): hf: ``TrainingArguments.gradient_checkpointing``; olmo_core/olmo2: OLMo-core's full activation
    #: checkpointing (``TransformerActivationCheckpointingConfig``)
    #: hf only: the Trainer's own loggers besides the run's tracker, a list of names (``tensorboard``, ``mlflow``,
    #: ... as ``TrainingArguments.report_to``; ``csv``: ``<run_dir>/trainer_log.csv``); one name, comma-separated
    #: names or ``none`` are taken as that list (``none``: ``[]``)
    report_to: Any = field(default_factory=list)


@dataclass
class ReleaseConf:
    """Release the run at its end (``release.push_to_hub=true``): the bundle of ``pretrain-exp-release``
    (:mod:`pretrain_exp.report.release`) written to ``out_dir`` and pushed to the Hub repos ``repo_id`` (model and
    dataset). The token is ``huggingface_hub``'s own (``HF_TOKEN`` or ``hf auth login``); a push that cannot
    happen is refused before training."""

    push_to_hub: bool = False
    repo_id: Optional[str] = None  #: ``<org>/<name>`` of the model repo (the dataset repo gets the same id)
    private: bool = True
    revision: str = "main"  #: the branch the final model goes to; each kept step gets its own branch
    out_dir: Optional[str] = None  #: the bundle's dir; None: ``<run_dir>/release``
    license: str = "other"  #: the cards' licence id


@dataclass
class WandbConf:
    """W&B tracking (``wandb=`` option); ``offline`` unless ``mode=online`` and a key is configured."""

    mode: WandbMode = WandbMode.offline
    project: str = "pretrain_exp"
    entity: Optional[str] = None
    name: str = II("run_name")  # type: ignore[assignment]
    resume_id: Optional[str] = None  #: attach to an existing W&B run by id (``resume="must"``)
    add_step_to_name: bool = False  #: append ``-step<checkpoint_step>`` to the run name
    group: Optional[str] = None  #: W&B group; None: the sweep's dir name in a sweep, the CPDT run's name for its arms
    job_type: Optional[str] = None  #: W&B job type; None: ``train`` (``eval`` with ``training.num_steps=0``)
    tags: List[str] = field(default_factory=list)  #: added to the framework, model and experiment names
    log_checkpoints: bool = False  #: also log the last checkpoint dir as an artifact (can be GBs)


class RunConfig(Protocol):
    """What a plugin (framework, eval, insertion type) may read of the whole run: the app's root config
    (:class:`pretrain_exp.app.config.ExperimentConfig`) satisfies it."""

    framework: FrameworkConf
    model: ModelConf
    data: DataConf
    training: TrainingConf
    eval: EvalConf
    wandb: WandbConf
    insertion: Any  #: :class:`pretrain_exp.insertion.schema.InsertionConf`
    name: str
    seed: int
    run_name: str
    run_dir: str
    cache_dir: str


def in_schema(schema: type, node: Any, key: str, to_object: bool = False):
    """``node`` (a dict or ``DictConfig``) merged into the structured config of ``schema``: a ``DictConfig`` of that
    dataclass (interpolations and missing values kept), or the dataclass instance with ``to_object=True``.

    :param key: dotted key of the node, for messages (``insertion.experiments.texts``).
    :raises ConfigError: for a field the schema lacks or a wrong type, naming ``<key>.<field>``.
    """
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        return OmegaConf.to_object(merged) if to_object else merged
    except OmegaConfBaseException as e:
        sub = getattr(e, "full_key", "") or getattr(e, "key", "") or ""
        raise ConfigError(f"{key}.{sub}".rstrip("."), str(e).splitlines()[0]) from None


def typed_node(key: str, node: Any, tag: str, registry: Mapping[str, Any], schema_of: Callable[[str], type],
               kind: str, check: Optional[Callable[[str, str, Any, type], None]] = None, to_object: bool = False):
    """``node`` (a composed or loaded plugin node: a dict or ``DictConfig``) as a ``DictConfig`` of the schema
    dataclass its ``tag`` field names (``framework.name``, ``insertion.experiments.<name>.type``,
    ``eval.tasks.<name>.type``), so that converting the whole config checks its fields; interpolations and missing
    values stay for later. The one helper the plugin registries (frameworks, insertion types, evals) type a node
    with.

    :param key: dotted key the node is configured under, for messages (``framework``).
    :param registry: the plugin kind's registry (plugin name -> anything), for the allowed names.
    :param schema_of: plugin name -> its schema dataclass.
    :param kind: what the registry names, for messages (``framework``, ``insertion type``, ``eval type``).
    :param check: ``check(key, name, node, schema)``, run before merging a node not yet of that schema (a plugin
        kind's own refusal, e.g. a field of another type).
    :param to_object: return the schema's dataclass instance instead (:func:`in_schema`).
    :raises ConfigError: naming ``<key>.<tag>`` for an unknown or unset name (listing the registered ones), or
        ``<key>.<field>`` for a field the schema lacks or a wrong type.
    """
    name = node.get(tag) if isinstance(node, (dict, DictConfig)) else None
    if not isinstance(name, str) or name not in registry:
        raise ConfigError(f"{key}.{tag}", f"unknown {kind} {name!r}; allowed: {sorted(registry)}")
    cls = schema_of(name)
    if isinstance(node, DictConfig) and OmegaConf.get_type(node) is cls and not to_object:
        return node
    if check is not None:
        check(key, name, node, cls)
    return in_schema(cls, node, key, to_object)

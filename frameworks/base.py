"""The contract between the experiment loop and a training framework.

A :class:`Framework` loads the run's initial checkpoint, finds the newest checkpoint the run already wrote
(resume), and trains from a checkpoint up to a given global step on the run's training rows, returning the new
:class:`Checkpoint`. Steps are global optimizer steps: a run continuing a checkpoint at step S for n steps ends
at step S + n.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, Iterator, Optional, Tuple

import numpy as np

from pretrain_exp.core.capabilities import FRAMEWORK, Capabilities
from pretrain_exp.core.config import ModelConf, RunConfig
from pretrain_exp.core.errors import CheckpointError
from pretrain_exp.core.rundir import RunDir

_multiarray = (np._core if hasattr(np, "_core") else np.core).multiarray
#: the non-tensor types a trainer state (OLMo-2 ``train.pt``, OLMo-core ``train/rank<r>.pt``) may hold for
#: ``torch.load(weights_only=True)``: ``pathlib`` paths of earlier checkpoints, numpy RNG state arrays and numpy
#: scalars; pickles name numpy's helpers by where they lived when written (numpy 1.x ``numpy.core``, numpy 2
#: ``numpy._core``), so both names are listed. Nothing else is unpickled.
TRAIN_STATE_SAFE_GLOBALS = [
    pathlib.PosixPath, pathlib.PurePosixPath, pathlib.WindowsPath, np.ndarray, np.dtype,
    *(type(np.dtype(t)) for t in (np.uint8, np.uint16, np.uint32, np.uint64, np.int64, np.float64)),
    *((f, f"numpy.{core}.multiarray.{f.__name__}") for f in (_multiarray._reconstruct, _multiarray.scalar)
      for core in ("core", "_core")),
]

#: called with (metrics, global step) for every logged training scalar
LogFn = Callable[[Dict[str, float], int], None]


@dataclass
class Checkpoint:
    """A checkpoint: its directory and the global step it holds. This class is a checkpoint that is an HF model
    dir, the format every framework exports to (:meth:`to_hf`) and the evals read; a framework whose checkpoints
    are in another format subclasses it with ``is_hf = False`` and its own :meth:`to_hf`."""

    path: Path
    step: int

    #: whether :attr:`path` is an HF model dir already (:meth:`to_hf` then writes nothing and returns it)
    is_hf: ClassVar[bool] = True

    def to_hf(self, out_dir: Path) -> Path:
        """Write (or point to) an HF model dir of this checkpoint; returns its path. HF checkpoints are HF dirs."""
        return self.path

    def export_hf(self, out_dir: Path) -> Path:
        """Keep an HF model dir of this checkpoint at ``out_dir`` (model, ``config.json``, tokenizer files), which
        stock ``transformers.AutoModelForCausalLM.from_pretrained`` and ``lm_eval --model hf`` load.

        Written by :meth:`to_hf` into a temporary sibling dir that is then renamed, so ``out_dir`` is either whole
        or absent; an existing ``out_dir`` is kept as it is. Returns ``out_dir``.

        :raises CheckpointError: if the checkpoint is an HF dir already (nothing to export; keep the checkpoint).
        """
        out_dir = Path(out_dir)
        if self.is_hf:
            raise CheckpointError(f"{self.path} is an HF model dir already; keep it instead of exporting it")
        if out_dir.is_dir():
            return out_dir
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}-"))
        try:
            self.to_hf(tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out_dir

    @contextlib.contextmanager
    def as_hf_temporary(self) -> Iterator[Path]:
        """An HF model dir of this checkpoint for the duration of a ``with`` block: the checkpoint itself when it is
        one (:attr:`is_hf`), else a conversion into a temporary dir, deleted afterwards."""
        if self.is_hf:
            yield self.path
            return
        tmp = Path(tempfile.mkdtemp(prefix="hf-"))
        try:
            out = self.to_hf(tmp)
            yield out
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class class_constant:
    """A class attribute computed once, on first read, by the decorated function (no arguments): for a value
    taken from a heavy library (``transformers``' scheduler names), so that importing a framework's module, and
    composing or validating a config with it, does not import that library. The value then replaces the
    descriptor on the class that read it."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn, self.__doc__ = fn, fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Optional[type] = None) -> Any:
        value = self.fn()
        setattr(owner if owner is not None else type(obj), self.name, value)
        return value


class Framework(ABC):
    """One training framework, bound to one run (config + run dir).

    Framework-neutral: what the initial checkpoint is (:meth:`resolve_model`), where its tokenizer and vocabulary
    size are read (:attr:`tokenizer_path`, :attr:`vocab_size`) and the checkpoint the run starts from
    (:meth:`initial_checkpoint`) are each framework's own (``frameworks/<name>/framework.py``), and so is what it
    can do: :attr:`capabilities` (none here).
    """

    #: what it can do (:mod:`pretrain_exp.core.capabilities`: ``applies_embedding_noise``, ``supports_random_init``,
    #: ``reads_plan_per_segment``, ``saves_async``, ``loads_hub_models``, ``checkpoints_are_hf``); none here
    capabilities: ClassVar[Capabilities] = Capabilities(FRAMEWORK)
    #: the ``training.lr_scheduler`` values :meth:`train` supports (checked when the config is validated)
    lr_schedulers: ClassVar[Tuple[str, ...]] = ()
    #: the ``training.report_to`` loggers :meth:`train` hands to its engine (none: only the run's own tracker)
    report_to: ClassVar[Tuple[str, ...]] = ()

    #: dotted config keys :meth:`checkpoint_settings` may supply (``${checkpoint:<key>}`` in the framework's YAML)
    SETTINGS: ClassVar[Tuple[str, ...]] = ()

    def __init__(self, cfg: RunConfig, model_dir: Path):
        self.cfg = cfg
        self.model_dir = Path(model_dir)  #: dir of the initial checkpoint (framework format)
        self.run_dir = Path(cfg.run_dir)

    @property
    def rundir(self) -> RunDir:
        """The run dir's layout (:class:`~pretrain_exp.core.rundir.RunDir`: checkpoints, work dirs, logs)."""
        return RunDir(self.run_dir)

    @property
    def checkpoint_dir(self) -> Path:
        """The folder :meth:`train` saves its checkpoints into (the engine's save folder; the run reads it, e.g.
        to name the checkpoint being written when the disk fills): ``checkpoints/`` of the run dir
        (:attr:`RunDir.checkpoints <pretrain_exp.core.rundir.RunDir.checkpoints>`)."""
        return self.rundir.checkpoints

    @classmethod
    @abstractmethod
    def resolve_model(cls, cfg: RunConfig) -> Path:
        """The initial checkpoint's dir, in the framework's format (an asset or a URL is fetched and converted
        once into the cache ``cfg.cache_dir``).

        :raises CheckpointError: if the configured checkpoint cannot be found or read.
        :raises ConfigError: for a ``model.*`` value the framework cannot load, naming the key.
        """

    @classmethod
    def checkpoint_settings(cls, model: ModelConf, cache_dir: str) -> Dict[str, Any]:
        """The run settings the initial checkpoint records, as dotted config key -> value (keys among
        :data:`SETTINGS`: ``model.checkpoint_step``, ``model.tokenizer``, ``training.sequence_length``,
        ``training.global_batch_size``, ``data.paths``, ``data.dtype``, ``data.seed``, ``data.first_epoch``).
        Read from the checkpoint's own files only (config and trainer state, not its weights). A key the
        checkpoint does not record is left out. None here.

        :param model: the run's ``model`` node (``checkpoint_step`` is only read where it selects the checkpoint,
            e.g. under ``model.url``).
        :raises CheckpointError: if the checkpoint's config cannot be read.
        """
        return {}

    @classmethod
    def missing_setting_hint(cls, key: str) -> str:
        """Why a checkpoint may lack setting ``key`` (for the error of ``${checkpoint:<key>}``); ``""`` if unknown."""
        return ""

    @property
    @abstractmethod
    def tokenizer_path(self) -> str:
        """HF tokenizer dir or asset name of the run (``model.tokenizer``, else the framework's default)."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Rows of the model's embedding matrix, as the checkpoint records it; 0 if unknown."""

    @abstractmethod
    def initial_checkpoint(self) -> Checkpoint:
        """The checkpoint the run starts from (step ``model.checkpoint_step``)."""

    @abstractmethod
    def latest_checkpoint(self) -> Optional[Checkpoint]:
        """The newest complete checkpoint this run wrote in its run dir, or ``None``."""

    def checkpoints(self) -> Dict[int, Checkpoint]:
        """Every complete checkpoint this run holds in its run dir, by global step (frameworks that keep several
        list them all; the default: the newest)."""
        last = self.latest_checkpoint()
        return {} if last is None else {last.step: last}

    @abstractmethod
    def peek_rows(self, rows, step: int, dp_rank: int, dp_world: int,
                  only: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """The rows DP rank ``dp_rank`` of ``dp_world`` will train at global step ``step``, read through the
        framework's own data path with the insertions applied exactly as :meth:`train` applies them (what the
        verifier, :func:`~pretrain_exp.insertion.verify.verify_batches`, checks).

        :param rows: the run's :class:`~pretrain_exp.data.rows.TrainingRows`.
        :param only: training-order indices to return (the others of the rank batch are not read); ``None`` = all.
        :returns: ``(q, tokens)``: ``int64`` ``(n,)`` training-order indices in the order the rank trains them and
            ``int64`` ``(n, L)`` their tokens as trained.
        :raises TrainingError: if the framework's data path does not hand over the run's rows.
        """

    def finish_checkpoints(self) -> None:
        """Wait until every checkpoint :meth:`train` returned is complete on disk (every rank calls it; a no-op for
        frameworks that save synchronously)."""

    @abstractmethod
    def train(self, start: Checkpoint, until_step: int, rows, log_fn: LogFn) -> Checkpoint:
        """Train from ``start`` to global step ``until_step`` on ``rows`` and save a checkpoint there (with
        :attr:`saves_async` it may still be being written on return; its ``to_hf`` and :meth:`finish_checkpoints`
        wait for it).

        :param rows: :class:`~pretrain_exp.data.rows.TrainingRows` covering the whole run (row 0 = first row
            after the initial checkpoint). Under ``W`` processes DP rank ``r`` trains
            :func:`~pretrain_exp.data.schedule.rows_for` ``(k, r, W, B)`` at global step ``k`` (OLMo's layout).
        :raises TrainingError: (or any runtime error) if training fails; the loop retries.
        """

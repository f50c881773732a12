"""The contract between the experiment loop and a training framework.

A :class:`Framework` loads the run's initial checkpoint, finds the newest checkpoint the run already wrote
(resume), and trains from a checkpoint up to a given global step on the run's training rows, returning the new
:class:`Checkpoint`. Steps are global optimizer steps: a run continuing a checkpoint at step S for n steps ends
at step S + n.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, Iterator, Optional, Tuple

import numpy as np

from pretrain_exp.core.config import ModelConf, RunConfig
from pretrain_exp.core.errors import CheckpointError, ConfigError
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
    """A checkpoint of a framework: its directory and the global step it holds."""

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
        """An HF model dir of this checkpoint for the duration of a ``with`` block (deleted afterwards if a
        conversion had to write one)."""
        tmp = Path(tempfile.mkdtemp(prefix="hf-"))
        try:
            out = self.to_hf(tmp)
            yield out
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class Framework(ABC):
    """One training framework, bound to one run (config + run dir).

    The defaults here are the HF ones: the initial checkpoint is an HF model dir (``model.asset`` converted
    once, or ``model.path``) that also holds the tokenizer and ``config.json``'s ``vocab_size``.
    """

    #: whether :meth:`train` adds Gaussian-poisoning noise (through
    #: :class:`~pretrain_exp.frameworks.noise_feed.NoiseFeed`)
    applies_embedding_noise: ClassVar[bool] = False
    #: whether ``model.init=random`` (pretraining from the engine's own initialisation of ``model.config``) works
    supports_random_init: ClassVar[bool] = False
    #: whether :meth:`train` reads ``rows.plan`` anew on every call, so spans added between segments
    #: (``insertion.dynamic``, :mod:`~pretrain_exp.insertion.dynamic`) are trained by the next segment
    reads_plan_per_segment: ClassVar[bool] = True
    #: the ``training.lr_scheduler`` values :meth:`train` supports (checked when the config is validated)
    lr_schedulers: ClassVar[Tuple[str, ...]] = ()
    #: the ``training.report_to`` loggers :meth:`train` hands to its engine (none: only the run's own tracker)
    report_to: ClassVar[Tuple[str, ...]] = ()

    #: whether :meth:`train` can return before its segment-end checkpoint is on disk
    #: (``training.checkpoint_async``; :meth:`finish_checkpoints` waits for it)
    saves_async: ClassVar[bool] = False

    #: whether :meth:`resolve_model` loads HF Hub model ids (``model.path=<org>/<name>``, ``model.revision``)
    loads_hub_models: ClassVar[bool] = True

    #: whether its checkpoints are HF model dirs, so a release has the final step's model without
    #: ``training.export_hf`` (False: it needs ``export_hf=final|every``)
    checkpoints_are_hf: ClassVar[bool] = True

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

    @classmethod
    def resolve_model(cls, cfg: RunConfig) -> Path:
        """The initial checkpoint's dir (an asset is fetched and converted once into the cache).

        ``model.path`` is a local HF model dir or a Hub model id (with ``model.revision``), resolved to its
        snapshot in the HF cache by :func:`pretrain_exp.frameworks.hub.hub_snapshot` (which honours ``HF_HOME``,
        ``HF_HUB_OFFLINE`` and ``HF_TOKEN``).

        :raises CheckpointError: if ``model.path`` is neither an HF model dir nor a Hub model that can be found, or
            ``model.url`` is set (HF checkpoints are not downloaded by URL).
        :raises ConfigError: (``model.revision``) for a revision the Hub model lacks, or one set with a local dir.
        """
        from pretrain_exp.data.assets import hf_model_dir
        from pretrain_exp.frameworks.hub import hub_snapshot, is_hub_id

        if cfg.model.init == "random":
            from pretrain_exp.frameworks.hf.scratch import random_init_model_dir

            return random_init_model_dir(cfg.model, cfg.cache_dir)
        if cfg.model.asset is not None:
            return hf_model_dir(cfg.model.asset, cfg.cache_dir)
        if cfg.model.url is not None:
            raise CheckpointError(f"model.url={cfg.model.url}: the {cfg.framework.name} framework loads HF model "
                                  "dirs (model.path or model.asset); URLs are for OLMo checkpoints")
        path = Path(cfg.model.path).expanduser()
        if not path.exists() and is_hub_id(cfg.model.path):
            return hub_snapshot(cfg.model.path, cfg.model.revision)
        if cfg.model.revision is not None:
            raise ConfigError("model.revision", f"{cfg.model.revision!r}: revisions select a Hub model's version; "
                              f"model.path={cfg.model.path} is a local path")
        if not (path / "config.json").is_file():
            raise CheckpointError(f"model.path={path}: missing checkpoint (no config.json in that directory)")
        return path

    @classmethod
    def checkpoint_settings(cls, model: ModelConf, cache_dir: str) -> Dict[str, Any]:
        """The run settings the initial checkpoint records, as dotted config key -> value (keys among
        :data:`SETTINGS`: ``model.checkpoint_step``, ``model.tokenizer``, ``training.sequence_length``,
        ``training.global_batch_size``, ``data.paths``, ``data.dtype``, ``data.seed``, ``data.first_epoch``).
        Read from the checkpoint's own files only (config and trainer state, not its weights). A key the
        checkpoint does not record is left out. The base (HF) records none.

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
    def tokenizer_path(self) -> str:
        """HF tokenizer dir or asset name of the run (``model.tokenizer``, else the model dir)."""
        return self.cfg.model.tokenizer or str(self.model_dir)

    @property
    def vocab_size(self) -> int:
        """Rows of the model's embedding matrix (``config.json``'s ``vocab_size``); 0 if unknown."""
        return int(json.loads((self.model_dir / "config.json").read_text()).get("vocab_size", 0))

    def initial_checkpoint(self) -> Checkpoint:
        """The checkpoint the run starts from (step ``model.checkpoint_step``)."""
        return Checkpoint(self.model_dir, self.cfg.model.checkpoint_step)

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

"""The contract between the experiment loop and a training framework.

A :class:`Framework` loads the run's initial checkpoint, finds the newest checkpoint the run already wrote
(resume), and trains from a checkpoint up to a given global step on the run's training rows, returning the new
:class:`Checkpoint`. Steps are global optimizer steps: a run continuing a checkpoint at step S for n steps ends
at step S + n.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import shutil
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

import numpy as np

from pretrain_exp.core.config import RunConfig
from pretrain_exp.core.errors import CheckpointError

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

    def get_step(self) -> int:
        """Global optimizer step of this checkpoint."""
        return self.step

    def to_hf(self, out_dir: Path) -> Path:
        """Write (or point to) an HF model dir of this checkpoint; returns its path. HF checkpoints are HF dirs."""
        return self.path

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

    #: whether :meth:`train` adds Gaussian-poisoning noise (:class:`~pretrain_exp.insertion.gaussian.EmbeddingNoise`)
    applies_embedding_noise: bool = False

    def __init__(self, cfg: RunConfig, model_dir: Path):
        self.cfg = cfg
        self.model_dir = Path(model_dir)  #: dir of the initial checkpoint (framework format)
        self.run_dir = Path(cfg.run_dir)

    @classmethod
    def resolve_model(cls, cfg: RunConfig) -> Path:
        """The initial checkpoint's dir (an asset is fetched and converted once into the cache).

        :raises CheckpointError: if ``model.path`` is not an HF model dir, or ``model.url`` is set (HF
            checkpoints are not downloaded by URL).
        """
        from pretrain_exp.data.assets import hf_model_dir

        if cfg.model.asset is not None:
            return hf_model_dir(cfg.model.asset, cfg.cache_dir)
        if cfg.model.url is not None:
            raise CheckpointError(f"model.url={cfg.model.url}: the {cfg.framework.name} framework loads HF model "
                                  "dirs (model.path or model.asset); URLs are for OLMo checkpoints")
        path = Path(cfg.model.path)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"model.path={path}: missing checkpoint (no config.json in that directory)")
        return path

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

    @abstractmethod
    def train(self, start: Checkpoint, until_step: int, rows, log_fn: LogFn) -> Checkpoint:
        """Train from ``start`` to global step ``until_step`` on ``rows`` and save a checkpoint there.

        :param rows: :class:`~pretrain_exp.data.rows.TrainingRows` covering the whole run (row 0 = first row
            after the initial checkpoint).
        :raises TrainingError: (or any runtime error) if training fails; the loop retries.
        """

"""The HF export of a segment's checkpoint (``training.export_hf``), the same for every framework.

``hf/step<N>/`` is written once per step and read by every eval of that step: kept after the run for ``every``
segment, for the ``final`` one, or for ``none`` (then it lives only as long as its evals need it: a temporary
export beside the checkpoint, the shared dir of ``eval.mode=distributed`` or the dir an ``async`` eval reads).
An OLMo-core / OLMo-2 checkpoint is converted (:meth:`~pretrain_exp.frameworks.base.Checkpoint.export_hf`). A
checkpoint that is an HF dir already (``framework=hf``: ``checkpoints/checkpoint-<k>/``) is read where it is; under
``every`` its model, config and tokenizer files (no optimizer, scheduler, RNG or trainer state) are also kept in
``hf/step<N>/``, hard-linked (:func:`~pretrain_exp.app.async_eval.link_model_files`), so that
``training.keep_last_checkpoints`` deleting the checkpoint later leaves them; under ``final`` the last checkpoint
itself is the final model and nothing is written.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from pathlib import Path
from typing import Iterator, Optional

from pretrain_exp.app.async_eval import link_model_files
from pretrain_exp.app.hooks import RunHook
from pretrain_exp.core.config import ExportHF
from pretrain_exp.core.distributed import barrier
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.frameworks.base import Checkpoint

log = logging.getLogger(__name__)


class HFExport(RunHook):
    """The run's HF exports ``<run dir>/hf/step<N>/``; as a hook (rank 0), :meth:`post_segment` keeps the export
    of a segment's checkpoint that ``training.export_hf`` asks for.

    :param rundir: the run dir.
    :param mode: ``training.export_hf``.
    :param end_step: the run's last global step (``model.checkpoint_step + training.num_steps``): ``final`` keeps
        the export of this step.
    :param main: whether this process is rank 0 (the only one that writes).
    """

    def __init__(self, rundir: RunDir, mode: ExportHF, end_step: int, main: bool = True):
        self.rundir, self.mode, self.end_step, self.main = rundir, mode, end_step, main

    def dir(self, step: int) -> Path:
        """Where the HF export of the checkpoint at global step ``step`` lives: ``<run dir>/hf/step<N>/``."""
        return self.rundir.hf_export(step)

    def keeps(self, step: int, is_hf: bool) -> bool:
        """Whether ``training.export_hf`` keeps the export of step ``step`` after its evals: ``every`` step, or the
        run's last one for ``final`` (not for a checkpoint that is an HF dir already, ``is_hf``: that checkpoint is
        the final model, kept by ``training.keep_last_checkpoints``)."""
        if self.mode == ExportHF.every:
            return True
        return not is_hf and self.mode == ExportHF.final and step == self.end_step

    def export(self, ckpt: Checkpoint) -> Path:
        """Write the HF export of ``ckpt`` into :meth:`dir` unless it is there already (logged with its time);
        returns the dir. A checkpoint that is an HF dir (``is_hf``) gives its model, config and tokenizer files,
        hard-linked (copied where the filesystem cannot link); another is converted by its ``export_hf``. Either
        way the dir is written into a temporary sibling and renamed, so it is whole or absent."""
        out = self.dir(ckpt.step)
        if not out.is_dir():
            t0 = time.perf_counter()
            if ckpt.is_hf:
                link_model_files(ckpt.path, out)
            else:
                ckpt.export_hf(out)
            log.info("HF export of step %d: %s (%.1f s)", ckpt.step, out, time.perf_counter() - t0)
        return out

    def keep(self, ckpt: Checkpoint) -> Optional[Path]:
        """Write the kept HF export of ``ckpt`` if :meth:`keeps` says so; returns its dir or ``None``. The evals
        of a converted checkpoint's step then read it instead of a temporary export (one export per segment)."""
        return self.export(ckpt) if self.keeps(ckpt.step, ckpt.is_hf) else None

    def post_segment(self, ckpt: Checkpoint, final: bool) -> None:
        if self.main:
            self.keep(ckpt)

    def drop(self, step: int, is_hf: bool) -> None:
        """Remove the export of ``step`` (and ``hf/`` when it is empty then) unless :meth:`keeps` keeps it."""
        out = self.dir(step)
        if out.is_dir() and not self.keeps(step, is_hf):
            shutil.rmtree(out)
            with contextlib.suppress(OSError):  # hf/ itself when it is empty now
                out.parent.rmdir()

    @contextlib.contextmanager
    def read(self, ckpt: Checkpoint) -> Iterator[Path]:
        """The HF dir to read ``ckpt`` from: its kept export if there is one, else a temporary one (deleted
        afterwards; the checkpoint itself for an HF checkpoint)."""
        kept = self.dir(ckpt.step)
        if not ckpt.is_hf and kept.is_dir():
            yield kept
        else:
            with ckpt.as_hf_temporary() as tmp:
                yield tmp

    @contextlib.contextmanager
    def shared(self, ckpt: Checkpoint) -> Iterator[Path]:
        """The one HF dir every rank reads under ``eval.mode=distributed`` (every rank enters this): the checkpoint
        itself (HF) or its export, written by rank 0 before a barrier if it is not kept already, and then removed
        by rank 0 after every rank is done with it."""
        if ckpt.is_hf:
            with self.read(ckpt) as d:
                yield d
            return
        out, temporary = self.dir(ckpt.step), False
        if self.main and not out.is_dir():
            self.export(ckpt)
            temporary = True
        barrier()
        try:
            yield out
        finally:
            barrier()
            if temporary:
                shutil.rmtree(out, ignore_errors=True)

"""``training.cleanup``: what a finished run removes from its run dir (rank 0, after the results and the release).

``none`` keeps everything; ``bulky`` removes every checkpoint but the newest and, for an HF checkpoint, the newest
one's optimizer, scheduler and RNG files (OLMo-core keeps its optimizer state inside its DCP shards); ``all``
removes the run dir.
"""

from __future__ import annotations

import shutil
from typing import Callable, Optional

from pretrain_exp.app.hooks import RunHook
from pretrain_exp.core.config import Cleanup
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.frameworks.base import Checkpoint

#: file-name prefixes of an HF checkpoint's training state (not the model)
TRAINING_STATE = ("optimizer", "scheduler", "rng_state")


def clean_run_dir(rundir: RunDir, mode: Cleanup, last: Optional[Checkpoint]) -> None:
    """Apply ``training.cleanup=mode`` to ``rundir`` (module docstring); ``last`` is the newest checkpoint."""
    if mode == Cleanup.all:
        shutil.rmtree(rundir.path)
    elif mode == Cleanup.bulky:
        ckpts = rundir.checkpoints
        for d in sorted(ckpts.iterdir()) if ckpts.is_dir() else []:
            if last is not None and d == last.path:
                for f in d.iterdir():
                    if f.name.startswith(TRAINING_STATE):
                        f.unlink()
            elif d.is_dir():
                shutil.rmtree(d)


class RunDirCleanup(RunHook):
    """The hook: :meth:`close` applies ``training.cleanup`` on rank 0 after a run that finished (a run that failed,
    :meth:`on_error`, keeps its run dir for the re-run).

    :param latest: returns the newest checkpoint then (``Framework.latest_checkpoint``).
    :param main: whether this process is rank 0 (the only one that cleans).
    """

    def __init__(self, rundir: RunDir, mode: Cleanup, latest: Callable[[], Optional[Checkpoint]], main: bool = True):
        self.rundir, self.mode, self.latest, self.main = rundir, mode, latest, main
        self.failed = False  #: an exception left the run (``on_error``)

    def on_error(self, exc: BaseException) -> None:
        self.failed = True

    def close(self) -> None:
        if self.main and not self.failed:
            clean_run_dir(self.rundir, self.mode, self.latest() if self.mode == Cleanup.bulky else None)

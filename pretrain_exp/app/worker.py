"""Worker entry point, without Hydra: ``python -m pretrain_exp.app.worker <run_dir>/config.resolved.yaml``.

torchrun starts one of these per rank (see :mod:`pretrain_exp.app.launch`); each loads the resolved config, and
runs the experiment; rank 0 alone writes files, logs metrics and runs evals. Rank 0's console shows what the
launching process's does and its records go to the run dir's ``pretrain_exp.log`` as well
(:func:`~pretrain_exp.core.logs.run_logging`, ``verbose`` from the config); the other ranks log warnings and errors
only (torchrun's ``--log-dir`` keeps their output). Exit status 2 with one line on stderr for an error of the
user's making. ``SIGINT`` / ``SIGTERM`` (torchrun passes on what stops the launching process) stop the rank at once
with its child processes, silently, with exit status 130 / 143 (:mod:`pretrain_exp.core.interrupt`; the launching
process prints the line).
"""

from __future__ import annotations

import logging
import sys
from typing import Callable, List, Optional

from pretrain_exp.app.validate import load_resolved
from pretrain_exp.core.distributed import is_main_process, rank
from pretrain_exp.core.errors import PretrainExpError
from pretrain_exp.core.interrupt import Interrupted, exit_now, interruptible, stop_children
from pretrain_exp.core.logs import run_logging
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.core.secrets import install_log_redaction, redact


def main(argv: Optional[List[str]] = None) -> int:
    """Run the experiment of a resolved config; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m pretrain_exp.app.worker <{RunDir.CONFIG}>", file=sys.stderr)
        return 2
    install_log_redaction()
    from pretrain_exp.app.experiment import run

    def go() -> None:
        cfg = load_resolved(argv[0])
        main_rank = is_main_process()
        with run_logging(RunDir(cfg.run_dir).log_file if main_rank else None, verbose=cfg.verbose,
                         console_level=logging.INFO if main_rank else logging.WARNING,
                         fmt=f"[%(asctime)s][rank {rank()}][%(name)s][%(levelname)s] - %(message)s"):
            run(cfg)

    with interruptible():
        try:
            return exit_status(go)
        except Interrupted as e:
            stop_children()
            exit_now(e.exit_status)
            return e.exit_status  # (not reached)


def exit_status(fn: Callable[[], object]) -> int:
    """Call ``fn``; 0, or 2 with one redacted ``error: ...`` line on stderr for an error of the user's making
    (:class:`PretrainExpError`). The exit convention of every entry point without Hydra."""
    try:
        fn()
    except PretrainExpError as e:
        print(f"error: {redact(' '.join(str(e).split()))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

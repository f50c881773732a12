"""The process of a background eval (``eval.mode=async``, :mod:`pretrain_exp.app.async_eval`)::

    python -m pretrain_exp.app.eval_worker <config.resolved.yaml> <step> <hf dir> [--log FILE]

evaluates the tasks of ``step`` missing in ``<run dir>/evals/step<N>/`` on the HF model dir, exactly as an
``inline`` eval does (:meth:`Evaluator.evaluate <pretrain_exp.app.evaluator.Evaluator.evaluate>` on the prepared
run, :func:`~pretrain_exp.app.prepare.prepare`), without Hydra and without writing anything else into the run dir.
Exit status 2 with one ``error:`` line for an error of the user's making.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import List, Optional

from pretrain_exp.core.rundir import RunDir

#: torchrun's variables, which the eval process must not inherit from the rank that started it
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def main(argv: Optional[List[str]] = None) -> int:
    """Run the missing evals of one step (module docstring); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    for key in list(os.environ):  # started by rank 0 of a torchrun job: this process is a world of its own
        if key in TORCHRUN_ENV or key.startswith("TORCHELASTIC_"):
            del os.environ[key]
    if "--log" in argv:  # a SLURM job: output into the step's log, as the local process's
        i = argv.index("--log")
        log_file = argv[i + 1]
        del argv[i:i + 2]
        fh = open(log_file, "a")
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
    if len(argv) != 3:
        print(f"usage: python -m pretrain_exp.app.eval_worker <{RunDir.CONFIG}> <step> <hf dir>", file=sys.stderr)
        return 2
    from pretrain_exp.core.secrets import install_log_redaction

    install_log_redaction()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][eval][%(name)s][%(levelname)s] - %(message)s",
                        force=True)
    from pretrain_exp.app.evaluator import Evaluator
    from pretrain_exp.app.hf_export import HFExport
    from pretrain_exp.app.prepare import prepare
    from pretrain_exp.app.tracking import NullTracker
    from pretrain_exp.app.validate import load_resolved
    from pretrain_exp.app.worker import exit_status
    from pretrain_exp.core.config import EvalMode
    from pretrain_exp.frameworks.base import Checkpoint

    def evaluate() -> None:
        cfg = load_resolved(argv[0])
        cfg.eval.mode = EvalMode.inline
        cfg.insertion.verify = False  # the run verified its plan; this process only reads it
        if cfg.training.num_threads > 0:
            import torch

            torch.set_num_threads(cfg.training.num_threads)
        ctx = prepare(cfg)  # the plan as of the step, the tokenizer, the held-out rows; no process started
        hf = HFExport(ctx.rundir, cfg.training.export_hf, ctx.end_step, ctx.main)
        evaluator = Evaluator(cfg.eval, ctx.rundir, hf, ctx.eval_context, NullTracker(), ctx.main,
                              start_step=ctx.start_step, end_step=ctx.end_step)
        evaluator.evaluate(Checkpoint(Path(argv[2]), int(argv[1])))

    return exit_status(evaluate)


if __name__ == "__main__":
    sys.exit(main())

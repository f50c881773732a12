"""``pretrain-exp-eval RUN_DIR [eval overrides] [--steps 4,8] [--redo]``: (re-)evaluate an existing run's
checkpoints with other or additional evals, without touching its training.

The run's ``config.resolved.yaml`` is the config; the command line may change only ``eval`` (``eval=[benchmark]``,
``'eval=[insertion_loss,mia]'``, ``eval.batch_size=4``, ...) and ``wandb``; the ``eval`` group is composed by
Hydra as for ``pretrain-exp`` (same options, same one-line errors). Every checkpoint the run holds is evaluated
(its checkpoints, kept HF exports ``hf/step<N>/`` and, if the run evaluated it, the initial checkpoint), or those
of ``--steps``; results go to the run's ``evals/step<N>/<task>.json`` (a task already there is kept unless
``--redo``), then ``results.json``, its tables and plots are rewritten and the table printed. Evals run in this
process (``eval.mode=inline``). Exit status 2 with one ``error:`` line for bad input (not a run dir, a
non-eval override, a step without a checkpoint). The engines' detail goes to the run's ``pretrain_exp.log``
(appended), and with ``-v`` to the console too (:mod:`pretrain_exp.core.logs`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import List, Optional

from pretrain_exp.core.errors import ConfigError, PretrainExpError
from pretrain_exp.core.logs import run_logging
from pretrain_exp.core.rundir import RunDir

log = logging.getLogger("pretrain_exp")
#: the keys (and groups) this command may change: the rest is the run's
ALLOWED = ("eval", "wandb")


def eval_config(run_dir: Path, overrides: List[str]):
    """The run's resolved config with its ``eval`` (and ``wandb``) node recomposed from ``overrides``, validated.

    :raises ConfigError: not a run dir, an override outside :data:`ALLOWED`, or an invalid eval config.
    :raises hydra.errors.HydraException: a composition error (mistyped key, wrong option).
    """
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from pretrain_exp import conf_dir
    from pretrain_exp.app.config import register_configs
    from pretrain_exp.app.validate import to_config
    from pretrain_exp.core.config import EvalMode

    path = RunDir(run_dir).config
    if not path.is_file():
        raise ConfigError("RUN_DIR", f"{run_dir} is not a run dir (no {RunDir.CONFIG})")
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key.split(".", 1)[0].split("/", 1)[0] not in ALLOWED:
            raise ConfigError(key, "pretrain-exp-eval changes only eval and wandb settings (eval=[...], "
                              "eval.<key>=...); the rest is the run's (re-run its own command to train more)")
    cfg = OmegaConf.load(path)
    if overrides:
        register_configs()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            composed = compose("config", overrides=[f"run_dir={run_dir}", *overrides])
        with open_dict(cfg):
            for group in ALLOWED:
                if any(o.lstrip("+~").startswith(group) for o in overrides):
                    cfg[group] = OmegaConf.to_container(composed[group], resolve=False)
    with open_dict(cfg):
        cfg.run_dir = str(run_dir)
    exp = to_config(cfg)
    exp.eval.mode = EvalMode.inline  # in this process (async/distributed belong to a training job)
    return exp


def evaluate_run(run_dir: Path, overrides: List[str], steps: Optional[List[int]] = None, redo: bool = False) -> dict:
    """Evaluate ``run_dir``'s checkpoints (module docstring); returns the new ``results.json`` content.

    :raises PretrainExpError: bad input (one line), a run dir in use by another process.
    """
    from pretrain_exp.app.experiment import Experiment, check_same_run
    from pretrain_exp.core.runlock import RunDirLock

    run_dir = Path(run_dir).resolve()
    exp = eval_config(run_dir, overrides)
    with RunDirLock(run_dir):
        check_same_run(exp, run_dir)
        return Experiment(exp).evaluate_checkpoints(steps, redo)


def main(argv: Optional[List[str]] = None) -> None:
    """The command line (module docstring)."""
    from pretrain_exp.report.summary import print_table

    ap = argparse.ArgumentParser(prog="pretrain-exp-eval", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: pretrain-exp-eval runs/<run> 'eval=[insertion_loss,mia]'")
    ap.add_argument("run_dir", type=Path, help=f"the run dir (holds {RunDir.CONFIG})")
    ap.add_argument("overrides", nargs="*", help="eval (and wandb) overrides, as for pretrain-exp")
    ap.add_argument("--steps", help="comma-separated global steps to evaluate (default: every checkpoint held)")
    ap.add_argument("--redo", action="store_true", help="re-run tasks already saved for a step")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="the engines' logs and warnings on the console too (always in the run dir's log file)")
    args = ap.parse_args(argv)
    run_dir = Path(args.run_dir).resolve()
    rundir = RunDir(run_dir)
    log_file = rundir.log_file if rundir.config.is_file() else None  # appended to
    with run_logging(log_file, verbose=args.verbose):
        results = _evaluate(args)
    print_table(results)
    print(f"run dir: {run_dir}")


def _evaluate(args: argparse.Namespace) -> dict:
    """:func:`evaluate_run` for the parsed command line; an error exits (one line, status 2)."""
    from hydra.errors import HydraException

    from pretrain_exp.app.hydra_errors import exit_on_hydra_error
    from pretrain_exp.core.secrets import redact

    try:
        try:
            steps = [int(s) for s in args.steps.split(",")] if args.steps else None
        except ValueError:
            raise ConfigError("--steps", f"must be comma-separated integers, got {args.steps!r}") from None
        return evaluate_run(args.run_dir, args.overrides, steps, args.redo)
    except HydraException as e:
        exit_on_hydra_error(e)
    except PretrainExpError as e:
        msg = " | ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())
        print(f"error: {redact(msg)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

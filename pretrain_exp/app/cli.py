"""Command line: ``python -m pretrain_exp [group=option ...] [key=value ...]`` (Hydra).

Examples::

    python -m pretrain_exp                                   # the embedded default (make demo)
    python -m pretrain_exp experiment=tiny                   # seconds-long smoke run
    python -m pretrain_exp insertion=texts insertion.experiments.texts.file=items.jsonl
    python -m pretrain_exp --cfg job                         # print the composed config
    python -m pretrain_exp -m seed=0,1,2                     # a sweep

Errors of the user's making print one line (``error: <dotted key or file:line>: ...``) and exit with status 2,
and a fresh run dir that holds nothing but the failed attempt's Hydra files, resolved config and insertion
plan is removed (in a sweep the job dir is kept and the error logged to its ``pretrain_exp.log`` for
``python -m pretrain_exp.report``). The last line of a successful run is ``run dir: <absolute path>``.
A run dir in use by another process is refused (:mod:`pretrain_exp.core.runlock`), and no credential reaches a log
line or a file of the run dir (:mod:`pretrain_exp.core.secrets`).

The console shows the project's lines (plan, audit, one line per logged training step, evals, the results table,
errors); the engines' detail (OLMo-core's, the HF Trainer's, transformers', lm-eval's records, Python warnings)
goes to the run dir's ``pretrain_exp.log`` (:mod:`pretrain_exp.core.logs`). ``-v`` / ``--verbose`` (the key
``verbose=true``) puts it on the console too; Hydra's ``hydra.verbose=true`` (or ``=[olmo_core]``, logger names)
adds DEBUG records.

Ctrl-C (``SIGINT``) or ``SIGTERM`` stops the run at once, with every process it started, and prints one line: the
step the run dir's newest checkpoint holds and the command that resumes (the same command line); exit status 130 /
143 (:mod:`pretrain_exp.core.interrupt`). A second Ctrl-C while it stops ends it at once. A job of a SLURM sweep
stopped by SLURM's ``SIGTERM`` where no requeue applies (its time limit with ``hydra.launcher.max_num_timeout`` used
up, ``scancel``) ends the same way, its line in the job's submitit log, with the command that submits that job
again (:func:`job_command`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import List, Optional

import hydra
from omegaconf import DictConfig

from pretrain_exp import conf_dir
from pretrain_exp.app.config import register_configs
from pretrain_exp.app.validate import to_config
from pretrain_exp.core.commands import prog
from pretrain_exp.core.errors import PretrainExpError
from pretrain_exp.core.interrupt import Interrupted, exit_now, interruptible, stop_children, submitit_interruptible
from pretrain_exp.core.logs import FILE_ONLY, run_logging
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.core.runlock import RunDirLock
from pretrain_exp.core.secrets import install_log_redaction, redact

log = logging.getLogger("pretrain_exp")
install_log_redaction()  # before Hydra logs the overrides
#: the Hydra config groups (``conf/`` of the checkout, ``pretrain_exp/conf`` of an installed wheel)
CONF_DIR = conf_dir()
register_configs()

#: files Hydra and the entry point write before any training (the Hydra files, the resolved config and the
#: insertion plan with its manifest); a fresh run dir holding only these is discarded on error, so a corrected
#: re-run in the same dir does not meet a stale plan
_SCAFFOLD = RunDir.SCAFFOLD


def hydra_files(cfg: DictConfig) -> dict:
    """``.hydra/{config,hydra,overrides}.yaml`` as Hydra writes them (name -> plain content, unredacted).

    ``conf/config.yaml`` sets ``hydra.output_subdir: null``, so Hydra writes no ``.hydra/`` before the job starts;
    the run writes them when it records itself (:func:`~pretrain_exp.app.run_record.record_run`), once the run dir
    is locked and the config accepted, so a refused re-run (a changed config, a run dir in use) leaves the run's
    ``.hydra/`` as it was.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hc = HydraConfig.get()
    return {"config": OmegaConf.to_container(cfg, resolve=False),
            "hydra": {"hydra": OmegaConf.to_container(hc, resolve=False)},
            "overrides": list(hc.overrides.task)}


#: whether :func:`main` set ``HYDRA_FULL_ERROR`` for Hydra's composition (a user's own setting is left alone)
_set_full_error = False
#: the command line as typed (before ``-v`` became ``verbose=true``): the resume command of an interrupted run
_command: List[str] = []
#: the interrupted run's line, once printed (a second signal does not print it again)
_said: List[str] = []
#: the run dir of the job running now and its ``model.checkpoint_step`` (for the line of a second signal)
_where: list = [None, 0]


def newest_checkpoint_step(run_dir: Path, checkpoint_step: int = 0) -> Optional[int]:
    """The global step of the newest complete checkpoint under ``run_dir/checkpoints`` (OLMo-core's ``step<N>``
    with its ``.metadata.json``; the HF Trainer's ``checkpoint-<k>`` with a whole ``trainer_state.json``, at step
    ``checkpoint_step + k``), or ``None``."""
    rd = RunDir(run_dir)
    steps = [s for s, _ in rd.checkpoint_dirs(RunDir.OLMO_CORE_CHECKPOINT, ".metadata.json")]
    steps += [checkpoint_step + k for k, _ in rd.hf_checkpoint_dirs()]
    return max(steps, default=None)


def interrupted_line(e: Interrupted, run_dir: Optional[Path], checkpoint_step: int = 0) -> str:
    """The one line of an interrupted run: the signal, the step the newest checkpoint of ``run_dir`` holds, and
    the command that resumes (the command line as typed)."""
    command = " ".join([prog("pretrain-exp", "pretrain_exp"), *map(shlex.quote, _command[1:])])
    step = newest_checkpoint_step(run_dir, checkpoint_step) if run_dir is not None and run_dir.is_dir() else None
    kept = (f"the newest checkpoint holds step {step} ({run_dir})" if step is not None
            else "no checkpoint was written yet")
    return f"interrupted ({e.name}): {kept}; resume with: {command}"


def _say_interrupted(e: Interrupted) -> None:
    """Print :func:`interrupted_line` of the job running now on stderr, once."""
    if not _said:
        _said.append(interrupted_line(e, *_where))
        print(_said[0], file=sys.stderr, flush=True)


def _one_line(e: BaseException) -> str:
    """The error message on one line (a wrapped engine error may span several)."""
    return " | ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


def verbose_flag_to_key(args: List[str]) -> List[str]:
    """The command line ``args`` with ``-v`` / ``--verbose`` (which Hydra's parser lacks) turned into the override
    ``verbose=true``, placed with the other overrides (argparse takes them only as one run of words)."""
    flags = ("-v", "--verbose")
    if not any(a in flags for a in args):
        return list(args)
    rest = [a for a in args if a not in flags]
    at = next((i for i, a in enumerate(rest) if "=" in a and not a.startswith("-")), len(rest))
    return [*rest[:at], "verbose=true", *rest[at:]]


def main() -> None:
    """The command (module docstring): Hydra's composition errors (a mistyped key, a wrong group option, a wrong
    type) become one ``error:`` line with the closest name and exit status 2
    (:func:`~pretrain_exp.app.hydra_errors.hydra_error_line`), like the project's own errors; so does a sweep's
    SLURM submission that sbatch refuses (:func:`~pretrain_exp.app.sweep_check.exit_on_submission_error`); a sweep
    job that ended without a result is one line and exit status 1
    (:func:`~pretrain_exp.app.sweep_check.exit_on_job_error`)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from pretrain_exp.app.hydra_errors import exit_on_hydra_error

    global _set_full_error
    _command[:] = sys.argv
    _said.clear()
    _where[:] = [None, 0]
    sys.argv = [sys.argv[0], *verbose_flag_to_key(sys.argv[1:])]
    ours = _set_full_error = "HYDRA_FULL_ERROR" not in os.environ
    if ours:  # Hydra re-raises composition errors instead of printing its own multi-line report and exiting 1
        os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        with interruptible(on_second=_say_interrupted):
            try:
                _main()
            except Interrupted as e:  # before the run dir was known, or after the run
                stop_children()
                _say_interrupted(e)
                exit_now(e.exit_status)
    except (HydraException, OmegaConfBaseException) as e:  # the latter: a resolver's error in Hydra's run dir
        exit_on_hydra_error(e)
    except (RuntimeError, OSError) as e:  # submitit's errors are RuntimeErrors: sbatch refused, or a job failed
        from pretrain_exp.app.sweep_check import exit_on_job_error, exit_on_submission_error

        try:
            exit_on_submission_error(e)
        except (RuntimeError, OSError) as not_submission:
            exit_on_job_error(not_submission)
    finally:
        from pretrain_exp.app.sweep_check import forget_sweep

        forget_sweep()
        if ours:
            os.environ.pop("HYDRA_FULL_ERROR", None)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _main(cfg: DictConfig) -> None:
    """Compose, validate once, launch (a CPDT config: :func:`~pretrain_exp.app.cpdt.run_cpdt`, which launches its
    arms); see the module docstring. In a SLURM job of Hydra's submitit launcher (where :func:`main` does not run),
    ``SIGTERM`` where no requeue applies and ``SIGINT`` stop the job as they stop a typed command
    (:func:`~pretrain_exp.core.interrupt.submitit_interruptible`)."""
    with submitit_interruptible(on_second=_say_interrupted):  # a no-op outside such a job
        try:
            _job(cfg)
        except Interrupted as e:  # before the run's log file was open
            _stop(e)


def _stop(e: Interrupted) -> None:
    """Stop every child process, print the interrupted line once and exit with ``128 + signum``. In a SLURM job the
    line comes first: SLURM's ``SIGKILL`` follows its ``SIGTERM`` after ``KillWait`` (30 s by default)."""
    if os.environ.get("SLURM_JOB_ID"):
        _say_interrupted(e)
    stop_children()
    _say_interrupted(e)
    exit_now(e.exit_status)


def _job(cfg: DictConfig) -> None:
    """The body of :func:`_main`: the job in its run dir, with the run's log file."""
    from hydra.core.hydra_config import HydraConfig

    if _set_full_error:  # the run's own errors and its child processes: as before
        os.environ.pop("HYDRA_FULL_ERROR", None)
    from hydra.types import RunMode

    run_dir = Path(cfg.run_dir).resolve()
    fresh = not RunDir(run_dir).config.exists()
    sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    verbose = bool(cfg.get("verbose")) or bool(HydraConfig.get().verbose)
    _where[:] = [run_dir, _checkpoint_step(cfg)]
    if not _command:  # a job of a sweep's launcher in a process of its own (SLURM): no command line typed here
        _command[:] = job_command(run_dir)
    with run_logging(RunDir(run_dir).log_file, verbose=verbose):  # hydra/job_logging: none (conf/config.yaml)
        try:
            _run(cfg, run_dir, fresh, sweep)
        except Interrupted as e:  # the children stopped, the log file told, one line on the console
            log.info("%s", interrupted_line(e, *_where), extra=FILE_ONLY)
            _stop(e)
    print(f"run dir: {run_dir}")


def job_command(run_dir: Path) -> List[str]:
    """The command line that re-submits this job of a sweep alone into its own run dir ``run_dir`` (``-m``, the
    sweep's launcher overrides and this job's own, ``hydra.sweep.dir`` / ``subdir`` naming the dir): the resume
    command of a job whose process was started by the launcher (a SLURM job), not from a typed command line."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return ["pretrain_exp", *hc.overrides.task, f"hydra.run.dir={run_dir}"]
    sweep_dir = Path(hc.sweep.dir).resolve()
    skip = ("hydra.mode=", "hydra.sweep.dir=", "hydra.sweep.subdir=")
    where = [f"hydra.sweep.dir={sweep_dir}"]
    with contextlib.suppress(ValueError):
        sub = run_dir.relative_to(sweep_dir)
        where += [] if str(sub) == "0" else [f"hydra.sweep.subdir={sub}"]  # "0": the only job of the re-run
    return ["pretrain_exp", "-m", *(o for o in hc.overrides.hydra if not o.startswith(skip)), *where,
            *hc.overrides.task]


def _checkpoint_step(cfg: DictConfig) -> int:
    """``model.checkpoint_step`` of ``cfg`` (0 when it does not resolve): the global step of an HF run's
    ``checkpoint-0``."""
    try:
        return int(cfg.model.checkpoint_step or 0)
    except Exception:  # noqa: BLE001  (an interpolation the run had not resolved yet)
        return 0


def _run(cfg: DictConfig, run_dir: Path, fresh: bool, sweep: bool) -> None:
    """The job of :func:`_main` in the run dir ``run_dir`` (``fresh``: it held no run; ``sweep``: a job of a
    multirun); an error of the user's making exits with status 2."""
    from hydra.core.hydra_config import HydraConfig

    from pretrain_exp.app.cpdt import run_cpdt
    from pretrain_exp.app.launch import job_nodes, launch, surplus_task
    from pretrain_exp.app.run_record import save_hydra_files
    from pretrain_exp.core.phases import PHASES

    if surplus_task():  # more SLURM tasks than nodes (a job requeued onto fewer nodes): one launcher per node
        log.info("SLURM task %s is not its node's first: that one launches the run", os.environ.get("SLURM_PROCID"))
        return
    PHASES.add("startup", time.time() - PHASES.process_start, PHASES.process_start,
               what="interpreter, imports, Hydra's composition")
    hydra = hydra_files(cfg)
    try:
        with PHASES.phase("settings", what="config resolved (checkpoint settings) and validated"):
            exp = to_config(cfg, list(HydraConfig.get().overrides.task))
        if sweep and exp.wandb.group is None:  # the jobs of a sweep side by side in W&B
            exp.wandb.group = Path(HydraConfig.get().sweep.dir).name
        overrides = HydraConfig.get().job.override_dirname
        if sweep and overrides and exp.wandb.name == exp.run_name:  # each job by its overrides, not the shared name
            exp.wandb.name = f"{exp.run_name}-{overrides}"
        # one process per run dir (core.runlock); torchrun ranks run under this one, and in a multi-node job the
        # other nodes' tasks under node 0's
        with RunDirLock(run_dir) if job_nodes().rank == 0 else contextlib.nullcontext():
            if exp.cpdt.experiments:  # dependence testing: one ordinary launch per arm, then the interaction table
                run_cpdt(exp, hydra)
            else:
                launch(exp, hydra)
    except PretrainExpError as e:
        log.debug("failed", exc_info=True)
        if sweep:  # keep the job dir, its .hydra/ and log, so the sweep report can say why this job failed
            if not RunDir(run_dir).config.exists():  # failed before the run recorded itself (and .hydra/)
                save_hydra_files(run_dir, hydra)
            log.error("error: %s", _one_line(e))
        elif fresh and run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= _SCAFFOLD:
            shutil.rmtree(run_dir, ignore_errors=True)
        print(f"error: {redact(_one_line(e))}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

"""A sweep's config checked before its jobs are launched: :class:`CheckFirstJob`, a Hydra callback
(``hydra.callbacks`` in ``conf/config.yaml``) that, in a multirun, composes and validates the first job's config
with the sweeper's own override expansion before the launcher runs or submits anything, so a config that is invalid
for every job is refused once (one ``error:`` line, exit status 2) instead of once per SLURM array task; so is a
first job whose run dir holds another run, and, under ``hydra/launcher=slurm*``, launcher settings SLURM would refuse
(:func:`~pretrain_exp.app.slurm_check.check_launcher`). A submission sbatch refuses all the same ends the same way
(:func:`exit_on_submission_error`), and a sweep dir it created holding nothing but the failed submission is
removed. A job that ends without a result (it failed, or SLURM stopped it at its time limit) ends the sweep with one
``error:`` line naming the job, what it said last and its log, exit status 1 (:func:`exit_on_job_error`)."""

from __future__ import annotations

import logging
import re
import shutil
import sys
from pathlib import Path
from typing import Any, List, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger("pretrain_exp")
#: the sweep being launched by this process: its dir, whether that existed before, its resolved launcher settings
#: (set by :meth:`CheckFirstJob.on_multirun_start`, read by :func:`exit_on_submission_error`)
_launching: dict = {}


def forget_sweep() -> None:
    """Forget the sweep this process launched (:func:`~pretrain_exp.app.cli.main` calls it as the command ends), so
    that a later command in the same process (a test, a notebook) names no sweep of an earlier one."""
    _launching.clear()


def first_job_overrides(config: DictConfig) -> List[str] | None:
    """The overrides of a multirun's first job, expanded as Hydra's basic sweeper expands them (its
    ``hydra.sweeper.params`` then the command line's overrides), or ``None`` for another sweeper."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeper = config.hydra.sweeper
    if sweeper.get("_target_") != f"{BasicSweeper.__module__}.{BasicSweeper.__name__}":
        return None
    params = BasicSweeper(max_batch_size=None, params=sweeper.get("params"))._parse_config()
    args = params + list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
    parsed = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader()).parse_overrides(args)
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return list(batches[0][0]) if batches and batches[0] else []


class CheckFirstJob(Callback):
    """``on_multirun_start``: validate the first job's config (module docstring) before the sweep launches;
    ``on_multirun_end``: print the sweep dir and the command of its report."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(str(config.hydra.sweep.dir)).resolve()
        print(f"sweep dir: {sweep}")
        print(f"report: pretrain-exp-report {sweep}   (or python -m pretrain_exp.report {sweep})")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.global_hydra import GlobalHydra

        from pretrain_exp.app.validate import to_config
        from pretrain_exp.core.errors import PretrainExpError

        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        _launching.clear()
        _launching.update(dir=sweep_dir, existed=sweep_dir.exists(), launcher=None)
        overrides = first_job_overrides(config)
        if overrides is None:
            log.info("sweep config check skipped: sweeper %s", config.hydra.sweeper.get("_target_"))
            return check_slurm_launcher(config)
        job = GlobalHydra.instance().config_loader().load_sweep_config(config, overrides)
        first_dir = first_job_dir(job, sweep_dir)
        with open_dict(job):
            job.run_dir = "<first job of the sweep>"  # not resolved: nothing is written while checking
            del job["hydra"]
        shown = " ".join(overrides) or "(no overrides)"
        try:
            exp = to_config(job, overrides)
            if first_dir is not None:  # a re-run into the same sweep dir: the first job's run dir as the CLI checks it
                from pretrain_exp.app.run_name import own_run_dir
                from pretrain_exp.app.run_record import RunDirConflict, check_same_run, recorded_form

                try:
                    check_same_run(first_dir, recorded_form(exp))
                except RunDirConflict as e:  # the way out as the sweep's command line has it (hydra.sweep.dir=)
                    way_out = own_run_dir(list(config.hydra.overrides.hydra), sweep=True)
                    raise RunDirConflict(e.key, e.what, e.restore, way_out) from None
        except PretrainExpError as e:
            msg = " | ".join(line.strip() for line in str(e).splitlines() if line.strip())
            print(f"error: {msg} (the sweep's first job: {shown}); nothing was launched", file=sys.stderr)
            sys.exit(2)
        check_slurm_launcher(config)


def check_slurm_launcher(config: DictConfig) -> None:
    """Under Hydra's submitit SLURM launcher, refuse settings SLURM would refuse (one ``error:`` line, exit status 2;
    :func:`~pretrain_exp.app.slurm_check.check_launcher`) before anything is submitted; other launchers pass."""
    from pretrain_exp.app.slurm_check import check_launcher, is_slurm_launcher
    from pretrain_exp.core.errors import PretrainExpError

    if not is_slurm_launcher(config.hydra.launcher.get("_target_")):
        return
    try:
        launcher = OmegaConf.to_container(config.hydra.launcher, resolve=True)
    except Exception:  # noqa: BLE001  (a setting resolved only by the launcher: sbatch's answer is the check)
        return
    _launching["launcher"] = launcher
    try:
        check_launcher(launcher)
    except PretrainExpError as e:
        print(f"error: {e}; nothing was submitted", file=sys.stderr)
        sys.exit(2)


def first_job_dir(job: DictConfig, sweep_dir: Path) -> Optional[Path]:
    """The run dir of a sweep's first job (``sweep_dir/hydra.sweep.subdir`` with job number 0), where it holds
    a run's ``config.resolved.yaml``; ``None`` otherwise or where the subdir does not resolve before launch."""
    from pretrain_exp.core.rundir import RunDir

    try:
        with open_dict(job):
            job.hydra.job.num = 0
        path = sweep_dir / str(job.hydra.sweep.subdir)
    except Exception:  # noqa: BLE001  (a subdir resolved only by the launcher: the job checks itself)
        return None
    return path.resolve() if RunDir(path).config.is_file() else None


def exit_on_submission_error(e: BaseException) -> None:
    """A SLURM submission that failed (:func:`~pretrain_exp.app.slurm_check.submission_error_line`) as one
    ``error:`` line and exit status 2, removing the sweep dir where this process created it and it holds no job;
    re-raise ``e`` for any other error."""
    from pretrain_exp.app.slurm_check import submission_error_line
    from pretrain_exp.core.secrets import redact

    line = submission_error_line(e, _launching.get("launcher"))
    if line is None:
        raise e
    sweep_dir = _launching.get("dir")
    if sweep_dir is not None and not _launching.get("existed") and sweep_dir.is_dir() \
            and {p.name for p in sweep_dir.iterdir()} <= {"multirun.yaml", ".submitit"}:
        shutil.rmtree(sweep_dir, ignore_errors=True)
    print(f"error: {redact(line)}", file=sys.stderr)
    sys.exit(2)


#: submitit's ``UncompletedJobError`` / ``FailedJobError`` messages (submitit/core/core.py, ``_get_outcome_and_result``
#: and ``exception``): the job id, its state, the paths of its logs
_NO_OUTPUT = re.compile(r"Job (?P<job>\S+) \(task: (?P<task>\d+)\) with path (?P<pickle>\S+)\s+"
                        r"has not produced any output \(state: (?P<state>[^)]*)\)")
_FAILED_LOG = re.compile(r"or at paths:\s+- (?P<err>\S+)")


def job_error_line(e: BaseException) -> Optional[str]:
    """One line (without ``error:``) for a sweep job that ended without a result: submitit's ``UncompletedJobError``
    (no result: the job exited with an error, or SLURM ended it, ``state`` as SLURM or the local executor says) or
    ``FailedJobError`` (the job raised). It names the job, its last words (the most telling line of its log,
    :func:`~pretrain_exp.report.failures.last_error_line`: the run's ``interrupted (...)`` line with the command that
    resumes, or its ``error:`` line) and its log file; ``None`` for any other error."""
    from submitit.core.utils import UncompletedJobError

    from pretrain_exp.report.failures import last_error_line

    if not isinstance(e, UncompletedJobError):
        return None
    text = str(e)
    m = _NO_OUTPUT.search(text)
    if m is not None:
        pickle = Path(m["pickle"])
        log_path = pickle.with_name(pickle.name.replace("_result.pkl", "_log.err"))
        what = f"job {m['job']} ended without a result (state: {m['state']})"
    else:
        found = _FAILED_LOG.search(text)
        log_path = Path(found["err"]) if found else None
        what = "a job failed"
    said = log_path.read_text(errors="replace") if log_path is not None and log_path.is_file() else text
    last = last_error_line(said)[1] or last_error_line(text)[1]
    line = what + (f": {last.removeprefix('error: ')}" if last else "")
    if log_path is not None:
        line += f"; its log: {log_path}"
    sweep_dir = _launching.get("dir")
    return line + (f"; every job: pretrain-exp-report {sweep_dir}" if sweep_dir is not None else "")


def exit_on_job_error(e: BaseException) -> None:
    """A sweep job that ended without a result (:func:`job_error_line`) as one ``error:`` line and exit status 1;
    re-raise ``e`` for any other error."""
    from pretrain_exp.core.secrets import redact

    line = job_error_line(e)
    if line is None:
        raise e
    print(f"error: {redact(line)}", file=sys.stderr)
    sys.exit(1)

"""A sweep job that ends without a result, as the sweep process tells it: one line naming the job, what it said
last and its log (:func:`pretrain_exp.app.sweep_check.job_error_line`), from the errors real submitit jobs raise
(submitit's local executor runs the job as SLURM's does: its own process, logs and result file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pretrain_exp.app.sweep_check import exit_on_job_error, job_error_line


def says_error_and_exits() -> None:
    """What the entry point does for an error of the user's making: one ``error:`` line, exit status 2."""
    print("[2026-01-01 00:00:00,000][pretrain_exp][INFO] - step 1/3", file=sys.stderr)
    print("error: data.paths[0]: no such file: /nowhere.npy", file=sys.stderr)
    print("srun: error: vm: task 0: Exited with exit code 2", file=sys.stderr)  # what SLURM adds after it
    sys.exit(2)


def interrupted_at_the_time_limit() -> None:
    """What a run stopped by SLURM's time limit leaves: SLURM's notice, the run's one line, then ``srun``'s own
    words, exit status 143."""
    print("slurmstepd: error: *** JOB 139 ON vm CANCELLED AT 2026-01-01T00:01:00 DUE TO TIME LIMIT ***",
          file=sys.stderr)
    print("interrupted (SIGTERM): the newest checkpoint holds step 10 (/s/0); resume with: python -m pretrain_exp "
          "-m seed=0", file=sys.stderr)
    print("srun: error: vm: task 0: Exited with exit code 143", file=sys.stderr)
    sys.exit(143)


def raises() -> None:
    raise ValueError("Invalid beta parameter at index 0: 2.0")


def failed_job(tmp_path: Path, fn):
    import submitit

    executor = submitit.LocalExecutor(folder=str(tmp_path / ".submitit" / "%j"))
    executor.update_parameters(timeout_min=2)
    job = executor.submit(fn)
    job._results_timeout_s = 1  # how long submitit waits for a result file a finished job did not write (15 s)
    with pytest.raises(submitit.core.utils.UncompletedJobError) as e:
        job.results()
    return job, e.value


def test_a_job_that_exited_with_an_error_line(tmp_path):
    job, e = failed_job(tmp_path, says_error_and_exits)
    line = job_error_line(e)
    assert line == (f"job {job.job_id} ended without a result (state: FINISHED): data.paths[0]: no such file: "
                    f"/nowhere.npy; its log: {job.paths.stderr}"), line


def test_a_job_whose_log_names_srun_is_no_submission_error(tmp_path):
    """A job's error quotes its log, where ``srun`` and ``slurm`` appear: it is not taken for a missing ``srun``."""
    from pretrain_exp.app.slurm_check import submission_error_line

    job, e = failed_job(tmp_path, interrupted_at_the_time_limit)
    assert "srun" in str(e) and "slurm" in str(e).lower()
    assert submission_error_line(e) is None


def test_a_job_stopped_at_its_time_limit_gives_the_runs_own_line(tmp_path):
    job, e = failed_job(tmp_path, interrupted_at_the_time_limit)
    line = job_error_line(e)
    assert line.startswith(f"job {job.job_id} ended without a result (state: ")
    assert ": interrupted (SIGTERM): the newest checkpoint holds step 10 (/s/0); resume with: python -m " \
           f"pretrain_exp -m seed=0; its log: {job.paths.stderr}" in line, line


def test_a_job_that_raised(tmp_path):
    job, e = failed_job(tmp_path, raises)
    assert type(e).__name__ == "FailedJobError"
    assert job_error_line(e) == (f"a job failed: ValueError: Invalid beta parameter at index 0: 2.0; its log: "
                                 f"{job.paths.stderr}")


def test_other_errors_are_not_taken(tmp_path):
    assert job_error_line(RuntimeError("something else")) is None
    with pytest.raises(RuntimeError, match="something else"):
        exit_on_job_error(RuntimeError("something else"))


def test_exit_on_job_error_is_one_line_and_exit_status_1(tmp_path):
    """In a process of its own, as the CLI calls it: stderr holds the one line, nothing else."""
    code = ("import sys; sys.path.insert(0, {root!r}); from tests.unit.app.test_sweep_job_errors import failed_job, "
            "says_error_and_exits\nimport pathlib, pytest\n"
            "from pretrain_exp.app.sweep_check import exit_on_job_error\n"
            "exit_on_job_error(failed_job(pathlib.Path({tmp!r}), says_error_and_exits)[1])\n")
    root = str(Path(__file__).resolve().parents[3])
    proc = subprocess.run([sys.executable, "-c", code.format(root=root, tmp=str(tmp_path))], capture_output=True,
                          text=True, timeout=120, cwd=root)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: job ") and "no such file: /nowhere.npy" in lines[0], lines


def test_a_command_forgets_its_sweep_as_it_ends(tmp_path, monkeypatch):
    """A job error after a command that launched a sweep in the same process names no sweep of that command: the
    in-process sweep of another test once made this file's lines end in ``every job: pretrain-exp-report <its
    sweep>``."""
    from pretrain_exp.app import sweep_check
    from tests.conftest import run_entry_point

    sweep_check._launching.update(dir=tmp_path / "an-earlier-sweep", existed=False, launcher=None)
    assert run_entry_point(monkeypatch, tmp_path, ["training.num_steps=-1"]) == 2  # a command that ends
    job, e = failed_job(tmp_path, says_error_and_exits)
    assert job_error_line(e).endswith(f"; its log: {job.paths.stderr}")

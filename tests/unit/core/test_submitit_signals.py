"""``submitit_interruptible`` inside a real submitit job (submitit's local executor: its job runner installs the
same signal handlers as in a SLURM job): ``SIGTERM`` stops the job with status 143 where no requeue applies, and is
ignored, as submitit ignores it, once submitit requeued the job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def guarded(ready: str) -> str:
    """The job: ``ready`` gets its pid once :func:`submitit_interruptible` is active; then it waits; an
    :class:`Interrupted` ends it with its status, as the CLI does."""
    from pretrain_exp.core.interrupt import Interrupted, exit_now, submitit_interruptible

    try:
        with submitit_interruptible():
            Path(ready).write_text(str(os.getpid()))
            time.sleep(60)
    except Interrupted as e:
        print(f"stopped by {e.name}", flush=True)
        exit_now(e.exit_status)
    return "slept"


def start(tmp_path: Path, max_num_timeout: int):
    import submitit

    executor = submitit.LocalExecutor(folder=str(tmp_path / "jobs"))
    executor.update_parameters(timeout_min=1, max_num_timeout=max_num_timeout)
    ready = tmp_path / "ready"
    job = executor.submit(guarded, str(ready))
    deadline = time.monotonic() + 120
    while not ready.is_file():
        assert job.state not in ("DONE", "FAILED", "INTERRUPTED"), job.stderr()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return job, int(ready.read_text())


def ended(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("usr2_first", [False, True])
def test_sigterm_stops_the_job_where_no_requeue_applies(tmp_path, usr2_first):
    job, pid = start(tmp_path, max_num_timeout=0)
    if usr2_first:  # the time limit is near; submitit declines to requeue (no timeouts left): the job goes on
        os.kill(pid, signal.SIGUSR2)
        assert not ended(pid, timeout=3)
    os.kill(pid, signal.SIGTERM)  # SLURM's time limit
    assert ended(pid)
    out, err = job.stdout() or "", job.stderr() or ""
    assert "stopped by SIGTERM" in out, out + err
    assert "Bypassing signal SIGTERM" not in err
    if usr2_first:
        assert "Job not requeued because: timed-out and not checkpointable" in err + out
        assert "training goes on until SLURM stops the job" in err + out


def test_sigterm_outside_a_submitit_job_is_left_to_interruptible(tmp_path):
    """Outside a submitit job the context manager changes no handler (the CLI's own ``interruptible`` applies)."""
    code = ("import signal; from pretrain_exp.core.interrupt import submitit_interruptible, OWN_GROUP\n"
            "h = signal.getsignal(signal.SIGTERM)\n"
            "with submitit_interruptible(): assert signal.getsignal(signal.SIGTERM) is h and OWN_GROUP == "
            "{'start_new_session': True}\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

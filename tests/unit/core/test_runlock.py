"""The run-dir lock: a live holder refuses a second process with its host and pid; a dead holder's lock (same
host), a requeued SLURM job's old lock and another host's lock without heartbeat are taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from pretrain_exp.core.errors import LaunchError
from pretrain_exp.core.runlock import LOCK_NAME, RunDirLock, process_start
from tests.conftest import ROOT

HOLD = ("import sys; from pretrain_exp.core.runlock import RunDirLock\n"
        "with RunDirLock(sys.argv[1]):\n"
        "    print('held', flush=True); sys.stdin.read()\n")


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of ``tmp_path/run`` until it is killed or its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def write_record(run, **fields):
    rec = {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid()), "slurm_job": None,
           "slurm_restart": 0, "taken": time.time()} | fields
    run.mkdir(parents=True, exist_ok=True)
    (run / LOCK_NAME).write_text(json.dumps(rec))
    return run / LOCK_NAME


def test_a_live_holder_refuses_a_second_process_and_removes_its_lock_at_the_end(tmp_path, holder):
    run = tmp_path / "run"
    with pytest.raises(LaunchError) as ei:
        RunDirLock(run).acquire()
    msg = str(ei.value)
    assert f"in use by pid {holder.pid} on host {socket.gethostname()}" in msg and "\n" not in msg
    holder.stdin.close()  # the holder ends normally: the lock is gone with it
    holder.wait(timeout=30)
    assert not (run / LOCK_NAME).exists()


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path, holder, caplog):
    run = tmp_path / "run"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    assert (run / LOCK_NAME).is_file()  # left behind
    with RunDirLock(run) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert "taking over the stale lock" in caplog.text and f"process {holder.pid} is gone" in caplog.text
    assert not (run / LOCK_NAME).exists()


def test_a_reused_pid_is_not_the_holder(tmp_path):
    run = tmp_path / "run"
    write_record(run, pid=os.getppid(), start="another-boot:1")  # a live pid, but started at another time
    with RunDirLock(run):
        pass
    write_record(run, pid=os.getppid(), start=process_start(os.getppid()))  # the same live process: held
    with pytest.raises(LaunchError, match=f"in use by pid {os.getppid()}"):
        RunDirLock(run).acquire()


def test_another_hosts_lock_lives_by_its_heartbeat(tmp_path):
    run = tmp_path / "run"
    lock = write_record(run, host="node-17", pid=4242)
    with pytest.raises(LaunchError, match="in use by pid 4242 on host node-17"):
        RunDirLock(run, stale_after_s=60).acquire()
    old = time.time() - 120
    os.utime(lock, (old, old))  # no heartbeat for two minutes
    with RunDirLock(run, stale_after_s=60):
        assert json.loads(lock.read_text())["host"] == socket.gethostname()


def test_a_requeued_slurm_job_takes_over_its_old_incarnations_lock(tmp_path, monkeypatch):
    run = tmp_path / "run"
    write_record(run, host="node-3", pid=999, slurm_job="77_5", slurm_restart=0)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "5")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with RunDirLock(run) as lock:  # fresh heartbeat on another host, but the same job restarted
        assert json.loads(lock.path.read_text())["slurm_job"] == "77_5"
    write_record(run, host="node-3", pid=999, slurm_job="78_5", slurm_restart=0)  # another job: held
    with pytest.raises(LaunchError, match="SLURM job 78_5"):
        RunDirLock(run).acquire()


def test_the_heartbeat_touches_a_held_lock(tmp_path):
    with RunDirLock(tmp_path / "run", heartbeat_s=0.05) as lock:
        old = time.time() - 100
        os.utime(lock.path, (old, old))
        time.sleep(0.3)
        assert time.time() - lock.path.stat().st_mtime < 5

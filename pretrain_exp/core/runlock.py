"""One process per run dir: :class:`RunDirLock`, held by the process that launches a run (the Hydra job; under
torchrun the launcher, never the ranks) for as long as the run goes on.

The lock is the file ``<run dir>/.lock``, created exclusively (``O_CREAT | O_EXCL``, which works on NFS and
Lustre too) and holding its holder as JSON: ``host``, ``pid``, the process ``start`` time (from
``/proc/<pid>/stat``, so a reused pid is not mistaken for the holder), the SLURM job (``slurm_job``: array
job/task or job id, ``slurm_restart``: ``SLURM_RESTART_COUNT``) and the time it was taken. A daemon thread
touches the file every :data:`HEARTBEAT_S` seconds while it is held. A second process finds the lock held and is
refused with one :class:`~pretrain_exp.core.errors.LaunchError` naming the holder's host and pid, unless the
lock is stale:

- same host: the holder's pid is gone, or runs another process (another start time);
- same SLURM job, later restart (a requeued job: SLURM never runs two incarnations of one job, so the old one is
  dead, on whichever host it ran);
- another host: the pid cannot be checked from here, so the heartbeat decides: a lock whose file was not touched
  for ``stale_after_s`` seconds (default :data:`STALE_AFTER_S`, ten heartbeats) is stale; a younger one is held.

A stale lock is taken over (logged with the old holder). The holder removes the lock when the run ends, on
error as well; a killed holder leaves it behind, and the next launch takes it over as above.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Optional

from pretrain_exp.core.errors import LaunchError
from pretrain_exp.core.rundir import RunDir

log = logging.getLogger(__name__)

LOCK_NAME = RunDir.LOCK  #: ``<run dir>/.lock``
HEARTBEAT_S = 30.0  #: seconds between touches of a held lock
STALE_AFTER_S = 300.0  #: a lock of another host not touched for this long is stale


def process_start(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (clock ticks since boot, field 22 of ``/proc/<pid>/stat``, with the boot
    id); None if there is no such process or no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{boot}:{ticks}"


def _slurm_job() -> Optional[str]:
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '')}"
    return env.get("SLURM_JOB_ID")


def holder_record() -> dict:
    """This process as a lock holder (module docstring)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid()),
            "slurm_job": _slurm_job(), "slurm_restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
            "taken": time.time()}


class RunDirLock:
    """The lock of one run dir (module docstring); a context manager.

    :param stale_after_s: heartbeat age after which another host's lock is stale.
    :raises LaunchError: on entry, if another live process holds the lock, naming its host and pid.
    """

    def __init__(self, run_dir: str | Path, stale_after_s: float = STALE_AFTER_S, heartbeat_s: float = HEARTBEAT_S):
        self.path = RunDir(run_dir).lock
        self.stale_after_s, self.heartbeat_s = stale_after_s, heartbeat_s
        self.me = holder_record()
        self._stop = threading.Event()
        self._beat: Optional[threading.Thread] = None

    def _read(self) -> Optional[dict]:
        try:
            rec = json.loads(self.path.read_text())
            return rec if isinstance(rec, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # being written, or garbage

    def _age(self) -> float:
        try:
            return time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    def stale_reason(self, rec: dict) -> Optional[str]:
        """Why the lock ``rec`` (its holder) is stale, or None if its holder may still run."""
        me, age = self.me, self._age()
        if not rec:  # no holder written: a crash between create and write, or a write under way
            return f"no holder recorded for {age:.0f} s" if age > 5 else None
        if rec.get("slurm_job") and rec.get("slurm_job") == me["slurm_job"] and \
                int(rec.get("slurm_restart", 0)) < me["slurm_restart"]:
            return f"SLURM job {rec['slurm_job']} was requeued (restart {me['slurm_restart']})"
        if rec.get("host") == me["host"]:
            start = process_start(int(rec.get("pid", -1)))
            if start is None:
                return f"process {rec.get('pid')} is gone"
            if rec.get("start") and start != rec.get("start"):
                return f"pid {rec.get('pid')} now belongs to another process"
            return None
        if age > self.stale_after_s:
            return f"no heartbeat for {age:.0f} s (> {self.stale_after_s:.0f} s)"
        return None

    def acquire(self) -> None:
        """Take the lock, or take over a stale one.

        :raises LaunchError: if another live process holds it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(self.me) + "\n")
                self._start_heartbeat()
                return
            try:
                guard = open(self.path)
            except FileNotFoundError:
                continue
            with guard:  # contenders on this host take turns to judge and remove a stale lock (flock of the file)
                fcntl.flock(guard, fcntl.LOCK_EX)
                rec = self._read()
                if rec is None:
                    continue
                why = self.stale_reason(rec)
                if why is None:
                    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.get("taken", 0)))
                    slurm = f", SLURM job {rec['slurm_job']}" if rec.get("slurm_job") else ""
                    raise LaunchError(f"run dir {self.path.parent} is in use by pid {rec.get('pid')} on host "
                                      f"{rec.get('host')}{slurm} (since {since}; lock file {self.path}); wait for it "
                                      "to end, or give this run its own run dir: name=<new name>")
                log.warning("taking over the stale lock of %s (pid %s on %s): %s", self.path.parent, rec.get("pid"),
                            rec.get("host"), why)
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
        raise LaunchError(f"run dir {self.path.parent}: could not take its lock {self.path} (contended)")

    def _start_heartbeat(self) -> None:
        def beat():
            while not self._stop.wait(self.heartbeat_s):
                with contextlib.suppress(OSError):
                    os.utime(self.path)

        self._stop.clear()
        self._beat = threading.Thread(target=beat, name="run-dir-lock-heartbeat", daemon=True)
        self._beat.start()

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still this process's."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        rec = self._read()
        if rec and rec.get("pid") == self.me["pid"] and rec.get("host") == self.me["host"]:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def __enter__(self) -> "RunDirLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

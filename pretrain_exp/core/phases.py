"""Where a run's time goes before its first training step: one log line per phase and ``<run dir>/phases.json``.

Every process has one recorder, :data:`PHASES`. The code of each phase wraps itself in ``PHASES.phase(name)``
(or records a duration measured elsewhere with :meth:`Phases.add`, or an instant with :meth:`Phases.mark`); each
finished phase is logged as ``phase <name>: <seconds> s`` and, once the run has attached its run dir
(:meth:`Phases.attach`, rank 0), the whole record is rewritten atomically into ``phases.json``::

    {"process_start": <unix time>, "phases": [{"name": "size index", "start_s": 4.1, "seconds": 0.8, ...}, ...],
     "events": {"first step": {"at_s": 61.2, "unix": <unix time>, "step": 1}}}

``start_s`` and ``at_s`` are seconds since the process started (``/proc/self/stat``; where that cannot be read,
since this module was imported); extra keys of a phase say what it measured (``cached``, ``files``, ``rows``, ...),
set on the record the ``with`` block yields; the settings the run ran under are in ``config.resolved.yaml``, not
repeated here. The event
``first step`` is the moment the training engine has the first batch in hand and starts the step
(``benchmarks/first_step.py`` reads it). Wall-clock seconds (``time.time``), so a parent process can compare them
with its own clock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from pretrain_exp.core.rundir import RunDir

log = logging.getLogger(__name__)

FIRST_STEP = "first step"  #: the event of the first training step's start


def process_start_time() -> float:
    """Unix time at which this process started (``/proc/self/stat`` field 22 and the boot time of ``/proc/stat``);
    the current time where ``/proc`` is missing."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of the whole line: starttime, clock ticks after boot
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class Phases:
    """The phase record of this process (module docstring). Thread-safe."""

    def __init__(self):
        self.process_start = process_start_time()
        self.phases: List[Dict[str, Any]] = []
        self.events: Dict[str, Dict[str, Any]] = {}
        self.path: Optional[Path] = None
        self._lock = threading.Lock()

    def attach(self, run_dir: str | Path) -> None:
        """Write ``<run_dir>/phases.json`` now and after every later phase (call on rank 0 only)."""
        self.path = RunDir(run_dir).phases
        self._write()

    def add(self, name: str, seconds: float, start: Optional[float] = None, **info: Any) -> Dict[str, Any]:
        """Record phase ``name`` that took ``seconds`` (and began at unix time ``start``, default: ``seconds``
        ago); logs it and returns its record."""
        start = time.time() - seconds if start is None else start
        rec = {"name": name, "start_s": round(start - self.process_start, 4), "seconds": round(seconds, 4), **info}
        with self._lock:
            self.phases.append(rec)
        extra = ", ".join(f"{k}={v}" for k, v in info.items())
        log.debug("phase %s: %.2f s%s", name, seconds, f" ({extra})" if extra else "")
        self._write()
        return rec

    @contextlib.contextmanager
    def phase(self, name: str, **info: Any) -> Iterator[Dict[str, Any]]:
        """Time the ``with`` block as phase ``name``; the yielded dict takes extra keys to record with it (also when
        the block raises, which is recorded as ``failed``)."""
        extra: Dict[str, Any] = dict(info)
        start = time.time()
        ok = False
        try:
            yield extra
            ok = True
        finally:
            if not ok:
                extra["failed"] = True
            self.add(name, time.time() - start, start, **extra)

    def mark(self, name: str, once: bool = True, **info: Any) -> None:
        """Record the instant ``name`` (the first one only, with ``once``) and log it with the seconds since the
        process started."""
        now = time.time()
        with self._lock:
            if once and name in self.events:
                return
            self.events[name] = {"at_s": round(now - self.process_start, 4), "unix": now, **info}
        log.debug("phase event %s: %.2f s after the process started", name, now - self.process_start)
        self._write()

    def summary(self) -> Dict[str, Any]:
        """The record as ``phases.json`` holds it."""
        with self._lock:
            return {"process_start": self.process_start, "phases": [dict(p) for p in self.phases],
                    "events": {k: dict(v) for k, v in self.events.items()}}

    def _write(self) -> None:
        if self.path is None:
            return
        from pretrain_exp.core.io import write_json

        try:
            write_json(self.path, self.summary())
        except OSError as e:  # a record of timings never stops a run
            log.debug("%s not written: %s", self.path, e)


PHASES = Phases()  #: this process's recorder

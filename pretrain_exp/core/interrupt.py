"""Stopping a run on ``SIGINT`` (Ctrl-C) and ``SIGTERM`` (``kill``, SLURM's time limit): at once, every child
process with it, one line, exit status ``128 + signal`` (130, 143).

While :func:`interruptible` is active, the first of these signals raises :class:`Interrupted` (a
``KeyboardInterrupt``) in the main thread, wherever it is: the run's ``on_error`` hooks run and its context managers
close on the way out, as for Ctrl-C; the process then ends with :func:`exit_now`. Every write a reader takes is
atomic (a temporary file renamed into place, :mod:`pretrain_exp.core.io`; a checkpoint counts once its framework's
last file is written), so what is there after the signal is what the re-run resumes from. A second signal while
the first is being handled stops at once: the children are killed, ``on_second`` runs (it prints the line) and the
process exits with ``128 + signal``.

The child processes a run starts (the audit beside training, the window stream, background evals, torchrun) run in
process groups of their own (:data:`OWN_GROUP`), so that a Ctrl-C on the terminal reaches the run alone and no
child prints a traceback of its own; they are :func:`track`-ed and :func:`stop_children` stops them (their whole
group: ``SIGTERM``, then ``SIGKILL`` after a grace period). torchrun stops its ranks itself on ``SIGTERM``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import Callable, Iterator, Optional

#: the signals :func:`interruptible` handles
SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: seconds :func:`stop_children` waits after ``SIGTERM`` before ``SIGKILL`` (torchrun's own wait for its ranks)
GRACE_S = 30.0
#: ``subprocess.Popen`` keywords of a child in a process group (and session) of its own
OWN_GROUP = {"start_new_session": True}

_children: "weakref.WeakSet[subprocess.Popen]" = weakref.WeakSet()
_local = threading.local()  #: ``depth``: nesting of :func:`signals_deferred`; ``pending``: the signal it holds
_state: dict = {"handler": None, "received": None}  #: the active handler; the first signal's :class:`Interrupted`


class Interrupted(KeyboardInterrupt):
    """The run was stopped by signal ``signum``; :attr:`exit_status` is ``128 + signum``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        """The signal's name (``SIGINT``)."""
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """``128 + signum``: the shell's status of a process ended by the signal."""
        return 128 + self.signum


def track(proc: subprocess.Popen) -> subprocess.Popen:
    """Register a child process (started with :data:`OWN_GROUP`) for :func:`stop_children`; returns it."""
    _children.add(proc)
    return proc


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to ``proc``'s process group (it leads one), or to ``proc`` alone if it leads none."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)


def stop_children(grace_s: float = GRACE_S, kill: bool = False) -> None:
    """Stop every :func:`track`-ed child that still runs, with its process group: ``SIGTERM`` (``SIGKILL`` with
    ``kill``), then ``SIGKILL`` for those still running after ``grace_s`` seconds; reaps them."""
    live = [p for p in list(_children) if p.poll() is None]
    for p in live:
        _signal_group(p, signal.SIGKILL if kill else signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in live:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()


def signal_handler() -> Optional[Callable]:
    """The handler :func:`interruptible` installed (``None`` outside it): for an engine that installs its own
    while it trains (OLMo-core's ``Trainer.fit``), so that a signal stops the run there too."""
    return _state["handler"]


def received() -> Optional[Interrupted]:
    """The first signal's :class:`Interrupted` once one arrived in :func:`interruptible`, else ``None``."""
    return _state["received"]


def exit_now(status: int) -> None:
    """End the process with ``status`` once the output and the log records are flushed, without the interpreter's
    shutdown: that joins the engines' background threads (an asynchronous checkpoint save waiting on a rank that is
    gone would hold the process, and one that can no longer schedule its work prints a traceback). What such a
    save leaves is a temporary folder no reader takes."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(status)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """In the main thread, a first signal of :func:`interruptible` that arrives while the block runs raises its
    :class:`Interrupted` when the block ends instead of inside it (a console line is written whole, once: a
    write cut by the exception would be written again when the progress display closes). Elsewhere a no-op."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth
        pending = getattr(_local, "pending", None)
        if depth == 0 and pending is not None:
            _local.pending = None
            raise pending


@contextlib.contextmanager
def interruptible(on_second: Optional[Callable[[Interrupted], None]] = None) -> Iterator[None]:
    """Handle :data:`SIGNALS` while the block runs (module docstring); the previous handlers come back afterwards.
    Only in the main thread (elsewhere it changes nothing).

    :param on_second: called with the first signal's :class:`Interrupted` when a second signal arrives, before the
        process exits with its status (it must not raise).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list = []

    def handler(signum, frame):
        if not first:
            first.append(Interrupted(signum))
            _state["received"] = first[0]
            if getattr(_local, "depth", 0):  # in signals_deferred (the handler runs in the main thread)
                _local.pending = first[0]
                return
            raise first[0]
        stop_children(grace_s=1.0, kill=True)
        if on_second is not None:
            on_second(first[0])
        os._exit(first[0].exit_status)

    saved = {s: signal.signal(s, handler) for s in SIGNALS}
    outer = dict(_state)
    _state.update(handler=handler, received=None)
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        _state.update(outer)

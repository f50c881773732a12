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

In a SLURM job of submitit (Hydra's SLURM launcher), :func:`submitit_interruptible` does the same where it does not
interfere with submitit's requeue: submitit's preemption signal still checkpoints and requeues the job, and a
``SIGTERM`` (SLURM's time limit, ``scancel``) stops the run only where no requeue applies.
"""

from __future__ import annotations

import contextlib
import functools
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
#: ``subprocess.Popen`` keywords of a child in a process group (and session) of its own (in a SLURM job of
#: submitit's, also one that ignores submitit's preemption signal: :func:`submitit_interruptible`)
OWN_GROUP: dict = {"start_new_session": True}

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


def _submitit_handler(handler: object) -> bool:
    """Whether ``handler`` (a signal handler) is submitit's (a method of its job's ``SignalHandler``)."""
    owner = getattr(handler, "__self__", None)
    return owner is not None and type(owner).__module__.startswith("submitit.")


@contextlib.contextmanager
def submitit_interruptible(on_second: Optional[Callable[[Interrupted], None]] = None) -> Iterator[None]:
    """:func:`interruptible` for the block, in a job of submitit (Hydra's SLURM launcher) where that does not
    interfere with submitit's requeue; a no-op elsewhere (submitit's handlers not installed, or not the main thread).

    submitit handles its preemption signal (``SIGUSR2``, ``$SUBMITIT_PREEMPT_SIGNAL``: SLURM sends it
    ``signal_delay_s`` before the time limit or on preemption) by checkpointing the job and requeueing it
    (``scontrol requeue``, which SIGTERMs the job), and ignores ``SIGTERM``. Here its handler still runs first;
    ``SIGTERM`` is ignored as before while it runs, once it requeued, and in a task that leaves the requeue to
    global rank 0. Where no requeue applies (submitit declines: ``max_num_timeout`` reached, or no such signal came,
    e.g. SLURM's ``SIGTERM`` at the time limit or ``scancel``), ``SIGTERM`` and ``SIGINT`` stop the run as
    :func:`interruptible` does: :class:`Interrupted` in the main thread, exit status 143 / 130 for the caller to
    give. A declined requeue lets training go on until that ``SIGTERM`` (logged). The children started with
    :data:`OWN_GROUP` meanwhile ignore the preemption signal, which SLURM sends to every process of the job step.
    """
    usr = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
    theirs = signal.getsignal(usr) if usr is not None else None
    if threading.current_thread() is not threading.main_thread() or not _submitit_handler(theirs):
        yield
        return
    from submitit.core.utils import UncompletedJobError

    their_term = signal.getsignal(signal.SIGTERM)
    state: list = [None]  #: None, "handling", "requeued" (or left to rank 0), "declined"

    def on_usr(signum, frame):
        state[0] = "handling"
        try:
            theirs(signum, frame)
        except UncompletedJobError as e:  # submitit's way of saying "not requeued"
            state[0] = "declined"
            logging.getLogger(__name__).warning("%s: %s; training goes on until SLURM stops the job (SIGTERM)",
                                                signal.Signals(signum).name, str(e).rstrip("."))
            return
        except BaseException:  # SystemExit once it requeued the job
            state[0] = "requeued"
            raise
        state[0] = "requeued"  # returned: a task of global rank > 0, whose requeue is rank 0's

    def on_term(signum, frame):
        if state[0] in ("handling", "requeued"):
            if callable(their_term):
                their_term(signum, frame)
            return
        _state["handler"](signum, frame)

    with interruptible(on_second):
        saved = {s: signal.signal(s, h) for s, h in ((usr, on_usr), (signal.SIGTERM, on_term))}
        # SLURM sends the signal to every process of the job step: the children ignore it (an ignored signal stays
        # ignored across exec), else it kills them (the audit, torchrun and its ranks) where no requeue follows
        OWN_GROUP["preexec_fn"] = functools.partial(signal.signal, usr, signal.SIG_IGN)
        try:
            yield
        finally:
            OWN_GROUP.pop("preexec_fn", None)
            for s, h in saved.items():
                signal.signal(s, h)

"""The natural-duplicate audit beside training: :func:`~pretrain_exp.insertion.audit.audit_plan` in a process of
its own, so that ``insertion.audit=on`` keeps nothing proportional to the window on the path to the first step.

:class:`BackgroundAudit` writes a job spec (JSON: the token files as the run maps them, their dtype, the order's
``L``, ``B``, seed, first epoch and chunk, the window's rows, the held-out rows, ``n``, the EOS id stripped from the
items, the worker processes, where to write) and the static plan (``static.npz``) into a temporary folder of the
audit cache (``<cache>/audits/.job-*/``), and starts ``python -m pretrain_exp.insertion.audit_job <spec>``: a
fresh interpreter (no fork of a process holding the trainer's threads, no inherited file descriptors such as the
run dir's lock) at a lower CPU priority (``os.nice``), whose pool of scanning processes
(:func:`~pretrain_exp.insertion.audit.scan_parallel`) runs on the cores the trainer leaves idle. It rebuilds the
token files and the data order from the caches (size index, permutation), reads the window's rows, waiting for the
window stream where one is running (:mod:`pretrain_exp.data.stream`), computes the audit exactly as the run would
in its own process, and writes it to the audit cache (``<cache>/audits/<key>.json``, for the sweep's other jobs)
and to the run's ``audit.json``. The counts do not depend on where the audit runs (the same function on the same
rows); ``tests/unit/app/test_audit_run.py`` compares them with an audit computed in the run's process.

The run polls the job at its segment ends (:meth:`BackgroundAudit.poll`) and waits for it before it writes its
results (:meth:`BackgroundAudit.wait`, logged with the seconds it waited). The job stops itself when the run's
process is gone; a job still running when the run's interpreter exits is terminated.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np

from pretrain_exp.core.commands import stop_process
from pretrain_exp.core.errors import InsertionError
from pretrain_exp.core.interrupt import OWN_GROUP, track
from pretrain_exp.core.io import write_json
from pretrain_exp.core.logs import child_logging
from pretrain_exp.insertion.audit import AuditResult

log = logging.getLogger(__name__)

NICE = 10  #: CPU priority increment of the audit process (and its scanning workers)
PARENT_CHECK_S = 2.0  #: how often the job checks that the run's process is still there, seconds
JOB_PLAN = "static.npz"  #: the static plan's file in the job's temporary folder (not a run dir)


class BackgroundAudit:
    """The audit of ``plan`` over the window of ``order`` in a process of its own (module docstring).

    :param plan: the static plan (its items are audited; the placement does not matter).
    :param order: the run's :class:`~pretrain_exp.data.order.DataOrder` (its files, dtype and order settings;
        ``order.gate``, a running window stream's gate, is handed over).
    :param window_rows: ``(first, end)``: the training-order rows the run trains.
    :param held_rows: ``int64`` training-order rows held out for perplexity.
    :param n: n-gram length; ``strip``: the EOS id dropped from the items' ends (or ``None``).
    :param workers: scanning processes of the job.
    :param out: the run's ``audit.json``; ``shared``: the audit cache entry ``<cache>/audits/<key>.json``.
    :param mode: ``insertion.audit`` as recorded in the files (``"on"``).
    """

    def __init__(self, plan, order, window_rows: tuple[int, int], held_rows: np.ndarray, n: int,
                 strip: Optional[int], workers: int, out: Path, shared: Path, mode: str):
        self.plan, self.order = plan, order
        self.window_rows = (int(window_rows[0]), int(window_rows[1]))
        self.held_rows = np.asarray(held_rows, dtype=np.int64)
        self.n, self.strip, self.workers = int(n), strip, int(workers)
        self.out, self.shared, self.mode = Path(out), Path(shared), str(mode)
        self.proc: Optional[subprocess.Popen] = None
        self.tmp: Optional[Path] = None
        self.started = 0.0
        self.waited_s = 0.0  #: seconds :meth:`wait` held the run

    def spec(self) -> dict:
        """The job spec (JSON-ready)."""
        files, o = self.order.files, self.order
        gate = getattr(o, "gate", None)
        return {"version": 1, "paths": [str(p) for p in files.paths], "dtype": files.dtype.name,
                "cache_dir": str(files.cache_dir) if files.cache_dir is not None else None,
                "sequence_length": o.sequence_length, "global_batch_size": o.global_batch_size, "seed": o.seed,
                "first_epoch": o.first_epoch, "chunk": o.chunk, "window_rows": list(self.window_rows),
                "held_rows": self.held_rows.tolist(), "n": self.n, "strip": self.strip, "workers": self.workers,
                "out": str(self.out), "shared": str(self.shared), "mode": self.mode, "plan": JOB_PLAN,
                "gate": gate.to_json() if gate is not None else None, "parent": os.getpid()}

    def start(self) -> "BackgroundAudit":
        """Write the spec and the plan, start the job; returns ``self``."""
        self.shared.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=".job-", dir=self.shared.parent))
        self.plan.save(self.tmp / JOB_PLAN)
        write_json(self.tmp / "spec.json", self.spec())
        env = dict(os.environ)
        root = Path(__file__).resolve().parents[2]
        if (root / "pyproject.toml").is_file():  # a checkout (an installed package is found as it is)
            env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.started = time.monotonic()
        self.proc = track(subprocess.Popen([sys.executable, "-m", "pretrain_exp.insertion.audit_job",
                                            str(self.tmp / "spec.json")], env=env, stdin=subprocess.DEVNULL,
                                           **OWN_GROUP))
        atexit.register(self.close)
        log.info("audit: %d items against %d window rows and %d held-out rows, beside training (process %d, %d "
                 "scanning process(es) at lower priority)", self.plan.num_items,
                 self.window_rows[1] - self.window_rows[0], self.held_rows.size, self.proc.pid, self.workers)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def poll(self) -> Optional[AuditResult]:
        """The result once the job has ended, else ``None``.

        :raises InsertionError: if the job failed (its error message, and that a re-run audits again).
        """
        if self.proc is None or self.proc.poll() is None:
            return None
        return self._result()

    def wait(self) -> AuditResult:
        """Wait for the job (logged when it is still running) and return its result.

        :raises InsertionError: see :meth:`poll`.
        """
        if self.proc is not None and self.proc.poll() is None:
            log.info("audit: waiting for the natural-duplicate audit beside training (running for %.0f s)",
                     time.monotonic() - self.started)
            t0 = time.monotonic()
            self.proc.wait()
            self.waited_s = time.monotonic() - t0
            log.info("audit: done; the run waited %.1f s for it", self.waited_s)
        return self._result()

    def _result(self) -> AuditResult:
        code = self.proc.returncode
        error = self.tmp / "error.txt" if self.tmp is not None else None
        why = error.read_text().strip() if error is not None and error.is_file() else f"exit status {code}"
        try:
            if code != 0:
                raise InsertionError(f"the natural-duplicate audit beside training failed: {why}; re-run the same "
                                     "command to audit again (or insertion.audit=off)")
            return AuditResult.load(self.out)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the job if it still runs and remove its temporary folder."""
        if self.proc is not None:
            stop_process(self.proc)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        atexit.unregister(self.close)


def _watch_parent(parent: int) -> None:
    """End this process (and its scanning workers) when the run's process ``parent`` is gone."""
    while True:
        time.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            import multiprocessing

            for child in multiprocessing.active_children():
                child.terminate()
            os._exit(3)


def run_job(spec_path: str | Path) -> AuditResult:
    """The job: read the spec (module docstring), audit, write the audit cache entry and ``audit.json``."""
    from pretrain_exp.data.order import DataOrder
    from pretrain_exp.data.token_files import TokenFiles
    from pretrain_exp.insertion.audit import audit_plan
    from pretrain_exp.insertion.plan import Plan

    spec_path = Path(spec_path)
    spec = json.loads(spec_path.read_text())
    files = TokenFiles(spec["paths"], np.dtype(spec["dtype"]), cache_dir=spec["cache_dir"], progress=False)
    order = DataOrder(files, spec["sequence_length"], spec["global_batch_size"], spec["seed"], spec["first_epoch"],
                      cache_dir=spec["cache_dir"], chunk=spec["chunk"])
    if spec.get("gate"):
        from pretrain_exp.data.stream import StreamGate

        order.gate = StreamGate.from_json(spec["gate"], drives=False)  # follows the stream, never moves it
    plan = Plan.load(spec_path.parent / spec["plan"])
    a, b = spec["window_rows"]
    res = audit_plan(plan, order.row_tokens, np.arange(a, b, dtype=np.int64), np.asarray(spec["held_rows"], np.int64),
                     spec["n"], strip=spec["strip"], workers=spec["workers"])
    res.save(spec["shared"], plan, spec["mode"])
    res.save(spec["out"], plan, spec["mode"])
    return res


def main(argv=None) -> None:
    """``python -m pretrain_exp.insertion.audit_job SPEC``: run :func:`run_job` at lower priority; on an error write
    its message to ``error.txt`` beside the spec and exit with status 1."""
    argv = sys.argv[1:] if argv is None else argv
    spec_path = Path(argv[0])
    child_logging(quiet=True)  # the run logs the audit's counts and seconds when it collects it
    try:
        os.nice(NICE)
    except OSError:
        pass
    parent = json.loads(spec_path.read_text()).get("parent")
    if parent:
        threading.Thread(target=_watch_parent, args=(int(parent),), daemon=True).start()
    try:
        run_job(spec_path)
    except Exception as e:  # noqa: BLE001  (reported to the run, which raises it)
        (spec_path.parent / "error.txt").write_text(f"{type(e).__name__}: {e}\n")
        log.error("audit failed: %s: %s", type(e).__name__, e)
        sys.exit(1)


if __name__ == "__main__":
    main()

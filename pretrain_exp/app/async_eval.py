"""``eval.mode=async``: a segment's evals run in a separate process (or SLURM job) while training goes on.

After each segment, rank 0 of the run writes the segment's HF model dir ``<run dir>/hf/step<N>/`` (an OLMo-core
checkpoint's export; an HF checkpoint's model files, hard-linked, so that ``training.keep_last_checkpoints`` may
delete the checkpoint meanwhile), writes the marker ``evals/step<N>/.async.json`` (which tasks, where, since when)
and starts::

    python -m pretrain_exp.app.eval_worker <config.resolved.yaml> <step> <hf dir>

which evaluates the missing tasks of that step exactly as ``inline`` does (:meth:`Experiment.evaluate
<pretrain_exp.app.experiment.Experiment.evaluate>`: the same items, batches and code, so the same numbers) and
writes ``evals/step<N>/<task>.json`` (atomically) and its log ``evals/step<N>/async.log``. The run polls its
evals between segments: finished ones are logged to W&B at their own global step, their marker and (unless
``training.export_hf`` keeps it) their HF dir removed. Before ``results.json`` the run waits for the rest.

No run waits on a job it blocks: at that final wait, a SLURM eval job still pending (not started, e.g. queued for
the resources the run itself holds) after ``eval.async_pending_wait_s`` seconds is cancelled (``scancel
--state=PENDING``, so a job that has just started is left to finish) and its evals run in the run's own
allocation (the same worker as a child process, output into the same ``async.log``), logged with the wait.

Where the process runs (``eval.async_launcher``): ``local`` (a child process on this node), ``slurm`` (a SLURM job
of one task, submitted through submitit with the run's own launcher settings, read from ``.hydra/hydra.yaml``:
partition, account, time, memory, CPUs, GPUs), or ``auto`` (``slurm`` when the run itself was launched by
``hydra/launcher=slurm*``, else ``local``).

A kill at any point loses no finished eval: a re-run of the same command starts processes for the evals still
missing (their HF dirs are removed only once their evals are written). ``python -m pretrain_exp.report <dir>``
names the pending ones (:func:`~pretrain_exp.report.pending.pending_evals`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from pretrain_exp.core.errors import LaunchError
from pretrain_exp.core.interrupt import OWN_GROUP, track
from pretrain_exp.core.io import default_mode, write_json
from pretrain_exp.core.rundir import RunDir

log = logging.getLogger(__name__)

LOG = RunDir.ASYNC_LOG  #: ``evals/step<N>/async.log``: its output
#: files of an HF checkpoint dir that an eval does not read (optimizer, scheduler, RNG and trainer state)
NOT_MODEL = ("optimizer", "scheduler", "rng_state", "trainer_state", "training_args")


def link_model_files(src: Path, out: Path) -> Path:
    """An HF model dir at ``out`` holding ``src``'s model, config and tokenizer files (not its optimizer,
    scheduler, RNG or trainer state), hard-linked where the filesystem allows (copied otherwise); written into a
    temporary sibling and renamed, so ``out`` is whole or absent. An existing ``out`` is kept."""
    if out.is_dir():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        for f in sorted(Path(src).iterdir()):
            if f.is_file() and not f.name.startswith(NOT_MODEL):
                try:
                    os.link(f, tmp / f.name)
                except OSError:
                    shutil.copy2(f, tmp / f.name)
        os.chmod(tmp, default_mode(directory=True))
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def run_launcher(run_dir: Path) -> Dict[str, Any]:
    """The Hydra launcher settings the run was started with (``.hydra/hydra.yaml``'s ``hydra.launcher``, with
    its interpolations such as ``name: ${hydra.job.name}`` resolved against that file; a value that does not
    resolve there is left out); ``{}`` when absent, e.g. a run started through the worker entry point."""
    from omegaconf import OmegaConf

    path = RunDir(run_dir).hydra_file("hydra")
    if not path.is_file():
        return {}
    cfg = OmegaConf.load(path)
    launcher = OmegaConf.select(cfg, "hydra.launcher")
    if not OmegaConf.is_dict(launcher):
        return {}
    out: Dict[str, Any] = {}
    for key in launcher:
        try:
            value = launcher[key]
            out[str(key)] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception:  # noqa: BLE001  (a resolver of Hydra's runtime, e.g. ${now:...}: not needed here)
            continue
    return out


def resolve_launcher(choice: str, run_dir: Path) -> str:
    """``local`` or ``slurm`` for ``eval.async_launcher`` = ``choice`` (module docstring)."""
    if choice != "auto":
        return choice
    return "slurm" if "SlurmLauncher" in str(run_launcher(run_dir).get("_target_", "")) else "local"


#: settings of hydra-submitit-launcher's SLURM config that submitit's ``AutoExecutor`` takes without the
#: ``slurm_`` prefix; the rest (partition, account, qos, constraint, ...) take it
_COMMON = ("timeout_min", "mem_gb", "cpus_per_task", "gpus_per_node", "name")
#: settings that describe the training job's shape or Hydra's bookkeeping, not an eval job's
_SKIP = ("_target_", "submitit_folder", "nodes", "tasks_per_node", "max_num_timeout", "setup", "signal_delay_s",
         "array_parallelism", "additional_parameters", "srun_args", "stderr_to_stdout")


def slurm_parameters(launcher: Dict[str, Any]) -> Dict[str, Any]:
    """submitit ``AutoExecutor.update_parameters`` keywords for an eval job, from the run's launcher settings
    (hydra-submitit-launcher's ``SlurmQueueConf`` field names): one node, one task, at most one GPU."""
    out: Dict[str, Any] = {"nodes": 1, "tasks_per_node": 1}
    for key, value in launcher.items():
        if key in _SKIP or value is None:
            continue
        out[key if key in _COMMON else f"slurm_{key}"] = value
    if out.get("gpus_per_node"):
        out["gpus_per_node"] = 1
    extra = launcher.get("additional_parameters") or {}
    if extra:
        out["slurm_additional_parameters"] = dict(extra)
    out["name"] = f"{launcher.get('name') or 'pretrain_exp'}-eval"
    return out


def slurm_state(job_id: str) -> Optional[str]:
    """The SLURM state of ``job_id`` as ``squeue`` says it (``PENDING``, ``RUNNING``, ...; works without
    accounting), or ``None`` when the job has left the queue or ``squeue`` cannot answer."""
    try:
        proc = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    state = proc.stdout.strip().splitlines()
    return state[0].strip() if proc.returncode == 0 and state else None


def cancel_if_pending(job_id: str) -> bool:
    """Cancel SLURM job ``job_id`` only while it is still pending (``scancel --state=PENDING``); ``True`` when it
    was cancelled before it started, ``False`` when it had started (it is left to finish) or the state stays
    unknown for 10 s."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["scancel", "--state=PENDING", str(job_id)], capture_output=True, timeout=60)
    for _ in range(50):  # the controller applies the cancel asynchronously
        state = slurm_state(job_id)
        if state != "PENDING":
            return state in ("CANCELLED", None)
        time.sleep(0.2)
    return False


@dataclass
class _Job:
    step: int
    handle: Any  #: ``subprocess.Popen`` (local) or ``submitit.Job`` (slurm)
    log_path: Path
    argv: List[str] = field(default_factory=list)  #: the eval worker's arguments (config, step, HF dir)
    config: Optional[Path] = None  #: a private unredacted config to delete when done
    reported: bool = False

    def done(self) -> bool:
        return self.handle.poll() is not None if isinstance(self.handle, subprocess.Popen) else self.handle.done()

    def failure(self) -> Optional[str]:
        """``None`` when the job succeeded, else why it did not."""
        if isinstance(self.handle, subprocess.Popen):
            rc = self.handle.returncode
            return None if rc == 0 else f"exit status {rc}"
        try:
            self.handle.result()
        except Exception as e:  # noqa: BLE001  (submitit re-raises the job's failure here)
            return f"SLURM job {self.handle.job_id}: {type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}"
        return None


@dataclass
class AsyncEvals:
    """The async evals of one run (rank 0 only): :meth:`launch` one per evaluated step, :meth:`poll` between
    segments, :meth:`wait` before ``results.json``."""

    run_dir: Path
    config: Path  #: the config file the eval processes read (``config.resolved.yaml`` or a private copy)
    launcher: str  #: ``local`` or ``slurm``
    private_config: bool = False  #: ``config`` holds credentials: removed once no eval process needs it
    jobs: Dict[int, _Job] = field(default_factory=dict)

    def launch(self, step: int, hf_dir: Path, tasks: List[str]) -> None:
        """Start the evals ``tasks`` of ``step`` on the HF model dir ``hf_dir`` (module docstring).

        :raises LaunchError: if the process or SLURM job cannot be started.
        """
        rd = RunDir(self.run_dir)
        rd.eval_dir(step).mkdir(parents=True, exist_ok=True)
        argv = [str(self.config), str(step), str(hf_dir)]
        log_path = rd.eval_log(step)
        if self.launcher == "slurm":
            try:
                import submitit

                executor = submitit.AutoExecutor(folder=str(rd.eval_slurm), cluster="slurm")
                executor.update_parameters(**slurm_parameters(run_launcher(self.run_dir)))
                command = [sys.executable, "-m", "pretrain_exp.app.eval_worker", *argv, "--log", str(log_path)]
                handle = executor.submit(submitit.helpers.CommandFunction(command, cwd=os.getcwd()))
            except Exception as e:  # noqa: BLE001  (sbatch missing or refusing)
                raise LaunchError(f"eval.async_launcher=slurm: submitting the evals of step {step} failed: "
                                  f"{type(e).__name__}: {e}") from e
            where = {"launcher": "slurm", "job_id": str(handle.job_id)}
        else:
            with open(log_path, "ab") as f:
                handle = track(subprocess.Popen([sys.executable, "-m", "pretrain_exp.app.eval_worker", *argv],
                                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                **OWN_GROUP))
            where = {"launcher": "local", "host": socket.gethostname(), "pid": handle.pid}
        write_json(rd.eval_marker(step), {"step": step, "tasks": tasks, "hf_dir": str(hf_dir), **where,
                                          "started": time.strftime("%Y-%m-%dT%H:%M:%S")})
        self.jobs[step] = _Job(step, handle, log_path, argv)
        log.info("evaluating step %d in the background (%s): %s; log %s", step,
                 f"SLURM job {where['job_id']}" if "job_id" in where else f"pid {where['pid']}", ", ".join(tasks),
                 log_path)

    def poll(self) -> List[int]:
        """Steps whose evals finished since the last call (successfully or not; :meth:`failures` says)."""
        out = []
        for job in self.jobs.values():
            if not job.reported and job.done():
                job.reported = True
                out.append(job.step)
        return sorted(out)

    def wait(self, pending_wait_s: float = 60.0, poll_s: float = 0.2) -> List[int]:
        """Wait for every started eval; a SLURM eval job still pending after ``pending_wait_s`` seconds of this
        wait is cancelled and its evals run here, in the run's own allocation (module docstring). Returns the
        steps that finished during the wait."""
        waiting = [j.step for j in self.jobs.values() if not j.done()]
        if waiting:
            log.info("waiting for the background evals of step(s) %s", ", ".join(map(str, waiting)))
        t0 = time.perf_counter()
        next_check = t0 + pending_wait_s
        while not all(j.done() for j in self.jobs.values()):
            if time.perf_counter() >= next_check:
                self._take_over_pending(time.perf_counter() - t0)
                next_check = time.perf_counter() + 5.0  # a requeued job may become pending again
            time.sleep(poll_s)
        if waiting:
            log.info("background evals done after %.1f s of waiting", time.perf_counter() - t0)
        return self.poll()

    def _take_over_pending(self, waited_s: float) -> None:
        """Run here, one after another, the evals of the SLURM jobs that have not started (cancelled first)."""
        for job in sorted(self.jobs.values(), key=lambda j: j.step):
            if isinstance(job.handle, subprocess.Popen) or job.done():
                continue
            job_id = str(job.handle.job_id)
            if slurm_state(job_id) != "PENDING" or not cancel_if_pending(job_id):
                continue
            log.warning("the eval job of step %d (SLURM job %s) had not started after %.1f s of the final wait "
                        "(pending, e.g. for the resources this run holds): cancelled; running its evals in this "
                        "run's allocation (log %s)", job.step, job_id, waited_s, job.log_path)
            marker = RunDir(self.run_dir).eval_marker(job.step)
            with contextlib.suppress(OSError, ValueError):  # the report's view of it: here now, not in SLURM
                rec = {k: v for k, v in json.loads(marker.read_text()).items() if k != "job_id"}
                write_json(marker, {**rec, "launcher": "inline", "host": socket.gethostname(), "pid": os.getpid(),
                                    "cancelled_job_id": job_id})
            t0 = time.perf_counter()
            with open(job.log_path, "ab") as f:
                job.handle = track(subprocess.Popen([sys.executable, "-m", "pretrain_exp.app.eval_worker", *job.argv],
                                                    stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                    **OWN_GROUP))
                job.handle.wait()
            log.info("evals of step %d run in this run's allocation in %.1f s (exit status %d)", job.step,
                     time.perf_counter() - t0, job.handle.returncode)

    def failures(self) -> Dict[int, str]:
        """``{step: why}`` of the finished evals that failed."""
        return {j.step: f"{j.failure()} (log: {j.log_path})" for j in self.jobs.values()
                if j.done() and j.failure() is not None}

    def close(self) -> None:
        """Remove the private config copy (if any) once no eval process runs."""
        if self.private_config and all(j.done() for j in self.jobs.values()):
            with contextlib.suppress(FileNotFoundError):
                self.config.unlink()

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
from pretrain_exp.core.io import default_mode, write_json
from pretrain_exp.report.pending import MARKER

log = logging.getLogger(__name__)

LOG = "async.log"  #: ``evals/step<N>/async.log``: its output
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
    """The Hydra launcher settings the run was started with (``.hydra/hydra.yaml``'s ``hydra.launcher``;
    ``{}`` when absent, e.g. a run started through the worker entry point)."""
    import yaml

    path = Path(run_dir) / ".hydra" / "hydra.yaml"
    if not path.is_file():
        return {}
    launcher = (yaml.safe_load(path.read_text()) or {}).get("hydra", {}).get("launcher") or {}
    return dict(launcher) if isinstance(launcher, dict) else {}


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


@dataclass
class _Job:
    step: int
    handle: Any  #: ``subprocess.Popen`` (local) or ``submitit.Job`` (slurm)
    log_path: Path
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
        out = self.run_dir / "evals" / f"step{step}"
        out.mkdir(parents=True, exist_ok=True)
        argv = [str(self.config), str(step), str(hf_dir)]
        log_path = out / LOG
        if self.launcher == "slurm":
            try:
                import submitit

                executor = submitit.AutoExecutor(folder=str(self.run_dir / "evals" / "slurm"), cluster="slurm")
                executor.update_parameters(**slurm_parameters(run_launcher(self.run_dir)))
                command = [sys.executable, "-m", "pretrain_exp.app.eval_worker", *argv, "--log", str(log_path)]
                handle = executor.submit(submitit.helpers.CommandFunction(command, cwd=os.getcwd()))
            except Exception as e:  # noqa: BLE001  (sbatch missing or refusing)
                raise LaunchError(f"eval.async_launcher=slurm: submitting the evals of step {step} failed: "
                                  f"{type(e).__name__}: {e}") from e
            where = {"launcher": "slurm", "job_id": str(handle.job_id)}
        else:
            with open(log_path, "ab") as f:
                handle = subprocess.Popen([sys.executable, "-m", "pretrain_exp.app.eval_worker", *argv],
                                          stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            where = {"launcher": "local", "host": socket.gethostname(), "pid": handle.pid}
        write_json(out / MARKER, {"step": step, "tasks": tasks, "hf_dir": str(hf_dir), **where,
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%S")})
        self.jobs[step] = _Job(step, handle, log_path)
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

    def wait(self) -> List[int]:
        """Wait for every started eval; returns the steps that finished during the wait."""
        waiting = [j.step for j in self.jobs.values() if not j.done()]
        if waiting:
            log.info("waiting for the background evals of step(s) %s", ", ".join(map(str, waiting)))
        t0 = time.perf_counter()
        while not all(j.done() for j in self.jobs.values()):
            time.sleep(0.2)
        if waiting:
            log.info("background evals done after %.1f s of waiting", time.perf_counter() - t0)
        return self.poll()

    def failures(self) -> Dict[int, str]:
        """``{step: why}`` of the finished evals that failed."""
        return {j.step: f"{j.failure()} (log: {j.log_path})" for j in self.jobs.values()
                if j.done() and j.failure() is not None}

    def close(self) -> None:
        """Remove the private config copy (if any) once no eval process runs."""
        if self.private_config and all(j.done() for j in self.jobs.values()):
            with contextlib.suppress(FileNotFoundError):
                self.config.unlink()

"""Launching a composed run: in this process, or as N ranks under torchrun.

The Hydra job (local, submitit_local or a SLURM array task via hydra-submitit-launcher) calls :func:`launch`:
it writes ``config.resolved.yaml`` into the run dir, checks that the job's allocation holds
``training.nproc_per_node`` devices (GPUs, or CPUs on a CPU-only node), and then either runs the experiment in
this process (N = 1) or starts ``python -m torch.distributed.run --standalone --nproc-per-node N -m
pretrain_exp.app.worker config.resolved.yaml`` as a child. Workers never import Hydra; only rank 0 writes.

Multi-node jobs (``nodes > 1``) are refused: one job = one node. Preemption and timeouts: a requeued job
(submitit's checkpointing, ``hydra.launcher.max_num_timeout``) re-runs the same Hydra job in the same run dir,
which resumes from the run's newest checkpoint (see :mod:`pretrain_exp.app.experiment`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List

import torch
from omegaconf import OmegaConf

from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.core.errors import LaunchError, TrainingError

log = logging.getLogger(__name__)


def available_devices() -> tuple[int, str]:
    """``(count, kind)`` of devices this job may use: GPUs if any are visible, else CPUs of the allocation
    (``SLURM_CPUS_ON_NODE`` in a SLURM job, else the CPUs this process may run on)."""
    if torch.cuda.is_available():
        return torch.cuda.device_count(), "GPUs"
    cpus = os.environ.get("SLURM_CPUS_ON_NODE")
    return (int(cpus) if cpus else len(os.sched_getaffinity(0))), "CPUs"


def check_allocation(cfg: ExperimentConfig) -> None:
    """Fail fast if the job cannot hold ``training.nproc_per_node`` ranks on one node.

    :raises LaunchError: for a multi-node allocation or too few devices, naming what was asked and what is there.
    """
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1")))
    if nodes > 1:
        raise LaunchError(f"this job has {nodes} nodes; multi-node runs are not supported (one job = one node, "
                          "set hydra.launcher.nodes=1)")
    n = cfg.training.nproc_per_node
    have, kind = available_devices()
    if n > have:
        raise LaunchError(f"training.nproc_per_node={n} but this job's allocation has {have} {kind}; ask for "
                          f"{n} (hydra.launcher.gpus_per_node / cpus_per_task) or lower training.nproc_per_node")


def torchrun_argv(nproc: int, config_path: Path, log_dir: Path) -> List[str]:
    """The command that runs ``nproc`` workers on this node (same interpreter, hence the same venv)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            f"--log-dir={log_dir}", "--redirects=3", "--tee=3", "-m", "pretrain_exp.app.worker", str(config_path)]


@contextlib.contextmanager
def _worker_config(cfg: ExperimentConfig, resolved: Path) -> Iterator[Path]:
    """The config file the workers read: ``config.resolved.yaml``, or, when the config holds credentials (which
    that file has redacted), an unredacted copy readable by this user only, outside the run dir, removed when
    the workers are done."""
    from pretrain_exp.app.experiment import holds_credentials
    from pretrain_exp.app.tracking import config_dict

    if not holds_credentials(cfg):
        yield resolved
        return
    fd, tmp = tempfile.mkstemp(prefix="pretrain_exp-config-", suffix=".yaml")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(OmegaConf.to_yaml(OmegaConf.create(config_dict(cfg))))
        yield Path(tmp)
    finally:
        os.unlink(tmp)


def launch(cfg: ExperimentConfig) -> dict | None:
    """Run the experiment of ``cfg`` (module docstring); returns ``results.json``'s content when run in-process.

    :raises LaunchError: for an allocation that cannot hold the ranks.
    :raises TrainingError: if the torchrun child fails.
    """
    from pretrain_exp.app.experiment import Experiment, check_same_run, run, save_resolved_config

    check_allocation(cfg)
    if cfg.training.nproc_per_node == 1:
        return run(cfg)
    run_dir = Path(cfg.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    check_same_run(cfg, run_dir)
    config_path = save_resolved_config(cfg, run_dir)
    Experiment(cfg)  # assets, tokens, plan + verification here, so config and data errors surface before torchrun
    with _worker_config(cfg, config_path) as worker_config:
        argv = torchrun_argv(cfg.training.nproc_per_node, worker_config, run_dir / "torchrun")
        log.info("starting %d ranks: %s", cfg.training.nproc_per_node, " ".join(argv))
        proc = subprocess.run(argv)
    if proc.returncode != 0:
        raise TrainingError(f"torchrun with {cfg.training.nproc_per_node} ranks exited with status "
                            f"{proc.returncode}; rank logs: {run_dir / 'torchrun'}")
    return None

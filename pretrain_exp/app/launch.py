"""Launching a composed run: in this process, or as N ranks per node under torchrun, on one node or several.

The Hydra job (local, submitit_local or a SLURM task via hydra-submitit-launcher) calls :func:`launch`: it checks
that the job's allocation holds ``training.nproc_per_node`` devices per node (GPUs, or CPUs on a CPU-only node)
and the nodes it was given, writes ``config.resolved.yaml`` into the run dir, and then either runs the experiment
in this process (one node, N = 1) or starts torchrun as a child:

- one node: ``python -m torch.distributed.run --standalone --nproc-per-node N -m pretrain_exp.app.worker
  config.resolved.yaml``;
- ``M`` nodes (``hydra/launcher=slurm_multinode``: one SLURM task per node, each running this function):
  ``python -m torch.distributed.run --nnodes M --node-rank $SLURM_NODEID --rdzv-backend c10d --rdzv-endpoint
  <first node>:<port> --rdzv-id <job id> --nproc-per-node N -m pretrain_exp.app.worker <config>``, the pattern of
  OLMo-core's and torchtitan's SLURM scripts; the run dir must be on a filesystem every node sees (OLMo-core is
  told so with ``OLMO_SHARED_FS=1``). The endpoint is the first host of the job's node list (or
  ``MASTER_ADDR``) and a port derived from the job id (or ``MASTER_PORT``), as submitit's
  ``TorchDistributedEnvironment`` derives them (:func:`job_nodes`). Only node 0 writes into the run dir (config,
  plan, manifest); the other nodes hand their workers a node-local copy of the resolved config, and their ranks
  only read.

Workers never import Hydra; only global rank 0 writes results. Preemption and timeouts: a requeued job
(submitit's checkpointing, ``hydra.launcher.max_num_timeout``) re-runs the same Hydra job (every node's task) in
the same run dir, which resumes from the run's newest checkpoint (see :mod:`pretrain_exp.app.experiment`). In a
SLURM job the allocation decides the node count: a job requeued onto fewer (or more) nodes than ``training.nnodes``
trains on the nodes it got, with the same global batch (:func:`fit_to_allocation`, logged), and where ``srun``
starts more tasks than nodes, the first task of each node launches and the others end (:func:`surplus_task`).

torchrun runs in a process group of its own, its output copied to this process's console (:func:`_copy_output`:
rank 0's lines without torchrun's ``[default0]:`` prefix when the console shows bare lines); an interruption of this
process stops it with ``SIGTERM`` (it stops its ranks) and copies no more of its output
(:mod:`pretrain_exp.core.interrupt`).
"""

from __future__ import annotations

import copy
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, List, Optional

import torch

from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.app.validate import FP8_MIN_CAPABILITY, fp8_refusal
from pretrain_exp.core.config import Precision
from pretrain_exp.core.errors import ConfigError, LaunchError, TrainingError
from pretrain_exp.core.interrupt import OWN_GROUP, track
from pretrain_exp.core.logs import CONSOLE_ENV, console_is_plain
from pretrain_exp.core.rundir import RunDir

log = logging.getLogger(__name__)


def available_devices() -> tuple[int, str]:
    """``(count, kind)`` of devices this job may use: GPUs if any are visible, else CPUs of the allocation
    (``SLURM_CPUS_ON_NODE`` in a SLURM job, else the CPUs this process may run on)."""
    if torch.cuda.is_available():
        return torch.cuda.device_count(), "GPUs"
    cpus = os.environ.get("SLURM_CPUS_ON_NODE")
    return (int(cpus) if cpus else len(os.sched_getaffinity(0))), "CPUs"


@dataclass(frozen=True)
class Nodes:
    """The job's nodes as torchrun sees them: ``count`` nodes, this one is ``rank`` (0-based), rendezvous at
    ``endpoint`` (``host:port``; ``None`` on one node) under id ``rdzv_id``."""

    count: int = 1
    rank: int = 0
    endpoint: Optional[str] = None
    rdzv_id: str = "pretrain_exp"


def job_nodes() -> Nodes:
    """This job's nodes from SLURM's environment (``SLURM_JOB_NUM_NODES`` or ``SLURM_NNODES``, ``SLURM_NODEID``,
    ``SLURM_JOB_ID``); one node outside SLURM. The rendezvous host is ``MASTER_ADDR`` if set (e.g. an address
    where node names do not resolve: ``hydra.launcher.setup=["export MASTER_ADDR=..."]``), else the first host of
    ``SLURM_JOB_NODELIST``; the port ``MASTER_PORT`` if set, else the one submitit's
    ``TorchDistributedEnvironment`` derives from the job id (``20000 + id % 20000``).

    :raises LaunchError: for a node rank outside ``[0, count)`` or a multi-node job without a node list.
    """
    count = int(os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1")))
    if count <= 1:
        return Nodes()
    node = int(os.environ.get("SLURM_NODEID", "0"))
    if not 0 <= node < count:
        raise LaunchError(f"SLURM_NODEID={node} is not a node of this {count}-node job")
    job_id = os.environ.get("SLURM_JOB_ID", "0")
    host = os.environ.get("MASTER_ADDR")
    if not host:
        nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
        if not nodelist:
            raise LaunchError(f"a {count}-node job without SLURM_JOB_NODELIST (or MASTER_ADDR): the rendezvous "
                              "host is unknown")
        from submitit.slurm.slurm import _parse_node_list

        host = _parse_node_list(nodelist)[0]
    port = os.environ.get("MASTER_PORT") or (20000 + int(job_id) % 20000 if job_id.isdigit() else 29500)
    return Nodes(count, node, f"{host}:{port}", job_id)


def surplus_task() -> bool:
    """Whether this process is a second (or later) SLURM task on its node (``SLURM_LOCALID`` > 0). The launcher
    runs one task per node (torchrun starts the node's ranks), but a job requeued onto fewer nodes keeps the task
    count it was submitted with (the batch script's ``SLURM_NTASKS``), so ``srun`` starts several tasks on one node:
    only the first of each node launches, the others end at once (:func:`pretrain_exp.app.cli` checks this)."""
    return int(os.environ.get("SLURM_LOCALID") or 0) > 0


def fit_to_allocation(cfg: ExperimentConfig, nodes: Nodes) -> ExperimentConfig:
    """``cfg`` with ``training.nnodes`` set to the node count of this SLURM job's allocation when they differ (a
    warning names both): the allocation is the truth, e.g. for a job requeued onto another node count (the layout is
    not part of the run: :data:`~pretrain_exp.app.run_name.LAYOUT_KEYS`). ``cfg`` itself outside a SLURM job
    (``SLURM_JOB_ID`` unset) or when they agree; never modified in place.

    :raises LaunchError: (``training.nnodes``) when the global batch does not split over the allocation's ranks
        (``micro_batch_size x nproc_per_node x nodes``).
    """
    t = cfg.training
    if nodes.count == t.nnodes or not os.environ.get("SLURM_JOB_ID"):
        return cfg
    per_step = t.micro_batch_size * t.nproc_per_node * nodes.count
    if t.global_batch_size % per_step:
        raise LaunchError(f"training.nnodes={t.nnodes} but this SLURM job has {nodes.count} node(s), and "
                          f"training.global_batch_size={t.global_batch_size} rows is not a multiple of "
                          f"micro_batch_size x nproc_per_node x nodes = {t.micro_batch_size} x {t.nproc_per_node} x "
                          f"{nodes.count}; ask for {t.nnodes} node(s) (hydra.launcher.nodes) or change "
                          "training.micro_batch_size")
    log.warning("training.nnodes=%d but SLURM gave this job %d node(s): training on %d node(s), world size %d "
                "(the allocation decides; the global batch of %d rows is unchanged)", t.nnodes, nodes.count,
                nodes.count, nodes.count * t.nproc_per_node, t.global_batch_size)
    cfg = copy.deepcopy(cfg)
    cfg.training.nnodes = nodes.count
    return cfg


def check_machine(cfg: ExperimentConfig) -> None:
    """Check ``cfg`` against the machine this job trains on: ``training.precision=fp8`` needs a CUDA GPU of compute
    capability >= 8.9 and an importable torchao (:func:`~pretrain_exp.app.validate.fp8_refusal`, on the first visible
    device). Called by the job before anything starts (:func:`check_allocation`), not by
    :func:`~pretrain_exp.app.validate.validate`: a config is also validated where nothing trains (a login node
    submitting a SLURM sweep, ``pretrain-exp-inspect``, an eval worker).

    :raises ConfigError: naming ``training.precision``, with the reason.
    """
    if cfg.training.precision != Precision.fp8:
        return
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    error = None
    if capability is not None and tuple(capability) >= FP8_MIN_CAPABILITY:
        try:
            import torchao.float8  # noqa: F401  (OLMo-core's Float8Config converts the model with it)
        except Exception as e:  # not installed, or built for another torch
            error = f"{type(e).__name__}: {e}"
    why = fp8_refusal(capability, error, torch.__version__)
    if why is not None:
        raise ConfigError("training.precision", why)


def check_allocation(cfg: ExperimentConfig, nodes: Optional[Nodes] = None) -> None:
    """Fail fast if the job cannot hold ``training.nproc_per_node`` ranks on each node, if its nodes are not the
    ones the run asks for (``training.nnodes``; :func:`launch` first sets it to a SLURM job's node count,
    :func:`fit_to_allocation`), or if this machine cannot train the config
    (:func:`check_machine`: ``training.precision=fp8``).

    :raises LaunchError: for too few devices on this node or a node count other than ``training.nnodes``, naming
        what was asked and what is there.
    :raises ConfigError: (``training.precision``) for fp8 without a CUDA GPU of compute capability >= 8.9 or torchao.
    """
    check_machine(cfg)
    nodes = job_nodes() if nodes is None else nodes
    want = cfg.training.nnodes
    if nodes.count != want:
        raise LaunchError(f"training.nnodes={want} but this job has {nodes.count} node(s); ask for {want} "
                          f"(hydra/launcher=slurm_multinode hydra.launcher.nodes={want}) or set "
                          f"training.nnodes={nodes.count}")
    n = cfg.training.nproc_per_node
    have, kind = available_devices()
    if n > have:
        raise LaunchError(f"training.nproc_per_node={n} but this job's allocation has {have} {kind}"
                          f"{' per node' if nodes.count > 1 else ''}; ask for {n} (hydra.launcher.gpus_per_node / "
                          "cpus_per_task) or lower training.nproc_per_node")


def torchrun_argv(nproc: int, config_path: Path, log_dir: Path, nodes: Nodes = Nodes()) -> List[str]:
    """The command that runs ``nproc`` workers on this node (same interpreter, hence the same venv): standalone
    on one node, a c10d rendezvous at ``nodes.endpoint`` across several (module docstring)."""
    if nodes.count == 1:
        where = ["--standalone"]
    else:
        where = [f"--nnodes={nodes.count}", f"--node-rank={nodes.rank}", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint={nodes.endpoint}", f"--rdzv-id={nodes.rdzv_id}"]
    return [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc-per-node={nproc}",
            f"--log-dir={log_dir}", "--redirects=3", "--tee=3", "-m", "pretrain_exp.app.worker", str(config_path)]


#: torchrun's prefix of its ranks' output lines (``--tee``): ``[default<local rank>]:``
RANK_PREFIX = re.compile(rb"^\[default(\d+)\]:")


def _copy_output(src: IO[bytes], dst: IO[str], plain: bool, muted: threading.Event) -> threading.Thread:
    """Copy ``src`` (a pipe of torchrun's output) to ``dst`` line by line until it closes, in a daemon thread;
    nothing once ``muted`` is set. With ``plain``, rank 0's lines lose torchrun's ``[default0]:`` prefix and the
    other ranks' read ``rank <r>: ...``."""
    def copy() -> None:
        for raw in iter(src.readline, b""):
            if muted.is_set():
                continue
            m = RANK_PREFIX.match(raw) if plain else None
            if m:
                raw = raw[m.end():] if m.group(1) == b"0" else b"rank " + m.group(1) + b": " + raw[m.end():]
            dst.write(raw.decode("utf-8", "replace"))
            dst.flush()
        src.close()

    t = threading.Thread(target=copy, name="torchrun-output", daemon=True)
    t.start()
    return t


def launch(cfg: ExperimentConfig, hydra: Optional[dict] = None) -> dict | None:
    """Run the experiment of ``cfg`` (module docstring); returns ``results.json``'s content when run in-process.

    :param hydra: the ``.hydra/`` files of a run of the command line (:func:`~pretrain_exp.app.cli.hydra_files`),
        written with ``config.resolved.yaml`` when the run is recorded
        (:func:`~pretrain_exp.app.run_record.record_run`).
    :raises LaunchError: for an allocation that cannot hold the ranks.
    :raises TrainingError: if the torchrun child fails.
    """
    from pretrain_exp.app.experiment import run
    from pretrain_exp.app.prepare import prepare
    from pretrain_exp.app.run_record import record_run, worker_config

    nodes = job_nodes()
    cfg = fit_to_allocation(cfg, nodes)
    check_allocation(cfg, nodes)
    run_dir = Path(cfg.run_dir).resolve()
    # the run is recorded here, once, before any process of it starts; the other nodes write nothing into the run
    # dir: their workers read a node-local copy of the config
    own_dir = run_dir if nodes.rank == 0 else Path(tempfile.mkdtemp(
        prefix=f"pretrain_exp-{nodes.rdzv_id}-node{nodes.rank}-"))
    record = record_run(cfg, own_dir, hydra)
    if cfg.training.nproc_per_node == 1 and nodes.count == 1:
        return run(cfg)
    world = cfg.training.nproc_per_node * nodes.count
    log_dir = RunDir(own_dir).torchrun_logs
    if nodes.rank == 0:
        # assets, tokens, plan + verification here (no process started): config and data errors surface before
        # torchrun; the audit beside training and the window stream start in the ranks' loop
        prepare(cfg)
    # the run dir must be on a filesystem every node sees; OLMo-core refuses to checkpoint across nodes unless told
    env = dict(os.environ) if nodes.count == 1 else {"OLMO_SHARED_FS": "1", **os.environ}
    plain = console_is_plain(cfg.verbose)
    env[CONSOLE_ENV] = "plain" if plain else "full"
    with worker_config(cfg, record) as config_file:
        argv = torchrun_argv(cfg.training.nproc_per_node, config_file, log_dir, nodes)
        log.info("starting %d of %d ranks (node %d of %d): %s", cfg.training.nproc_per_node, world, nodes.rank,
                 nodes.count, " ".join(argv))
        proc = track(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, **OWN_GROUP))
        muted = threading.Event()
        copies = [_copy_output(proc.stdout, sys.stdout, plain, muted),
                  _copy_output(proc.stderr, sys.stderr, plain, muted)]
        try:
            proc.wait()
        except BaseException:  # interrupted: the caller stops torchrun; its dying words stay in the rank logs
            muted.set()
            raise
        for t in copies:
            t.join()
    if proc.returncode != 0:
        raise TrainingError(f"torchrun with {cfg.training.nproc_per_node} ranks on node {nodes.rank} of "
                            f"{nodes.count} exited with status {proc.returncode}; rank logs: {log_dir}")
    return None

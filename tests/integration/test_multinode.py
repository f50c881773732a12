"""Two simulated nodes on this machine: the CLI runs once per node, as each node's SLURM task runs it under
``hydra/launcher=slurm_multinode`` (``SLURM_JOB_NUM_NODES=2``, ``SLURM_NODEID=0/1``; the rendezvous host
``MASTER_ADDR=127.0.0.1``), so each starts a ``torch.distributed.run`` launcher with ``--nnodes 2 --node-rank r``
and a c10d rendezvous; the ranks join one gloo process group.

Two nodes x 1 rank train the rows and reach the weights of one node x 2 ranks exactly, and the rows of one
process (step ``k`` trains rows ``[(k-1)B, kB)``); only node 0 writes the run's config, plan and results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pretrain_exp.frameworks.olmo_core.checkpoint import load_model
from tests.conftest import CACHE_DIR, CHECKOUT_PYTHONPATH, ROOT
from tests.unit.frameworks.olmo_core.test_framework import (
    RUN,
    assert_two_ranks_train_what_one_trains,
    trained_rows,
)

pytestmark = pytest.mark.slow

#: 4 steps of 4 rows (one segment), 8 bios at dup counts 0/1/2/4, rows logged by every rank
OLMO_CORE = [*(o for o in RUN if not o.startswith(("training.num_steps", "training.checkpoint_interval"))),
             "training.num_steps=4", "training.checkpoint_interval=4", "eval=[]"]


def cli_env(runs: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_SIZE"))}
    return env | {"PRETRAIN_EXP_RUNS": str(runs), "PRETRAIN_EXP_CACHE": str(CACHE_DIR), "WANDB_SILENT": "true",
                  "PYTHONPATH": CHECKOUT_PYTHONPATH, **extra}


def run_cli(args, run_dir: Path, runs: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pretrain_exp", *args, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                          env=cli_env(runs), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


def run_two_nodes(args, run_dir: Path, runs: Path) -> None:
    """Both nodes' CLI processes at once, as the two SLURM tasks of one job. The rendezvous store is this
    process's, bound (to a port the system picks) before the nodes start and held until they end: each node's
    torchrun finds the endpoint's port taken and connects to it as a client, as torch's c10d rendezvous backend
    does where another process on the host holds the store (no port picked, released and bound again)."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)
    port = str(store.port)
    procs = []
    for node in (0, 1):
        env = cli_env(runs, SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="2", SLURM_NODEID=str(node),
                      SLURM_JOB_NODELIST="node[0-1]", SLURM_CPUS_ON_NODE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=port)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "pretrain_exp", *args, "training.nnodes=2", f"hydra.run.dir={run_dir}"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + 900
    while any(p.poll() is None for p in procs):  # a node that fails ends the job (the other waits in a collective)
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.5)
    outs = [p.communicate()[0] for p in procs]
    del store  # held while the nodes ran
    for node, (p, out) in enumerate(zip(procs, outs)):
        logs = "".join(f.read_text() for f in sorted(run_dir.glob("torchrun/**/stderr.log")))
        assert p.returncode == 0, f"node {node}:\n{out[-3000:]}\n{logs[-3000:]}"
    assert "--nnodes=2" in outs[1] and "--node-rank=1" in outs[1] and "--rdzv-backend=c10d" in outs[1]


def weights(ckpt_dir: Path) -> dict:
    return {k: v.clone() for k, v in load_model(ckpt_dir).state_dict().items()}


def test_two_nodes_train_the_rows_and_weights_of_one_node_with_two_ranks(tmp_path):
    runs = tmp_path / "runs"
    one, one_node, two_nodes = runs / "one", runs / "1x2", runs / "2x1"
    run_cli(OLMO_CORE, one, runs)
    run_cli([*OLMO_CORE, "training.nproc_per_node=2"], one_node, runs)
    run_two_nodes(OLMO_CORE, two_nodes, runs)

    assert sorted(p.name for p in (two_nodes / "rows").glob("rank*.jsonl")) == ["rank0.jsonl", "rank1.jsonl"]
    assert trained_rows(two_nodes) == trained_rows(one_node)
    assert_two_ranks_train_what_one_trains(one, two_nodes, steps=4, B=4)  # step k: rows [(k-1)B, kB), same tokens
    final_2x1, final_1x2 = weights(two_nodes / "checkpoints" / "step4"), weights(one_node / "checkpoints" / "step4")
    final_1 = weights(one / "checkpoints" / "step4")
    for k, v in final_1x2.items():
        torch.testing.assert_close(final_2x1[k], v, rtol=0, atol=0, msg=k)  # the same 2-rank gloo reduction
        torch.testing.assert_close(final_1[k], v, rtol=0, atol=2e-3, msg=k)  # one process: float-level only
    metrics = [json.loads(line) for line in (two_nodes / "metrics.jsonl").read_text().splitlines()]
    assert sorted(m["step"] for m in metrics if "train/loss" in m) == [1, 2, 3, 4]  # logged once, by rank 0
    assert json.loads((two_nodes / "results.json").read_text())["plan"]["num_insertions"] > 0


HF = ["experiment=tiny", "wandb=disabled", "training.num_threads=1", "training.num_steps=2",
      "training.checkpoint_interval=2", "training.global_batch_size=4", "training.micro_batch_size=2",
      "insertion.experiments.fictional_bios.num_items=4", "insertion.experiments.fictional_bios.repetitions=[1,2]",
      "eval=[]"]


def test_hf_two_nodes_reach_the_weights_of_one_node_with_two_ranks(tmp_path):
    from safetensors.torch import load_file

    runs = tmp_path / "runs"
    one_node, two_nodes = runs / "1x2", runs / "2x1"
    run_cli([*HF, "training.nproc_per_node=2"], one_node, runs)
    run_two_nodes(HF, two_nodes, runs)
    a = load_file(one_node / "checkpoints" / "checkpoint-2" / "model.safetensors")
    b = load_file(two_nodes / "checkpoints" / "checkpoint-2" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)
    metrics = [json.loads(line) for line in (two_nodes / "metrics.jsonl").read_text().splitlines()]
    assert sorted(m["step"] for m in metrics if "train/loss" in m) == [1, 2]

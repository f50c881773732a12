"""Launch glue: torchrun argv, allocation checks, launcher presets, workers without Hydra."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from pretrain_exp.app.launch import Nodes, check_allocation, job_nodes, torchrun_argv
from pretrain_exp.core.errors import LaunchError
from tests.conftest import CONF_DIR, ROOT, make_config


def test_torchrun_argv_uses_this_interpreter_and_the_worker(tmp_path):
    argv = torchrun_argv(4, tmp_path / "config.resolved.yaml", tmp_path / "torchrun")
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in argv and "--nproc-per-node=4" in argv
    assert argv[-3:] == ["-m", "pretrain_exp.app.worker", str(tmp_path / "config.resolved.yaml")]


@pytest.mark.parametrize("env,nproc,needle", [
    ({"SLURM_CPUS_ON_NODE": "2"}, 4, "training.nproc_per_node=4 but this job's allocation has 2 CPUs"),
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "gpu[3-4]"}, 1,
     "training.nnodes=1 but this job has 2 node"),
])
def test_allocation_checks_fail_fast(env, nproc, needle, tmp_path, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = make_config("experiment=tiny", f"training.nproc_per_node={nproc}", "training.micro_batch_size=2",
                      run_dir=tmp_path)
    with pytest.raises(LaunchError, match=needle):
        check_allocation(cfg)


def test_allocation_that_fits_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "2")
    check_allocation(make_config("experiment=tiny", "training.nproc_per_node=2", run_dir=tmp_path))


def test_multi_node_torchrun_argv_is_one_c10d_rendezvous_per_job(tmp_path):
    argv = torchrun_argv(8, tmp_path / "c.yaml", tmp_path / "logs", Nodes(2, 1, "gpu3:29500", "77"))
    assert "--standalone" not in argv
    for arg in ("--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d", "--rdzv-endpoint=gpu3:29500",
                "--rdzv-id=77", "--nproc-per-node=8"):
        assert arg in argv
    assert argv[-3:] == ["-m", "pretrain_exp.app.worker", str(tmp_path / "c.yaml")]


def test_job_nodes_from_slurm_environment(monkeypatch):
    for k in ("MASTER_ADDR", "MASTER_PORT", "SLURM_NNODES"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    assert job_nodes() == Nodes()
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")
    monkeypatch.setenv("SLURM_NODEID", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-a[07-09]")
    assert job_nodes() == Nodes(3, 2, "gpu-a07:23456", "123456")  # first host, port as submitit derives it
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.5")
    assert job_nodes().endpoint == "10.0.0.5:23456"
    monkeypatch.setenv("MASTER_PORT", "29400")
    assert job_nodes().endpoint == "10.0.0.5:29400"
    monkeypatch.setenv("SLURM_NODEID", "3")
    with pytest.raises(LaunchError, match="SLURM_NODEID=3 is not a node of this 3-node job"):
        job_nodes()


def test_allocation_check_covers_nodes_and_devices_per_node(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "2")
    cfg = make_config("experiment=tiny", "training.nnodes=2", "training.nproc_per_node=2",
                      "training.micro_batch_size=2", run_dir=tmp_path)
    check_allocation(cfg, Nodes(2, 1, "h:1"))
    with pytest.raises(LaunchError, match="training.nnodes=2 but this job has 1 node"):
        check_allocation(cfg, Nodes())
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "1")
    with pytest.raises(LaunchError, match="has 1 CPUs per node"):
        check_allocation(cfg, Nodes(2, 0, "h:1"))


def test_global_batch_must_split_over_all_nodes(tmp_path):
    from pretrain_exp.core.errors import ConfigError

    with pytest.raises(ConfigError, match="micro_batch_size x nproc_per_node x nnodes = 4 x 1 x 3"):
        make_config("experiment=tiny", "training.nnodes=3", run_dir=tmp_path)


def test_slurm_multinode_preset_asks_nodes_and_gpus_from_the_run(tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("config", overrides=["hydra/launcher=slurm_multinode", f"run_dir={tmp_path}",
                                                 "training.nnodes=2", "training.nproc_per_node=8"],
                            return_hydra_config=True)
    lc = cfg.hydra.launcher
    assert lc._target_.endswith("SlurmLauncher")
    assert (lc.nodes, lc.tasks_per_node, lc.gpus_per_node) == (2, 1, 8)
    assert lc.max_num_timeout > 0


@pytest.mark.parametrize("launcher,gpus", [("slurm", 1), ("slurm_8gpu", 8), ("slurm_cpu", None)])
def test_slurm_presets_are_one_task_per_node(launcher, gpus, tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("config", overrides=[f"hydra/launcher={launcher}", f"run_dir={tmp_path}"],
                            return_hydra_config=True)
    lc = cfg.hydra.launcher
    assert lc._target_.endswith("SlurmLauncher")
    assert (lc.tasks_per_node, lc.nodes, lc.gpus_per_node) == (1, 1, gpus)
    assert lc.max_num_timeout > 0  # requeue is safe: re-runs resume from the job's checkpoints


@pytest.mark.slow  # a fresh interpreter importing the worker and every framework (~10 s)
def test_the_worker_never_imports_hydra():
    code = ("import sys, pretrain_exp.app.worker, pretrain_exp.app.experiment, pretrain_exp.frameworks.hf.framework; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('hydra', 'hydra_plugins')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

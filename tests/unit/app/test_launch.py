"""Launch glue: torchrun argv, allocation checks, launcher presets, workers without Hydra."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from pretrain_exp.app.launch import check_allocation, torchrun_argv
from pretrain_exp.core.errors import LaunchError
from tests.conftest import CONF_DIR, ROOT, make_config


def test_torchrun_argv_uses_this_interpreter_and_the_worker(tmp_path):
    argv = torchrun_argv(4, tmp_path / "config.resolved.yaml", tmp_path / "torchrun")
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in argv and "--nproc-per-node=4" in argv
    assert argv[-3:] == ["-m", "pretrain_exp.app.worker", str(tmp_path / "config.resolved.yaml")]


@pytest.mark.parametrize("env,nproc,needle", [
    ({"SLURM_CPUS_ON_NODE": "2"}, 4, "training.nproc_per_node=4 but this job's allocation has 2 CPUs"),
    ({"SLURM_JOB_NUM_NODES": "2"}, 1, "multi-node runs are not supported"),
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
    code = ("import sys, pretrain_exp.app.worker, pretrain_exp.app.experiment, frameworks.hf.framework; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('hydra', 'hydra_plugins')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

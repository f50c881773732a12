"""Launch glue: torchrun argv, allocation checks, launcher presets, workers without Hydra."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from pretrain_exp.app.launch import Nodes, check_allocation, fit_to_allocation, job_nodes, surplus_task, torchrun_argv
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


def test_a_slurm_job_trains_on_the_nodes_it_was_given(tmp_path, monkeypatch, caplog):
    """The allocation decides the node count (a job requeued onto another one), with the global batch unchanged;
    outside SLURM the configured count stands (check_allocation refuses a mismatch)."""
    cfg = make_config("experiment=tiny", "training.nnodes=2", "training.micro_batch_size=2", run_dir=tmp_path)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert fit_to_allocation(cfg, Nodes()) is cfg
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    fitted = fit_to_allocation(cfg, Nodes())
    assert fitted.training.nnodes == 1 and cfg.training.nnodes == 2
    assert "training.nnodes=2 but SLURM gave this job 1 node(s): training on 1 node(s), world size 1" in caplog.text
    check_allocation(fitted, Nodes())
    assert fit_to_allocation(fitted, Nodes()) is fitted
    with pytest.raises(LaunchError, match=r"training.nnodes=2 but this SLURM job has 3 node\(s\), and "
                       r"training.global_batch_size=8 rows is not a multiple of .* = 2 x 1 x 3"):
        fit_to_allocation(cfg, Nodes(3, 0, "h:1"))


@pytest.mark.parametrize("localid,surplus", [(None, False), ("0", False), ("1", True)])
def test_only_the_first_slurm_task_of_a_node_launches(localid, surplus, monkeypatch):
    monkeypatch.delenv("SLURM_LOCALID", raising=False)
    if localid is not None:
        monkeypatch.setenv("SLURM_LOCALID", localid)
    assert surplus_task() is surplus


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


def test_slurm_8gpu_submission_script_and_partition_check(tmp_path, monkeypatch):
    """``hydra/launcher=slurm_8gpu`` with ``training.nproc_per_node=8``, beyond composing: Hydra's submitit launcher,
    built from the composed preset, writes the sbatch script of one node, one task, 8 GPUs, 64 CPUs and 512 GB,
    SIGUSR2 120 s before the time limit (submitit's requeue), running submitit's job runner with this interpreter
    (nothing is submitted: the ``PATH`` here holds an ``srun`` that submitit only looks for, and no ``sbatch``, so
    the script stays in submitit's folder); the pre-submission check accepts it on a partition of 8-GPU nodes and
    names ``gpus_per_node`` on one of 4."""
    from hydra.utils import instantiate

    from pretrain_exp.app.slurm_check import check_launcher, parse_sinfo

    job = ["experiment=tiny", "training.nproc_per_node=8", "training.micro_batch_size=1"]
    make_config(*job, run_dir=tmp_path / "run")  # the job's own config is valid
    sweep = tmp_path / "sweep"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("config", return_hydra_config=True, overrides=[
            "hydra/launcher=slurm_8gpu", "hydra.launcher.partition=gpu",
            f"run_dir={tmp_path / 'run'}", f"hydra.sweep.dir={sweep}", *job])
    launcher = instantiate(cfg.hydra.launcher)
    launcher.config = cfg
    bin_dir = tmp_path / "bin"  # commands that are looked for, never run

    def found(name: str) -> None:
        (bin_dir / name).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / name).chmod(0o755)

    bin_dir.mkdir()
    found("srun")
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(OSError):  # no sbatch to run: nothing is submitted, even on a SLURM login node
        launcher.launch([["seed=1"]], initial_job_idx=0)
    (script,) = (sweep / ".submitit").glob(".submission_file_*.sh")
    lines = script.read_text().splitlines()
    sbatch = sorted(x for x in lines if x.startswith("#SBATCH --") and "put=" not in x and "error=" not in x)
    assert sbatch == ["#SBATCH --cpus-per-task=64", "#SBATCH --gpus-per-node=8", "#SBATCH --job-name=pretrain_exp",
                      "#SBATCH --mem=512GB", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
                      "#SBATCH --open-mode=append", "#SBATCH --partition=gpu",
                      "#SBATCH --signal=USR2@120", "#SBATCH --time=240", "#SBATCH --wckey=submitit"]
    assert lines[-1].startswith("srun ") and f"{sys.executable} -u -m submitit.core._submit " in lines[-1]

    found("sbatch")  # check_launcher first asks whether sbatch is there
    check_launcher(launcher.params, parse_sinfo("gpu*|4|128|1031000|gpu:h100:8(S:0-1)|2-00:00:00"))
    with pytest.raises(LaunchError, match=r"hydra\.launcher\.gpus_per_node=8: partition 'gpu' has 4 GPU\(s\) per "
                                          r"node; .*set hydra\.launcher\.gpus_per_node=4"):
        check_launcher(launcher.params, parse_sinfo("gpu*|4|128|1031000|gpu:a100:4|2-00:00:00"))


@pytest.mark.slow  # a fresh interpreter importing the worker and every framework (~10 s)
def test_the_worker_never_imports_hydra():
    code = ("import sys, pretrain_exp.app.worker, pretrain_exp.app.experiment, pretrain_exp.frameworks.hf.framework; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('hydra', 'hydra_plugins')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_torchrun_output_is_copied_with_rank_0_bare_on_a_terminal_and_nothing_once_muted():
    """torchrun's ``--tee`` lines reach the console: on a terminal rank 0's without ``[default0]:`` and the other
    ranks' as ``rank <r>: ...``; elsewhere as they are; after an interruption (``muted``) nothing more."""
    import io
    import os
    import threading

    from pretrain_exp.app.launch import _copy_output

    text = b"[default0]:step 1/3: loss 11.5\n[default1]:warning: slow disk\nSetting OMP_NUM_THREADS\n"
    for plain, want in ((True, "step 1/3: loss 11.5\nrank 1: warning: slow disk\nSetting OMP_NUM_THREADS\n"),
                        (False, text.decode())):
        r, w = os.pipe()
        out = io.StringIO()
        t = _copy_output(os.fdopen(r, "rb"), out, plain, threading.Event())
        with os.fdopen(w, "wb") as f:
            f.write(text)
        t.join(10)
        assert out.getvalue() == want
    r, w = os.pipe()
    out, muted = io.StringIO(), threading.Event()
    muted.set()
    t = _copy_output(os.fdopen(r, "rb"), out, True, muted)
    with os.fdopen(w, "wb") as f:
        f.write(b"[default0]:Traceback (most recent call last):\n")
    t.join(10)
    assert out.getvalue() == ""

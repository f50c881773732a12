"""A sweep SLURM would refuse ends with one ``error:`` line naming the ``hydra.launcher.*`` option to change and the
partition's limits (from ``sinfo``), exit status 2, and no sweep dir; tested on a real SLURM cluster
(``../shared/tools/slurm-localhost.sh up``: partition ``debug``, no GPUs) where one answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CACHE_DIR, CHECKOUT_PYTHONPATH, ROOT
from tests.integration.test_slurm import _controller_answers

needs_slurm = pytest.mark.skipif(not _controller_answers(), reason="no SLURM controller answers `sinfo` "
                                 "(start one with ../shared/tools/slurm-localhost.sh up)")


def sweep(tmp_path: Path, *overrides: str, path: str | None = None) -> subprocess.CompletedProcess:
    """The README's sweep (``-m seed=0,1 hydra/launcher=...``) into ``tmp_path/sweep``."""
    env = os.environ | {"PRETRAIN_EXP_CACHE": str(CACHE_DIR), "PRETRAIN_EXP_RUNS": str(tmp_path / "runs"),
                        "PYTHONPATH": CHECKOUT_PYTHONPATH, "WANDB_SILENT": "true"}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "pretrain_exp", "-m", "seed=0,1", *overrides,
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def assert_one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, and the output is one ``error:`` line holding every needle; returns it."""
    out = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(out) == 1, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    assert out[0].startswith("error: ") and "Traceback" not in proc.stderr
    for n in needles:
        assert n in out[0], (n, out[0])
    return out[0]


@pytest.mark.slow
@pytest.mark.slurm(jobs=False)  # refused before a job runs: no turn to wait for
@needs_slurm
@pytest.mark.parametrize("overrides, needles", [
    # the README's sweep as it stands, on a partition without GPUs (the slurm preset asks for 1 GPU, 16 CPUs, 64 GB)
    (["hydra/launcher=slurm", "hydra.launcher.partition=debug"],
     ["hydra.launcher.gpus_per_node=1: partition 'debug' has no GPUs", "hydra.launcher.gpus_per_node=null",
      "hydra/launcher=slurm_cpu", "partition 'debug' (sinfo): 1 node(s) of"]),
    (["hydra/launcher=slurm_cpu", "hydra.launcher.partition=debg"],
     ["hydra.launcher.partition=debg: no such partition (sinfo: debug)",
      "did you mean hydra.launcher.partition=debug"]),
    (["hydra/launcher=slurm_cpu", "hydra.launcher.partition=debug", "hydra.launcher.mem_gb=100000"],
     ["hydra.launcher.mem_gb=100000: more than a node of partition 'debug' has", "GB, no GPU; no time limit"]),
    (["hydra/launcher=slurm_cpu", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=4096"],
     ["hydra.launcher.cpus_per_task=4096: 4096 CPUs, more than a node of partition 'debug' has"]),
], ids=["gpus", "partition", "memory", "cpus"])
def test_a_sweep_slurm_would_refuse_is_one_line_naming_the_option(tmp_path, overrides, needles):
    proc = sweep(tmp_path, *overrides)
    assert_one_line(proc, "SLURM would refuse this sweep", *needles, "nothing was submitted")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
@pytest.mark.slurm(jobs=False)  # refused before a job runs: no turn to wait for
@needs_slurm
def test_a_submission_sbatch_refuses_ends_with_one_line_and_no_sweep_dir(tmp_path):
    """A refusal ``sinfo`` cannot foresee (a node feature the cluster lacks): sbatch's answer, as one line."""
    proc = sweep(tmp_path, "hydra/launcher=slurm_cpu", "hydra.launcher.partition=debug",
                 "hydra.launcher.constraint=no_such_feature")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: sbatch refused the sweep (") and "change hydra.launcher.constraint" in last, last
    assert "partition 'debug' (sinfo):" in last
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_a_slurm_sweep_without_sbatch_is_one_line(tmp_path):
    """No SLURM commands on PATH (not a login node): one line naming ``hydra/launcher``, before submitit's
    ``Could not detect "srun"`` traceback."""
    bare = tmp_path / "bin"
    bare.mkdir()
    os.symlink(sys.executable, bare / "python")
    assert shutil.which("sbatch", path=str(bare)) is None
    proc = sweep(tmp_path, "hydra/launcher=slurm_cpu", "hydra.launcher.partition=debug", path=str(bare))
    assert_one_line(proc, "hydra/launcher=slurm: there is no `sbatch`", "hydra/launcher=local")
    assert not (tmp_path / "sweep").exists()

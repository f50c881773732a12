"""Resuming on another device layout: a run cut after its first checkpoint (a preempted job, killed) resumes
with another number of ranks in the same run dir, which the same command finds (the layout is not part of the
run's name). Each step trains the same global rows (the verifier checks the resumed segment's batches), the
final weights and per-dup losses match the uninterrupted run's to float precision, and ``layouts.jsonl`` /
``results.json`` record the layout of each segment."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pretrain_exp.app.run_name import run_suffix
from pretrain_exp.core.rundir import RunDir
from tests.conftest import ROOT
from tests.integration.test_multinode import HF, cli_env, run_cli

pytestmark = pytest.mark.slow

#: 4 steps of 4 rows in 2 segments, 4 items at dup counts 1/2 (test_multinode's HF run, two segments)
RUN = [*(o for o in HF if not o.startswith(("training.num_steps", "training.checkpoint_interval", "eval="))),
       "training.num_steps=4", "training.checkpoint_interval=2", "eval=[insertion_loss]"]


def cut_after_first_checkpoint(args, run_dir: Path, runs: Path,
                               marker: Path = Path("checkpoints") / "checkpoint-2" / "trainer_state.json") -> None:
    """Start the CLI and kill its whole process tree (SIGKILL, as a preempted job's) once the first segment's
    checkpoint is complete (``marker``: the file its framework writes last; the HF Trainer's ``trainer_state.json``
    by default)."""
    proc = subprocess.Popen([sys.executable, "-m", "pretrain_exp", *args, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                            env=cli_env(runs), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marker = run_dir / marker
    deadline = time.monotonic() + 900
    while not marker.is_file():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    import psutil

    tree = [psutil.Process(proc.pid)]
    tree += tree[0].children(recursive=True)  # torchrun's ranks run in sessions of their own
    for p in tree:
        p.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree[1:], timeout=30)
    proc.communicate()
    assert not (run_dir / "results.json").exists()


def test_the_layout_is_not_part_of_the_run_name():
    assert run_suffix(["training.nproc_per_node=2", "training.micro_batch_size=2", "training.nnodes=1",
                       "training.data_parallel=ddp"]) == ""
    assert run_suffix(["training.global_batch_size=4"]) != ""


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2)])
def test_hf_run_resumes_on_another_number_of_ranks(tmp_path, before, after):
    from safetensors.torch import load_file

    runs = tmp_path / "runs"
    whole, cut = runs / "whole", runs / "cut"
    run_cli([*RUN, f"training.nproc_per_node={before}"], whole, runs)
    cut_after_first_checkpoint([*RUN, f"training.nproc_per_node={before}"], cut, runs)
    logged = (cut / "pretrain_exp.log").stat().st_size
    run_cli([*RUN, f"training.nproc_per_node={after}"], cut, runs)

    layouts = RunDir(cut).read_layouts()  # each step's layout (a line of the segment the kill cut is superseded)
    assert [(r["from_step"], r["to_step"], r["world_size"]) for r in layouts] == [(0, 2, before), (2, 4, after)]
    assert [r["gradient_accumulation"] for r in layouts] == [4 // (2 * before), 4 // (2 * after)]
    res, ref = (json.loads((d / "results.json").read_text()) for d in (cut, whole))
    assert res["layouts"] == layouts and res["run_name"] == ref["run_name"]
    resumed = (cut / "pretrain_exp.log").read_bytes()[logged:].decode()
    assert res["plan"]["num_insertions"] > 0 and "verified plan: " in resumed  # the resumed layout's batches
    assert f"resuming from {cut / 'checkpoints' / 'checkpoint-2'} (step 2)" in resumed
    a = load_file(whole / "checkpoints" / "checkpoint-4" / "model.safetensors")
    b = load_file(cut / "checkpoints" / "checkpoint-4" / "model.safetensors")
    for k in a:  # another reduction order on another number of ranks: float-level differences only
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=2e-3, msg=k)
    for r, q in zip(res["per_dup"], ref["per_dup"]):
        assert (r["experiment"], r["dup_count"]) == (q["experiment"], q["dup_count"])
        assert abs(r["mean_loss"] - q["mean_loss"]) < 1e-3


def test_olmo_core_run_resumes_on_fewer_ranks(tmp_path):
    """OLMo-core's distributed checkpoint reshards on load: a 2-rank run cut after step 2 resumes on 1 rank and
    trains the same rows with the same tokens at every step as the uninterrupted 2-rank run."""
    from tests.unit.frameworks.olmo_core.test_framework import RUN as OLMO_CORE
    from tests.unit.frameworks.olmo_core.test_framework import trained_rows

    runs = tmp_path / "runs"
    whole, cut = runs / "whole", runs / "cut"
    args = [*(o for o in OLMO_CORE if not o.startswith("training.num_steps")), "training.num_steps=4",
            "eval=[insertion_loss]"]
    run_cli([*args, "training.nproc_per_node=2"], whole, runs)
    cut_after_first_checkpoint([*args, "training.nproc_per_node=2"], cut, runs,
                               marker=Path("checkpoints") / "step2" / ".metadata.json")
    run_cli([*args, "training.nproc_per_node=1"], cut, runs)

    layouts = RunDir(cut).read_layouts()  # each step's layout (a line of the segment the kill cut is superseded)
    assert [(r["from_step"], r["to_step"], r["world_size"]) for r in layouts] == [(0, 2, 2), (2, 4, 1)]
    rows_whole, rows_cut = trained_rows(whole), trained_rows(cut)
    assert sorted(rows_cut) == [1, 2, 3, 4] and rows_cut == rows_whole  # every step: the same rows, same tokens
    res, ref = (json.loads((d / "results.json").read_text()) for d in (cut, whole))
    for r, q in zip(res["per_dup"], ref["per_dup"]):
        assert (r["experiment"], r["dup_count"]) == (q["experiment"], q["dup_count"])
        assert abs(r["mean_loss"] - q["mean_loss"]) < 1e-3

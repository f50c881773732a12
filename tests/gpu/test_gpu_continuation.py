"""Exact continuation on the GPU in bf16 (``make gpu-test``; marker ``gpu``): the project's one-step continuation
against OLMo-core's own one-step continuation on the same GPU with the same settings (bf16 autocast, SDPA, one
process), for ``framework=olmo_core`` on a checkpoint written by OLMo-core's own trainer
(``tests/unit/frameworks/olmo_core/upstream_run.py``) and for ``framework=olmo2`` on the tiny OLMo-2 preset, whose
converted checkpoint OLMo-core's ``Trainer`` continues directly (``tests/gpu/olmo2_reference.py``).

Rows must be identical. The loss of the step is compared within :data:`BF16_LOSS_TOL`: both sides run OLMo-core's
model on the same weights and tokens with the same kernels, so the only freedom left is the reduction order inside
bf16 matrix products (cuBLAS may pick another split-K algorithm per process), which moves each logit by at most a
few bf16 rounding steps (2^-8 relative) and the mean cross-entropy over a batch by far less than 1e-3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import CACHE_DIR, CHECKOUT_PYTHONPATH, ROOT
from tests.gpu.test_gpu_scale import cli

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BF16_LOSS_TOL = 1e-3  #: |loss - OLMo-core's loss| of the continued step (module docstring: far below it)
GPU_BF16 = ("--device", "cuda", "--bf16")


def steps_of(path: Path) -> dict:
    out: dict = {}
    for rec in map(json.loads, path.read_text().splitlines()):
        out.setdefault(rec["step"], {"index": [], "loss": rec["loss"]})["index"] += rec["index"]
    return out


def report(name: str, line: str) -> None:
    """Print a measured line and keep it in ``$PRETRAIN_EXP_GPU_REPORT`` (if set) for the benchmarks docs."""
    print(f"{name}: {line}")
    if os.environ.get("PRETRAIN_EXP_GPU_REPORT"):
        with open(os.environ["PRETRAIN_EXP_GPU_REPORT"], "a") as f:
            f.write(f"{name}: {line}\n")


def test_olmo_core_one_bf16_step_on_the_gpu_equals_olmo_cores(tmp_path):
    from pretrain_exp.frameworks.olmo_core.checkpoint import load_model
    from tests.unit.frameworks.olmo_core.test_upstream_checkpoint import MINIMAL, build_fixture, losses, trained

    fx = build_fixture(tmp_path / "upstream", 4, *GPU_BF16)  # OLMo-core alone: steps 1-3, then its own step 4
    run = tmp_path / "run"
    cli([*MINIMAL, f"model.path={fx['step3']}", "training.num_steps=1", "training.precision=bf16"], run)
    rows, loss = trained(run), losses(run)
    assert sorted(rows) == [4]
    assert rows[4] == fx["steps"][4]["index"]
    diff = abs(loss[4] - fx["steps"][4]["loss"])
    ids = torch.tensor([list(range(1000, 1064)), list(range(5000, 5064))])
    with torch.no_grad():
        dlogits = float((load_model(run / "checkpoints" / "step4")(ids)
                         - load_model(fx["ref"] / "step4")(ids)).abs().max())
    report("olmo_core continuation", f"step 4 rows {len(rows[4])}/{len(rows[4])} identical, loss "
           f"{loss[4]:.6f} vs OLMo-core {fx['steps'][4]['loss']:.6f} (|diff| {diff:.2e}, tolerance "
           f"{BF16_LOSS_TOL:g}), max |dlogits| after the step {dlogits:.3g} (fp32, CPU)")
    assert diff <= BF16_LOSS_TOL
    assert dlogits < 0.1  # the same AdamW update up to bf16 gradient rounding


def test_olmo2_one_bf16_step_on_the_gpu_equals_olmo_cores_trainer_on_the_converted_checkpoint(tmp_path):
    from pretrain_exp.frameworks.olmo2.framework import convert_to_olmo_core, olmo2_checkpoint_dir
    from tests.conftest import make_config
    from tests.unit.frameworks.olmo_core.test_upstream_checkpoint import losses, trained

    args = ["framework=olmo2", "insertion=none", "eval=[]", "wandb=disabled", "training.log_rows=true",
            "training.num_steps=1", "training.checkpoint_interval=1", "training.precision=bf16",
            "data.held_out_rows=0"]
    run = tmp_path / "run"
    cli(args, run)
    cfg = make_config(*args, run_dir=tmp_path / "cfg")
    source = olmo2_checkpoint_dir(cfg.model, str(CACHE_DIR))
    converted = convert_to_olmo_core(cfg, source)  # the run converted it: cached, returned as is
    ref = tmp_path / "ref"
    ref.mkdir()
    env = os.environ | {"PYTHONPATH": CHECKOUT_PYTHONPATH}
    proc = subprocess.run([sys.executable, "-m", "tests.gpu.olmo2_reference", *GPU_BF16, str(converted), str(source),
                           str(ref), str(tmp_path / "work"), "1"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    want = steps_of(ref / "upstream_steps.jsonl")
    rows, loss = trained(run), losses(run)
    assert sorted(rows) == [1] and sorted(want) == [1]
    assert rows[1] == want[1]["index"]
    diff = abs(loss[1] - want[1]["loss"])
    report("olmo2 continuation", f"step 1 rows {len(rows[1])}/{len(rows[1])} identical, loss {loss[1]:.6f} vs "
           f"OLMo-core's trainer {want[1]['loss']:.6f} (|diff| {diff:.2e}, tolerance {BF16_LOSS_TOL:g})")
    assert diff <= BF16_LOSS_TOL

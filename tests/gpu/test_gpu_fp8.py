"""``training.precision=fp8`` on a float8 GPU (``-m gpu``; skipped without CUDA of compute capability >= 8.9 or
without torchao): OLMo-core's ``Float8Config`` of the run turns the model's linear layers (not the output layer)
into torchao ``Float8Linear`` with a loss close to bf16's on the same weights, and a from-scratch olmo_core run
under FSDP (float8 all-gathers) trains."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import CACHE_DIR, CHECKOUT_PYTHONPATH, ROOT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                                 reason="needs a CUDA device of compute capability >= 8.9")]


@pytest.fixture(autouse=True)
def _torchao():
    """torchao is the ``fp8`` extra: skip where it is not installed (inside the tests, so ``-m "not gpu"``
    deselects them instead of reporting a skip)."""
    pytest.importorskip("torchao", reason="training.precision=fp8 needs torchao")


def test_float8_config_converts_the_linear_layers_and_keeps_the_loss():
    from torchao.float8.float8_linear import Float8Linear  # not re-exported by torchao.float8

    from pretrain_exp.core.config import Precision
    from pretrain_exp.frameworks.olmo_core.framework import precision_config
    from pretrain_exp.frameworks.olmo_core.presets import builder_config

    torch.manual_seed(0)
    model = builder_config("olmo2_14M", 100_352, init_seed=0).build(init_device="cuda")
    model.init_weights(device=torch.device("cuda"))
    fp8 = copy.deepcopy(model)
    autocast, float8 = precision_config(Precision.fp8, cuda=True, sharded=False)
    fp8.apply_fp8(float8)  # what OLMo-core's train module does with the run's float8_config
    converted = [n for n, m in fp8.named_modules() if isinstance(m, Float8Linear)]
    assert len(converted) == 4 * 7  # per block: q, k, v, out, and the MLP's w1, w2, w3
    assert not isinstance(fp8.lm_head.w_out, Float8Linear)
    ids = torch.randint(0, 100_278, (4, 513), device="cuda")
    losses = []
    for m in (model, fp8):
        with torch.autocast("cuda", dtype=autocast.as_pt()):
            loss = m(ids[:, :-1], labels=ids[:, 1:]).loss
        loss.backward()
        grads = [p.grad for p in m.parameters() if p.grad is not None]
        assert len(grads) == len(list(m.parameters())) and all(g.is_cuda and torch.isfinite(g).all() for g in grads)
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=0.01), losses


@pytest.mark.slow
def test_fp8_run_trains_under_fsdp(tmp_path):
    run_dir = tmp_path / "fp8"
    env = os.environ | {"PRETRAIN_EXP_RUNS": str(tmp_path), "PRETRAIN_EXP_CACHE": str(CACHE_DIR),
                        "WANDB_SILENT": "true", "PYTHONPATH": CHECKOUT_PYTHONPATH}
    args = ["experiment=scratch_olmo_core", "training.precision=fp8", "training.data_parallel=fsdp",
            "training.attention=sdpa", "wandb=disabled", "eval=[insertion_loss]", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run([sys.executable, "-m", "pretrain_exp", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert json.loads((run_dir / "results.json").read_text())["step"] == 12
    losses = [m["train/loss"] for m in map(json.loads, Path(run_dir / "metrics.jsonl").read_text().splitlines())
              if "train/loss" in m]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]

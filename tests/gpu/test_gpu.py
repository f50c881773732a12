"""GPU checks (``-m gpu``; CI runs everything else): the hf framework trains on CUDA with bf16 autocast."""

from __future__ import annotations

import json

import pytest
import torch

from pretrain_exp.app.experiment import Experiment
from pretrain_exp.frameworks.hf.trainer import bf16_supported
from tests.conftest import make_config

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_tiny_run_on_cuda_with_bf16(tmp_path, tiny_model_dir):
    assert bf16_supported()
    cfg = make_config("experiment=tiny", "wandb=disabled", "training.precision=bf16", run_dir=tmp_path)
    torch.cuda.reset_peak_memory_stats()
    Experiment(cfg).run()
    assert torch.cuda.max_memory_allocated() > 10 * 2**20  # the model, its gradients and Adam states: on the GPU
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["step"] == 12 and [r["dup_count"] for r in res["per_dup"]] == [0, 1, 4, 16]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    speeds = [m["train/tokens_per_s"] for m in metrics if "train/tokens_per_s" in m]
    assert speeds and all(s > 0 for s in speeds)

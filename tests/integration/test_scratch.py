"""Pretraining from scratch (``model.init=random``) through the CLI, on OLMo-core (a toy OLMo-2 shape by builder
name) and on HF (the tiny Llama's config): the step-0 checkpoint is the engine's own seeded initialisation, the
run trains, a run resumed from a mid-run checkpoint ends bit-identical to the uninterrupted one, and the insertion
loss orders by dup count (16 < 4 < 1 < 0)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import CACHE_DIR, CHECKOUT_PYTHONPATH, ROOT

pytestmark = pytest.mark.slow

COMMON = ["wandb=disabled", "training.num_threads=1", "eval=[insertion_loss]", "training.keep_last_checkpoints=0"]


def cli(args, run_dir: Path) -> str:
    env = os.environ | {"PRETRAIN_EXP_RUNS": str(run_dir.parent), "PRETRAIN_EXP_CACHE": str(CACHE_DIR),
                        "WANDB_SILENT": "true", "PYTHONPATH": CHECKOUT_PYTHONPATH}
    proc = subprocess.run([sys.executable, "-m", "pretrain_exp", *args, *COMMON, f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stderr + proc.stdout


def assert_loss_orders_by_dup_count(run_dir: Path) -> None:
    per_dup = json.loads((run_dir / "results.json").read_text())["per_dup"]
    assert [r["dup_count"] for r in per_dup] == [0, 1, 4, 16]
    loss = [r["mean_loss"] for r in per_dup]
    assert loss[0] > loss[1] > loss[2] > loss[3], loss


def rerun_from(run_dir: Path, copy: Path, keep_step: int, ckpt_glob: str, step_of) -> None:
    """``copy`` = ``run_dir`` with everything after checkpoint ``keep_step`` removed (as if the job died there)."""
    shutil.copytree(run_dir, copy)
    for d in (copy / "checkpoints").glob(ckpt_glob):
        if step_of(d) > keep_step:
            shutil.rmtree(d)
    for d in (copy / "evals").glob("step*"):
        if int(d.name[4:]) > keep_step:
            shutil.rmtree(d)
    (copy / "results.json").unlink()


def test_olmo_core_from_scratch_trains_resumes_and_memorizes_by_dup_count(tmp_path):
    from pretrain_exp.frameworks.olmo_core.checkpoint import load_model
    from pretrain_exp.frameworks.olmo_core.presets import builder_config

    args = ["experiment=scratch_olmo_core", "seed=0"]
    ref = tmp_path / "ref"
    cli(args, ref)
    (init,) = CACHE_DIR.glob("models/scratch-olmo2_14M-seed0-*")
    expected = builder_config("olmo2_14M", 100_352, init_seed=0).build(init_device="cpu")
    expected.init_weights(device=torch.device("cpu"))  # OLMo-core's own initialisation, seed 0
    got = load_model(init).state_dict()
    for k, v in expected.state_dict().items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=0, msg=k)
    assert_loss_orders_by_dup_count(ref)

    resumed = tmp_path / "resumed"
    rerun_from(ref, resumed, 4, "step*", lambda d: int(d.name[4:]))
    assert "resuming from" in cli(args, resumed)
    a, b = load_model(ref / "checkpoints" / "step12").state_dict(), load_model(resumed / "checkpoints" / "step12")
    for k, v in b.state_dict().items():
        torch.testing.assert_close(v, a[k], rtol=0, atol=0, msg=k)


def test_hf_from_scratch_trains_resumes_and_memorizes_by_dup_count(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from pretrain_exp.data.assets import hf_model_dir

    config_dir = tmp_path / "arch"  # an architecture given as a bare config.json, written by transformers
    AutoConfig.from_pretrained(hf_model_dir("tiny_llama", CACHE_DIR)).save_pretrained(config_dir)
    args = ["experiment=scratch_hf", f"model.config={config_dir / 'config.json'}", "model.tokenizer=smollm2_135m",
            "seed=1"]
    ref = tmp_path / "ref"
    cli(args, ref)
    (init,) = [d for d in CACHE_DIR.glob("models/scratch-hf-llama-seed1-*")
               if json.loads((d / ".complete.json").read_text())["config"] == str(config_dir / "config.json")]
    torch.manual_seed(1)
    expected = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir))  # transformers' init, seed 1
    got = load_file(init / "model.safetensors")
    for k, v in got.items():
        torch.testing.assert_close(v, expected.state_dict()[k], rtol=0, atol=0, msg=k)
    assert_loss_orders_by_dup_count(ref)

    resumed = tmp_path / "resumed"
    rerun_from(ref, resumed, 4, "checkpoint-*", lambda d: int(d.name.split("-")[1]))
    assert "resuming from" in cli(args, resumed)
    a = load_file(ref / "checkpoints" / "checkpoint-12" / "model.safetensors")
    b = load_file(resumed / "checkpoints" / "checkpoint-12" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)

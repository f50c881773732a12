"""The GPU path (``make gpu-test``; marker ``gpu``, skipped without CUDA): OLMo-core FSDP in bf16 on one GPU with toy
OLMo-2 and OLMo-3 shapes trained from scratch (trains, resumes bit-identically, the insertions land in the trained
rows), the hf framework in bf16 with SDPA, the benchmark and memorization evals scoring on the GPU, the HF export of
an OLMo-core checkpoint reproducing its logits on the GPU, and the throughput benchmark's code path."""

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

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def cli(args, run_dir: Path) -> str:
    env = os.environ | {"PRETRAIN_EXP_RUNS": str(run_dir.parent), "PRETRAIN_EXP_CACHE": str(CACHE_DIR),
                        "WANDB_SILENT": "true", "PYTHONPATH": CHECKOUT_PYTHONPATH}
    proc = subprocess.run([sys.executable, "-m", "pretrain_exp", *args, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def trained_rows(run_dir: Path) -> dict:
    out: dict = {}
    for f in sorted((run_dir / "rows").glob("rank*.jsonl")):
        for rec in map(json.loads, f.read_text().splitlines()):
            out.setdefault(rec["step"], {}).update(dict(zip(rec["rows"], rec["sha256"])))
    return out


@pytest.mark.parametrize("shape", ["olmo2_14M", "olmo3_14M"])
def test_olmo_core_fsdp_bf16_from_scratch_trains_resumes_and_inserts(shape, tmp_path):
    from pretrain_exp.frameworks.olmo_core.checkpoint import load_model
    from pretrain_exp.insertion.plan import Plan

    args = ["experiment=scratch_olmo_core", f"model.config={shape}", "training.precision=bf16",
            "training.data_parallel=fsdp", "training.attention=sdpa", "training.log_rows=true", "wandb=disabled",
            "training.keep_last_checkpoints=0", "eval=[insertion_loss]"]
    ref = tmp_path / "ref"
    cli(args, ref)
    res = json.loads((ref / "results.json").read_text())
    assert res["step"] == 12
    loss = [r["mean_loss"] for r in res["per_dup"]]
    assert loss[0] > loss[-1], loss  # dup 16 is learnt more than dup 0
    metrics = [json.loads(line) for line in (ref / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("train/mfu", 0) > 0 for m in metrics)  # OLMo-core's speed monitor on a GPU

    plan = Plan.load(ref / "plan.npz")
    rows = trained_rows(ref)
    assert sorted(rows) == list(range(1, 13))
    B = 8
    for k, seen in rows.items():
        assert sorted(seen) == list(range((k - 1) * B, k * B))
    assert plan.num_insertions > 0  # the callback checked and overwrote every planned span (it raises otherwise)

    resumed = tmp_path / "resumed"
    shutil.copytree(ref, resumed)
    for d in (resumed / "checkpoints").glob("step*"):
        if int(d.name[4:]) > 4:
            shutil.rmtree(d)
    for d in (resumed / "evals").glob("step*"):
        if int(d.name[4:]) > 4:
            shutil.rmtree(d)
    (resumed / "results.json").unlink()
    assert "resuming from" in cli(args, resumed)
    a = load_model(ref / "checkpoints" / "step12").state_dict()
    b = load_model(resumed / "checkpoints" / "step12").state_dict()
    for k, v in b.items():
        torch.testing.assert_close(v, a[k], rtol=0, atol=0, msg=k)


def test_hf_bf16_sdpa_with_benchmark_and_memorization_evals_on_the_gpu(tmp_path, monkeypatch):
    from pretrain_exp.app.experiment import Experiment
    from pretrain_exp.evals import scoring
    from tests.conftest import make_config

    devices = []
    model_device = scoring.model_device

    def recording(model):
        devices.append(model_device(model).type)
        return model_device(model)

    monkeypatch.setattr(scoring, "model_device", recording)
    cfg = make_config("experiment=contamination_demo", "model=tiny_llama", "wandb=disabled",
                      "training.precision=bf16", "framework.attn_implementation=sdpa", "eval.on_load=false",
                      "eval=[benchmark,memorization]", run_dir=tmp_path)
    Experiment(cfg).run()
    step = json.loads((tmp_path / "results.json").read_text())["step"]
    evals = sorted(p.stem for p in (tmp_path / "evals" / f"step{step}").glob("*.json"))
    assert evals == ["benchmark", "memorization"]
    assert devices and set(devices) == {"cuda"}


def test_hf_export_of_an_olmo_core_checkpoint_matches_its_logits_on_the_gpu(tmp_path):
    from transformers import AutoModelForCausalLM

    from pretrain_exp.core.config import ModelConf
    from pretrain_exp.data.tokenize import load_tokenizer
    from pretrain_exp.frameworks.olmo_core.checkpoint import OlmoCoreCheckpoint, load_model
    from pretrain_exp.frameworks.olmo_core.presets import random_init_checkpoint

    ckpt = random_init_checkpoint(ModelConf(name="t", init="random", config="olmo3_14M", init_seed=0), CACHE_DIR)
    tok = load_tokenizer("dolma2", CACHE_DIR)
    ids = torch.tensor([tok("To be, or not to be, that is the question")["input_ids"]], device="cuda")
    ours = load_model(ckpt).cuda().eval()
    with OlmoCoreCheckpoint(ckpt, 0, tok).as_hf_temporary() as hf_dir:
        hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).cuda().eval()
        with torch.no_grad():
            torch.testing.assert_close(hf(ids).logits, ours(ids), rtol=1e-4, atol=1e-4)


def test_throughput_benchmark_runs_on_the_gpu(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/gpu_throughput.py", "--config", "olmo2_14M",
                          "--sequence-length", "512", "--steps", "6", "--warmup", "2", "--no-compile",
                          "--attention", "sdpa", "--out", str(tmp_path)],
                         cwd=ROOT, env=os.environ | {"PYTHONPATH": CHECKOUT_PYTHONPATH}, capture_output=True, text=True,
                         timeout=1800)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "olmo_core (compile off, sdpa): insertion on / off" in out.stdout
    assert "hf (compile off, sdpa): insertion on / off" in out.stdout
    assert "/ bare OLMo-core = " in out.stdout

"""``benchmarks/gpu_throughput.py``: its figures (FLOPs per token from OLMo-core, MFU, plan sizing, steady-state
tokens/s) and, on CPU with ``--tiny``, the whole code path (slow)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import CHECKOUT_PYTHONPATH, ROOT

spec = importlib.util.spec_from_file_location("gpu_throughput", ROOT / "benchmarks" / "gpu_throughput.py")
bench = importlib.util.module_from_spec(spec)
sys.modules["gpu_throughput"] = bench  # dataclasses look their module up
spec.loader.exec_module(bench)


def test_olmo2_1b_flops_and_mfu():
    fpt = bench.flops_per_token("olmo2_1B_v2", 4096)
    # 6 N (N ~ 1.28e9 parameters incl. the 100,352 x 2,048 output layer) + attention 12 n_layers d L
    assert 8.0e9 < fpt < 9.5e9
    assert bench.mfu(40_000, fpt, 989.0) == pytest.approx(40_000 * fpt / 989e12)


def test_plan_sizing_and_steady_state_rate(tmp_path):
    n = bench.bios_for_fraction(0.015, 40 * 4 * 4096)
    assert n % 4 == 0
    copies = n / 4 * sum(bench.REPETITIONS)
    assert copies * bench.BIO_TOKENS / (40 * 4 * 4096) == pytest.approx(0.015, rel=0.05)
    m = tmp_path / "metrics.jsonl"
    m.write_text("\n".join(json.dumps({"step": k, "train/tokens_per_s": v}) for k, v in
                           [(1, 10.0), (2, 100.0), (3, 200.0), (4, 300.0)]))
    assert bench.steady_tokens_per_s(m, warmup=1) == 200.0
    with pytest.raises(RuntimeError, match="no train/tokens_per_s"):
        bench.steady_tokens_per_s(m, warmup=4)
    args = bench.run_overrides("olmo_core", bench.Setup("olmo2_1B_v2", 4096, 4, 40, 10, "bf16", True, "flash", 989.0),
                               True, 0.015, None)
    assert {"model.config=olmo2_1B_v2", "training.compile=true", "training.attention=flash",
            "training.sequence_length=4096", "training.micro_batch_size=4"} <= set(args)


def test_fp8_rows_are_compared_with_bf16_by_tokens_per_s_and_last_loss(tmp_path):
    def run(fw, precision, tps, losses):
        d = tmp_path / f"{fw}-{precision}"
        d.mkdir()
        (d / "metrics.jsonl").write_text("\n".join(
            json.dumps({"step": k, "train/tokens_per_s": tps, "train/loss": x}) for k, x in enumerate(losses, 1)))
        s = bench.Setup("olmo2_1B_v2", 4096, 4, len(losses), 1, precision, True, "sdpa", 989.0)
        return bench.measure(d, fw, True, "sdpa", False, s, 8_000_000_000, None)

    bf16, fp8 = run("olmo_core", "bf16", 50_000.0, [11.0, 9.0, 8.25]), run("olmo_core", "fp8", 60_000.0, [11, 9, 8.5])
    assert (bf16["precision"], bf16["loss_step"], bf16["loss"]) == ("bf16", 3, 8.25)
    lines = bench.precision_lines([bf16, fp8, run("hf", "bf16", 40_000.0, [11.0, 10.0])])  # hf: no fp8 row
    assert lines == ["olmo_core (compile on, sdpa, insertion off): fp8 / bf16 tokens/s = 1.200 (goal >= 1.15); "
                     "loss at step 3: bf16 8.2500, fp8 8.5000 (fp8 - bf16 = +0.2500)"]
    args = bench.run_overrides("olmo_core", bench.Setup("olmo2_1B_v2", 4096, 4, 40, 10, "fp8", True, "sdpa", 989.0),
                               False, 0.015, None)
    assert "training.precision=fp8" in args


@pytest.mark.slow
def test_tiny_run_prints_the_table(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/gpu_throughput.py", "--tiny", "--out", str(tmp_path)],
                         cwd=ROOT, env=os.environ | {"PYTHONPATH": CHECKOUT_PYTHONPATH, "WANDB_SILENT": "true"},
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "olmo_core (compile off, sdpa): insertion on / off" in out.stdout
    assert "hf (compile off, sdpa): insertion on / off" in out.stdout
    assert "olmo_core (compile off, sdpa, insertion off) / bare OLMo-core = " in out.stdout
    assert bench.plan_fraction(tmp_path / "olmo_core-eager-sdpa-insert") > 0
    assert bench.plan_fraction(tmp_path / "hf-eager-sdpa-plain") == 0.0
    assert bench.steady_tokens_per_s(tmp_path / "olmo_core-bare" / "metrics.jsonl", 1) > 0


def test_a_configuration_that_does_not_run_makes_the_exit_status_1(tmp_path):
    """fp8 is refused without a float8 GPU: the run is reported as failed, the table is still printed, and the
    benchmark exits 1 (a table with a row missing is not a measurement)."""
    out = subprocess.run([sys.executable, "benchmarks/gpu_throughput.py", "--tiny", "--frameworks", "olmo_core",
                          "--no-bare", "--precision", "fp8", "--insertion", "off", "--out", str(tmp_path)],
                         cwd=ROOT, env=os.environ | {"PYTHONPATH": CHECKOUT_PYTHONPATH, "WANDB_SILENT": "true",
                                                     "CUDA_VISIBLE_DEVICES": ""},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "failed: " in out.stdout and "framework" in out.stdout
    assert out.stderr.strip().splitlines()[-1] == "error: 1 configuration(s) did not run: olmo_core-eager-sdpa-plain"

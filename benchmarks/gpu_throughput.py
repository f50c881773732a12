"""GPU training throughput: tokens/s per GPU and MFU of the OLMo-2 1B shape, with and without a paper-scale insertion
plan, on the olmo_core framework (OLMo-core's Trainer, ``torch.compile``, flash or SDPA attention, bf16) and on the
hf framework (``transformers.Trainer``, SDPA, bf16), in one run.

Every configuration is a real from-scratch run of the project's CLI (``model.init=random``,
``model.config=olmo2_1B_v2``: OLMo-core's ``TransformerConfig.olmo2_1B_v2``, the released OLMo-2 1B: 16 layers,
d_model 2048; for hf the same shape exported to an HF ``Olmo2ForCausalLM`` config) at sequence length 4096 with
a micro-batch of ``--micro-batch`` rows per GPU (4: the OLMo-2 1B recipe's rank micro-batch of 16,384 tokens), on
the Shakespeare corpus's dolma2 tokens. The insertion plan writes fictional
biographies at dup counts 1/2/4/8 into ``--fraction`` (default 1.5%) of the training tokens. tokens/s per GPU is the
median over the steps after ``--warmup`` (compilation and the first steps excluded), read from the run's
``metrics.jsonl`` (OLMo-core's speed monitor ``throughput/device/TPS``; the hf framework's per-step tokens/s); MFU =
tokens/s/GPU x OLMo-core's ``num_flops_per_token(4096)`` of the model / the peak (``--peak-tflops``, H100 SXM bf16
dense 989 TFLOP/s). Prints one table and the ratios insertion on / off (goal >= 0.99) and the MFU goals (olmo_core
>= 45%, hf >= 35%). Numbers are printed, not asserted.

``--tiny`` runs the same code path on a CPU in about a minute: the ``olmo2_14M`` shape, sequence length 128, 3 steps,
no compile, SDPA, fp32, a nominal 1 TFLOP/s peak (the figures mean nothing there).

Usage: ``python benchmarks/gpu_throughput.py [--frameworks olmo_core,hf] [--steps N] [--micro-batch M]
[--attention flash|sdpa] [--no-compile] [--tiny]`` (``make gpu-bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
H100_BF16_DENSE_TFLOPS = 989.0  #: NVIDIA H100 SXM bf16 dense peak
BIO_TOKENS = 46.5  #: mean dolma2 tokens of one generated fictional biography
REPETITIONS = (1, 2, 4, 8)


@dataclass
class Setup:
    """One benchmark shape: model builder, sequence length, micro-batch, steps, precision and compile."""

    config: str
    sequence_length: int
    micro_batch: int
    steps: int
    warmup: int
    precision: str
    compile: bool
    attention: str
    peak_tflops: float


def bios_for_fraction(fraction: float, window_tokens: int) -> int:
    """Number of fictional biographies (a multiple of 4, one quarter per dup count in :data:`REPETITIONS`) whose
    copies fill about ``fraction`` of a ``window_tokens``-token training window."""
    per_item = BIO_TOKENS * sum(REPETITIONS) / len(REPETITIONS)
    return max(4, 4 * round(fraction * window_tokens / per_item / 4))


def run_overrides(framework: str, setup: Setup, insertion: bool, fraction: float,
                  hf_config: Optional[Path]) -> List[str]:
    """The CLI overrides of one configuration (a from-scratch run of ``setup`` on ``framework``)."""
    L, B = setup.sequence_length, setup.micro_batch
    out = ["model=scratch", "data=shakespeare", "training=tiny", "wandb=disabled", "eval=[]",
           f"training.num_steps={setup.steps}", f"training.checkpoint_interval={setup.steps}",
           f"training.sequence_length={L}", f"training.global_batch_size={B}", f"training.micro_batch_size={B}",
           f"training.precision={setup.precision}", "training.learning_rate=4e-4", "training.warmup_steps=0",
           "training.lr_scheduler=constant", "data.held_out_rows=0", "insertion.verify=false"]
    if framework == "olmo_core":
        out += ["framework=olmo_core", "framework.lr_schedule=run", f"model.config={setup.config}",
                f"training.compile={str(setup.compile).lower()}", f"training.attention={setup.attention}"]
    else:
        out += ["framework=hf", f"model.config={hf_config}", "model.tokenizer=dolma2",
                "framework.attn_implementation=sdpa"]
    if insertion:
        n = bios_for_fraction(fraction, setup.steps * B * L)
        out += ["insertion=fictional_bios", f"insertion.experiments.fictional_bios.num_items={n}",
                f"insertion.experiments.fictional_bios.repetitions=[{','.join(map(str, REPETITIONS))}]"]
    else:
        out += ["insertion=none"]
    return out


def steady_tokens_per_s(metrics_path: Path, warmup: int) -> float:
    """Median ``train/tokens_per_s`` of the steps after ``warmup`` in a run's ``metrics.jsonl``.

    :raises RuntimeError: if no step after the warmup logged it.
    """
    values = [m["train/tokens_per_s"] for m in map(json.loads, metrics_path.read_text().splitlines())
              if "train/tokens_per_s" in m and m["step"] > warmup]
    if not values:
        raise RuntimeError(f"{metrics_path}: no train/tokens_per_s after step {warmup}")
    return float(statistics.median(values))


def flops_per_token(config: str, sequence_length: int, vocab_size: int = 100_352) -> int:
    """OLMo-core's idealised training FLOPs per token (``Transformer.num_flops_per_token``) of builder ``config``."""
    import torch

    from frameworks.olmo_core.presets import builder_config

    with torch.device("meta"):
        model = builder_config(config, vocab_size, 0).build(init_device="meta")
    return int(model.num_flops_per_token(sequence_length))


def mfu(tokens_per_s_per_gpu: float, flops_per_tok: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s per GPU over the peak (a fraction)."""
    return tokens_per_s_per_gpu * flops_per_tok / (peak_tflops * 1e12)


def plan_fraction(run_dir: Path) -> float:
    """Share of the run's training tokens the saved plan rewrites (0 without a plan)."""
    from pretrain_exp.insertion.plan import Plan

    path = run_dir / "plan.npz"
    if not path.is_file():
        return 0.0
    plan = Plan.load(path)
    return float(plan.lengths.sum()) / (plan.window[1] - plan.window[0])


def hf_config_of(config: str, out: Path, cache_dir: str) -> Path:
    """The HF ``config.json`` of OLMo-core builder ``config``: its seeded from-scratch checkpoint exported with
    OLMo-core's own HF converter (:class:`~frameworks.olmo_core.checkpoint.OlmoCoreCheckpoint`)."""
    from frameworks.olmo_core.checkpoint import OlmoCoreCheckpoint
    from frameworks.olmo_core.presets import random_init_checkpoint
    from pretrain_exp.core.config import ModelConf
    from pretrain_exp.data.tokenize import load_tokenizer

    ckpt = random_init_checkpoint(ModelConf(name="bench", init="random", config=config, init_seed=0), cache_dir)
    hf_dir = OlmoCoreCheckpoint(ckpt, 0, load_tokenizer("dolma2", cache_dir)).to_hf(out)
    return Path(hf_dir) / "config.json"


def run_one(overrides: List[str], run_dir: Path, env: Dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "pretrain_exp", *overrides, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nexit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frameworks", default="olmo_core,hf")
    ap.add_argument("--config", default="olmo2_1B_v2",
                    help="OLMo-core TransformerConfig builder (olmo2_1B_v2: the released OLMo-2 1B)")
    ap.add_argument("--sequence-length", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=4, help="rows per GPU per step (OLMo-2 1B recipe: 4)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of the median (compilation)")
    ap.add_argument("--fraction", type=float, default=0.015, help="share of training tokens the plan rewrites")
    ap.add_argument("--attention", choices=["flash", "sdpa"], default="flash")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=H100_BF16_DENSE_TFLOPS)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run of the same code path")
    ap.add_argument("--out", type=Path, default=None, help="keep the run dirs here (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.tiny:
        setup = Setup("olmo2_14M", 128, 4, 3, 1, "fp32", False, "sdpa", 1.0)
    else:
        setup = Setup(args.config, args.sequence_length, args.micro_batch, args.steps, args.warmup, "bf16",
                      not args.no_compile, args.attention, args.peak_tflops)
    cache_dir = os.environ.get("PRETRAIN_EXP_CACHE", str(Path.home() / ".cache" / "pretrain_exp"))
    env = os.environ | {"PRETRAIN_EXP_CACHE": cache_dir, "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT)}
    fpt = flops_per_token(setup.config, setup.sequence_length)
    frameworks = [f for f in args.frameworks.split(",") if f]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        out = args.out or Path(tmp)
        hf_config = hf_config_of(setup.config, out / "hf-config", cache_dir) if "hf" in frameworks else None
        for fw in frameworks:
            for insertion in (False, True):
                run_dir = out / f"{fw}-{'insert' if insertion else 'plain'}"
                run_one(run_overrides(fw, setup, insertion, args.fraction, hf_config), run_dir, env)
                tps = steady_tokens_per_s(run_dir / "metrics.jsonl", setup.warmup)
                rows.append((fw, insertion, plan_fraction(run_dir), tps, mfu(tps, fpt, setup.peak_tflops)))
    print(f"{setup.config}, L={setup.sequence_length}, micro-batch {setup.micro_batch}, {setup.steps} steps "
          f"(median after {setup.warmup}), {setup.precision}, compile={setup.compile}, attention={setup.attention}, "
          f"{fpt / 1e9:.2f} GFLOP/token, peak {setup.peak_tflops:g} TFLOP/s")
    print(f"{'framework':<10} {'insertions':>10} {'plan share':>10} {'tokens/s/GPU':>13} {'MFU':>7}")
    for fw, ins, frac, tps, m in rows:
        print(f"{fw:<10} {'on' if ins else 'off':>10} {100 * frac:>9.2f}% {tps:>13,.0f} {100 * m:>6.1f}%")
    by = {(fw, ins): tps for fw, ins, _, tps, _ in rows}
    goals = {"olmo_core": 0.45, "hf": 0.35}
    for fw in frameworks:
        ratio = by[(fw, True)] / by[(fw, False)]
        best = max(m for f, _, _, _, m in rows if f == fw)
        print(f"{fw}: insertion on / off = {ratio:.3f} (goal >= 0.99); MFU {100 * best:.1f}% "
              f"(goal >= {100 * goals[fw]:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

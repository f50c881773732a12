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
dense 989 TFLOP/s, also the H200's). Each olmo_core configuration runs for every ``--compile`` (on, off) and
``--attention`` (sdpa, flash: left out with a note where flash-attn is not installed) setting, each hf one for every
``--compile`` setting (``training.compile``: ``TrainingArguments.torch_compile``); the anchor is
OLMo-core's own ``Trainer`` on the same shape, tokens and settings with nothing of the project in the loop
(:func:`bare_olmo_core`). Each row also gives the data wait per step (OLMo-core's ``throughput/device/data loading
(%)``), the peak GPU memory in use during the run (``nvidia-smi``) and OLMo-core's peak reserved memory.
``--probe-micro-batch 4,8,16`` tries one training step per micro-batch size for the largest that fits.
``--remote-latency-ms MS`` adds an olmo_core row (insertion on) whose token file is read over HTTP from a Range server
on 127.0.0.1 (``tests/remote_server.py``, its own process, ``MS`` ms added to every request) through the run's window
prefetch and OLMo-core's 4 loader workers: its data wait per step is the figure (goal <= 1%).
``--async-eval`` adds an ``eval.mode=async`` run (:func:`async_eval_run`): OLMo-core's ``--async-config`` shape
(default ``olmo2_190M``) trains 3 segments while the default evals of each segment's checkpoint run in their own
process on the same GPU; it prints the median tokens/s of the steps with evals beside them over the steps of the
first segment (none beside them), and the peak GPU memory.
``--precision bf16,fp8`` runs every olmo_core configuration in each ``training.precision`` (fp8: OLMo-core's float8
training, olmo_core/olmo2 only, so hf keeps the others), on the same tokens from the same seed; it prints
tokens/s fp8 / bf16 (goal >= 1.15) and the training loss of each at the last step with their difference (MFU stays
against the bf16 peak). Prints one table and the ratios insertion on / off (goal >= 0.99), project / anchor (goal
>= 0.98; the anchor runs in bf16) and the MFU goals (olmo_core >= 45%, hf >= 35%). Numbers are printed, not
asserted; a failed configuration is reported, the others still run, and the exit status is 1.

``--tiny`` runs the same code path on a CPU in about a minute: the ``olmo2_14M`` shape, sequence length 128, 3 steps,
no compile, SDPA, fp32 (unless ``--precision`` says otherwise; fp8 is refused without a float8 GPU, and reported as
a failed configuration), a nominal 1 TFLOP/s peak (the figures mean nothing there).

Usage: ``python benchmarks/gpu_throughput.py [--frameworks olmo_core,hf] [--steps N] [--micro-batch M]
[--compile on,off] [--attention sdpa,flash] [--precision bf16,fp8] [--no-bare] [--probe-micro-batch 4,8] [--tiny]``
(``make gpu-bench ARGS=...``); the measured H200 table is in docs/development/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
FP8_GOAL = 1.15  #: tokens/s of fp8 over bf16 (same shape, compile and attention)


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
                  hf_config: Optional[Path], data: Optional[List[str]] = None) -> List[str]:
    """The CLI overrides of one configuration (a from-scratch run of ``setup`` on ``framework``); ``data``
    replaces ``data=shakespeare`` (e.g. remote token files)."""
    L, B = setup.sequence_length, setup.micro_batch
    out = [*(data or ["data=shakespeare"]), "model=scratch", "training=tiny", "wandb=disabled", "eval=[]",
           f"training.num_steps={setup.steps}", f"training.checkpoint_interval={setup.steps}",
           f"training.sequence_length={L}", f"training.global_batch_size={B}", f"training.micro_batch_size={B}",
           f"training.precision={setup.precision}", "training.learning_rate=4e-4", "training.warmup_steps=0",
           "training.lr_scheduler=constant", "data.held_out_rows=0", "insertion.verify=false"]
    if framework == "olmo_core":
        out += ["framework=olmo_core", "framework.lr_schedule=run", f"model.config={setup.config}",
                f"training.compile={str(setup.compile).lower()}", f"training.attention={setup.attention}"]
    else:
        out += ["framework=hf", f"model.config={hf_config}", "model.tokenizer=dolma2",
                "framework.attn_implementation=sdpa", f"training.compile={str(setup.compile).lower()}"]
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

    from pretrain_exp.frameworks.olmo_core.presets import builder_config

    with torch.device("meta"):
        model = builder_config(config, vocab_size, 0).build(init_device="meta")
    return int(model.num_flops_per_token(sequence_length))


def mfu(tokens_per_s_per_gpu: float, flops_per_tok: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s per GPU over the peak (a fraction)."""
    return tokens_per_s_per_gpu * flops_per_tok / (peak_tflops * 1e12)


def last_loss(metrics_path: Path) -> tuple:
    """``(step, loss)`` of the last step in a ``metrics.jsonl`` that logged the training loss (``train/loss``; the
    anchor's ``train/CE loss``), or ``(None, None)``."""
    last = (None, None)
    for m in map(json.loads, metrics_path.read_text().splitlines()):
        loss = m.get("train/loss", m.get("train/CE loss"))
        if loss is not None and (last[0] is None or m["step"] >= last[0]):
            last = (m["step"], float(loss))
    return last


def precision_lines(rows: List[dict], base: str = "bf16", other: str = "fp8", goal: float = FP8_GOAL) -> List[str]:
    """For every configuration (framework, compile, attention, insertion) measured in precision ``base`` and
    ``other``: tokens/s ``other`` / ``base`` against ``goal``, and the loss of each at its last step with the
    difference ``other - base`` (the runs share tokens and seed, so they differ by their precision only)."""
    by = {(r["framework"], r["compile"], r["attention"], r["insertion"], r["precision"]): r for r in rows}
    out = []
    for (fw, comp, attn, ins, prec), a in by.items():
        b = by.get((fw, comp, attn, ins, other))
        if prec != base or b is None:
            continue
        where = f"{fw} (compile {'on' if comp else 'off'}, {attn}, insertion {'on' if ins else 'off'})"
        line = f"{where}: {other} / {base} tokens/s = {b['tps'] / a['tps']:.3f} (goal >= {goal:g})"
        if a["loss"] is not None and b["loss"] is not None:
            line += (f"; loss at step {a['loss_step']}: {base} {a['loss']:.4f}, {other} {b['loss']:.4f} "
                     f"({other} - {base} = {b['loss'] - a['loss']:+.4f})")
        out.append(line)
    return out


def plan_fraction(run_dir: Path) -> float:
    """Share of the run's training tokens the saved plan rewrites (0 without a plan)."""
    from pretrain_exp.core.rundir import RunDir
    from pretrain_exp.insertion.plan import Plan

    path = RunDir(run_dir).plan
    if not path.is_file():
        return 0.0
    plan = Plan.load(path)
    return float(plan.lengths.sum()) / (plan.window[1] - plan.window[0])


def hf_config_of(config: str, out: Path, cache_dir: str) -> Path:
    """The HF ``config.json`` of OLMo-core builder ``config``: its seeded from-scratch checkpoint exported with
    OLMo-core's own HF converter (:class:`~pretrain_exp.frameworks.olmo_core.checkpoint.OlmoCoreCheckpoint`)."""
    from pretrain_exp.core.config import ModelConf
    from pretrain_exp.data.tokenize import load_tokenizer
    from pretrain_exp.frameworks.olmo_core.checkpoint import OlmoCoreCheckpoint
    from pretrain_exp.frameworks.olmo_core.presets import random_init_checkpoint

    ckpt = random_init_checkpoint(ModelConf(name="bench", init="random", config=config, init_seed=0), cache_dir)
    hf_dir = OlmoCoreCheckpoint(ckpt, 0, load_tokenizer("dolma2", cache_dir)).to_hf(out)
    return Path(hf_dir) / "config.json"


class GpuMemoryPoll:
    """Peak GPU memory in use (GiB, ``nvidia-smi``'s ``memory.used`` of the device: the CUDA context and the
    allocator's reserve included) while the ``with`` block runs, sampled every 200 ms; ``None`` without
    ``nvidia-smi`` (CPU)."""

    def __enter__(self):
        import shutil
        import threading

        self.peak_mib: Optional[float] = None
        self.proc = None
        if shutil.which("nvidia-smi") is None:
            return self
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "-i", "0", "-lms", "200"], stdout=subprocess.PIPE, text=True)

        def read():
            for line in self.proc.stdout:
                try:
                    self.peak_mib = max(self.peak_mib or 0.0, float(line.strip()))
                except ValueError:
                    continue

        self.thread = threading.Thread(target=read, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
            self.thread.join(timeout=5)

    @property
    def peak_gib(self) -> Optional[float]:
        return None if self.peak_mib is None else self.peak_mib / 1024


def run_one(overrides: List[str], run_dir: Path, env: Dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "pretrain_exp", *overrides, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nexit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def steady_median(metrics_path: Path, name: str, warmup: int) -> Optional[float]:
    """Median of metric ``name`` over the steps after ``warmup`` in a ``metrics.jsonl`` (``None`` if absent)."""
    values = [m[name] for m in map(json.loads, metrics_path.read_text().splitlines())
              if name in m and m["step"] > warmup]
    return float(statistics.median(values)) if values else None


def dolma2_token_file(cache_dir: str) -> Path:
    """The Shakespeare corpus's dolma2 token file in the cache (uint32 ids), tokenized there first if no run has
    (the project's tokenizer and cache, so the project's runs read the same file).

    :raises DataError: if the corpus or the tokenizer cannot be read from the cache or the registry.
    """
    from pretrain_exp.core.cachedir import CacheDir
    from pretrain_exp.data.tokenize import load_tokenizer, tokenize_sources

    files = tokenize_sources("shakespeare", load_tokenizer("dolma2", cache_dir), CacheDir(cache_dir).tokens, cache_dir,
                             progress=False)
    return files[0]


def bare_olmo_core(setup: Setup, token_file: Path, run_dir: Path) -> None:
    """The anchor: OLMo-core's own ``Trainer`` on the same shape, tokens, micro-batch, precision, attention and
    compile setting as the project's ``olmo_core`` runs, with nothing of the project in the loop (AdamW at a
    constant LR 4e-4, a loader of 4 workers, no checkpoint). Writes ``metrics.jsonl`` with the same names as a run
    (``train/tokens_per_s`` from OLMo-core's ``throughput/device/TPS``)."""
    import torch
    from olmo_core.config import DType
    from olmo_core.data import NumpyDataLoaderConfig, NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig
    from olmo_core.nn.attention.backend import AttentionBackendName
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.optim import AdamWConfig, ConstantScheduler
    from olmo_core.train import Duration, TrainerConfig, prepare_training_environment
    from olmo_core.train.callbacks import Callback, CheckpointerCallback
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    from pretrain_exp.core.rundir import RunDir

    L, B = setup.sequence_length, setup.micro_batch
    cuda = torch.cuda.is_available()
    prepare_training_environment(backend=None)
    config = getattr(TransformerConfig, setup.config)(vocab_size=100_352)
    if cuda:
        config.block.sequence_mixer.backend = (AttentionBackendName.flash_2 if setup.attention == "flash"
                                               else AttentionBackendName.torch)
    model = config.build(init_device="meta")
    module = TransformerTrainModuleConfig(
        rank_microbatch_size=B * L, max_sequence_length=L, optim=AdamWConfig(lr=4e-4), scheduler=ConstantScheduler(),
        max_grad_norm=1.0, autocast_precision=DType.bfloat16 if setup.precision == "bf16" else None,
        compile_model=setup.compile).build(model, device=torch.device("cuda" if cuda else "cpu"))
    dataset = NumpyFSLDatasetConfig(paths=[str(token_file)], sequence_length=L, dtype=NumpyDatasetDType.uint32,
                                    tokenizer=TokenizerConfig.dolma2(), work_dir=str(run_dir / "work")).build()
    loader = NumpyDataLoaderConfig(global_batch_size=B * L, seed=0, num_workers=4 if cuda else 0,
                                   prefetch_factor=2 if cuda else None, work_dir=str(run_dir / "work")).build(dataset)
    out = RunDir(run_dir).metrics

    class Record(Callback):
        def log_metrics(self, step, metrics):
            rec = {"step": step, **{k: float(v) for k, v in metrics.items()}}
            if "throughput/device/TPS" in metrics:
                rec["train/tokens_per_s"] = float(metrics["throughput/device/TPS"])
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")

    TrainerConfig(save_folder=str(RunDir(run_dir).checkpoints), max_duration=Duration.steps(setup.steps),
                  metrics_collect_interval=1, device="cuda" if cuda else "cpu",
                  callbacks={"record": Record(), "checkpointer": CheckpointerCallback(enabled=False)},
                  ).build(module, loader).fit()


class RemoteTokens:
    """``token_file`` served over HTTP by ``tests/remote_server.py`` in a child process (its own GIL, as a real
    server) with ``latency_ms`` added to every request; a context manager whose ``overrides`` point a run at it
    (``data=token_files``, the file's URL, ``data.prefetch=window``)."""

    def __init__(self, token_file: Path, latency_ms: float):
        self.token_file, self.latency_ms = token_file, latency_ms

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.remote_server", str(self.token_file.parent),
                                      "--latency-ms", str(self.latency_ms)], cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        base = self.proc.stdout.readline().strip()
        self.overrides = ["data=token_files", f"data.paths=[{base}/{self.token_file.name}]", "data.dtype=uint32",
                          "data.prefetch=window"]
        return self

    def __exit__(self, *exc):
        self.proc.stdin.close()
        self.served = self.proc.stdout.read().split()
        self.proc.wait(timeout=30)


def async_eval_run(config: str, sequence_length: int, micro_batch: int, steps: int, warmup: int, precision: str,
                   run_dir: Path, env: Dict[str, str]) -> dict:
    """A from-scratch ``framework=olmo_core`` run of builder ``config`` with the default evals in
    ``eval.mode=async``: ``steps`` steps in 3 segments; each segment's evals (HF export, then the evals in their own
    process) run beside the next segment's training on the same device. Returns the median tokens/s of steps
    ``warmup+1 .. steps/3`` (nothing beside them) and of the later steps (evals beside some of them), their ratio,
    the peak GPU memory (``nvidia-smi``) and the run's exit status.

    :raises RuntimeError: if the run fails.
    """
    from pretrain_exp.core.rundir import RunDir

    seg = steps // 3
    overrides = ["model=scratch", "data=shakespeare", "training=tiny", "wandb=disabled", "framework=olmo_core",
                 "framework.lr_schedule=run", f"model.config={config}", f"training.num_steps={3 * seg}",
                 f"training.checkpoint_interval={seg}", f"training.sequence_length={sequence_length}",
                 f"training.global_batch_size={micro_batch}", f"training.micro_batch_size={micro_batch}",
                 f"training.precision={precision}", "training.warmup_steps=0", "training.lr_scheduler=constant",
                 "data.held_out_rows=null", "eval.mode=async", "eval.async_launcher=local",
                 "training.export_hf=every"]
    with GpuMemoryPoll() as mem:
        run_one(overrides, run_dir, env)
    recs = [json.loads(x) for x in RunDir(run_dir).metrics.read_text().splitlines()]
    tps = {m["step"]: m["train/tokens_per_s"] for m in recs if "train/tokens_per_s" in m}
    alone = [v for k, v in tps.items() if warmup < k <= seg]
    beside = [v for k, v in tps.items() if k > seg + 1]
    evals = [d.name for _, d in RunDir(run_dir).eval_steps()]
    if not alone or not beside:
        raise RuntimeError(f"{run_dir}: too few steps logged ({sorted(tps)})")
    a, b = statistics.median(alone), statistics.median(beside)
    return {"alone_tps": a, "beside_tps": b, "ratio": b / a, "peak_gib": mem.peak_gib, "evals": evals,
            "segment_steps": seg}


def probe_micro_batch(setup: Setup, sizes: List[int]) -> List[tuple]:
    """``[(micro-batch, fits, peak allocated GiB)]``: one OLMo-core training step (forward with its loss,
    backward, AdamW step) of ``setup``'s model at sequence length ``L`` in bf16 autocast for each micro-batch size
    in increasing order, until one runs out of GPU memory (``torch.cuda.OutOfMemoryError``)."""
    import torch
    from olmo_core.nn.attention.backend import AttentionBackendName
    from olmo_core.nn.transformer import TransformerConfig

    out = []
    L = setup.sequence_length
    for mb in sorted(sizes):
        config = getattr(TransformerConfig, setup.config)(vocab_size=100_352)
        config.block.sequence_mixer.backend = AttentionBackendName.torch
        model = optim = None
        try:
            model = config.build(init_device="cuda")
            model.init_weights(device=torch.device("cuda"))
            optim = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            torch.cuda.reset_peak_memory_stats()
            ids = torch.randint(0, 100_278, (mb, L + 1), device="cuda")
            for _ in range(2):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(ids[:, :-1], labels=ids[:, 1:]).loss
                loss.backward()
                optim.step()
                optim.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            out.append((mb, True, torch.cuda.max_memory_allocated() / 2**30))
        except torch.cuda.OutOfMemoryError:
            out.append((mb, False, None))
        finally:
            del model, optim
            torch.cuda.empty_cache()
        if not out[-1][1]:
            break
    return out


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
    ap.add_argument("--attention", default="sdpa,flash",
                    help="olmo_core attention backends, comma-separated: sdpa, flash (flash-attn 2; skipped with a "
                         "note where it is not installed)")
    ap.add_argument("--compile", default="on,off", help="olmo_core torch.compile settings, comma-separated: on, off")
    ap.add_argument("--precision", default=None,
                    help="training.precision of each configuration, comma-separated: bf16, fp8 (olmo_core only; "
                         "needs a GPU of compute capability >= 8.9 and torchao), fp32; default bf16 (--tiny: fp32)")
    ap.add_argument("--no-compile", action="store_true", help="same as --compile off")
    ap.add_argument("--insertion", default="off,on", help="insertion plan settings, comma-separated: off, on")
    ap.add_argument("--bare", action=argparse.BooleanOptionalAction, default=True,
                    help="also OLMo-core's own trainer (the anchor), with the first olmo_core variant's settings")
    ap.add_argument("--probe-micro-batch", default="",
                    help="micro-batch sizes to try in one OLMo-core step each (largest that fits), e.g. 4,8,16,32")
    ap.add_argument("--hf-config", type=Path, default=None,
                    help="HF config.json of --config (default: exported from its from-scratch checkpoint)")
    ap.add_argument("--remote-latency-ms", type=float, default=None,
                    help="also an olmo_core row (insertion on) reading its tokens over HTTP from a local server "
                         "with this latency per request (window prefetch, OLMo-core's 4 loader workers)")
    ap.add_argument("--async-eval", action="store_true",
                    help="also an eval.mode=async run: step time with the default evals beside training")
    ap.add_argument("--async-config", default="olmo2_190M", help="model builder of the --async-eval run")
    ap.add_argument("--async-steps", type=int, default=60, help="steps of the --async-eval run (3 segments)")
    ap.add_argument("--peak-tflops", type=float, default=H100_BF16_DENSE_TFLOPS)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run of the same code path")
    ap.add_argument("--out", type=Path, default=None, help="keep the run dirs here (default: a temp dir, each run "
                    "dir removed once measured)")
    ap.add_argument("--bare-run", type=Path, default=None, help=argparse.SUPPRESS)  # internal: the anchor's process
    args = ap.parse_args(argv)
    compile_modes = ["off"] if args.no_compile else [c for c in args.compile.split(",") if c]
    base_precision = "fp32" if args.tiny else "bf16"  #: the anchor's, and the default
    precisions = [p for p in (args.precision or base_precision).split(",") if p]
    unknown = sorted(set(precisions) - {"bf16", "fp8", "fp32", "auto"})
    if unknown or not precisions:
        ap.error(f"--precision: unknown {unknown or precisions}; allowed: bf16, fp8, fp32, auto")
    if args.tiny:
        setup = Setup("olmo2_14M", 128, 4, 3, 1, precisions[0], False, "sdpa", 1.0)
        compile_modes, attentions = ["off"], ["sdpa"]
    else:
        setup = Setup(args.config, args.sequence_length, args.micro_batch, args.steps, args.warmup, precisions[0],
                      compile_modes[0] == "on", args.attention.split(",")[0], args.peak_tflops)
        attentions = [a for a in args.attention.split(",") if a]
    cache_dir = os.environ.get("PRETRAIN_EXP_CACHE", str(Path.home() / ".cache" / "pretrain_exp"))
    if args.bare_run is not None:
        bare_olmo_core(Setup(**{**setup.__dict__, "precision": base_precision}), dolma2_token_file(cache_dir),
                       args.bare_run)
        return 0
    import importlib.util

    if "flash" in attentions and importlib.util.find_spec("flash_attn") is None:
        print("note: flash-attn is not installed here; the flash rows are left out")
        attentions = [a for a in attentions if a != "flash"] or ["sdpa"]
    # the checkout first, then the caller's entries (where the libraries live when they are not installed)
    env = os.environ | {"PRETRAIN_EXP_CACHE": cache_dir, "WANDB_SILENT": "true",
                        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    fpt = flops_per_token(setup.config, setup.sequence_length)
    frameworks = [f for f in args.frameworks.split(",") if f]
    insertions = [i == "on" for i in args.insertion.split(",") if i]
    device = "CPU"
    import torch

    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    rows, failed = [], []  # failed: the configurations that did not run (the exit status says so)
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        out = args.out or Path(tmp)
        hf_config = None
        if "hf" in frameworks:
            hf_config = args.hf_config or hf_config_of(setup.config, out / "hf-config", cache_dir)
        variants = []
        for fw in frameworks:
            if fw == "olmo_core":
                variants += [(fw, c == "on", a, p) for p in precisions for c in compile_modes for a in attentions]
            else:  # hf: SDPA; compiled through TrainingArguments.torch_compile (training.compile); no fp8
                variants += [(fw, c == "on", "sdpa", p) for p in precisions if p != "fp8" for c in compile_modes]
        if "hf" in frameworks and "fp8" in precisions:
            print("note: training.precision=fp8 is OLMo-core's float8 training; the hf rows run the other precisions")
        multi = len(precisions) > 1  # run dirs and ratio labels name the precision
        if args.bare and "olmo_core" in frameworks:
            dolma2_token_file(cache_dir)  # tokenized here, so the anchor and the runs read one file
            s = Setup(**{**setup.__dict__, "compile": compile_modes[0] == "on", "attention": attentions[0],
                         "precision": base_precision})
            run_dir = out / "olmo_core-bare"
            run_dir.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, str(Path(__file__).resolve()), "--bare-run", str(run_dir), "--config", s.config,
                   "--sequence-length", str(s.sequence_length), "--micro-batch", str(s.micro_batch), "--steps",
                   str(s.steps), "--warmup", str(s.warmup), "--attention", s.attention,
                   "--compile", "on" if s.compile else "off"] + (["--tiny"] if args.tiny else [])
            with GpuMemoryPoll() as mem:
                proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"failed: {' '.join(cmd)}\nexit {proc.returncode}\n{proc.stderr[-3000:]}", flush=True)
                failed.append("olmo_core-bare")
            else:
                rows.append(measure(run_dir, "olmo_core (bare OLMo-core Trainer)", s.compile, s.attention, False, s,
                                    fpt, mem.peak_gib))
                print(f"measured bare OLMo-core: {rows[-1]}", flush=True)
        for fw, comp, attn, prec in variants:
            s = Setup(**{**setup.__dict__, "compile": comp, "attention": attn, "precision": prec})
            for insertion in insertions:
                name = (f"{fw}-{'compile' if comp else 'eager'}-{attn}-{'insert' if insertion else 'plain'}"
                        f"{'-' + prec if multi else ''}")
                run_dir = out / name
                try:
                    with GpuMemoryPoll() as mem:
                        run_one(run_overrides(fw, s, insertion, args.fraction, hf_config)
                                + ["training.export_hf=none"], run_dir, env)
                except RuntimeError as e:  # the other configurations still run; the table leaves this one out
                    print(f"failed: {e}", flush=True)
                    failed.append(name)
                    continue
                rows.append(measure(run_dir, fw, comp, attn, insertion, s, fpt, mem.peak_gib))
                print(f"measured {name}: {rows[-1]}", flush=True)
                if args.out is None:
                    shutil.rmtree(run_dir, ignore_errors=True)
        if args.remote_latency_ms is not None and "olmo_core" in frameworks:
            s = Setup(**{**setup.__dict__, "compile": compile_modes[0] == "on", "attention": attentions[0]})
            label = f"olmo_core (remote, {args.remote_latency_ms:g} ms/request)"
            run_dir = out / "olmo_core-remote"
            try:
                with RemoteTokens(dolma2_token_file(cache_dir), args.remote_latency_ms) as remote, \
                        GpuMemoryPoll() as mem:
                    run_one(run_overrides("olmo_core", s, True, args.fraction, None, remote.overrides)
                            + ["training.export_hf=none"], run_dir, env)
                rows.append(measure(run_dir, label, s.compile, s.attention, True, s, fpt, mem.peak_gib))
                print(f"measured {label}: {rows[-1]}; served (requests, bytes): {remote.served}", flush=True)
            except RuntimeError as e:
                print(f"failed: {e}", flush=True)
                failed.append(label)
        if args.async_eval:
            cfg = "olmo2_14M" if args.tiny else args.async_config
            L = setup.sequence_length
            try:
                res = async_eval_run(cfg, L, setup.micro_batch, 24 if args.tiny else args.async_steps,
                                     1 if args.tiny else setup.warmup, setup.precision, out / "olmo_core-async", env)
                print(f"eval.mode=async ({cfg}, L={L}, micro-batch {setup.micro_batch}, {res['segment_steps']} steps "
                      f"per segment, evals {', '.join(res['evals'])}): tokens/s with evals beside / alone = "
                      f"{res['beside_tps']:,.0f} / {res['alone_tps']:,.0f} = {res['ratio']:.3f}; peak GPU memory "
                      f"{'n/a' if res['peak_gib'] is None else format(res['peak_gib'], '.1f') + ' GiB'}", flush=True)
            except RuntimeError as e:
                print(f"failed: eval.mode=async run: {e}", flush=True)
                failed.append("eval.mode=async")
    print(f"{device}: {setup.config}, L={setup.sequence_length}, micro-batch {setup.micro_batch}, {setup.steps} "
          f"steps (median after {setup.warmup}), {','.join(precisions)}, {fpt / 1e9:.2f} GFLOP/token, peak "
          f"{setup.peak_tflops:g} TFLOP/s")
    head = (f"{'framework':<36} {'compile':>7} {'attn':>5} {'prec':>4} {'insert':>6} {'plan share':>10} "
            f"{'tokens/s/GPU':>13} {'MFU':>6} {'data wait':>9} {'peak mem':>9} {'reserved':>9} {'last loss':>9}")
    print(head)

    def gib(x):
        return "n/a" if x is None else f"{x:.1f} GiB"

    for r in rows:
        wait = "n/a" if r["data_wait_pct"] is None else f"{r['data_wait_pct']:.2f}%"
        loss = "n/a" if r["loss"] is None else f"{r['loss']:.4f}"
        print(f"{r['framework']:<36} {'on' if r['compile'] else 'off':>7} {r['attention']:>5} {r['precision']:>4} "
              f"{'on' if r['insertion'] else 'off':>6} {100 * r['plan_share']:>9.2f}% {r['tps']:>13,.0f} "
              f"{100 * r['mfu']:>5.1f}% {wait:>9} {gib(r['peak_gib']):>9} {gib(r['reserved_gib']):>9} {loss:>9}")
    goals = {"olmo_core": 0.45, "hf": 0.35}
    by = {(r["framework"], r["compile"], r["attention"], r["insertion"], r["precision"]): r["tps"] for r in rows}
    bare = next((r["tps"] for r in rows if r["framework"].startswith("olmo_core (bare")), None)
    for fw, comp, attn, prec in variants:
        if (fw, comp, attn, True, prec) in by and (fw, comp, attn, False, prec) in by:
            ratio = by[(fw, comp, attn, True, prec)] / by[(fw, comp, attn, False, prec)]
            print(f"{fw} (compile {'on' if comp else 'off'}, {attn}{', ' + prec if multi else ''}): insertion on / "
                  f"off = {ratio:.3f} (goal >= 0.99)")
    for line in precision_lines(rows):
        print(line)
    for fw in frameworks:
        best = max((r["mfu"] for r in rows if r["framework"] == fw), default=0.0)
        print(f"{fw}: best MFU {100 * best:.1f}% (goal >= {100 * goals[fw]:.0f}%)")
    if bare is not None:
        s = setup.compile, setup.attention
        for insertion in insertions:
            key = ("olmo_core", *s, insertion, base_precision)
            if key in by:
                print(f"olmo_core (compile {'on' if s[0] else 'off'}, {s[1]}, insertion "
                      f"{'on' if insertion else 'off'}) / bare OLMo-core = {by[key] / bare:.3f} (goal >= 0.98)")
    if args.probe_micro_batch:
        if not torch.cuda.is_available():
            print("micro-batch probe: needs a GPU")
        else:
            sizes = [int(x) for x in args.probe_micro_batch.split(",")]
            for mb, fits, peak in probe_micro_batch(setup, sizes):
                result = f"fits, peak allocated {peak:.1f} GiB" if fits else "out of memory"
                print(f"micro-batch {mb} x {setup.sequence_length}: {result}")
    if failed:
        print(f"error: {len(failed)} configuration(s) did not run: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def measure(run_dir: Path, fw: str, comp: bool, attn: str, insertion: bool, setup: Setup, fpt: int,
            peak_gib: Optional[float]) -> dict:
    """One table row from a finished run dir's ``metrics.jsonl`` (and ``plan.npz``) of a run in
    ``setup.precision``."""
    from pretrain_exp.core.rundir import RunDir

    metrics = RunDir(run_dir).metrics
    tps = steady_tokens_per_s(metrics, setup.warmup)
    loss_step, loss = last_loss(metrics)
    return {"framework": fw, "compile": comp, "attention": attn, "insertion": insertion,
            "precision": setup.precision, "loss_step": loss_step, "loss": loss,
            "plan_share": plan_fraction(run_dir), "tps": tps, "mfu": mfu(tps, fpt, setup.peak_tflops),
            "data_wait_pct": steady_median(metrics, "throughput/device/data loading (%)", setup.warmup),
            "peak_gib": peak_gib,
            "reserved_gib": max((m["gpu_memory/GPU reserved mem (GiB)"] for m in map(json.loads, metrics.read_text()
                                 .splitlines()) if "gpu_memory/GPU reserved mem (GiB)" in m), default=None)}


if __name__ == "__main__":
    sys.exit(main())

"""Step time of the run's training path against the bare engines, on the same model, rows and batch (CPU).

- ``hf``: the ``hf`` framework's :meth:`train <pretrain_exp.frameworks.hf.framework.HFFramework.train>`
  (``model=tiny_llama``, the run's :class:`~pretrain_exp.data.rows.TrainingRows` with its plan, the rank-layout sampler,
  its callbacks)
  against a bare ``transformers.Trainer`` on the same model dir, the same rows (already holding the insertions, as a
  plain list) and the same batch, micro-batch, optimizer and schedule settings, no callbacks (goal >= 0.99x);
- ``olmo_core``: the ``olmo_core`` framework's ``train`` (tiny OLMo-3-shaped preset, the insertion callback, a plan
  writing ``--fraction`` of the window's tokens) against OLMo-core's own ``Trainer`` with its default callbacks only
  (``TrainerConfig`` defaults) on the same model checkpoint, train module settings and ``NumpyDataLoader`` over the
  same token files (goal >= 0.99x).

Step time = ``(T(long) - T(short)) / (long - short)`` of whole ``train`` calls (model load, setup and the final save
cancel), each side the minimum over ``--reps`` repeats run interleaved (ours, theirs, ours, ...) in one process,
one torch thread; T is wall time and, the figure other jobs on a shared box disturb least, the process's CPU time.
Ratio = their step time / ours (>= 1: ours is not slower). Numbers are printed, not asserted.

Usage: ``python benchmarks/step_overhead.py [--short 2] [--long 8] [--reps 3] [--only hf|olmo_core]
[--json OUT.json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict

import numpy as np
import torch

from pretrain_exp.app.experiment import Experiment
from pretrain_exp.app.prefetch import compose_run_config
from pretrain_exp.core.rundir import RunDir


def _quiet(log_fn_metrics, step) -> None:
    pass


def _hf_sides(tmp: Path, long: int, threads: int, fraction: float) -> Dict[str, Callable[[int, Path], None]]:
    """``{"ours": fn, "theirs": fn}``: ``fn(steps, out_dir)`` trains ``steps`` steps of the hf run."""
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments, default_data_collator

    items = tmp / "hf-items.jsonl"
    _items_file(items, fraction * long * 8 * 128, vocab=49_152)
    cfg = compose_run_config(["experiment=tiny", "framework=hf", "wandb=disabled", "eval=[]", "insertion=tokens",
                              f"insertion.experiments.tokens.file={items}",
                              f"training.num_steps={long}", f"training.checkpoint_interval={long}",
                              f"training.num_threads={threads}", f"run_dir={tmp / 'hf'}"])
    exp = Experiment(cfg)
    fw, t = exp.framework, cfg.training
    rows = [{k: v for k, v in exp.rows[i].items() if k != "row_index"} for i in range(len(exp.rows))]
    ours_args = fw.training_arguments()

    def ours(steps: int, out: Path) -> None:
        fw.run_dir = out
        fw.train(fw.initial_checkpoint(), steps, exp.rows, _quiet)

    def theirs(steps: int, out: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(str(exp.model_dir), dtype=getattr(torch, cfg.model.dtype))
        args = TrainingArguments(
            output_dir=str(out), max_steps=steps, per_device_train_batch_size=t.micro_batch_size,
            gradient_accumulation_steps=ours_args.gradient_accumulation_steps, learning_rate=t.learning_rate,
            lr_scheduler_type=t.lr_scheduler, warmup_steps=t.warmup_steps, weight_decay=t.weight_decay,
            bf16=ours_args.bf16, use_cpu=ours_args.use_cpu, save_strategy="no", report_to="none", seed=cfg.seed)
        Trainer(model=model, args=args, train_dataset=rows[:steps * t.global_batch_size],
                data_collator=default_data_collator).train()

    info = {"model": "tiny_llama", "rows": len(rows), "sequence_length": t.sequence_length,
            "global_batch_size": t.global_batch_size, "micro_batch_size": t.micro_batch_size,
            "insertions": exp.plan.num_insertions,
            "inserted_token_fraction": round(float(exp.plan.lengths.sum()) / (len(rows) * t.sequence_length), 4)}
    return {"ours": ours, "theirs": theirs, "info": info}


def _items_file(path: Path, tokens: int, vocab: int, seed: int = 0) -> int:
    """Write token items of 16-64 ids (uniform; the runs' rows are 128 tokens) summing to about ``tokens`` ids;
    returns the item count."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 65, size=max(1, round(tokens / 40)))
    with open(path, "w") as f:
        for n in lengths:
            f.write(json.dumps(rng.integers(0, vocab, size=int(n)).tolist()) + "\n")
    return lengths.size


def _olmo_core_sides(tmp: Path, long: int, threads: int, fraction: float) -> Dict[str, Callable[[int, Path], None]]:
    """``{"ours": fn, "theirs": fn}`` of the olmo_core run (module docstring)."""
    from olmo_core.data import NumpyDataLoaderConfig
    from olmo_core.distributed import parallel
    from olmo_core.train import Duration, LoadStrategy, TrainerConfig
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    from pretrain_exp.frameworks.olmo_core.checkpoint import model_config
    from pretrain_exp.frameworks.olmo_core.presets import TINY_DATA

    _, L, B, _ = TINY_DATA["olmo3_tiny"]
    items = tmp / "items.jsonl"
    n_items = _items_file(items, fraction * long * B * L, vocab=100_278)
    cfg = compose_run_config(["framework=olmo_core", "training=tiny", "insertion=tokens", "wandb=disabled",
                              "eval=[]", f"insertion.experiments.tokens.file={items}",
                              f"training.num_steps={long}", f"training.checkpoint_interval={long}",
                              f"training.num_threads={threads}", f"run_dir={tmp / 'olmo_core'}"])
    exp = Experiment(cfg)
    fw, t = exp.framework, cfg.training

    def ours(steps: int, out: Path) -> None:
        fw.run_dir = out
        fw.train(fw.initial_checkpoint(), steps, exp.rows, _quiet)

    def theirs(steps: int, out: Path) -> None:
        parallel._WORLD_MESH = None
        model = model_config(exp.model_dir, cuda=False).build(init_device="cpu")
        train_module = TransformerTrainModuleConfig(
            rank_microbatch_size=t.micro_batch_size * L, max_sequence_length=L, optim=fw.optim_config(),
            max_grad_norm=fw.max_grad_norm, z_loss_multiplier=fw.z_loss_multiplier, scheduler=fw.scheduler(),
        ).build(model, device=torch.device("cpu"))
        fw.run_dir = out
        loader = NumpyDataLoaderConfig(global_batch_size=B * L, seed=fw.loader_seed, work_dir=str(out / "work"),
                                       num_workers=0).build(fw.dataset(exp.order))
        TrainerConfig(save_folder=str(RunDir(out).checkpoints), load_path=str(exp.model_dir),
                      load_strategy=LoadStrategy.always, load_trainer_state=False, load_optim_state=False,
                      max_duration=Duration.steps(steps), device="cpu").build(train_module, loader).fit()

    plan = exp.plan
    info = {"model": "olmo3_tiny", "sequence_length": L, "global_batch_size": B,
            "micro_batch_size": t.micro_batch_size, "items": n_items, "insertions": plan.num_insertions,
            "inserted_token_fraction": round(float(plan.lengths.sum()) / (long * B * L), 4)}
    return {"ours": ours, "theirs": theirs, "info": info}


def measure(sides, short: int, long: int, reps: int, tmp: Path) -> dict:
    """Per-step seconds of each side from interleaved ``train`` calls of ``short`` and ``long`` steps: wall and
    process CPU time (all threads of this process; the figure that other jobs on a shared box disturb least)."""
    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    times = {c: {s: {short: [], long: []} for s in ("ours", "theirs")} for c in clocks}
    tmp.mkdir(parents=True, exist_ok=True)
    k = 0
    for _ in range(reps):
        for steps in (short, long):
            for side in ("ours", "theirs"):
                k += 1
                t0 = {c: f() for c, f in clocks.items()}
                sides[side](steps, tmp / f"{side}-{k}")
                for c, f in clocks.items():
                    times[c][side][steps].append(f() - t0[c])
    out = {}
    for c, by_side in times.items():
        step_s = {s: (min(v[long]) - min(v[short])) / (long - short) for s, v in by_side.items()}
        out.update({f"ours_{c}_step_s": step_s["ours"], f"theirs_{c}_step_s": step_s["theirs"],
                    f"ratio_{c}": step_s["theirs"] / step_s["ours"]})
    return {**out, "times_s": times, **sides["info"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", type=int, default=2, help="steps of the short train calls")
    ap.add_argument("--long", type=int, default=8, help="steps of the long train calls")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--fraction", type=float, default=0.015, help="olmo_core: share of the tokens inserted")
    ap.add_argument("--only", choices=["hf", "olmo_core"])
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for name in ("transformers", "olmo_core", "pretrain_exp"):
        logging.getLogger(name).setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in ("hf", "olmo_core"):
            if args.only not in (None, name):
                continue
            sides = (_hf_sides(tmp, args.long, args.threads, args.fraction) if name == "hf"
                     else _olmo_core_sides(tmp, args.long, args.threads, args.fraction))
            res = out[name] = measure(sides, args.short, args.long, args.reps, tmp / name)
            theirs = "bare transformers.Trainer" if name == "hf" else "OLMo-core Trainer, no callback"
            print(f"{name}: per step, ours {res['ours_cpu_step_s'] * 1e3:.1f} ms CPU "
                  f"({res['ours_wall_step_s'] * 1e3:.1f} ms wall), {theirs} "
                  f"{res['theirs_cpu_step_s'] * 1e3:.1f} ms CPU "
                  f"({res['theirs_wall_step_s'] * 1e3:.1f} ms wall); ratio {res['ratio_cpu']:.3f} CPU, "
                  f"{res['ratio_wall']:.3f} wall (goal >= 0.99) | {json.dumps(sides['info'])}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

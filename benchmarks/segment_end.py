"""Segment-end cost of ``eval.mode`` = inline, distributed and async, on the user's path.

Each mode is one real run through the CLI (``python -m pretrain_exp <overrides> eval.mode=<mode>``, its own run dir
under a temp dir), and the figures come from what the run records: ``results.json``'s ``timing`` (per segment the
training seconds, which include a synchronous checkpoint save (``hf``; ``olmo_core``/``olmo2`` save in the
background: ``benchmarks/checkpoint_save.py``), and the segment-end seconds that held training up: export plus the
evals, or their launch; the final wait for background evals) and each eval's ``seconds`` in ``evals/step*/``.

Printed per mode: segments, mean training s/segment, mean segment-end s/segment and its ratio to the training
time (goal for ``async``: <= 5%), the final wait, the summed eval seconds, the run's wall time. With
``--nproc W`` > 1 the runs have ``training.nproc_per_node=W`` (torchrun, gloo on CPU) and ``distributed``'s eval
seconds are compared with ``inline``'s (goal: <= 1/W + 10%). Last, on paper: the fraction of an 8-GPU job's
GPU-seconds that sit idle while rank 0 evaluates alone (``inline``): ``7 E / (8 (T + E))`` with this run's per-segment
eval time ``E`` and training time ``T`` — the share ``distributed`` and ``async`` give back.

Usage: ``python benchmarks/segment_end.py [--modes inline,async] [--nproc 1] [--json OUT] [-- OVERRIDES ...]``
(default overrides: the embedded default run, ``make demo``; ``-- experiment=tiny`` for a seconds-long check).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Tuple

from pretrain_exp.core.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]


def run_cli(overrides: list, run_dir: Path) -> Tuple[dict, float]:
    """``python -m pretrain_exp *overrides`` into ``run_dir`` (W&B disabled); returns its ``results.json`` and the
    wall seconds. Exits with the run's stderr tail if it fails."""
    cmd = [sys.executable, "-m", "pretrain_exp", *overrides, f"hydra.run.dir={run_dir}", "wandb=disabled"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ | {"WANDB_SILENT": "true"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(overrides)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return RunDir(run_dir).read_results(), wall


def run_mode(mode: str, overrides: list, nproc: int, out: Path) -> dict:
    """One run in ``mode``; returns its figures (see the module docstring)."""
    run_dir = out / mode
    ranks = [f"training.nproc_per_node={nproc}"] if nproc > 1 else []
    res, wall = run_cli([*overrides, f"eval.mode={mode}", *ranks], run_dir)
    segs = res["timing"]["segments"]
    train = statistics.mean(s["train_s"] for s in segs)
    end = statistics.mean(s["segment_end_s"] for s in segs)
    evals = {}
    for rec in (r for by_task in RunDir(run_dir).all_evals().values() for r in by_task.values()):
        evals[rec["task"]] = evals.get(rec["task"], 0.0) + rec["seconds"]
    return {"mode": mode, "segments": len(segs), "train_s": train, "segment_end_s": end, "ratio": end / train,
            "final_wait_s": res["timing"]["final_eval_wait_s"], "eval_s": sum(evals.values()), "eval_s_by_task":
            evals, "wall_s": wall, "per_dup": res["per_dup"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="inline,distributed,async")
    ap.add_argument("--nproc", type=int, default=1, help="ranks per run (training.nproc_per_node)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the runs (default: the embedded default run)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    with tempfile.TemporaryDirectory(prefix="segment-end-") as tmp:
        rows = [run_mode(m, args.overrides, args.nproc, Path(tmp)) for m in modes]
    print(f"segment-end cost, {args.nproc} process(es), overrides: {' '.join(args.overrides) or '(default run)'}")
    print(f"{'mode':<12} {'segs':>4} {'train s/seg':>11} {'end s/seg':>9} {'end/train':>9} {'final wait s':>12} "
          f"{'eval s':>7} {'wall s':>7}")
    for r in rows:
        print(f"{r['mode']:<12} {r['segments']:>4} {r['train_s']:>11.2f} {r['segment_end_s']:>9.2f} "
              f"{100 * r['ratio']:>8.1f}% {r['final_wait_s']:>12.2f} {r['eval_s']:>7.2f} {r['wall_s']:>7.1f}")
    by = {r["mode"]: r for r in rows}
    same = all(r["per_dup"] == rows[0]["per_dup"] for r in rows)
    print(f"per_dup identical across modes: {same}")
    if "async" in by:
        print(f"async: segment end = {100 * by['async']['ratio']:.1f}% of a segment's training (goal <= 5%)")
    if "inline" in by and "distributed" in by and args.nproc > 1:
        q = by["distributed"]["eval_s"] / by["inline"]["eval_s"]
        print(f"distributed: eval time {q:.3f}x inline with {args.nproc} processes (goal <= "
              f"{1 / args.nproc + 0.10:.3f})")
    if "inline" in by:
        r = by["inline"]
        e, t = r["segment_end_s"], r["train_s"]
        print(f"on paper, 8 GPUs, inline: 7 of 8 GPUs idle for E = {e:.2f} s after each T = {t:.2f} s segment: "
              f"{100 * 7 * e / (8 * (t + e)):.1f}% of the job's GPU-seconds, which distributed and async give back")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

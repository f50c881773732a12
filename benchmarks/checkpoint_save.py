"""Segment-end checkpoint saves on OLMo-core: synchronous vs asynchronous (``training.checkpoint_async``).

Two real runs through the CLI (``python -m pretrain_exp <overrides> training.checkpoint_async=<false|true>``, each in
its own run dir under a temp dir). Figures from what the runs record: ``results.json``'s ``timing`` (per segment the
training seconds, which hold the save when it is synchronous, and the segment-end seconds: HF export and evals) and
OLMo-core's own save metrics in ``metrics.jsonl`` (``checkpoint/save_duration_s``: the blocking save;
``checkpoint/save_async_duration_s``: the background write; ``checkpoint/hold_s``: the seconds each save held the
training loop). Also checked: every segment's checkpoint holds the same
weights in both runs (read back with OLMo-core's DCP reader), and the runs' ``per_dup`` rows are identical.

Printed per mode: mean training s/segment, segment-end s/segment, the save seconds OLMo-core measured, the seconds
a save held training, the final wait for the last checkpoint, the wall time; then the held seconds as a share of a
segment's training time, synchronous vs asynchronous.

Usage: ``python benchmarks/checkpoint_save.py [--json OUT] [-- OVERRIDES ...]`` (default: a from-scratch OLMo-2
60M-shaped run on the Shakespeare corpus, 3 segments of 2 steps; a checkpoint with AdamW state is ~0.9 GB).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.segment_end import run_cli  # noqa: E402
from pretrain_exp.core.rundir import RunDir  # noqa: E402

DEFAULT = ["experiment=scratch_olmo_core", "model.config=olmo2_60M", "training.num_steps=6",
           "training.checkpoint_interval=2", "training.keep_last_checkpoints=0", "eval=[insertion_loss]",
           "insertion.experiments.fictional_bios.num_items=8",
           "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]"]


def run(async_save: bool, overrides: list, out: Path) -> dict:
    """One run; returns its figures (module docstring)."""
    run_dir = out / ("async" if async_save else "sync")
    res, wall = run_cli([*overrides, f"training.checkpoint_async={str(async_save).lower()}"], run_dir)
    segs = res["timing"]["segments"]
    saves, holds = [], []
    for line in RunDir(run_dir).metrics.read_text().splitlines():
        rec = json.loads(line)
        for key in ("checkpoint/save_duration_s", "checkpoint/save_async_duration_s"):
            if key in rec:
                saves.append(rec[key])
        if "checkpoint/hold_s" in rec:
            holds.append(rec["checkpoint/hold_s"])
    return {"async": async_save, "run_dir": run_dir, "train_s": statistics.mean(s["train_s"] for s in segs),
            "segment_end_s": statistics.mean(s["segment_end_s"] for s in segs),
            "save_s": statistics.mean(saves) if saves else float("nan"), "saves": len(saves),
            "hold_s": statistics.mean(holds) if holds else float("nan"), "holds": holds,
            "final_wait_s": res["timing"].get("final_checkpoint_wait_s", 0.0), "wall_s": wall,
            "steps": [s["step"] for s in segs], "per_dup": res["per_dup"]}


def same_weights(a: Path, b: Path) -> bool:
    """Whether two OLMo-core checkpoints hold bit-identical model weights."""
    import torch

    from pretrain_exp.frameworks.olmo_core.checkpoint import load_model

    wa, wb = load_model(a).state_dict(), load_model(b).state_dict()
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of both runs (default: see the module docstring)")
    args = ap.parse_args()
    overrides = args.overrides or DEFAULT
    with tempfile.TemporaryDirectory(prefix="checkpoint-save-") as tmp:
        sync, asyn = run(False, overrides, Path(tmp)), run(True, overrides, Path(tmp))
        equal = all(same_weights(RunDir(sync["run_dir"]).checkpoint(k), RunDir(asyn["run_dir"]).checkpoint(k))
                    for k in sync["steps"])
    print(f"segment-end checkpoint saves on OLMo-core, overrides: {' '.join(overrides)}")
    print(f"{'save':<6} {'train s/seg':>11} {'end s/seg':>9} {'save s (OLMo-core)':>18} {'held s/save':>11} "
          f"{'final wait s':>12} {'wall s':>7}")
    for r in (sync, asyn):
        print(f"{'async' if r['async'] else 'sync':<6} {r['train_s']:>11.2f} {r['segment_end_s']:>9.2f} "
              f"{r['save_s']:>18.2f} {r['hold_s']:>11.2f} {r['final_wait_s']:>12.2f} {r['wall_s']:>7.1f}")
    print(f"checkpoints bit-identical at steps {sync['steps']}: {equal}; per_dup identical: "
          f"{sync['per_dup'] == asyn['per_dup']}")
    print(f"the segment-end save held training {sync['hold_s']:.2f} s ({100 * sync['hold_s'] / sync['train_s']:.1f}% "
          f"of a segment) synchronously, {asyn['hold_s']:.2f} s ({100 * asyn['hold_s'] / asyn['train_s']:.1f}%) "
          f"asynchronously ({asyn['hold_s'] / sync['hold_s']:.2f}x)")
    if args.json:
        for r in (sync, asyn):
            r.pop("run_dir")
        Path(args.json).write_text(json.dumps({"sync": sync, "async": asyn, "bit_identical": equal}, indent=1))


if __name__ == "__main__":
    main()

"""Results of a run: ``results.json``, the loss-vs-dup-count plot and the console table.

``results.json`` holds ``per_dup``: one row ``{experiment, dup_count, n_items, mean_loss, ci_low, ci_high}``
per experiment and dup count, from the ``insertion_loss`` eval of the last evaluated step (95% bootstrap CIs
over items), plus the memorization rows, every eval's metrics by step, and the plan's size.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Dict

from pretrain_exp.config import ExperimentConfig


def write_text(path: Path, text: str) -> None:
    """Write a text file atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json(path: Path, obj) -> None:
    """Write JSON atomically (NaN written as ``null``)."""
    write_text(path, json.dumps(_nan_to_none(obj), indent=1) + "\n")


def _nan_to_none(obj):
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return obj


def _task_of_type(cfg: ExperimentConfig, kind: str):
    return next((name for name, t in cfg.eval.tasks.items() if t.type == kind), None)


def summarize(cfg: ExperimentConfig, plan, evaluated_now: Dict[int, dict], evaluated_all: Dict[int, dict],
              wall_s: float) -> dict:
    """The ``results.json`` content (module docstring).

    :param evaluated_now: step -> task -> eval record, from this invocation (may be partial on resume).
    :param evaluated_all: step -> task -> eval record, everything in the run dir.
    """
    last = max(evaluated_all) if evaluated_all else None
    at_last = evaluated_all.get(last, {})
    loss_task, mem_task = _task_of_type(cfg, "insertion_loss"), _task_of_type(cfg, "memorization")
    window = [int(w) for w in plan.window]
    return {
        "run_name": cfg.run_name,
        "run_dir": str(Path(cfg.run_dir).resolve()),
        "framework": cfg.framework.name,
        "model": {"name": cfg.model.name, "asset": cfg.model.asset, "path": cfg.model.path,
                  "checkpoint_step": cfg.model.checkpoint_step},
        "seed": cfg.seed,
        "step": last,
        "plan": {"num_items": plan.num_items, "num_insertions": plan.num_insertions,
                 "inserted_tokens": int(plan.lengths.sum()), "window": window,
                 "inserted_fraction": float(plan.lengths.sum()) / max(1, window[1] - window[0]),
                 "experiments": plan.experiments},
        "per_dup": at_last.get(loss_task, {}).get("per_dup", []) if loss_task else [],
        "memorization": at_last.get(mem_task, {}).get("per_dup", []) if mem_task else [],
        "metrics": {task: rec.get("metrics", {}) for task, rec in at_last.items()},
        "by_step": {str(step): {task: rec.get("metrics", {}) for task, rec in tasks.items()}
                    for step, tasks in evaluated_all.items()},
        "steps_evaluated_now": sorted(evaluated_now),
        "wall_s": wall_s,
    }


def plot_per_dup(results: dict, path: Path) -> None:
    """PNG of mean insertion loss vs dup count (95% CI bars), one line per experiment; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results.get("per_dup", [])
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for exp in sorted({r["experiment"] for r in rows}):
        rs = sorted((r for r in rows if r["experiment"] == exp), key=lambda r: r["dup_count"])
        x = [r["dup_count"] for r in rs]
        y = [r["mean_loss"] for r in rs]
        lo = [r["mean_loss"] - (r["ci_low"] if r["ci_low"] is not None else r["mean_loss"]) for r in rs]
        hi = [(r["ci_high"] if r["ci_high"] is not None else r["mean_loss"]) - r["mean_loss"] for r in rs]
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=exp)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("dup count (0 = never-inserted control)")
    ax.set_ylabel("mean loss per token (nats)")
    ax.set_title(f"{results.get('run_name')} at step {results.get('step')}", fontsize=9)
    if rows:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(fd)
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


def print_table(results: dict) -> None:
    """Print the per-dup table (loss with CI, memorization) and the held-out perplexity with rich."""
    from rich.console import Console
    from rich.table import Table

    mem = {(r["experiment"], r["dup_count"]): r for r in results.get("memorization", [])}
    table = Table(title=f"{results['run_name']}: insertion loss at step {results['step']} (95% bootstrap CI)")
    for col in ("experiment", "dup count", "items", "mean loss", "95% CI", "exact match", "matched tokens"):
        table.add_column(col, justify="left" if col == "experiment" else "right")

    def fmt(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    for r in results.get("per_dup", []):
        m = mem.get((r["experiment"], r["dup_count"]), {})
        table.add_row(r["experiment"], str(r["dup_count"]), str(r["n_items"]), fmt(r["mean_loss"]),
                      f"[{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]", fmt(m.get("exact_match_rate"), ".2f"),
                      fmt(m.get("mean_matched_length"), ".1f"))
    console = Console(width=max(110, Console().width))
    console.print(table)
    for task, metrics in results.get("metrics", {}).items():
        if "held_out/perplexity" in metrics:
            console.print(f"held-out perplexity ({task}): {metrics['held_out/perplexity']:.2f} "
                          f"over {int(metrics.get('held_out/tokens', 0))} tokens")

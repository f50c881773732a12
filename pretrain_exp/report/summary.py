"""A run's own summary: the ``results.json`` content and the console table at the end of a run.

``results.json`` holds ``per_dup``: one row ``{experiment, dup_count, n_items, mean_loss, ci_low, ci_high}``
per experiment and dup count, from the ``insertion_loss`` eval of the last evaluated step (95% bootstrap CIs
over items), plus the memorization rows, every eval's metrics by step, and the plan's size. Its figures are
:func:`pretrain_exp.report.plots.plot_per_dup` and :func:`~pretrain_exp.report.plots.plot_loss_vs_step`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

from pretrain_exp.core.config import RunConfig


def _task_of_type(cfg: RunConfig, kind: str):
    return next((name for name, t in cfg.eval.tasks.items() if t.type == kind), None)


def summarize(cfg: RunConfig, plan, evaluated_now: Dict[int, dict], evaluated_all: Dict[int, dict],
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

"""The report's figures (matplotlib, Agg backend), each written atomically as PNG: a run's loss vs dup count and
loss vs step, a sweep's effect vs dup count and benchmark acc clean vs contaminated."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from pretrain_exp.core.io import atomic_path
from pretrain_exp.report.text import fmt


def plot_per_dup(results: dict, path: Path) -> None:
    """PNG of mean insertion loss vs dup count (95% CI bars) at the last evaluated step, one line per
    experiment; written atomically."""
    rows = [dict(r, job=r["experiment"]) for r in results.get("per_dup", [])]
    plot_effect_vs_dup(rows, {}, path, f"{results.get('run_name')} at step {results.get('step')}")


_LOSS_KEY = re.compile(r"^(?P<exp>.+)/dup(?P<dup>\d+)/mean_loss$")


def plot_loss_vs_step(results: dict, path: Path) -> None:
    """PNG of mean insertion loss vs global step, one line per experiment and dup count, from every evaluated
    step (``results["by_step"]``): learning while an item is inserted, forgetting after its last insertion."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: Dict[Tuple[str, int], List[Tuple[int, float]]] = {}
    for step, tasks in results.get("by_step", {}).items():
        for metrics in tasks.values():
            for key, value in metrics.items():
                m = _LOSS_KEY.match(key)
                if m and value is not None:
                    series.setdefault((m["exp"], int(m["dup"])), []).append((int(step), value))
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    multi = len({e for e, _ in series}) > 1
    for (exp, dup), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{exp + ' ' if multi else ''}dup {dup}")
    ax.set_xlabel("global step")
    ax.set_ylabel("mean loss per token (nats)")
    ax.set_title(f"{results.get('run_name')}: insertion loss by step", fontsize=9)
    if series:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def plot_effect_vs_dup(rows: Sequence[dict], labels: Dict[str, str], path: Path, title: str) -> None:
    """PNG of mean loss vs dup count (95% CI bars), one line per job (and experiment); written atomically. A point
    whose group has items that also occur naturally in the window (``natural_items`` of the audit) is annotated
    with their number and the group's mean effective dup count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series: Dict[Tuple[str, str], List[dict]] = {}
    for r in rows:
        series.setdefault((r["job"], r["experiment"]), []).append(r)
    experiments = {e for _, e in series}
    for (job, exp), rs in series.items():
        rs = sorted((r for r in rs if r["mean_loss"] is not None), key=lambda r: r["dup_count"])
        y = [r["mean_loss"] for r in rs]
        lo = [r["mean_loss"] - (r["ci_low"] if r["ci_low"] is not None else r["mean_loss"]) for r in rs]
        hi = [(r["ci_high"] if r["ci_high"] is not None else r["mean_loss"]) - r["mean_loss"] for r in rs]
        label = labels.get(job, job)
        if len(experiments) > 1 and exp != label:
            label += f" / {exp}"
        ax.errorbar([r["dup_count"] for r in rs], y, yerr=[lo, hi], marker="o", capsize=3, label=label, alpha=0.85)
        for r in rs:  # the natural-duplicate audit: groups whose items also occur in the window
            if r.get("natural_items"):
                ax.annotate(f"{r['natural_items']} natural, eff. {r['effective_dup_mean']:.2f}",
                            (r["dup_count"], r["mean_loss"]), textcoords="offset points", xytext=(4, 4), fontsize=6,
                            color="crimson")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("dup count (0 = never-inserted control)")
    ax.set_ylabel("mean loss per token (nats)")
    ax.set_title(title, fontsize=9)
    if series:
        ax.legend(fontsize=7, ncol=1 if len(series) <= 8 else 2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def plot_benchmark(rows: Sequence[dict], labels: Dict[str, str], path: Path, title: str) -> None:
    """PNG of benchmark acc, clean (dup 0) vs contaminated (dup > 0), one pair of bars per job and experiment,
    with the contamination effect and its 95% CI written above; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 * len(rows) + 2), 3.8))
    x = list(range(len(rows)))
    ax.bar([i - 0.2 for i in x], [r["acc_clean"] or 0 for r in rows], width=0.4, label="clean (dup 0)")
    ax.bar([i + 0.2 for i in x], [r["acc_contaminated"] or 0 for r in rows], width=0.4, label="contaminated")
    for i, r in enumerate(rows):
        top = max(r["acc_clean"] or 0, r["acc_contaminated"] or 0)
        ax.annotate(f"{fmt(r['effect'], '+.3f')} [{fmt(r['ci_low'], '+.3f')}, {fmt(r['ci_high'], '+.3f')}]",
                    (i, top), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ax.set_xticks(x, [f"{labels.get(r['job'], r['job'])}\n{r['experiment']}" for r in rows], fontsize=7)
    ax.set_ylabel("acc")
    ax.set_ylim(0, 1.1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def save_png(fig, path: Path) -> None:
    """Save a matplotlib figure as PNG atomically."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)

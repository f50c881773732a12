"""The report's figures (matplotlib, Agg backend), each written atomically as PNG and as PDF beside it (same name,
``.pdf``: vector, for a paper): a run's loss vs dup count and loss vs step, a sweep's effect vs dup count and
benchmark acc clean vs contaminated. Each figure's title says what it shows, wrapped to fit the figure, with the run
or sweep name as a small subtitle under it (:func:`set_titles`); a log-x dup axis ticks at the dup counts plotted
(:func:`dup_axis`).

Every interval is drawn as given (:func:`draw_intervals`): from its ``ci_low`` to its ``ci_high``, whether or not it
is centred on the point or crosses zero, never clipped; a point without an interval (fewer than 2 items, no spread,
or seed variance not identified) is drawn hollow with no bar and a legend entry saying why; a missing value is not
drawn at all. The axis label names the interval's level and method (``95% CI, t``). Each plot function returns its
(closed) figure, whose artists hold what was drawn.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from pretrain_exp.core.io import atomic_path
from pretrain_exp.report.text import NA, fmt, fmt_ci, method_label, missing, no_interval_reasons

#: the ``gid`` of the line collections holding the interval bars (one per series) and of the hollow no-interval marks
CI_GID, NO_CI_GID = "ci", "no-ci"


def ci_label(methods, level: float = 0.95) -> str:
    """``"95% CI, t"`` for the methods of the plotted rows (:func:`~pretrain_exp.report.text.method_label`);
    ``"95% CI"`` when no row has an interval."""
    m = method_label(methods)
    return f"{level:.0%} CI" + (f", {m}" if m else "")


def draw_intervals(ax, x: Sequence[float], y: Sequence[Optional[float]], low: Sequence[Optional[float]],
                   high: Sequence[Optional[float]], label: Optional[str] = None, **line_kw) -> Tuple[object, int]:
    """Draw one series: a line with a marker per point with a value, a vertical bar from ``low[i]`` to ``high[i]``
    exactly as given (no clipping, asymmetric or not containing the point) with caps, and a hollow marker (no bar)
    where a bound is missing (``None``/``nan``). Points whose ``y`` is missing are not drawn.

    :returns: ``(line, points without an interval)``.
    """
    pts = [(xi, yi, lo, hi) for xi, yi, lo, hi in zip(x, y, low, high) if not missing(yi)]
    (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, **line_kw)
    color = line.get_color()
    with_ci = [p for p in pts if not (missing(p[2]) or missing(p[3]))]
    if with_ci:
        bars = ax.vlines([p[0] for p in with_ci], [p[2] for p in with_ci], [p[3] for p in with_ci], color=color,
                         alpha=line_kw.get("alpha", 1.0))
        bars.set_gid(CI_GID)
        for k in (2, 3):  # caps
            ax.plot([p[0] for p in with_ci], [p[k] for p in with_ci], ls="none", marker="_", ms=8, color=color)
    without = [p for p in pts if missing(p[2]) or missing(p[3])]
    if without:
        (hollow,) = ax.plot([p[0] for p in without], [p[1] for p in without], ls="none", marker="o", ms=7,
                            mfc="white", mec=color, mew=1.5, zorder=3)
        hollow.set_gid(NO_CI_GID)
    return line, len(without)


def dup_axis(ax, dups: Sequence[float], label: str = "dup count (0 = never-inserted control)") -> None:
    """A symlog x axis (linear below 1, so dup 0 is drawn) whose ticks are the plotted dup counts themselves
    (``0 1 4 16 64``, not powers of ten), with a small margin on both sides and ``label``."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ticks = sorted({int(d) for d in dups if not missing(d)})
    ax.set_xscale("symlog", linthresh=1, linscale=0.5)
    if ticks:
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlim(-0.25 if ticks[0] == 0 else ticks[0] * 0.8, max(ticks) * 1.25 + 0.25)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)


def set_titles(ax, what: str, name: Optional[str] = None) -> None:
    """The axes title ``what`` (wrapped at 70 characters) and, under it, ``name`` (the run or sweep; wrapped at 95,
    small, grey) as a subtitle; both stay inside the figure once it is laid out (``tight_layout``)."""
    sub = "\n".join(textwrap.wrap(str(name), 95)) if name else ""
    ax.set_title("\n".join(textwrap.wrap(what, 70)), fontsize=9, pad=6 + 9 * (sub.count("\n") + 1) if sub else 6)
    if sub:
        from matplotlib.transforms import offset_copy

        ax.text(0.5, 1.0, sub, transform=offset_copy(ax.transAxes, fig=ax.figure, y=3, units="points"),
                ha="center", va="bottom", fontsize=7, color="dimgray")


def no_interval_legend(ax, methods: Sequence[Optional[str]]) -> None:
    """Add the legend entry of the hollow markers (``no interval (n < 2)``) when any plotted point has none."""
    from matplotlib.lines import Line2D

    why = no_interval_reasons(methods)
    if why:
        ax.add_line(Line2D([], [], ls="none", marker="o", mfc="white", mec="grey", label=f"no interval ({why})"))


def plot_per_dup(results: dict, path: Path):
    """PNG of mean insertion loss vs dup count (interval bars) at the last evaluated step, one line per
    experiment; written atomically."""
    rows = [dict(r, job=r["experiment"]) for r in results.get("per_dup", [])]
    return plot_effect_vs_dup(rows, {}, path, f"mean insertion loss by dup count at step {results.get('step')}",
                              subtitle=results.get("run_name"))


_LOSS_KEY = re.compile(r"^(?P<exp>.+)/dup(?P<dup>\d+)/mean_loss$")


def plot_loss_vs_step(results: dict, path: Path):
    """PNG of mean insertion loss vs global step, one line per experiment and dup count, from every evaluated
    step (``results["by_step"]``): learning while an item is inserted, forgetting after its last insertion. A
    continued run's ``by_step`` holds its parent's steps too (:mod:`pretrain_exp.app.parent`): a dotted line marks
    the parent's last step, where this run starts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: Dict[Tuple[str, int], List[Tuple[int, float]]] = {}
    for step, tasks in results.get("by_step", {}).items():
        for metrics in tasks.values():
            for key, value in metrics.items():
                m = _LOSS_KEY.match(key)
                if m and not missing(value):
                    series.setdefault((m["exp"], int(m["dup"])), []).append((int(step), value))
    fig, ax = plt.subplots(figsize=(6.8, 3.8))
    multi = len({e for e, _ in series}) > 1
    for (exp, dup), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{exp + ' ' if multi else ''}dup {dup}")
    parent, name = results.get("parent"), results.get("run_name")
    if parent:
        ax.axvline(parent["step"], color="0.4", linestyle=":", linewidth=1, label=f"continued at step {parent['step']}")
        name = f"{name}, continuing {parent.get('run_name') or 'its parent'}"
    ax.set_xlabel("global step")
    ax.set_ylabel("mean loss per token (nats)")
    set_titles(ax, "mean insertion loss by global step", name)
    if series:  # beside the axes: the lines may fill any corner (a continued run's curves fall, then rise)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return fig


def plot_effect_vs_dup(rows: Sequence[dict], labels: Dict[str, str], path: Path, title: str,
                       subtitle: Optional[str] = None):
    """PNG of mean loss vs dup count with each row's interval (``ci_low``, ``ci_high``, ``ci_method``; module
    docstring), one line per job (and experiment); written atomically. A point whose group has items that also occur
    naturally in the window (``natural_items`` of the audit) is annotated with their number and the group's mean
    effective dup count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series: Dict[Tuple[str, str], List[dict]] = {}
    for r in rows:
        series.setdefault((r["job"], r["experiment"]), []).append(r)
    experiments = {e for _, e in series}
    shown = []
    for (job, exp), rs in series.items():
        rs = sorted((r for r in rs if not missing(r.get("mean_loss"))), key=lambda r: r["dup_count"])
        shown += rs
        label = labels.get(job, job)
        if len(experiments) > 1 and exp != label:
            label += f" / {exp}"
        draw_intervals(ax, [r["dup_count"] for r in rs], [r["mean_loss"] for r in rs],
                       [r.get("ci_low") for r in rs], [r.get("ci_high") for r in rs], label=label, alpha=0.85)
        for r in rs:  # the natural-duplicate audit: groups whose items also occur in the window
            if r.get("natural_items"):
                ax.annotate(f"{r['natural_items']} natural, eff. {r['effective_dup_mean']:.2f}",
                            (r["dup_count"], r["mean_loss"]), textcoords="offset points", xytext=(4, 4), fontsize=6,
                            color="crimson")
    no_interval_legend(ax, [r.get("ci_method") for r in shown if missing(r.get("ci_low"))
                            or missing(r.get("ci_high"))])
    dup_axis(ax, [r["dup_count"] for r in shown])
    ax.set_ylabel(f"mean loss per token (nats), {ci_label(r.get('ci_method') for r in shown)}")
    set_titles(ax, title, subtitle)
    if series:
        ax.legend(fontsize=7, ncol=1 if len(series) <= 8 else 2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return fig


def plot_benchmark(rows: Sequence[dict], labels: Dict[str, str], path: Path, title: str,
                   subtitle: Optional[str] = None):
    """PNG of benchmark acc, clean (dup 0) vs contaminated (dup > 0, all their items pooled: the weighting of the
    contamination effect), one pair of bars per job and experiment, with the contamination effect and its interval
    (``effect_ci_method``) written above; a missing acc has no bar and reads ``n/a``; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 * len(rows) + 2), 3.8))
    x = list(range(len(rows)))
    for key, dx, label in (("acc_clean", -0.2, "clean (dup 0)"), ("acc_contaminated", 0.2, "contaminated (dup > 0)")):
        have = [(i, r[key]) for i, r in zip(x, rows) if not missing(r.get(key))]
        ax.bar([i + dx for i, _ in have], [a for _, a in have], width=0.4, label=label)
        for i, r in zip(x, rows):
            if missing(r.get(key)):
                ax.annotate(NA, (i + dx, 0), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7)
    for i, r in enumerate(rows):
        top = max([r[k] for k in ("acc_clean", "acc_contaminated") if not missing(r.get(k))] or [0])
        method = f" ({r['effect_ci_method']})" if r.get("effect_ci_method") else ""
        ax.annotate(f"{fmt(r['effect'], '+.3f')} {fmt_ci(r.get('ci_low'), r.get('ci_high'), '+.3f')}{method}",
                    (i, top), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ax.set_xticks(x, [f"{labels.get(r['job'], r['job'])}\n{r['experiment']}" for r in rows], fontsize=7)
    ax.set_ylabel("acc")
    ax.set_ylim(0, 1.1)
    set_titles(ax, title, subtitle)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return fig


def save_png(fig, path: Path) -> None:
    """Save a matplotlib figure as PNG (``path``, 120 dpi) and as PDF (``path`` with ``.pdf``), each atomically."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    with atomic_path(Path(path).with_suffix(".pdf")) as tmp:
        fig.savefig(tmp, format="pdf")

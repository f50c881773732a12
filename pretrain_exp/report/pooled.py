"""The insertion effect pooled over seeds: ``effect_pooled.csv`` and ``effect_vs_dup.png`` of a sweep report.

Jobs that differ only by ``seed`` form one group (their other swept overrides are equal; with none, the group is
``all``). For each group, experiment and dup count ``d > 0`` the effect of one job is ``mean loss(dup 0 items) -
mean loss(dup d items)`` (nats/token) at its last evaluated step, from the per-item losses of its
``insertion_loss`` eval; the pooled effect is the mean over the group's seeds (:func:`pool_seeds`).

Its interval is a t interval over the per-seed effects (``S - 1`` degrees of freedom,
:func:`pretrain_exp.core.stats.seed_interval`): the seeds are the independent replicates (each re-draws the
generated items, the training order and the placement) and each per-seed effect already holds the noise of its
items, so resampling the items again would count it twice. With ``S <= 2`` seeds the seed-to-seed variance is not
identified and no interval is given (``ci_method`` says so, the tables print ``n/a``). In a simulation with a
seed-level shift of the effect (sd 0.3, item sd 0.3, 16 items per group) this interval covers 0.95-0.96 at 3 and 5
seeds, where a two-stage (seeds, then items) percentile bootstrap covers 0.85-0.91
(``tests/unit/report/test_statistics_report.py``). The p-value is the exact two-sided sign-flip test over the per-seed
effects (:func:`pretrain_exp.core.stats.sign_flip_pvalue`; under no effect each seed's effect is symmetric about
0); it cannot go below ``min_p = 2 / 2**S`` (0.5 at 2 seeds, 0.0625 at 5: 6 seeds are needed for 0.05). A group
whose dup groups hold fewer than :data:`~pretrain_exp.core.stats.MIN_ITEMS_PER_GROUP` items in some seed is flagged
``small_n``.

The dose response pooled over seeds (:func:`pooled_trend`, ``trend_pooled.csv``): per seed, the OLS slope of the
per-item insertion loss on ``log(1 + dup count)`` over all of the experiment's items, controls included (the point
estimate of :func:`pretrain_exp.core.stats.trend_test`, each seed's primary endpoint), then the same t interval over
seeds and sign-flip p. The memorization rate pooled over seeds (:func:`pooled_exact_match`,
``exact_match_pooled.csv``): the k-extractable items of all seeds over all their items, with a Wilson interval that
treats the items of all seeds as independent, and each seed's rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from pretrain_exp.core import stats

#: the columns of ``effect_pooled.csv``
POOLED_COLUMNS = ("group", "experiment", "dup_count", "n_seeds", "seeds", "n_items", "small_n", "effect", "ci_low",
                  "ci_high", "ci_method", "sd_seeds", "p_value", "p_method", "min_p")
#: the columns of ``trend_pooled.csv``
TREND_COLUMNS = ("group", "experiment", "n_seeds", "seeds", "n_items", "slope", "ci_low", "ci_high", "ci_method",
                 "sd_seeds", "p_value", "p_method", "min_p", "seed_slopes")
#: the columns of ``exact_match_pooled.csv``
EXACT_MATCH_COLUMNS = ("group", "experiment", "dup_count", "n_seeds", "seeds", "matched", "n_items", "rate", "ci_low",
                       "ci_high", "ci_method", "seed_rates")
#: the group label of jobs with no swept override but the seed
ALL = "all"


def job_losses(run) -> pd.DataFrame:
    """Per-item ``insertion_loss`` rows (``experiment, dup_count, item_id, loss``) of a run's last evaluated step.

    :param run: the run dir, or its :func:`~pretrain_exp.report.tables.load_run` frame (read once by the caller)."""
    return _last_step_items(run, "insertion_loss", "loss")


def job_exact_matches(run) -> pd.DataFrame:
    """Per-item ``memorization`` rows (``experiment, dup_count, item_id, exact_match``) of a run's last evaluated
    step (items too short to be scored left out); ``run`` as for :func:`job_losses`."""
    return _last_step_items(run, "memorization", "exact_match")


def _last_step_items(run, eval_type: str, column: str) -> pd.DataFrame:
    from pretrain_exp.report.tables import load_run

    df = run if isinstance(run, pd.DataFrame) else load_run(run)
    if df.empty or "eval_type" not in df or column not in df:
        return pd.DataFrame(columns=["experiment", "dup_count", "item_id", column])
    df = df[(df["eval_type"] == eval_type) & df[column].notna()]
    if df.empty:
        return df
    return df[df["step"] == df["step"].max()][["experiment", "dup_count", "item_id", column]]


def _run(job: dict):
    """A job's per-item frame where the caller read it (``frame``), else its run dir."""
    return job["frame"] if "frame" in job else Path(job["path"])


def pool_seeds(per_seed: Sequence[Tuple[np.ndarray, np.ndarray]], level: float = stats.LEVEL) -> dict:
    """The effect of one dup count pooled over seeds (module docstring).

    :param per_seed: one ``(control, treated)`` pair per seed: the per-item values (e.g. losses in nats/token) of
        the dup-0 items and of the dup-``d`` items, float arrays of shape ``(n_0,)`` and ``(n_d,)``, both non-empty.
    :returns: ``{effect, ci_low, ci_high, ci_method, n_seeds, sd_seeds, p_value, p_method, min_p, n_items,
        small_n}``: ``effect`` the mean over seeds of ``mean(control) - mean(treated)``; the t interval over seeds
        (``nan`` for ``S <= 2``: ``ci_method`` ``"none (seed variance not identified, S = 2)"``); the exact sign-flip
        p over seeds (``nan`` for one seed) and the smallest p it can give; ``n_items`` the smallest group of any
        seed.
    :raises ValueError: for no seeds or an empty group.
    """
    if not per_seed:
        raise ValueError("pooling over seeds needs at least one seed")
    effects = []
    for control, treated in per_seed:
        c, t = np.asarray(control, dtype=np.float64), np.asarray(treated, dtype=np.float64)
        if c.size == 0 or t.size == 0:
            raise ValueError(f"a per-seed effect needs items in both groups, got {c.size} and {t.size}")
        effects.append(float(c.mean() - t.mean()))
    out = stats.seed_interval(effects, level)
    n_items = int(min(min(np.size(c), np.size(t)) for c, t in per_seed))
    s = len(effects)
    if s >= 2 and all(np.isfinite(effects)):
        p, method = stats.sign_flip_pvalue(np.array(effects)), f"exact sign-flip over {s} seeds"
    else:
        p, method = float("nan"), f"none (S = {s})"
    return {**out, "p_value": p, "p_method": method, "min_p": stats.min_sign_flip_p(s), "n_items": n_items,
            "small_n": bool(n_items < stats.MIN_ITEMS_PER_GROUP)}


def pooled_effects(jobs: Sequence[dict]) -> List[dict]:
    """Rows of :data:`POOLED_COLUMNS` (module docstring), by group, experiment and dup count.

    :param jobs: ``{"group": label of the non-seed overrides ("" for none: shown as :data:`ALL`), "seed": int,
        "path": run dir}`` per finished job, optionally with ``"frame"``: its ``load_run`` frame, read once for
        :func:`pooled_effects`, :func:`pooled_trend` and :func:`pooled_exact_match`.
    """
    groups: Dict[str, List[dict]] = {}
    for j in jobs:
        groups.setdefault(j["group"] or ALL, []).append(j)
    rows = []
    for label, members in groups.items():
        losses = [(j["seed"], job_losses(_run(j))) for j in sorted(members, key=lambda j: j["seed"])]
        losses = [(s, df) for s, df in losses if not df.empty]
        experiments = sorted({e for _, df in losses for e in df["experiment"].unique()})
        for exp in experiments:
            dups = sorted({int(d) for _, df in losses for d in df[df["experiment"] == exp]["dup_count"]} - {0})
            for d in dups:
                per_seed = []
                for s, df in losses:
                    a = df[(df["experiment"] == exp) & (df["dup_count"] == 0)]["loss"].to_numpy(float)
                    b = df[(df["experiment"] == exp) & (df["dup_count"] == d)]["loss"].to_numpy(float)
                    if a.size and b.size:
                        per_seed.append((s, a, b))
                if not per_seed:
                    continue
                pooled = pool_seeds([(a, b) for _, a, b in per_seed])
                rows.append({"group": label, "experiment": exp, "dup_count": d,
                             "seeds": ",".join(str(s) for s, _, _ in per_seed), **pooled})
    return rows


def _groups(jobs: Sequence[dict]) -> Dict[str, List[dict]]:
    groups: Dict[str, List[dict]] = {}
    for j in jobs:
        groups.setdefault(j["group"] or ALL, []).append(j)
    return {k: sorted(v, key=lambda j: j["seed"]) for k, v in groups.items()}


def pooled_trend(jobs: Sequence[dict]) -> List[dict]:
    """Rows of :data:`TREND_COLUMNS` (module docstring), by group and experiment: the slope of the per-item loss on
    ``log(1 + dup count)`` (nats/token per unit of ``log(1 + dup)``; negative where copies lower the loss), pooled
    over seeds as :func:`pool_seeds` pools an effect. ``jobs`` as for :func:`pooled_effects`; an experiment with one
    dup count in a seed is left out of that seed."""
    rows = []
    for label, members in _groups(jobs).items():
        losses = [(j["seed"], job_losses(_run(j))) for j in members]
        losses = [(s, df) for s, df in losses if not df.empty]
        for exp in sorted({e for _, df in losses for e in df["experiment"].unique()}):
            slopes, seeds, n_items = [], [], []
            for s, df in losses:
                d = df[df["experiment"] == exp]
                fit = stats.trend_test(d["loss"].to_numpy(float), d["dup_count"].to_numpy(float), permutations=0)
                if np.isfinite(fit["slope"]):
                    slopes.append(fit["slope"])
                    seeds.append(s)
                    n_items.append(fit["n_items"])
            if not slopes:
                continue
            out = stats.seed_interval(slopes)
            s_count = len(slopes)
            p, method = ((stats.sign_flip_pvalue(np.array(slopes)), f"exact sign-flip over {s_count} seeds")
                         if s_count >= 2 else (float("nan"), f"none (S = {s_count})"))
            rows.append({"group": label, "experiment": exp, "n_seeds": s_count, "seeds": ",".join(map(str, seeds)),
                         "n_items": int(min(n_items)), "slope": out["effect"], "ci_low": out["ci_low"],
                         "ci_high": out["ci_high"], "ci_method": out["ci_method"], "sd_seeds": out["sd_seeds"],
                         "p_value": p, "p_method": method, "min_p": stats.min_sign_flip_p(s_count),
                         "seed_slopes": ",".join(f"{x:.4f}" for x in slopes)})
    return rows


def pooled_exact_match(jobs: Sequence[dict]) -> List[dict]:
    """Rows of :data:`EXACT_MATCH_COLUMNS` (module docstring), by group, experiment and dup count: the
    k-extractable rate of the ``memorization`` eval over the items of all seeds with its Wilson interval
    (:func:`pretrain_exp.core.stats.wilson_interval`) and each seed's rate. ``jobs`` as for
    :func:`pooled_effects`; jobs without a memorization eval give no rows."""
    rows = []
    for label, members in _groups(jobs).items():
        hits = [(j["seed"], job_exact_matches(_run(j))) for j in members]
        hits = [(s, df) for s, df in hits if not df.empty]
        for exp in sorted({e for _, df in hits for e in df["experiment"].unique()}):
            for d in sorted({int(x) for _, df in hits for x in df[df["experiment"] == exp]["dup_count"]}):
                per_seed = [(s, df[(df["experiment"] == exp) & (df["dup_count"] == d)]["exact_match"].astype(bool))
                            for s, df in hits]
                per_seed = [(s, v) for s, v in per_seed if len(v)]
                k, n = sum(int(v.sum()) for _, v in per_seed), sum(len(v) for _, v in per_seed)
                rate, low, high, method = stats.wilson_interval(k, n)
                rows.append({"group": label, "experiment": exp, "dup_count": d, "n_seeds": len(per_seed),
                             "seeds": ",".join(str(s) for s, _ in per_seed), "matched": k, "n_items": n,
                             "rate": rate, "ci_low": low, "ci_high": high,
                             "ci_method": f"{method} over the items of {len(per_seed)} seed(s)",
                             "seed_rates": ",".join(f"{v.mean():.3f}" for _, v in per_seed)})
    return rows


def _draw_series(rows: Sequence[dict], value: str):
    """A figure with one line per group and experiment of ``rows`` (``value`` with its ``ci_low``/``ci_high``,
    drawn as given), labelled with the seed count; returns ``(fig, ax)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pretrain_exp.report.plots import draw_intervals

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series: Dict[tuple, List[dict]] = {}
    for r in rows:
        series.setdefault((r["group"], r["experiment"]), []).append(r)
    for (group, exp), rs in series.items():
        rs = sorted(rs, key=lambda r: r["dup_count"])
        label = " ".join(x for x in (group, exp if len({e for _, e in series}) > 1 else "") if x) or exp
        draw_intervals(ax, [r["dup_count"] for r in rs], [r[value] for r in rs], [r.get("ci_low") for r in rs],
                       [r.get("ci_high") for r in rs], label=f"{label} ({rs[0]['n_seeds']} seed(s))")
    return fig, ax


def _finish(fig, ax, path: Path, title: str, subtitle: Optional[str]):
    """Titles, legend, grid and layout of a pooled figure, saved (PNG and PDF) and closed; returns the figure."""
    import matplotlib.pyplot as plt

    from pretrain_exp.report.plots import save_png, set_titles

    set_titles(ax, title, subtitle)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return fig


def plot_exact_match(rows: Sequence[dict], path: Path, title: str, subtitle: Optional[str] = None):
    """PNG of the pooled k-extractable rate vs dup count (:func:`pooled_exact_match` rows) with its Wilson
    interval, one line per group and experiment, each seed's rate as a small dot; written atomically. Returns the
    (closed) figure."""
    from pretrain_exp.report.plots import dup_axis

    fig, ax = _draw_series(rows, "rate")
    for r in rows:
        seed_rates = [float(x) for x in str(r["seed_rates"]).split(",") if x]
        ax.scatter([r["dup_count"]] * len(seed_rates), seed_rates, s=8, color="grey", alpha=0.6, zorder=1)
    dup_axis(ax, [r["dup_count"] for r in rows])
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel("k-extractable rate (95% CI, Wilson); grey: each seed")
    return _finish(fig, ax, path, title, subtitle)


def plot_pooled(rows: Sequence[dict], path: Path, title: str, trend: Sequence[dict] = (),
                subtitle: Optional[str] = None):
    """PNG of the pooled effect vs dup count with its interval over seeds, drawn as given
    (:func:`pretrain_exp.report.plots.draw_intervals`; hollow, with no bar, where the seed variance is not
    identified), one line per group and experiment, and the log-linear fit of ``trend`` (:func:`pooled_trend`
    rows) dashed with its interval; written atomically. Returns the (closed) figure."""
    from pretrain_exp.report.plots import ci_label, dup_axis, no_interval_legend

    fig, ax = _draw_series(rows, "effect")
    no_interval_legend(ax, [r.get("ci_method") for r in rows if r.get("ci_low") is None
                            or not np.isfinite(r["ci_low"])])
    x = np.linspace(0, max([r["dup_count"] for r in rows] + [1]), 200)
    for t in trend:  # effect(d) = -slope * log(1 + d): the fitted dose response and its interval over seeds
        ax.plot(x, -t["slope"] * np.log1p(x), lw=1, ls="--", color="black",
                label=f"log-linear fit: {-t['slope']:.3f} x log(1 + dup)" + (
                    f" [{-t['ci_high']:.3f}, {-t['ci_low']:.3f}]" if np.isfinite(t["ci_low"]) else ""))
        if np.isfinite(t["ci_low"]):
            ax.fill_between(x, -t["ci_high"] * np.log1p(x), -t["ci_low"] * np.log1p(x), color="black", alpha=0.08)
    ax.axhline(0, color="grey", lw=0.8)
    dup_axis(ax, [0] + [r["dup_count"] for r in rows])
    ax.set_ylabel(f"loss(dup 0) - loss(dup), nats/token\n({ci_label(r.get('ci_method') for r in rows)})")
    return _finish(fig, ax, path, title, subtitle)

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
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np
import pandas as pd

from pretrain_exp.core import stats

#: the columns of ``effect_pooled.csv``
POOLED_COLUMNS = ("group", "experiment", "dup_count", "n_seeds", "seeds", "n_items", "small_n", "effect", "ci_low",
                  "ci_high", "ci_method", "sd_seeds", "p_value", "p_method", "min_p")
#: the group label of jobs with no swept override but the seed
ALL = "all"


def job_losses(run_dir: Path) -> pd.DataFrame:
    """Per-item ``insertion_loss`` rows (``experiment, dup_count, item_id, loss``) of a run's last evaluated step."""
    from pretrain_exp.report.tables import load_run

    df = load_run(run_dir)
    if df.empty or "eval_type" not in df:
        return pd.DataFrame(columns=["experiment", "dup_count", "item_id", "loss"])
    df = df[(df["eval_type"] == "insertion_loss") & df["loss"].notna()]
    if df.empty:
        return df
    return df[df["step"] == df["step"].max()][["experiment", "dup_count", "item_id", "loss"]]


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
        "path": run dir}`` per finished job.
    """
    groups: Dict[str, List[dict]] = {}
    for j in jobs:
        groups.setdefault(j["group"] or ALL, []).append(j)
    rows = []
    for label, members in groups.items():
        losses = [(j["seed"], job_losses(Path(j["path"]))) for j in sorted(members, key=lambda j: j["seed"])]
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


def plot_pooled(rows: Sequence[dict], path: Path, title: str):
    """PNG of the pooled effect vs dup count with its interval over seeds, drawn as given
    (:func:`pretrain_exp.report.plots.draw_intervals`; hollow, with no bar, where the seed variance is not
    identified), one line per group and experiment; written atomically. Returns the (closed) figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pretrain_exp.report.plots import ci_label, draw_intervals, no_interval_legend, save_png

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series: Dict[tuple, List[dict]] = {}
    for r in rows:
        series.setdefault((r["group"], r["experiment"]), []).append(r)
    for (group, exp), rs in series.items():
        rs = sorted(rs, key=lambda r: r["dup_count"])
        label = " ".join(x for x in (group, exp if len({e for _, e in series}) > 1 else "") if x) or exp
        draw_intervals(ax, [r["dup_count"] for r in rs], [r["effect"] for r in rs], [r.get("ci_low") for r in rs],
                       [r.get("ci_high") for r in rs], label=f"{label} ({rs[0]['n_seeds']} seed(s))")
    no_interval_legend(ax, [r.get("ci_method") for r in rows if r.get("ci_low") is None
                            or not np.isfinite(r["ci_low"])])
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("dup count")
    ax.set_ylabel(f"loss(dup 0) - loss(dup) [nats/token], {ci_label(r.get('ci_method') for r in rows)}")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    save_png(fig, path)
    plt.close(fig)
    return fig

"""The insertion effect pooled over seeds: ``effect_pooled.csv`` and ``effect_vs_dup.png`` of a sweep report.

Jobs that differ only by ``seed`` form one group (their other swept overrides are equal). For each group,
experiment and dup count ``d > 0`` the effect of one job is ``mean loss(dup 0 items) - mean loss(dup d items)``
(nats/token) at its last evaluated step, from the per-item losses of its ``insertion_loss`` eval; the pooled effect
is the mean over the group's seeds. Its 95% CI is a two-stage (cluster) percentile bootstrap: resample the seeds
with replacement, then within each drawn seed resample the items of both dup groups with replacement (Davison &
Hinkley 1997, sec. 3.8). Items and seeds are both random draws here (the item sample; the training order and
placement), the seeds nest the items, and with a handful of seeds a mixed model's seed variance is poorly
identified while the bootstrap needs no distributional assumption. With one seed the CI covers the items only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np
import pandas as pd

#: the columns of ``effect_pooled.csv``
POOLED_COLUMNS = ("group", "experiment", "dup_count", "n_seeds", "seeds", "n_items", "effect", "ci_low", "ci_high")
#: fewer items than this in a dup group (per seed) and its CI is unreliable (a percentile bootstrap of the mean needs
#: roughly 10 or more; with 2 items it collapses to the two values)
MIN_ITEMS_FOR_CI = 10


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


def pooled_effects(jobs: Sequence[dict], samples: int = 2000, seed: int = 0) -> List[dict]:
    """Rows of :data:`POOLED_COLUMNS` (module docstring).

    :param jobs: ``{"group": label of the non-seed overrides, "seed": int, "path": run dir}`` per finished job.
    :param samples: bootstrap samples.
    """
    rng = np.random.default_rng(seed)
    groups: Dict[str, List[dict]] = {}
    for j in jobs:
        groups.setdefault(j["group"], []).append(j)
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
                effect = float(np.mean([a.mean() - b.mean() for _, a, b in per_seed]))
                boot = np.stack([rng.choice(a, (samples, a.size)).mean(1) - rng.choice(b, (samples, b.size)).mean(1)
                                 for _, a, b in per_seed])  # (seeds, samples): items resampled within each seed
                pick = rng.integers(0, len(per_seed), (samples, len(per_seed)))  # seeds resampled
                pooled = boot[pick, np.arange(samples)[:, None]].mean(1)
                lo, hi = np.percentile(pooled, [2.5, 97.5])
                rows.append({"group": label, "experiment": exp, "dup_count": d, "n_seeds": len(per_seed),
                             "seeds": ",".join(str(s) for s, _, _ in per_seed),
                             "n_items": int(min(min(a.size, b.size) for _, a, b in per_seed)),
                             "effect": effect, "ci_low": float(lo), "ci_high": float(hi)})
    return rows


def plot_pooled(rows: Sequence[dict], path: Path, title: str) -> None:
    """PNG of the pooled effect (95% CI bars) vs dup count, one line per group and experiment; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pretrain_exp.report.plots import save_png

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series: Dict[tuple, List[dict]] = {}
    for r in rows:
        series.setdefault((r["group"], r["experiment"]), []).append(r)
    for (group, exp), rs in series.items():
        rs = sorted(rs, key=lambda r: r["dup_count"])
        y = np.array([r["effect"] for r in rs])
        err = np.array([[e - r["ci_low"] for e, r in zip(y, rs)], [r["ci_high"] - e for e, r in zip(y, rs)]])
        label = " ".join(x for x in (group, exp if len({e for _, e in series}) > 1 else "") if x) or exp
        ax.errorbar([r["dup_count"] for r in rs], y, yerr=np.maximum(err, 0), marker="o", capsize=3,
                    label=f"{label} ({rs[0]['n_seeds']} seed(s))")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("dup count")
    ax.set_ylabel("effect: loss(dup 0) - loss(dup) [nats/token]")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    save_png(fig, path)

"""A sweep report's dose response and memorization pooled over seeds (``trend_pooled.csv``,
``exact_match_pooled.csv``, ``exact_match_vs_dup.png``) and the dup-count axis of its figures."""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from pretrain_exp.core.io import write_json
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.report.pooled import plot_exact_match, plot_pooled
from pretrain_exp.report.sweep import write_report

DUPS = (0, 1, 4, 16, 64)


def _job(root, seed, rng):
    """A finished job dir whose per-item losses fall with log(1 + dup) and whose items are memorized from dup 16."""
    d = root / str(seed)
    rd = RunDir(d)
    losses, matches = [], []
    for dc in DUPS:
        for i in range(8):
            item = len(losses)
            losses.append({"item_id": item, "experiment": "bios", "dup_count": dc,
                           "loss": 3.0 - (0.3 + 0.05 * seed) * np.log1p(dc) + rng.normal(0, 0.2)})
            matches.append({"item_id": item, "experiment": "bios", "dup_count": dc,
                            "exact_match": bool(dc >= 16 and (dc == 64 or i < 2 + seed)), "fraction_matched": 0.0})
    write_json(rd.evals(8, "insertion_loss"), {"task": "insertion_loss", "type": "insertion_loss", "step": 8,
                                               "metrics": {}, "per_dup": [], "rows": losses})
    write_json(rd.evals(8, "memorization"), {"task": "memorization", "type": "memorization", "step": 8,
                                             "metrics": {}, "per_dup": [], "rows": matches})
    (d / "config.resolved.yaml").write_text(f"seed: {seed}\n")
    write_json(rd.results, {"run_name": str(seed), "seed": seed, "step": 8, "per_dup": [], "effects": [],
                            "metrics": {}})
    return losses, matches


def test_trend_and_exact_match_pooled_over_three_seeds(tmp_path):
    rng = np.random.default_rng(3)
    jobs = [_job(tmp_path, s, rng) for s in range(3)]
    rep = write_report(tmp_path)
    with open(rep["paths"]["trend_csv"], newline="") as f:
        (trend,) = csv.DictReader(f)
    slopes = [sps.linregress(np.log1p([r["dup_count"] for r in losses]), [r["loss"] for r in losses]).slope
              for losses, _ in jobs]
    ci = sps.ttest_1samp(slopes, 0.0).confidence_interval(0.95)
    assert float(trend["slope"]) == pytest.approx(np.mean(slopes))
    assert (float(trend["ci_low"]), float(trend["ci_high"])) == pytest.approx((ci.low, ci.high))
    assert trend["ci_method"] == "t over seeds" and trend["n_seeds"] == "3" and trend["n_items"] == "40"
    assert float(trend["p_value"]) == pytest.approx(0.25) == float(trend["min_p"])  # all 3 negative: 2 / 2**3
    with open(rep["paths"]["exact_match_csv"], newline="") as f:
        rows = {int(r["dup_count"]): r for r in csv.DictReader(f)}
    assert sorted(rows) == list(DUPS)
    r16 = rows[16]
    k = sum(m["exact_match"] for _, ms in jobs for m in ms if m["dup_count"] == 16)
    assert (int(r16["matched"]), int(r16["n_items"])) == (k, 24) == (2 + 3 + 4, 24)
    wilson = sps.binomtest(k, 24).proportion_ci(0.95, method="wilson")
    assert (float(r16["ci_low"]), float(r16["ci_high"])) == pytest.approx((wilson.low, wilson.high))
    assert r16["seed_rates"] == "0.250,0.375,0.500" and rows[64]["rate"] == "1.0" and rows[0]["matched"] == "0"
    md = rep["paths"]["md"].read_text()
    assert "## Dose response pooled over seeds" in md and "## Memorization pooled over seeds" in md
    assert rep["paths"]["exact_match_png"].is_file() and rep["paths"]["pooled_png"].is_file()


def test_figures_tick_the_dup_counts_and_draw_the_fit():
    rows = [{"group": "all", "experiment": "bios", "dup_count": d, "effect": 0.3 * np.log1p(d), "ci_low": 0.1,
             "ci_high": 2.0, "ci_method": "t over seeds", "n_seeds": 3} for d in (1, 4, 16, 64)]
    trend = [{"slope": -0.3, "ci_low": -0.35, "ci_high": -0.25}]
    with tempfile.TemporaryDirectory() as d:
        fig = plot_pooled(rows, Path(d) / "e.png", "a long title " * 3, trend=trend)
        (ax,) = fig.axes
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "4", "16", "64"]
        assert list(ax.get_xticks()) == [0, 1, 4, 16, 64] and ax.get_xlim()[0] < 0
        fit = [line for line in ax.lines if line.get_linestyle() == "--"]
        assert len(fit) == 1 and fit[0].get_ydata()[-1] == pytest.approx(0.3 * np.log1p(64))
        em = [{"group": "all", "experiment": "bios", "dup_count": d, "rate": r, "ci_low": 0.0, "ci_high": 1.0,
               "n_seeds": 3, "seed_rates": f"{r},{r},{r}"} for d, r in ((0, 0.0), (4, 0.25), (64, 1.0))]
        fig = plot_exact_match(em, Path(d) / "m.png", "m")
        assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0", "4", "64"]


def _inside(fig, artist) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the plot functions close their figures
    canvas.draw()
    box, page = artist.get_window_extent(canvas.get_renderer()), fig.bbox
    return box.x0 >= page.x0 and box.x1 <= page.x1 and box.y0 >= page.y0 and box.y1 <= page.y1


def test_sweep_figures_fit_their_titles_tick_the_dups_and_are_also_pdf(tmp_path):
    """A long sweep name is a subtitle, wrapped inside the figure; the title says what is shown; every figure of
    the report is written as PNG and PDF."""
    from pretrain_exp.report.plots import plot_effect_vs_dup

    name = "dup_grid-a-rather-long-sweep-name-with-overrides-" * 3
    rows = [{"job": "0", "experiment": "bios", "dup_count": d, "mean_loss": 3.0 - 0.3 * np.log1p(d), "ci_low": 2.0,
             "ci_high": 4.0, "ci_method": "t"} for d in DUPS]
    fig = plot_effect_vs_dup(rows, {"0": "seed=0"}, tmp_path / "loss_vs_dup.png",
                             "mean insertion loss by dup count (95% CI, t)", subtitle=name)
    (ax,) = fig.axes
    assert ax.get_title() == "mean insertion loss by dup count (95% CI, t)"
    (sub,) = [t for t in ax.texts if "rather-long" in t.get_text()]
    assert sub.get_text().replace("\n", "") == name.strip() and "\n" in sub.get_text()
    assert _inside(fig, ax.title) and _inside(fig, sub)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "4", "16", "64"]
    assert (tmp_path / "loss_vs_dup.png").stat().st_size > 0
    assert (tmp_path / "loss_vs_dup.pdf").read_bytes().startswith(b"%PDF")

    rng = np.random.default_rng(5)
    sweep = tmp_path / "sweep"
    for s in range(3):
        _job(sweep, s, rng)
    rep = write_report(sweep)
    for key in ("png", "pooled_png", "exact_match_png"):
        assert rep["paths"][key].with_suffix(".pdf").read_bytes().startswith(b"%PDF")

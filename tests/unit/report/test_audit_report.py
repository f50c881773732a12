"""The audit's counts in the run's results: per-dup rows, the table and the loss-vs-dup plot."""

from __future__ import annotations

import matplotlib.axes

from pretrain_exp.report.plots import plot_per_dup
from pretrain_exp.report.summary import audit_summary, print_table, with_natural

AUDIT = {"mode": "on", "ngram": 13, "source": "GPT-3", "window_tokens": 12288, "held_out_tokens": 1024,
         "seconds": 0.01, "tokens_per_s": 1.3e6, "contaminated_controls": [1],
         "items": [{"item_id": i, "experiment": "bios", "dup_count": d, "natural_exact": n, "natural_ngram_hits": g,
                    "natural_ngram_overlap": g / 10, "held_out_exact": 0, "effective_dup_count": d + n,
                    "exact_at": [{"position": 300, "step": 1, "row": 2, "offset": 44}] if n else [],
                    "ngram_at": []}
                   for i, (d, n, g) in enumerate([(0, 0, 0), (0, 2, 10), (4, 0, 3), (4, 0, 0)])]}


def test_per_dup_rows_table_and_plot(tmp_path, capsys):
    rows = [{"experiment": "bios", "dup_count": d, "n_items": 2, "mean_loss": 3.0 - d / 4, "ci_low": 2.5 - d / 4,
             "ci_high": 3.5 - d / 4} for d in (0, 4)]
    out = with_natural(rows, AUDIT)
    assert [(r["natural_items"], r["natural_exact"], r["effective_dup_mean"]) for r in out] == [(1, 2, 1.0),
                                                                                                (1, 0, 4.0)]
    summary = audit_summary(AUDIT)
    assert summary["contaminated_controls"] == [{"item_id": 1, "experiment": "bios", "natural_exact": 2,
                                                 "natural_ngram_overlap": 1.0,
                                                 "first": {"position": 300, "step": 1, "row": 2, "offset": 44}}]
    assert summary["items_in_window"] == 2
    results = {"run_name": "r", "step": 12, "per_dup": out, "memorization": [], "metrics": {}, "audit": summary}
    print_table(results)
    text = " ".join(capsys.readouterr().out.split())  # rich wraps lines at the terminal width
    assert "1/2" in text and "eff. dup" in text and "2 item(s) occur in the window, 1 of them controls" in text
    assert "control item 1 (bios): 2 exact, 100% of its n-grams; first at step 1, row 2, offset 44" in text
    seen = []
    orig = matplotlib.axes.Axes.annotate
    matplotlib.axes.Axes.annotate = lambda self, s, *a, **k: seen.append(s) or orig(self, s, *a, **k)
    try:
        plot_per_dup(results, tmp_path / "loss_vs_dup.png")
    finally:
        matplotlib.axes.Axes.annotate = orig
    assert (tmp_path / "loss_vs_dup.png").stat().st_size > 0
    assert seen == ["1 natural, eff. 1.00", "1 natural, eff. 4.00"]

"""The statistics a run's and a sweep's reports print: ``results.json``'s effects, primary endpoint, pre/post
effects and methods; the console table's intervals, ``n/a`` and small-group flags; the effect pooled over seeds
(t over seeds, calibrated; none with 2 seeds); intervals drawn as given in the plots; the contamination change since
step 0 and the item-weighted bars; the release card's per-dup rows."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict

import numpy as np
import pytest
from scipy import stats as sps

from pretrain_exp.core import stats
from pretrain_exp.core.io import write_json
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.evals.insertion_loss import InsertionLossConf, insertion_loss
from pretrain_exp.report.jobs import Job
from pretrain_exp.report.plots import CI_GID, NO_CI_GID, plot_benchmark, plot_effect_vs_dup
from pretrain_exp.report.pooled import plot_pooled, pool_seeds
from pretrain_exp.report.summary import change_since, contamination_summary, print_table, summarize
from pretrain_exp.report.sweep import benchmark_rows, write_report
from pretrain_exp.report.tables import sweep_frame
from tests.conftest import make_config, make_plan, random_item, tiny_model
from tests.unit.evals.test_evals import ctx_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DUPS = (0, 0, 0, 0, 1, 1, 1, 4, 4, 4)  #: 4 controls, 3 items at dup 1 and at dup 4


@pytest.fixture(scope="module")
def plan():
    rng = np.random.default_rng(7)
    return make_plan([(random_item(rng), d, 0) for d in DUPS])


def _loss_record(model, plan, step):
    """The ``insertion_loss`` eval record of ``model`` at ``step``, as the evaluator saves it."""
    res = insertion_loss(InsertionLossConf(), ctx_for(model, plan))
    return {"task": "insertion_loss", "type": "insertion_loss", "step": step, **asdict(res)}


def test_results_carry_effects_primary_endpoint_methods_and_pre_post_effects(tmp_path, plan):
    cfg = make_config("experiment=tiny", "wandb=disabled", run_dir=tmp_path)
    before, after = _loss_record(tiny_model(0), plan, 0), _loss_record(tiny_model(1), plan, 4)
    evaluated = {0: {"insertion_loss": before}, 4: {"insertion_loss": after}}
    res = summarize(cfg, plan, evaluated, evaluated, 1.0)

    assert [(r["dup_count"], r["n_items"], r["small_n"], r["ci_method"]) for r in res["per_dup"]] == [
        (0, 4, True, "t"), (1, 3, True, "t"), (4, 3, True, "t")]
    pairs = [r for r in res["effects"] if r["contrast"] != "trend"]
    assert [(r["task"], r["dup_count"], r["effect_ci_method"]) for r in pairs] == [
        ("insertion_loss", 1, "Welch t"), ("insertion_loss", 4, "Welch t")]
    assert [(r["experiment"], r["contrast"], r["primary"]) for r in res["primary"]] == [("bios", "trend", True)]
    st = res["statistics"]
    assert st["ci_level"] == 0.95 and st["min_items_per_group"] == stats.MIN_ITEMS_PER_GROUP == 8
    assert st["p_adjust"] == "holm" and "exact" in st["p_method"] and st["intervals"]["mean"] == "t"

    # pre/post: each item's loss change since step 0; effect = mean change(dup 0) - mean change(dup d)
    loss0 = {r["item_id"]: r["loss"] for r in before["rows"]}
    delta = {d: np.array([r["loss"] - loss0[r["item_id"]] for r in after["rows"] if r["dup_count"] == d])
             for d in (0, 1, 4)}
    did = res["did_effects"]
    assert [(r["dup_count"], r["n_treated"], r["n_control"], r["baseline_step"]) for r in did] == [
        (1, 3, 4, 0), (4, 3, 4, 0)]
    p = []
    for r in did:
        d = r["dup_count"]
        assert r["effect"] == pytest.approx(delta[0].mean() - delta[d].mean(), rel=1e-12)
        welch = sps.ttest_ind(delta[0], delta[d], equal_var=False).confidence_interval(0.95)
        assert (r["effect_ci_low"], r["effect_ci_high"]) == pytest.approx((welch.low, welch.high), rel=1e-9)
        exact = sps.permutation_test((delta[0], delta[d]), lambda a, b: a.mean() - b.mean(), n_resamples=np.inf,
                                     permutation_type="independent")
        assert r["p_value"] == pytest.approx(exact.pvalue) and r["p_method"] == "exact randomization"
        p.append(r["p_value"])
    lo, hi = sorted(p)  # Holm over the two contrasts: 2 * the smaller p, then max(that, the larger p)
    assert sorted(r["p_adjusted"] for r in did) == pytest.approx([min(1, 2 * lo), max(min(1, 2 * lo), hi)])
    assert {r["p_adjust_method"] for r in did} == {"holm"}
    # what results.json holds, read back, is the summary itself (no NaN: a missing interval is null)
    write_json(tmp_path / "results.json", res)
    assert json.loads((tmp_path / "results.json").read_text()) == res


def test_no_pre_post_effects_without_a_step0_record(tmp_path, plan):
    cfg = make_config("experiment=tiny", "wandb=disabled", run_dir=tmp_path)
    evaluated = {4: {"insertion_loss": _loss_record(tiny_model(1), plan, 4)}}
    res = summarize(cfg, plan, evaluated, evaluated, 1.0)
    assert res["did_effects"] == [] and len(res["effects"]) == 3


def _results(per_item, run_name="r"):
    """A run's results with the project's own per-dup rows and effects of per-item losses ``{dup: [...]}``."""
    rows = [{"item_id": i, "experiment": "bios", "dup_count": d, "loss": v}
            for i, (d, v) in enumerate((d, v) for d, vs in per_item.items() for v in vs)]
    per_dup = [{"mean_loss" if k == "mean" else k: v for k, v in g.items()}
               for g in stats.per_dup_summary(rows, "loss")]
    effects = [dict(e, task="insertion_loss", eval_type="insertion_loss")
               for e in stats.per_dup_effects(rows, "loss", sign=-1.0)]
    return {"run_name": run_name, "step": 12, "per_dup": per_dup, "memorization": [], "metrics": {},
            "effects": effects, "primary": [e for e in effects if e["primary"]]}


def test_console_table_names_the_method_flags_small_groups_and_prints_na(capsys):
    print_table(_results({0: [3.5, 3.7, 3.6, 3.9, 3.4], 1: [2.9], 16: [0.8, 1.1, 0.7, 0.9, 1.0, 0.6, 0.8, 0.9]}))
    out = capsys.readouterr().out
    lines = {line.split("│")[2].strip(): line for line in out.splitlines() if line.startswith("│ bios")
             and "vs" not in line}
    assert "95% CI (t)" in out and "bootstrap" not in out
    assert "│    1* │" in lines["1"] and "n/a" in lines["1"] and "2.900" in lines["1"]  # one item: no interval
    assert "│    5* │" in lines["0"] and "│     8 │" in lines["16"]
    assert "* fewer than 8 items per group" in out and "n/a: no interval (n < 2)" in out
    # the effects under the table: Welch interval, exact randomization p, Holm-adjusted p; then the primary endpoint
    effect = next(line for line in out.splitlines() if "dup 16 vs 0" in line)
    welch = sps.ttest_ind([3.5, 3.7, 3.6, 3.9, 3.4], [0.8, 1.1, 0.7, 0.9, 1.0, 0.6, 0.8, 0.9],
                          equal_var=False).confidence_interval(0.95)
    assert f"[{welch.low:.3f}, {welch.high:.3f}]" in effect and "8 vs 5" in effect
    assert "95% CI (Welch t)" in out and "p (Holm)" in out and "exact randomization test" in out
    one = next(line for line in out.splitlines() if "dup 1 vs 0" in line)  # 1 vs 5 items: no Welch interval
    assert "1 vs 5" in one and "n/a" in one
    assert "primary endpoint (bios, 14 items)" in out and "(95% CI, OLS t)" in out


def test_pooled_t_interval_over_seeds_matches_scipy_and_two_seeds_give_none():
    rng = np.random.default_rng(3)
    per_seed = [(rng.normal(3.0, 0.3, 8), rng.normal(2.0, 0.3, 8)) for _ in range(3)]
    effects = np.array([c.mean() - t.mean() for c, t in per_seed])
    row = pool_seeds(per_seed)
    ci = sps.ttest_1samp(effects, 0.0).confidence_interval(0.95)
    assert row["effect"] == pytest.approx(effects.mean())
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((ci.low, ci.high), rel=1e-12)
    assert row["ci_method"] == "t over seeds" and row["n_seeds"] == 3 and row["n_items"] == 8 and not row["small_n"]
    assert row["p_value"] == 0.25 and row["min_p"] == 0.25  # exact sign-flip over 3 seeds: all effects > 0
    two = pool_seeds(per_seed[:2])
    assert math.isnan(two["ci_low"]) and math.isnan(two["ci_high"])
    assert two["ci_method"] == "none (seed variance not identified, S = 2)" and two["min_p"] == 0.5


@pytest.mark.parametrize("seeds", [3, 5])
def test_pooled_interval_covers_with_seed_variance(seeds):
    """tau = 0.3 (sd of the seed-level shift of the effect), item sd 0.3, 16 items per group: coverage of the 95%
    interval of the mean effect over seeds (0.959 and 0.951 here); the two-stage (seeds, then items) percentile
    bootstrap it replaces covered 0.855 and 0.913 on the same draws."""
    rng = np.random.default_rng(seeds)
    reps, true, hits = 1500, 0.5, 0
    for _ in range(reps):
        shift = rng.normal(0.0, 0.3, seeds)
        per_seed = [(rng.normal(3.0, 0.3, 16), rng.normal(3.0 - true - s, 0.3, 16)) for s in shift]
        row = pool_seeds(per_seed)
        hits += row["ci_low"] <= true <= row["ci_high"]
    assert 0.92 <= hits / reps <= 0.98


def _job(root, name, seed, per_item):
    """A finished job dir: config, per-item insertion_loss rows at step 4, results.json."""
    d = root / name
    rd = RunDir(d)
    rows = [{"item_id": i, "experiment": "bios", "dup_count": dc, "loss": v}
            for i, (dc, v) in enumerate((dc, v) for dc, vs in per_item.items() for v in vs)]
    write_json(rd.evals(4, "insertion_loss"), {"task": "insertion_loss", "type": "insertion_loss", "step": 4,
                                               "metrics": {}, "per_dup": [], "rows": rows})
    (d / "config.resolved.yaml").write_text(f"seed: {seed}\n")
    res = _results(per_item, name)
    write_json(rd.results, dict(res, seed=seed, step=4, effects=[]))  # effects recomputed from the rows
    return d


def test_sweep_report_pools_two_seeds_without_an_interval(tmp_path, capsys):
    from pretrain_exp.report.cli import print_report

    for seed in (0, 1):
        _job(tmp_path, str(seed), seed, {0: [3.5, 3.7, 3.6 + seed, 3.9], 4: [2.0, 2.2, 2.1, 1.9 - seed / 2]})
    rep = write_report(tmp_path)
    with open(rep["paths"]["pooled_csv"], newline="") as f:
        (pooled,) = csv.DictReader(f)
    assert pooled["group"] == "all" and pooled["n_seeds"] == "2" and pooled["small_n"] == "True"
    assert pooled["ci_low"] == pooled["ci_high"] == "" and "seed variance not identified" in pooled["ci_method"]
    assert float(pooled["p_value"]) == 0.5 == float(pooled["min_p"])
    with open(rep["paths"]["csv"], newline="") as f:
        rows = {(r["job"], r["dup_count"]): r for r in csv.DictReader(f)}
    r = rows[("0", "4")]
    control, treated = [3.5, 3.7, 3.6, 3.9], [2.0, 2.2, 2.1, 1.9]
    welch = sps.ttest_ind(control, treated, equal_var=False).confidence_interval(0.95)
    assert (float(r["effect_ci_low"]), float(r["effect_ci_high"])) == pytest.approx((welch.low, welch.high))
    assert float(r["p_value"]) == pytest.approx(2 / 70) and r["effect_ci_method"] == "Welch t"
    assert r["small_n"] == "True" and r["ci_method"] == "t"
    print_report(rep)
    out = " ".join(capsys.readouterr().out.split())
    assert "seed variance not identified with 2 seed(s): no interval (n/a)" in out
    assert "│ all │" in out and "4* │" in out and "CIs are unreliable" not in out


def _errorbars(ax):
    """``[(x, low, high)]`` of the interval bars drawn, and ``[(x, y)]`` of the hollow no-interval points."""
    bars = [(float(seg[0, 0]), float(seg[0, 1]), float(seg[1, 1])) for c in ax.collections
            if c.get_gid() == CI_GID for seg in c.get_segments()]
    hollow = [tuple(map(float, xy)) for line in ax.lines if line.get_gid() == NO_CI_GID for xy in line.get_xydata()]
    return sorted(bars), sorted(hollow)


def test_plots_draw_intervals_as_given_and_none_without_one(tmp_path):
    rows = [{"group": "all", "experiment": "bios", "dup_count": 1, "n_seeds": 3, "effect": 0.2, "ci_low": 0.3,
             "ci_high": 0.9, "ci_method": "t over seeds"},  # not around the point (ci_low > mean)
            {"group": "all", "experiment": "bios", "dup_count": 4, "n_seeds": 3, "effect": 0.5, "ci_low": -0.4,
             "ci_high": 1.1, "ci_method": "t over seeds"},  # crosses zero
            {"group": "all", "experiment": "bios", "dup_count": 16, "n_seeds": 2, "effect": 1.0, "ci_low": float("nan"),
             "ci_high": float("nan"), "ci_method": "none (seed variance not identified, S = 2)"}]
    ax = plot_pooled(rows, tmp_path / "pooled.png", "t").axes[0]
    assert _errorbars(ax) == ([(1.0, 0.3, 0.9), (4.0, -0.4, 1.1)], [(16.0, 1.0)])
    assert "t over seeds" in ax.get_ylabel()
    assert "no interval (seed variance not identified, S = 2)" in [t.get_text() for t in ax.get_legend().texts]

    per_dup = [{"job": "j", "experiment": "bios", "dup_count": 0, "mean_loss": 3.0, "ci_low": 2.5, "ci_high": 3.2,
                "ci_method": "t"},
               {"job": "j", "experiment": "bios", "dup_count": 1, "mean_loss": 2.0, "ci_low": None, "ci_high": None,
                "ci_method": "none (n < 2)"}]
    ax = plot_effect_vs_dup(per_dup, {}, tmp_path / "loss.png", "t").axes[0]
    assert _errorbars(ax) == ([(0.0, 2.5, 3.2)], [(1.0, 2.0)]) and "95% CI, t" in ax.get_ylabel()

    bench = [{"job": "j", "experiment": "arc", "acc_clean": None, "acc_contaminated": 0.75, "effect": None,
              "ci_low": None, "ci_high": None}]
    ax = plot_benchmark(bench, {}, tmp_path / "bench.png", "t").axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert heights == [0.75] and "n/a" in [t.get_text() for t in ax.texts]  # no bar of height 0 for a missing acc


def _bench_rows(acc, dups):
    return [{"item_id": i, "experiment": "arc", "dup_count": d, "acc": a, "acc_norm": a} for i, (d, a) in
            enumerate(zip(dups, acc))]


def test_contamination_change_since_step0_spillover_and_item_weighted_bars(tmp_path):
    cfg = make_config("experiment=tiny", "wandb=disabled", run_dir=tmp_path)
    dups = [0] * 6 + [1] * 2 + [4] * 6
    before = _bench_rows([0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 0], dups)
    after = _bench_rows([1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1], dups)
    per_dup = [{"experiment": "arc", "dup_count": d, "n_items": dups.count(d),
                "acc": float(np.mean([r["acc"] for r in after if r["dup_count"] == d]))} for d in (0, 1, 4)]
    entry = contamination_summary("benchmark", {"type": "benchmark", "rows": after, "per_dup": per_dup,
                                                "effects": []}, {"rows": before}, 0, cfg)
    change = {(r["metric"], r["dup_count"]): r for r in entry["change_since_baseline"]}
    clean = change[("acc", 0)]  # the spillover: items never inserted
    diffs = np.array([a["acc"] - b["acc"] for a, b in zip(after, before) if a["dup_count"] == 0])
    ci = sps.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    assert clean["group"] == "clean" and clean["change"] == pytest.approx(diffs.mean())
    assert (clean["ci_low"], clean["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert change[("acc", "> 0")]["n_items"] == 8 and change[("acc", "> 0")]["group"] == "contaminated"
    assert change_since(before, after, "acc", 0) == [r for r in entry["change_since_baseline"] if r["metric"] == "acc"]
    assert [r["dup_count"] for r in entry["did_effects"]] == [1, 4, 1, 4]  # acc, then acc_norm

    job = Job(tmp_path, "0", results={"seed": 0, "step": 4, "per_dup": [], "contamination": {"benchmark": entry}})
    (row,) = benchmark_rows(sweep_frame([job]))
    hot = [r["acc"] for r in after if r["dup_count"] > 0]
    assert row["acc_contaminated"] == pytest.approx(np.mean(hot))  # item-pooled (7/8), not the groups' mean (0.92)
    assert row["acc_contaminated"] - row["acc_clean"] == pytest.approx(row["effect"])
    assert row["clean_change"] == pytest.approx(diffs.mean()) and row["n_contaminated"] == 8


def test_console_prints_contamination_with_spillover_and_marks_closed_loop_effects(tmp_path, capsys):
    """The run's console shows the benchmark's per-dup accuracies with their Wilson intervals, the effects with
    interval and p, and the clean items' change since step 0 (spillover); a closed loop's per-dup effects are
    marked as not randomized and its trend is not offered as the primary endpoint."""
    cfg = make_config("experiment=tiny", "wandb=disabled", run_dir=tmp_path)
    dups = [0] * 6 + [1] * 2 + [4] * 6
    before = _bench_rows([0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 0], dups)
    after = _bench_rows([1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1], dups)
    per_dup = []
    for d in (0, 1, 4):
        acc = [r["acc"] for r in after if r["dup_count"] == d]
        iv = stats.interval(acc, proportion=True)
        per_dup.append({"experiment": "arc", "dup_count": d, "n_items": len(acc), "acc": iv["mean"],
                        "acc_norm": iv["mean"], "ci_low": iv["ci_low"], "ci_high": iv["ci_high"],
                        "ci_method": iv["ci_method"], "small_n": iv["small_n"], "acc_norm_ci_low": iv["ci_low"],
                        "acc_norm_ci_high": iv["ci_high"]})
    entry = contamination_summary("benchmark", {"type": "benchmark", "rows": after, "per_dup": per_dup,
                                                "effects": []}, {"rows": before}, 0, cfg)
    results = dict(_results({0: [3.5, 3.7, 3.6, 3.9], 4: [2.0, 2.2, 1.9, 2.1]}), contamination={"benchmark": entry})
    print_table(results)
    out = capsys.readouterr().out
    assert "benchmark contamination (benchmark, experiment arc)" in out and "95% CI (Wilson)" in out
    assert "acc dup > 0 vs 0: +" in out and "(95% CI, Newcombe)" in out  # two inserted dup counts: pooled too
    spill = next(line for line in out.splitlines() if "spillover" in line)
    assert f"{entry['change_since_baseline'][0]['change']:+.3f}" in spill
    print_table(dict(results, dynamic={"realized_dup_groups_randomized": False, "items": [], "copies": 1,
                                       "policy": "spaced_repetition", "margin": 0.1}))
    out = capsys.readouterr().out
    assert "NOT randomized" in out and "primary endpoint" not in out


def test_release_card_rows_show_items_method_and_flag():
    from pretrain_exp.report.release import _eval_lines

    res = _results({0: [3.5, 3.7, 3.6, 3.9], 1: [3.0, 3.2, 2.8], 4: [2.9]})
    text = "\n".join(_eval_lines(dict(res, step=12)))
    assert "| bios | 0 | 4* | 3.675 | [" in text and "| t |" in text
    assert "| bios | 4 | 1* | 2.900 | n/a | none (n < 2) |" in text
    assert "fewer than 8 items" in text and "| dup 1 vs 0 |" in text

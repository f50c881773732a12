"""The statistics core against scipy, brute-force enumeration and published worked examples."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from pretrain_exp.core import stats


def test_t_interval_equals_scipy_and_has_no_interval_without_spread():
    v = np.array([3.1, 3.9, 2.7, 3.5])
    mean, low, high, method = stats.t_interval(v)
    ref = sps.t.interval(0.95, v.size - 1, loc=v.mean(), scale=sps.sem(v))
    assert (mean, method) == (pytest.approx(v.mean()), "t") and (low, high) == pytest.approx(ref)
    for bad, why in (([2.5], "n < 2"), ([0.0, 0.0, 0.0], "all values equal"), ([], "no items")):
        _, low, high, method = stats.t_interval(bad)
        assert math.isnan(low) and math.isnan(high) and why in method


def test_welch_interval_equals_scipy():
    a, b = np.array([2.1, 2.9, 3.3, 2.4, 2.8]), np.array([3.6, 3.9, 4.4, 3.1])
    d, low, high, method = stats.welch_interval(a, b)
    ref = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert d == pytest.approx(a.mean() - b.mean()) and (low, high) == pytest.approx((ref.low, ref.high))
    assert method == "Welch t"
    assert math.isnan(stats.welch_interval([1.0], b)[1])


def test_wilson_and_newcombe_match_published_values():
    """Newcombe 1998 (Stat. Med. 17, table II, example (a)): 56/70 - 48/80, method 10: 0.0524 to 0.3339."""
    p, low, high, method = stats.wilson_interval(0, 4)
    assert (p, low, method) == (0.0, 0.0, "Wilson") and high == pytest.approx(0.4899, abs=1e-4)  # not [0, 0]
    d, low, high, method = stats.newcombe_interval(56, 70, 48, 80)
    assert d == pytest.approx(0.2) and (low, high) == pytest.approx((0.0524, 0.3339), abs=1e-4)
    assert method == "Newcombe"


def test_auc_interval_is_a_proper_interval_at_perfect_separation():
    auc, low, high, method = stats.auc_interval([3.0, 4.0, 5.0, 6.0], [0.0, 1.0, 2.0, 2.5])
    assert auc == 1.0 and high == 1.0 and 0.5 < low < 0.7 and method == "Newcombe score"
    m, o = np.array([0.3, 0.9, 0.4, 0.8, 0.6]), np.array([0.1, 0.5, 0.2, 0.4])
    from sklearn.metrics import roc_auc_score

    auc, low, high, _ = stats.auc_interval(m, o)
    assert auc == pytest.approx(roc_auc_score([1] * 5 + [0] * 4, np.r_[m, o])) and low < auc < high


def test_randomization_test_is_exact_by_enumeration():
    t, c = np.array([1.0, 2.5, 3.0, 4.2]), np.array([0.2, 0.9, 1.1, 2.0])
    pooled, obs = np.r_[t, c], t.mean() - c.mean()
    diffs = [pooled[list(s)].mean() - np.delete(pooled, list(s)).mean() for s in itertools.combinations(range(8), 4)]
    lower = np.mean(np.array(diffs) <= obs + 1e-12)
    upper = np.mean(np.array(diffs) >= obs - 1e-12)
    p, method = stats.randomization_test(t, c)
    assert p == pytest.approx(min(1.0, 2 * min(lower, upper))) and method == "exact randomization"
    big_t, big_c = np.arange(20.0), np.arange(20.0) + 0.5  # C(40, 20) relabellings: Monte Carlo, seeded
    p, method = stats.randomization_test(big_t, big_c, permutations=999, seed=1)
    assert method == "randomization (999)" and p == stats.randomization_test(big_t, big_c, permutations=999, seed=1)[0]


def test_effect_uses_newcombe_for_proportions_and_welch_otherwise():
    e = stats.effect([1, 1, 1, 0], [0, 0, 1, 0], proportion=True)
    assert e["effect"] == 0.5 and e["effect_ci_method"] == "Newcombe" and e["n_treated"] == 4
    e = stats.effect([2.0, 2.2, 2.4], [3.0, 3.1, 3.5])
    assert e["effect_ci_method"] == "Welch t" and e["effect_ci_high"] < 0 and e["p_method"] == "exact randomization"


def test_trend_test_slope_equals_linregress():
    dups = np.repeat([0, 1, 4, 16], 3)
    y = 3.0 - 0.4 * np.log1p(dups) + np.random.default_rng(0).normal(0, 0.1, dups.size)
    r = stats.trend_test(y, dups, permutations=199, seed=0)
    fit = sps.linregress(np.log1p(dups), y)
    assert r["slope"] == pytest.approx(fit.slope) and r["slope_ci_low"] < fit.slope < r["slope_ci_high"]
    assert r["p_value"] == pytest.approx(2 / 200)  # the strongest of 200 labellings, two-sided (2 x one tail)
    assert math.isnan(stats.trend_test([1.0, 2.0, 3.0], [0, 0, 0])["slope"])


def test_holm_and_bh_match_their_definitions():
    p = [0.01, 0.04, 0.03, 0.005, float("nan")]
    assert stats.adjust(p, "holm")[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert math.isnan(stats.adjust(p, "holm")[4])
    assert stats.adjust(p, "bh")[:4] == pytest.approx(list(sps.false_discovery_control([0.01, 0.04, 0.03, 0.005])))
    assert stats.adjust(p, "none")[:4] == p[:4]
    with pytest.raises(ValueError, match="unknown p-value adjustment"):
        stats.adjust(p, "bonferroni")


def test_per_dup_effects_adjust_the_pairwise_family_and_keep_the_trend_primary():
    rng = np.random.default_rng(1)
    rows = [{"experiment": "bios", "dup_count": d, "loss": 3.0 - 0.3 * math.log1p(d) + rng.normal(0, 0.2)}
            for d in (0, 1, 4, 16) for _ in range(4)]
    out = stats.per_dup_effects(rows, "loss", sign=-1, permutations=99)
    pairs = [r for r in out if r["contrast"] != "trend"]
    assert [r["dup_count"] for r in pairs] == [1, 4, 16]
    assert [r["p_adjusted"] for r in pairs] == pytest.approx(stats.adjust([r["p_value"] for r in pairs], "holm"))
    loss = {d: np.mean([r["loss"] for r in rows if r["dup_count"] == d]) for d in (0, 16)}
    assert pairs[-1]["effect"] == pytest.approx(loss[0] - loss[16])  # sign=-1: a drop in loss is positive
    trend = out[-1]
    assert trend["primary"] and trend["contrast"] == "trend" and trend["effect"] > 0


def test_seed_interval_needs_three_seeds_and_equals_a_t_interval():
    r = stats.seed_interval([0.5, 0.7])
    assert math.isnan(r["ci_low"]) and "seed variance not identified" in r["ci_method"]
    r = stats.seed_interval([0.5, 0.7, 0.4])
    ref = sps.t.interval(0.95, 2, loc=np.mean([0.5, 0.7, 0.4]), scale=sps.sem([0.5, 0.7, 0.4]))
    assert (r["ci_low"], r["ci_high"]) == pytest.approx(ref) and r["ci_method"] == "t over seeds"


def test_tost_is_two_one_sided_t_tests():
    v = np.array([0.01, -0.02, 0.015, 0.0, -0.005, 0.01])
    r = stats.tost(v, margin=0.05)
    lower = sps.ttest_1samp(v, -0.05, alternative="greater").pvalue
    upper = sps.ttest_1samp(v, 0.05, alternative="less").pvalue
    assert r["tost_p"] == pytest.approx(max(lower, upper)) and r["equivalent"]
    assert stats.tost(v, margin=0.001)["equivalent"] is False
    with pytest.raises(ValueError, match="margin"):
        stats.tost(v, margin=0.0)
    assert stats.min_sign_flip_p(5) > 0.05 >= stats.min_sign_flip_p(6)


def test_items_per_group_matches_cohens_table():
    """Cohen 1988, table 2.4.1 (two-sided alpha 0.05, power 0.8): d = 0.2, 0.5, 0.8 need 393, 64, 26 per group."""
    assert [stats.items_per_group(d, 1.0) for d in (0.5, 0.8)] == [64, 26]
    assert stats.items_per_group(0.2, 1.0) in (393, 394)  # the table rounds the normal approximation
    assert stats.items_per_group(-0.3, 0.6) == stats.items_per_group(0.5, 1.0)  # only |effect| / sd matters
    with pytest.raises(ValueError, match="sd > 0"):
        stats.items_per_group(0.5, 0.0)


def test_a_signed_effect_keeps_which_group_is_treated():
    """``sign=-1`` (a loss, where a drop is the effect) negates the effect and its interval, never the group sizes:
    dup 4 has 2 items and the controls 5."""
    rows = [{"experiment": "e", "dup_count": 0, "loss": v} for v in (3.0, 3.2, 2.9, 3.1, 3.3)]
    rows += [{"experiment": "e", "dup_count": 4, "loss": v} for v in (2.0, 2.2)]
    r = stats.per_dup_effects(rows, "loss", sign=-1)[0]
    plain = stats.effect([2.0, 2.2], [3.0, 3.2, 2.9, 3.1, 3.3])
    assert (r["n_treated"], r["n_control"]) == (2, 5)
    assert (r["effect"], r["effect_ci_low"], r["effect_ci_high"]) == pytest.approx(
        (-plain["effect"], -plain["effect_ci_high"], -plain["effect_ci_low"]))
    assert r["p_value"] == plain["p_value"]

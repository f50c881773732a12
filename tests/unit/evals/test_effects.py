"""The intervals, effects and tests every eval reports, on tiny real models and plans: every per-dup row names its
interval's method and flags small groups, a group of one item gets no interval, every dup-vs-control effect has a
difference interval and a randomization p-value equal to a brute-force enumeration of the relabellings, and the
eval's p-values are Holm-adjusted together (the primary trend test is not)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

import pretrain_exp.evals.insertion_loss  # noqa: F401  (registration)
import pretrain_exp.evals.memorization  # noqa: F401
from pretrain_exp.core.stats import exact_randomization_test, newcombe_interval, wilson_interval
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.benchmark import summarize as benchmark_summary
from pretrain_exp.evals.effects import auc_randomization_test
from pretrain_exp.evals.knowledge import summarize as knowledge_summary
from pretrain_exp.evals.mia import MiaConf
from pretrain_exp.evals.registry import EVALS, run_eval
from tests.conftest import make_plan, random_item, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def ctx_for(model, plan, batch_size=4, p_adjust="holm", permutations=999) -> EvalContext:
    return EvalContext(model=model, tokenizer=None, plan=plan, held_out=np.empty((0, 8), np.int64), step=0,
                       batch_size=batch_size, seed=7, permutations=permutations,
                       p_adjust=p_adjust)


def brute_p(treated, control, statistic=lambda a, b: np.mean(a) - np.mean(b)) -> float:
    """Two-sided randomization p over every split of the pooled values into groups of the two sizes, scipy's
    convention: ``2 * min(P(T* >= T), P(T* <= T))``, capped at 1."""
    x = np.concatenate([np.asarray(treated, float), np.asarray(control, float)])
    n = len(treated)
    obs = statistic(x[:n], x[n:])
    null = []
    for idx in itertools.combinations(range(x.size), n):
        mask = np.zeros(x.size, bool)
        mask[list(idx)] = True
        null.append(statistic(x[mask], x[~mask]))
    null, tol = np.array(null), 1e-9 * max(1.0, abs(obs))
    return min(1.0, 2 * min(np.mean(null >= obs - tol), np.mean(null <= obs + tol)))


def holm(p) -> list:
    """Holm's step-down adjustment, written out: the i-th smallest p times (m - i), running maximum, capped at 1."""
    p = np.asarray(p, float)
    out, running = np.empty_like(p), 0.0
    for rank, i in enumerate(np.argsort(p, kind="stable")):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out.tolist()


def welch(t, c):
    """Welch's interval of mean(t) - mean(c) from scipy's own two-sample t test."""
    ci = sps.ttest_ind(t, c, equal_var=False).confidence_interval(0.95)
    return ci.low, ci.high


def check_family(effects):
    """Every non-primary row adjusted by Holm over all of them; primary rows are the trend tests, unadjusted."""
    secondary = [e for e in effects if not e["primary"]]
    assert [e["p_adjusted"] for e in secondary] == pytest.approx(holm([e["p_value"] for e in secondary]))
    assert all(e["p_adjust_method"] == "holm" for e in secondary)
    for e in effects:
        if e["primary"]:
            assert e["contrast"] == "trend" and e["p_adjusted"] == e["p_value"] and e["p_adjust_method"] == "none"


# ------------------------------------------------------------ insertion loss

def test_insertion_loss_effects_intervals_and_holm():
    rng = np.random.default_rng(3)
    items = [(random_item(rng, int(rng.integers(5, 15))), d, 0) for d in (0, 0, 0, 2, 2, 2, 5, 5, 5)]
    items += [(random_item(rng, 9), 0, 1), (random_item(rng, 11), 3, 1), (random_item(rng, 7), 3, 1)]
    plan = make_plan(items, experiments=("a", "b"))
    res = run_eval(EVALS["insertion_loss"].config(), ctx_for(tiny_model(1), plan))
    loss = {(r["experiment"], r["dup_count"]): [] for r in res.rows}
    for r in res.rows:
        loss[(r["experiment"], r["dup_count"])].append(r["loss"])
    # rows: method and flag; b's one control has no interval
    assert [(g["experiment"], g["dup_count"], g["ci_method"], g["small_n"]) for g in res.per_dup] == [
        ("a", 0, "t", True), ("a", 2, "t", True), ("a", 5, "t", True), ("b", 0, "none (n < 2)", True),
        ("b", 3, "t", True)]
    assert math.isnan(res.per_dup[3]["ci_low"]) and math.isnan(res.per_dup[3]["ci_high"])
    pairs = {(e["experiment"], e["dup_count"]): e for e in res.effects if e["contrast"] != "trend"}
    assert set(pairs) == {("a", 2), ("a", 5), ("b", 3)}
    for (exp, d), e in pairs.items():
        c, t = loss[(exp, 0)], loss[(exp, d)]
        assert e["effect"] == pytest.approx(np.mean(c) - np.mean(t))  # loss(dup 0) - loss(dup d)
        assert e["p_value"] == pytest.approx(brute_p(c, t)) and e["p_method"] == "exact randomization"
        if exp == "a":
            assert (e["effect_ci_low"], e["effect_ci_high"]) == pytest.approx(welch(c, t))
            assert e["effect_ci_method"] == "Welch t"
        else:  # one control: no interval, the exact test still
            assert math.isnan(e["effect_ci_low"]) and e["effect_ci_method"] == "none (n < 2)"
    check_family(res.effects)
    assert sum(e["primary"] for e in res.effects) == 2  # one trend per experiment
    gap = pairs[("a", 5)]
    m = res.metrics
    assert m["a/loss_gap_max_vs_0"] == pytest.approx(np.mean(loss[("a", 0)]) - np.mean(loss[("a", 5)]))
    key = "a/loss_gap_max_vs_0"
    assert [m[f"{key}_{x}"] for x in ("ci_low", "ci_high", "p_value", "p_adjusted")] == [
        gap["effect_ci_low"], gap["effect_ci_high"], gap["p_value"], gap["p_adjusted"]]
    ys = [-v for d in (0, 2, 5) for v in loss[("a", d)]]  # the drop in loss per unit of log(1 + dup)
    fit = sps.linregress(np.log1p([d for d in (0, 2, 5) for _ in loss[("a", d)]]), ys)
    half = sps.t.ppf(0.975, len(ys) - 2) * fit.stderr
    assert m["a/trend_slope"] == pytest.approx(fit.slope)
    assert (m["a/trend_slope_ci_low"], m["a/trend_slope_ci_high"]) == pytest.approx(
        (fit.slope - half, fit.slope + half))
    assert 0 < m["a/trend_slope_p_value"] <= 1


def test_bh_and_none_adjustments_follow_the_context():
    rng = np.random.default_rng(4)
    plan = make_plan([(random_item(rng, 8), d, 0) for d in (0, 0, 0, 1, 1, 1, 4, 4, 4)])
    model = tiny_model(2)
    raw = run_eval(EVALS["insertion_loss"].config(), ctx_for(model, plan, p_adjust="none")).effects
    bh = run_eval(EVALS["insertion_loss"].config(), ctx_for(model, plan, p_adjust="bh")).effects
    pairs = [e for e in raw if e["contrast"] != "trend"]
    assert all(e["p_adjusted"] == e["p_value"] for e in pairs)
    want = sps.false_discovery_control([e["p_value"] for e in pairs], method="bh")
    assert [e["p_adjusted"] for e in bh if e["contrast"] != "trend"] == pytest.approx(want)


# ------------------------------------------------------------ memorization

def test_memorization_rate_interval_and_effects(trained):
    model, plan = trained
    res = run_eval(EVALS["memorization"].config(prefix_length=4, suffix_length=16), ctx_for(model, plan))
    rows = {d: [r for r in res.rows if r["dup_count"] == d] for d in (0, 4)}
    for g in res.per_dup:
        k = sum(r["exact_match"] for r in rows[g["dup_count"]])
        assert (g["exact_match_rate"], g["ci_low"], g["ci_high"], g["ci_method"]) == pytest.approx(
            wilson_interval(k, 4)) and g["small_n"]
        assert g["fraction_matched_ci_method"] in ("t", "none (all values equal)")
    by = {(e["metric"], e["contrast"]): e for e in res.effects}
    em, fm = by[("exact_match", "dup 4 vs 0")], by[("fraction_matched", "dup 4 vs 0")]
    k4, k0 = (sum(r["exact_match"] for r in rows[d]) for d in (4, 0))
    assert (em["effect"], em["effect_ci_low"], em["effect_ci_high"], em["effect_ci_method"]) == pytest.approx(
        newcombe_interval(k4, 4, k0, 4))
    for e, key in ((em, "exact_match"), (fm, "fraction_matched")):
        assert e["p_value"] == pytest.approx(brute_p([r[key] for r in rows[4]], [r[key] for r in rows[0]]))
    assert fm["p_value"] == pytest.approx(2 / 70)  # 4 of 4 reproduced, the controls far less: the most extreme split
    # the primary trend; the exact-match trend over controls and one dup count would repeat the pairwise test
    assert by[("fraction_matched", "trend")]["primary"] and ("exact_match", "trend") not in by
    check_family(res.effects)


# ------------------------------------------------------------ MIA

def test_mia_perfect_separation_has_an_interval_and_an_exact_test(trained):
    model, plan = trained
    res = run_eval(MiaConf(), ctx_for(model, plan))
    loss = next(g for g in res.per_dup if g["score"] == "loss")
    assert loss["auc"] == 1.0 and loss["ci_high"] == 1.0 and 0.5 < loss["ci_low"] < 0.9  # not [1, 1]
    assert loss["ci_method"] == "Newcombe score" and loss["small_n"] and loss["n_items"] == 4
    members = {s: [r[s] for r in res.rows if r["dup_count"] == 4] for s in ("loss", "zlib", "min_k")}
    controls = {s: [r[s] for r in res.rows if r["dup_count"] == 0] for s in ("loss", "zlib", "min_k")}

    def auc(a, b):
        return float(np.mean([(x > y) + 0.5 * (x == y) for x in a for y in b])) - 0.5

    for e in res.effects:
        assert e["null"] == 0.5 and e["p_method"] == "exact randomization"
        assert e["p_value"] == pytest.approx(brute_p(members[e["score"]], controls[e["score"]], auc))
    assert next(e for e in res.effects if e["score"] == "loss")["p_value"] == pytest.approx(2 / 70)
    check_family(res.effects)  # over dup counts x scores: every AUC uses the same controls
    assert [g["p_adjusted"] for g in res.per_dup] == [e["p_adjusted"] for e in res.effects]


def test_auc_test_with_a_single_member_and_monte_carlo():
    p, method = auc_randomization_test([3.0], [1.0, 2.0, 4.0, 0.5], 999, 0)
    assert (p, method) == (pytest.approx(brute_p([3.0], [1.0, 2.0, 4.0, 0.5], lambda a, b: np.mean(
        [(x > y) + 0.5 * (x == y) for x in a for y in b]))), "exact randomization")
    rng = np.random.default_rng(0)
    p, method = auc_randomization_test(rng.normal(1, 1, 30), rng.normal(0, 1, 30), 999, 0)
    assert method == "randomization (999)" and 0.001 <= p < 0.05
    assert exact_randomization_test([1.0], [2.0, 3.0, 4.0]) == (pytest.approx(0.5), "exact randomization")


# ------------------------------------------------------------ knowledge

def knowledge_rows():
    """One memorization probe per fact (identical mode) and two generalization probes; dup 16 has one fact."""
    rng = np.random.default_rng(5)
    rows, fact = [], 0
    for dup, n_facts, shift in ((0, 4, 0.0), (4, 4, 3.0), (16, 1, 6.0)):
        for _ in range(n_facts):
            for kind, n_probes in (("memorization", 1), ("generalization", 2)):
                for _ in range(n_probes):
                    v = float(rng.normal(-8 + shift, 1.0))
                    rows.append({"experiment": "k", "repeat": "identical", "fact": fact, "dup_count": dup,
                                 "probe": kind, "logp_sum": v, "logp_mean": v / 3, "greedy_match": v > -6})
            fact += 1
    return rows


def test_knowledge_effects_wilson_and_holm():
    rows = knowledge_rows()
    per_dup, metrics, effects = knowledge_summary(rows, permutations=999, seed=0, p_adjust="holm")
    g = {(r["dup_count"], r["probe"]): r for r in per_dup}
    assert g[(4, "memorization")]["greedy_acc_ci_method"] == "Wilson"  # one probe per fact: 0/1 values
    assert g[(4, "generalization")]["greedy_acc_ci_method"] in ("t", "none (all values equal)")
    assert g[(16, "memorization")]["ci_method"] == "none (n < 2)" and math.isnan(g[(16, "memorization")]["ci_low"])
    assert all(r["small_n"] and r["n_items"] == r["n_facts"] for r in per_dup)
    facts = {}
    for r in rows:
        facts.setdefault((r["probe"], r["dup_count"], r["fact"]), []).append(r)
    for e in effects:
        if e["contrast"] == "trend":
            continue
        v = e["metric"]

        def fact_values(dup, v=v, e=e):
            return [np.mean([r["greedy_match"] if v == "greedy_acc" else r[v] for r in rs])
                    for (kind, d, _), rs in facts.items() if kind == e["probe"] and d == dup]

        t, c = fact_values(e["dup_count"]), fact_values(0)
        assert e["effect"] == pytest.approx(np.mean(t) - np.mean(c))
        assert e["p_value"] == pytest.approx(brute_p(t, c))
        key = f"k/dup{e['dup_count']}/{e['probe']}/{v}_effect"
        assert (metrics[key], metrics[f"{key}_p_value"], metrics[f"{key}_p_adjusted"]) == (
            e["effect"], e["p_value"], e["p_adjusted"])
        if v == "greedy_acc" and e["probe"] == "memorization":
            assert e["effect_ci_method"] == "Newcombe"
    check_family(effects)
    primary = [e for e in effects if e["primary"]]
    assert [(e["metric"], e["probe"]) for e in primary] == [("logp_mean", "memorization")]


# ------------------------------------------------------------ benchmark contamination

def test_benchmark_per_dup_effects_pooled_effect_and_ceiling():
    acc = {0: [1, 0, 0, 1, 0, 0], 2: [1, 1, 1, 1], 8: [1, 1, 0, 1]}
    norm = {0: [0, 0, 1, 1, 0, 0], 2: [1, 1, 0, 1], 8: [1, 1, 1, 1]}
    rows = [{"item_id": i, "experiment": "arc", "dup_count": d, "acc": float(a), "acc_norm": float(n)}
            for i, (d, a, n) in enumerate((d, a, n) for d in acc for a, n in zip(acc[d], norm[d]))]
    per_dup, metrics, effects = benchmark_summary(rows, "arc", ctx_for(None, None))
    by = {g["dup_count"]: g for g in per_dup}
    # at every item correct the Wilson interval is [0.51, 1], not [1, 1]; acc_norm has its own interval
    assert by[2]["acc"] == 1.0 and by[2]["ci_high"] == 1.0 and by[2]["ci_low"] == pytest.approx(0.5101, abs=1e-4)
    assert by[2]["ci_method"] == by[2]["acc_norm_ci_method"] == "Wilson" and by[2]["small_n"]
    assert (by[8]["acc_norm_ci_low"], by[8]["acc_norm_ci_high"]) == pytest.approx(wilson_interval(4, 4)[1:3])
    e = {(r["metric"], r["contrast"]): r for r in effects}
    for m, values in (("acc", acc), ("acc_norm", norm)):
        for d in (2, 8):
            row = e[(m, f"dup {d} vs 0")]
            assert (row["effect"], row["effect_ci_low"], row["effect_ci_high"]) == pytest.approx(
                newcombe_interval(sum(values[d]), len(values[d]), sum(values[0]), len(values[0]))[:3])
            assert row["p_value"] == pytest.approx(brute_p(values[d], values[0]))
            assert metrics[f"arc/dup{d}/{m}_effect_p_adjusted"] == row["p_adjusted"]
        pooled = e[(m, "dup > 0 vs 0")]
        inserted = values[2] + values[8]
        assert pooled["effect"] == metrics[f"arc/contamination_effect_{m}"] == pytest.approx(
            np.mean(inserted) - np.mean(values[0]))
        assert pooled["p_value"] == pytest.approx(brute_p(inserted, values[0]))
        assert metrics[f"arc/contamination_effect_{m}_ci_low"] == pooled["effect_ci_low"]
        assert metrics[f"arc/contamination_effect_{m}_p_value"] == pooled["p_value"]
    check_family(effects)
    assert [r["metric"] for r in effects if r["primary"]] == ["acc"]
    assert len([r for r in effects if not r["primary"]]) == 7  # 2 x (2 dup counts + pooled) + acc_norm's trend
    # one inserted dup count: the pooled effect is that dup count's, not a second test of the family
    rows8 = [r for r in rows if r["dup_count"] != 2]
    per_dup, metrics, effects = benchmark_summary(rows8, "arc", ctx_for(None, None))
    want = {("acc", "dup 8 vs 0"), ("acc_norm", "dup 8 vs 0"), ("acc", "trend")}
    assert {(e["metric"], e["contrast"]) for e in effects} == want
    e8 = next(e for e in effects if e["metric"] == "acc" and e["contrast"] == "dup 8 vs 0")
    check_family(effects)
    assert metrics["arc/contamination_effect_acc_p_adjusted"] == e8["p_adjusted"]
    assert metrics["arc/contamination_effect_acc"] == metrics["arc/dup8/acc_effect"] == pytest.approx(0.75 - 1 / 3)

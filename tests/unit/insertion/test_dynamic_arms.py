"""Closed-loop insertion as a randomized two-arm design: the controls are a seeded random draw of the static dup-0
items (required unless allowed on purpose, never inserted), the report compares every target with every control
(intent to treat: Welch interval, exact randomization p), counts memorization only when the next eval confirms it,
keeps the items already below the threshold at the start apart from the controls, and flags the per-dup groups as
chosen by the policy."""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console

from pretrain_exp.core import stats
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.insertion import dynamic
from pretrain_exp.insertion.items import assign_dup_counts, experiment_rng
from pretrain_exp.insertion.plan import Plan
from pretrain_exp.insertion.types.texts import TextsConf
from pretrain_exp.report.summary import print_dynamic_table

L, B, STEPS, ITEM_LEN = 16, 4, 12, 5


class _Task:
    type = "insertion_loss"


def _plan(dups, experiment=None) -> Plan:
    """One token item of ``ITEM_LEN`` tokens per entry of ``dups`` (its static dup count), copies at the starts of
    consecutive rows from step 2 on (so a step-0 eval precedes every copy); ``experiment``: per-item 0/1 (``a``/``b``),
    default all ``a``."""
    dups = np.asarray(dups, np.int64)
    n = dups.size
    toks = np.random.default_rng(0).integers(1, 100, size=n * ITEM_LEN).astype(np.uint16)
    items = np.repeat(np.arange(n), dups)
    pos = (B + np.arange(items.size)) * L  # row B + k: step 2 onwards, one copy per row
    assert pos.max(initial=0) < STEPS * B * L
    dix = np.concatenate([np.arange(d) for d in dups]).astype(np.int32) if items.size else np.zeros(0, np.int32)
    exp = np.zeros(n, np.int32) if experiment is None else np.asarray(experiment, np.int32)
    return Plan(L, B, (0, STEPS * B * L), ["a", "b"], np.arange(n + 1, dtype=np.int64) * ITEM_LEN, toks, exp,
                dups.astype(np.int32), pos, items.astype(np.int32), dix)


def _texts(repetitions=(0, 1)) -> TextsConf:
    return TextsConf(file="x.jsonl", repetitions=list(repetitions))


def _conf(experiments=None, **kw) -> dynamic.DynamicConf:
    exps = experiments or {"a": _texts(), "b": _texts()}
    return dynamic.parse_dynamic({"policy": "until_memorized", **kw}, exps, {"loss": _Task()})


def test_controls_are_a_seeded_uniform_draw_of_the_static_dup0_items_not_the_last_ones():
    dups = assign_dup_counts(40, [0, 1], experiment_rng(0, "a"), "repetitions")  # 20 at dup 0, dealt at random
    plan = _plan(dups)
    dup0 = np.flatnonzero(dups == 0)
    conf = _conf(experiments={"a": _texts()}, controls=5)
    arms = dynamic.assign_arms(plan, conf, seed=0)
    assert np.isin(arms.controls, dup0).all() and len(arms.controls) == 5
    assert sorted(arms.targets.tolist() + arms.controls.tolist()) == list(range(40))
    assert arms.controls.tolist() != dup0[-5:].tolist() and arms.controls.tolist() != list(range(35, 40))
    again = dynamic.assign_arms(plan, conf, seed=0)
    assert again.controls.tolist() == arms.controls.tolist()  # reproducible per seed
    draws = [dynamic.assign_arms(plan, conf, seed=s).controls for s in range(400)]
    assert len({tuple(d) for d in draws}) > 350  # the seed draws anew
    hits = np.bincount(np.concatenate(draws), minlength=40)
    assert hits[dups > 0].sum() == 0
    assert hits[dup0].min() > 60 and hits[dup0].max() < 140  # uniform over the 20 dup-0 items: 100 each expected
    default = dynamic.assign_arms(plan, _conf(experiments={"a": _texts()}), seed=0)
    assert len(default.controls) == 10 and np.isin(default.controls, dup0).all()  # default: half of them


def test_controls_are_required_unless_allowed_on_purpose():
    assert _conf().controls is None  # the default draws controls
    with pytest.raises(ConfigError, match="allow_no_controls=true") as e:
        _conf(controls=0)
    assert e.value.key == "insertion.dynamic.controls"
    conf = _conf(controls=0, allow_no_controls=True)
    arms = dynamic.assign_arms(_plan([0, 0, 1, 1]), conf, seed=0)
    assert arms.controls.size == 0 and arms.targets.tolist() == [0, 1, 2, 3]


def test_controls_have_static_dup_0_and_an_experiment_without_enough_dup0_items_is_refused():
    every_item_a_copy = {"a": _texts([1, 4])}
    with pytest.raises(ConfigError, match="repetitions") as e:  # seen in the config already
        _conf(experiments=every_item_a_copy)
    assert e.value.key == "insertion.dynamic.controls" and "allow_no_controls" in str(e.value)
    _conf(experiments={"a": _texts([0, 4])})
    _conf(experiments={"a": _texts([1, 4])}, controls=0, allow_no_controls=True)
    plan = _plan([0, 1, 0, 4, 1, 1])
    with pytest.raises(ConfigError, match="2 item") as e:  # on the plan: 3 asked, 2 at static dup 0
        dynamic.assign_arms(plan, _conf(controls=3), seed=0)
    assert e.value.key == "insertion.dynamic.controls"
    with pytest.raises(ConfigError, match="allow_no_controls"):
        dynamic.assign_arms(_plan([1, 4, 1]), _conf(), seed=0)
    conf = _conf(controls=2, threshold=1.0)
    arms = dynamic.assign_arms(plan, conf, seed=3)
    assert arms.controls.tolist() == [0, 2]
    rec = dynamic.decide(plan, conf, 0, 4, {0: {i: 9.0 for i in range(6)}}, 3, arms)
    assert rec["items"] == [1, 3, 4, 5] and rec["controls"] == [0, 2]  # every loss is high: only targets inserted
    assert dynamic.apply_additions(plan, rec).item_dup_count[[0, 2]].tolist() == [0, 0]


def _run(threshold=2.0):
    """A closed loop on given losses: 9 items at static dup 0, 3 controls (seeded draw), two decisions (steps 0
    and 4), evals at 0, 4 and 8."""
    plan = static = _plan([0] * 9)
    conf = _conf(experiments={"a": _texts()}, controls=3, threshold=threshold)
    arms = dynamic.assign_arms(static, conf, seed=0)
    c = arms.controls.tolist()
    t = arms.targets.tolist()
    hist = {0: {i: 3.0 + 0.1 * i for i in range(9)}}
    hist[0][t[0]] = 1.5  # below the threshold before any copy: never inserted
    recs = []
    for a, b in ((0, 4), (4, 8)):
        recs.append(dynamic.decide(plan, conf, a, b, hist, 0, arms))
        plan = dynamic.apply_additions(plan, recs[-1])
        if a == 0:
            hist[4] = {i: (1.8 if i in t else 2.9) + 0.01 * i for i in range(9)}
            hist[4][t[1]] = 2.5
    hist[8] = {i: (1.0 if i in t else 2.5) + 0.01 * i for i in range(9)}
    hist[8][t[2]] = 2.2  # below at step 4, back above at 8
    return plan, conf, arms, hist, recs, t, c


def test_intent_to_treat_compares_every_target_with_every_control_with_an_interval_and_exact_p():
    plan, conf, arms, hist, recs, t, c = _run()
    rows = dynamic.report(plan, conf, hist, recs, arms)
    assert [r["arm"] for r in rows] == ["target"] * 6 + ["control"] * 3
    out = dynamic.summary(plan, conf, hist, rows, seed=0)
    itt = {r["measure"]: r for r in out["itt"]}
    main = itt["final loss"]
    tl, cl = np.array([hist[8][i] for i in t]), np.array([hist[8][i] for i in c])
    assert main["primary"] and main["step"] == 8 and (main["n_treated"], main["n_control"]) == (6, 3)
    assert main["effect"] == pytest.approx(cl.mean() - tl.mean()) and main["effect"] > 0  # targets' loss lower
    welch = stats.welch_interval(cl, tl)
    assert (main["effect_ci_low"], main["effect_ci_high"]) == pytest.approx(welch[1:3])
    assert main["effect_ci_low"] > 0 and main["effect_ci_method"] == welch[3]
    # every control's final loss is above every target's: the most extreme of the C(9, 3) = 84 draws
    assert main["p_value"] == pytest.approx(2 / 84) and "exact" in main["p_method"]
    did = itt["loss change since step 0"]  # step 0 precedes every copy: a pre/post contrast too
    d_t = np.array([hist[8][i] - hist[0][i] for i in t])
    d_c = np.array([hist[8][i] - hist[0][i] for i in c])
    assert not did["primary"] and did["effect"] == pytest.approx(d_c.mean() - d_t.mean())
    assert did["p_adjust_method"] == "holm" and 0 < did["p_value"] <= 1
    arms_rows = {r["arm"]: r for r in out["arms"]}
    assert arms_rows["targets"]["randomized"] and arms_rows["controls"]["randomized"]
    assert arms_rows["targets"]["n_items"] == 6 and arms_rows["controls"]["mean"] == pytest.approx(cl.mean())
    assert arms_rows["targets"]["ci_method"] == "t" and arms_rows["controls"]["small_n"]


def test_items_below_the_threshold_at_the_first_decision_are_their_own_arm_not_controls():
    plan, conf, arms, hist, recs, t, c = _run()
    assert t[0] not in recs[0]["items"] and t[0] not in recs[0]["controls"]
    out = dynamic.summary(plan, conf, hist, dynamic.report(plan, conf, hist, recs, arms))
    arms_rows = {r["arm"]: r for r in out["arms"]}
    below = arms_rows["below threshold at start"]
    assert not below["randomized"] and below["n_items"] == 1 and below["mean"] == pytest.approx(hist[8][t[0]])
    assert arms_rows["controls"]["n_items"] == 3  # not pooled with the controls
    assert arms_rows["inserted by the policy"]["n_items"] == 5 and not arms_rows["inserted by the policy"]["randomized"]


def test_memorized_counts_only_when_the_next_eval_confirms_it():
    plan, conf, arms, hist, recs, t, c = _run()
    rows = {r["item_id"]: r for r in dynamic.report(plan, conf, hist, recs, arms)}
    assert (rows[t[2]]["memorized_at_step"], rows[t[2]]["confirmed"], rows[t[2]]["dups_needed"]) == (4, False, None)
    assert not rows[t[2]]["below_threshold_at_end"]  # fell back above
    assert (rows[t[3]]["memorized_at_step"], rows[t[3]]["confirmed"], rows[t[3]]["dups_needed"]) == (4, True, 1)
    assert (rows[t[1]]["memorized_at_step"], rows[t[1]]["confirmed"], rows[t[1]]["dups_needed"]) == (8, None, None)
    assert rows[t[1]]["dynamic_dups"] == 2
    out = dynamic.summary(plan, conf, hist, list(rows.values()))
    tg = next(r for r in out["arms"] if r["arm"] == "targets")
    assert (tg["crossed"], tg["confirmed"], tg["fell_back"], tg["unconfirmed"], tg["below_at_end"]) == (6, 4, 1, 1, 5)


def test_the_report_flags_realized_dup_groups_as_not_randomized_and_prints_the_arms():
    plan, conf, arms, hist, recs, t, c = _run()
    out = dynamic.summary(plan, conf, hist, dynamic.report(plan, conf, hist, recs, arms))
    assert out["realized_dup_groups_randomized"] is False
    console = Console(record=True, width=200)
    print_dynamic_table(out, console)
    text = console.export_text()
    assert "not randomized" in text and "intent to treat" in text and "regresses to the mean" in text
    assert "below threshold at start" in text and "no (policy)" in text
    assert "final loss (primary)" in text and "6 vs 3" in text and "0.024" in text  # the exact p, 2/84
    assert "Welch t" in text and "95% CI (t)" in text


def test_one_control_still_gets_an_exact_randomization_p():
    """An experiment with one static dup-0 item has one control (the default: half, rounded up); its exact test
    enumerates which of the n items is the control."""
    plan = _plan([0, 1, 1, 4, 4])
    conf = _conf(experiments={"a": _texts()})
    arms = dynamic.assign_arms(plan, conf, seed=0)
    assert arms.controls.tolist() == [0]
    hist = {0: {i: 5.0 for i in range(5)}, 8: {0: 4.0, 1: 3.0, 2: 3.5, 3: 2.0, 4: 3.9}}
    out = dynamic.summary(plan, conf, hist, dynamic.report(plan, conf, hist, [], arms))
    main = out["itt"][0]
    x = np.array([hist[8][i] for i in range(5)])
    null = np.array([x[k] - x[np.arange(5) != k].mean() for k in range(5)])  # control k: x[k] - mean(others)
    obs = null[0]
    want = 2 * min(np.mean(null <= obs), np.mean(null >= obs))
    assert main["effect"] == pytest.approx(obs) and main["p_value"] == pytest.approx(min(1.0, want))
    assert main["p_method"] == "exact randomization" and main["n_control"] == 1

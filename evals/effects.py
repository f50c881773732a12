"""The effects an eval reports at one step, as one multiplicity family.

Every eval that scores insertion experiments returns, besides its per-dup summary rows, the dup-``d``-vs-dup-0
effects of its per-item values (:attr:`~pretrain_exp.evals.base.EvalResult.effects`): each with a difference
interval and a randomization p-value (:func:`pretrain_exp.core.stats.per_dup_effects`), adjusted together with
every other test of that eval at that step (Holm by default, ``eval.p_adjust``). One trend test per experiment
(the slope over ``log(1 + dup count)`` of the eval's declared primary value) is the primary endpoint and is not
adjusted; the trend tests of its other values are secondary and join the family.

An effect row has the keys of :func:`~pretrain_exp.core.stats.per_dup_effects` (``experiment, dup_count,
contrast, primary, effect, effect_ci_low, effect_ci_high, effect_ci_method, p_value, p_method, n_treated,
n_control, p_adjusted, p_adjust_method, family``) plus ``metric`` (the per-item value compared) and the eval's own
labels (``score`` for MIA, ``probe`` for knowledge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from pretrain_exp.core.stats import MAX_EXACT, adjust_rows, auc_interval, dup_contrasts, exact_randomization_test

PRIMARY_FAMILY = "primary endpoint"  #: the ``family`` of the unadjusted primary trend rows


@dataclass
class EffectSpec:
    """One per-item value of an eval whose dup-vs-0 effects join the eval's family.

    :param rows: per-item dicts with ``experiment``, ``dup_count`` and ``value_key``.
    :param value_key: the value compared (``loss``, ``exact_match``, ...); reported as ``metric`` unless given.
    :param proportion: 0/1 values: Newcombe interval instead of Welch.
    :param sign: ``-1`` reports ``mean(dup 0) - mean(dup d)`` (a loss, where a drop is the effect).
    :param primary: this value's trend test is the eval's primary endpoint (unadjusted).
    :param labels: extra keys copied into every row (``{"probe": "memorization"}``).
    """

    rows: Sequence[Dict[str, Any]]
    value_key: str
    proportion: bool = False
    sign: float = 1.0
    primary: bool = False
    metric: str = ""
    labels: Dict[str, Any] = field(default_factory=dict)


def family_effects(specs: Sequence[EffectSpec], ctx: Any, family: str) -> List[Dict[str, Any]]:
    """The effect rows of ``specs`` with their p-values adjusted as one family.

    :param ctx: the :class:`~pretrain_exp.evals.base.EvalContext` (``permutations``, ``seed``, ``p_adjust``).
    :param family: the family's name in every adjusted row (e.g. ``"insertion_loss"``).
    :returns: the contrast rows of every spec, then the trend rows; the primary spec's trend rows have
        ``primary: true``, ``p_adjusted == p_value`` and ``family: "primary endpoint"``; every other row is adjusted
        with ``ctx.p_adjust`` over all of them (Holm: family-wise error over the eval's tests at this step). A
        secondary trend over the controls and a single dup count is left out: it repeats that pairwise test.
    """
    pairs: List[Dict[str, Any]] = []
    trends: List[Dict[str, Any]] = []
    for s in specs:
        rows = dup_contrasts(s.rows, s.value_key, s.proportion, ctx.permutations, ctx.seed, s.sign)
        n_pairs = {e: sum(r["experiment"] == e and r["contrast"] != "trend" for r in rows)
                   for e in {r["experiment"] for r in rows}}
        for r in rows:
            r.update(metric=s.metric or s.value_key, **s.labels)
            if r["contrast"] != "trend":
                pairs.append(r)
            elif s.primary or n_pairs[r["experiment"]] >= 2:  # over controls + one dup count: the pairwise test
                r["primary"] = bool(s.primary)
                trends.append(r)
    secondary = pairs + [r for r in trends if not r["primary"]]
    adjust_rows(secondary, ctx.p_adjust, family)
    for r in trends:
        if r["primary"]:
            r.update(p_adjusted=r["p_value"], p_adjust_method="none", family=PRIMARY_FAMILY)
    return pairs + trends


def adjust_family(rows: List[Dict[str, Any]], ctx: Any, family: str) -> List[Dict[str, Any]]:
    """Adjust the non-primary rows of ``rows`` together (:func:`~pretrain_exp.core.stats.adjust_rows` with
    ``ctx.p_adjust``), e.g. after adding rows built by hand to those of :func:`family_effects`; returns ``rows``."""
    adjust_rows([r for r in rows if not r.get("primary")], ctx.p_adjust, family)
    return rows


def auc_randomization_test(members, nonmembers, permutations: int, seed: int) -> Tuple[float, str]:
    """Two-sided randomization test of ``H0: AUC = 0.5`` (member and non-member labels exchangeable, as the dup
    counts were dealt at random): the statistic ``|AUC - 0.5|`` over relabellings of the pooled scores
    (``scipy.stats.permutation_test``, ``independent``), exact over every relabelling when there are at most
    :data:`~pretrain_exp.core.stats.MAX_EXACT`, else ``permutations`` random ones (``PCG64(seed)``). This is the
    exact Mann-Whitney test (Mann & Whitney 1947): the AUC is the U statistic over ``n1 * n0``.

    A group of one item is enumerated by :func:`~pretrain_exp.core.stats.exact_randomization_test` on the
    ranks (the AUC is an increasing function of the members' mean rank, so the p-value is the same).

    :param members: scores, shape ``(n1,)``; :param nonmembers: shape ``(n0,)``; non-finite values dropped.
    :returns: ``(p, method)``, ``p`` in ``(0, 1]``; ``(nan, "none (no items)")`` for an empty group.
    """
    from scipy import stats

    m = np.asarray(members, dtype=np.float64).ravel()
    o = np.asarray(nonmembers, dtype=np.float64).ravel()
    m, o = m[np.isfinite(m)], o[np.isfinite(o)]
    if m.size == 0 or o.size == 0:
        return float("nan"), "none (no items)"
    n1, n0 = m.size, o.size

    def auc(a, b, axis=-1):
        ranks = stats.rankdata(np.concatenate([a, b], axis=axis), axis=axis)
        return (ranks[..., :n1].sum(axis=-1) - n1 * (n1 + 1) / 2.0) / (n1 * n0) - 0.5

    exact = math.comb(n1 + n0, n1) <= MAX_EXACT
    if min(n1, n0) < 2:  # scipy needs two per group; the AUC is increasing in the members' mean rank
        ranks = stats.rankdata(np.concatenate([m, o]))
        return exact_randomization_test(ranks[:n1], ranks[n1:])
    res = stats.permutation_test((m, o), auc, permutation_type="independent", vectorized=True,
                                 alternative="two-sided", n_resamples=MAX_EXACT if exact else permutations,
                                 random_state=np.random.Generator(np.random.PCG64(seed)))
    return float(min(1.0, res.pvalue)), "exact randomization" if exact else f"randomization ({permutations:,})"


def auc_effect(members, nonmembers, permutations: int, seed: int) -> Dict[str, Any]:
    """One AUC row: ``{effect (the AUC), effect_ci_low, effect_ci_high, effect_ci_method, null: 0.5, p_value,
    p_method, n_treated, n_control}`` (:func:`~pretrain_exp.core.stats.auc_interval`,
    :func:`auc_randomization_test`)."""
    auc, low, high, method = auc_interval(members, nonmembers)
    p, p_method = auc_randomization_test(members, nonmembers, permutations, seed)
    return {"effect": auc, "effect_ci_low": low, "effect_ci_high": high, "effect_ci_method": method, "null": 0.5,
            "p_value": p, "p_method": p_method, "n_treated": int(np.size(members)),
            "n_control": int(np.size(nonmembers))}

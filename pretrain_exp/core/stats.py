"""Statistics shared by the evals and reports: confidence intervals calibrated at the group sizes runs use,
exact randomization tests of every effect, multiplicity adjustment, intervals over seeds, and the equivalence
test and sign-flip test of CPDT (:mod:`pretrain_exp.report.cpdt`).

Which interval for what (every row names its method in ``ci_method`` / ``effect_ci_method``):

========================================  ==============================================================
statistic                                 interval
========================================  ==============================================================
mean of a group (loss, log-prob, score)   Student t over items (:func:`t_interval`)
difference of two group means             Welch t (:func:`welch_interval`)
proportion (exact match, accuracy)        Wilson score (:func:`wilson_interval`)
difference of two proportions             Newcombe hybrid score (:func:`newcombe_interval`)
ROC AUC (membership inference)            Newcombe score, method 5 (:func:`auc_interval`)
slope over log(1 + dup count)             OLS t (:func:`trend_test`)
mean over seeds of per-seed effects       Student t over seeds, ``S >= 3`` (:func:`seed_interval`)
========================================  ==============================================================

The percentile bootstrap these replace covers 48-87% at 2-8 items per group (a nominal 95% interval);
``tests/unit/core/test_calibration.py`` holds every interval above to 0.92-0.98 at 4, 8 and 16 items for normal
data (the t interval of a mean to at least 0.90 for skewed, gamma(2), data).
No interval is given for fewer than 2 values, or where every value is equal (``nan``, shown as "n/a"),
and a group of fewer than :data:`MIN_ITEMS_PER_GROUP` items is flagged ``small_n``.

Dup counts are dealt to an experiment's items by a seeded random permutation, so the test of an effect is a
randomization test (Fisher 1935; :func:`randomization_test`): exact over every relabelling when there are at
most :data:`MAX_EXACT` of them, else Monte Carlo. p-values of one family are adjusted with :func:`adjust`
(Holm 1979 or Benjamini & Hochberg 1995).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

_CHUNK_ELEMENTS = 1 << 22  #: resampled indices drawn at once (bounds memory to ~32 MiB of int64)

LEVEL = 0.95  #: confidence level of every printed interval
#: fewer items than this in a group and its row carries ``small_n: true`` (and tables mark it); 8 per group gives
#: a two-sided exact randomization p down to 2 / C(16, 8) = 1.6e-4 (4 per group: 0.029)
MIN_ITEMS_PER_GROUP = 8
#: a randomization test enumerates every relabelling when there are at most this many, else draws
#: ``permutations`` of them at random
MAX_EXACT = 100_000
PERMUTATIONS = 9_999  #: Monte-Carlo relabellings of a randomization test that is not exact
ADJUST_METHODS = ("holm", "bh", "none")  #: multiplicity adjustments :func:`adjust` knows

NAN = float("nan")


def _finite(values) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).ravel()
    return v[np.isfinite(v)]


def t_interval(values, level: float = LEVEL) -> Tuple[float, float, float, str]:
    """Mean of ``values`` and its Student t confidence interval, ``mean -+ t_{n-1} * sd / sqrt(n)``
    (``scipy.stats.t``; sd with ``ddof=1``).

    :param values: per-item values, shape ``(n,)``, any real dtype; non-finite values are dropped.
    :returns: ``(mean, low, high, method)``; ``low = high = nan`` for ``n < 2`` or when every value is equal
        (no spread to estimate), with ``method`` saying why; ``mean = nan`` for ``n == 0``.
    """
    from scipy import stats

    v = _finite(values)
    if v.size == 0:
        return NAN, NAN, NAN, "none (no items)"
    mean = float(v.mean())
    if v.size < 2:
        return mean, NAN, NAN, "none (n < 2)"
    sd = float(v.std(ddof=1))
    if sd == 0.0:
        return mean, NAN, NAN, "none (all values equal)"
    half = float(stats.t.ppf(0.5 + level / 2, v.size - 1)) * sd / math.sqrt(v.size)
    return mean, mean - half, mean + half, "t"


def welch_interval(treated, control, level: float = LEVEL) -> Tuple[float, float, float, str]:
    """``mean(treated) - mean(control)`` and its Welch t interval (unequal variances, Welch-Satterthwaite
    degrees of freedom; Welch 1947, Biometrika 34).

    :param treated: shape ``(n_t,)``; :param control: shape ``(n_c,)``; non-finite values are dropped.
    :returns: ``(difference, low, high, method)``; no interval (``nan``) with fewer than 2 items in a group or
        no spread in either; ``difference = nan`` for an empty group.
    """
    from scipy import stats

    t, c = _finite(treated), _finite(control)
    if t.size == 0 or c.size == 0:
        return NAN, NAN, NAN, "none (no items)"
    diff = float(t.mean() - c.mean())
    if t.size < 2 or c.size < 2:
        return diff, NAN, NAN, "none (n < 2)"
    vt, vc = t.var(ddof=1) / t.size, c.var(ddof=1) / c.size
    se = math.sqrt(vt + vc)
    if se == 0.0:
        return diff, NAN, NAN, "none (all values equal)"
    df = (vt + vc) ** 2 / (vt ** 2 / (t.size - 1) + vc ** 2 / (c.size - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return diff, diff - half, diff + half, "Welch t"


def wilson_interval(successes: int, n: int, level: float = LEVEL) -> Tuple[float, float, float, str]:
    """Proportion ``successes / n`` and its Wilson score interval (Wilson 1927, JASA 22;
    ``scipy.stats.binomtest(...).proportion_ci(method="wilson")``). Defined at 0 and ``n`` successes too.

    :returns: ``(proportion, low, high, method)``; all ``nan`` for ``n == 0``.
    """
    from scipy import stats

    if n <= 0:
        return NAN, NAN, NAN, "none (no items)"
    ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return successes / n, float(ci.low), float(ci.high), "Wilson"


def newcombe_interval(k_treated: int, n_treated: int, k_control: int, n_control: int,
                      level: float = LEVEL) -> Tuple[float, float, float, str]:
    """Difference of two proportions ``k_t / n_t - k_c / n_c`` and its Newcombe hybrid score interval, built
    from the two Wilson intervals (Newcombe 1998, Stat. Med. 17, "Interval estimation for the difference between
    independent proportions", method 10).

    :returns: ``(difference, low, high, method)``; all ``nan`` if a group is empty.
    """
    p1, l1, u1, _ = wilson_interval(k_treated, n_treated, level)
    p2, l2, u2, _ = wilson_interval(k_control, n_control, level)
    if n_treated <= 0 or n_control <= 0:
        return NAN, NAN, NAN, "none (no items)"
    d = p1 - p2
    return (d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2),
            "Newcombe")


def interval(values, proportion: bool = False, level: float = LEVEL) -> Dict[str, Any]:
    """A group's summary row: ``{n_items, mean, ci_low, ci_high, ci_method, small_n}`` (:func:`t_interval`, or
    :func:`wilson_interval` when ``proportion`` and the values are 0/1)."""
    v = _finite(values)
    if proportion:
        mean, low, high, method = wilson_interval(int(round(v.sum())), v.size, level)
    else:
        mean, low, high, method = t_interval(v, level)
    return {"n_items": int(v.size), "mean": mean, "ci_low": low, "ci_high": high, "ci_method": method,
            "small_n": bool(v.size < MIN_ITEMS_PER_GROUP)}


def randomization_test(treated, control, permutations: int = PERMUTATIONS, seed: int = 0) -> Tuple[float, str]:
    """Two-sided randomization test of ``H0: the group labels do not matter`` with the statistic
    ``mean(treated) - mean(control)`` (Fisher 1935; ``scipy.stats.permutation_test``, ``independent``).

    Valid by design where the labels were dealt at random (dup counts are a seeded permutation of an
    experiment's items). With at most :data:`MAX_EXACT` distinct relabellings every one is enumerated and the p is
    exact (its smallest value is ``2 / C(n_t + n_c, n_t)``: 0.029 at 4 vs 4); otherwise ``permutations`` random
    ones give ``p = (1 + #extreme) / (1 + permutations)`` (Phipson & Smyth 2010).

    :returns: ``(p, method)``, ``p`` in ``(0, 1]``; ``(nan, "none ...")`` for an empty group.
    """
    from scipy import stats

    t, c = _finite(treated), _finite(control)
    if t.size == 0 or c.size == 0:
        return NAN, "none (no items)"
    if min(t.size, c.size) == 1:  # scipy's permutation_test needs 2 items per group
        return exact_randomization_test(t, c)
    exact = math.comb(t.size + c.size, t.size) <= MAX_EXACT
    res = stats.permutation_test((t, c), lambda a, b, axis: a.mean(axis=axis) - b.mean(axis=axis),
                                 permutation_type="independent", vectorized=True, alternative="two-sided",
                                 n_resamples=MAX_EXACT if exact else permutations,
                                 random_state=np.random.Generator(np.random.PCG64(seed)))
    return float(min(1.0, res.pvalue)), "exact randomization" if exact else f"randomization ({permutations:,})"


def exact_randomization_test(treated, control) -> Tuple[float, str]:
    """The exact two-sided randomization test of :func:`randomization_test` by enumerating every split of the pooled
    values into groups of the two sizes (for a group of one item, which ``scipy.stats.permutation_test`` does not
    take): ``p = min(1, 2 min(P(T* >= T), P(T* <= T)))`` over the splits, ``T = mean(treated) - mean(control)``
    (scipy's two-sided convention; ties within ``1e-12`` relative count as extreme).

    :returns: ``(p, "exact randomization")``; ``(nan, "none (no items)")`` for an empty group.
    :raises ValueError: for more than :data:`MAX_EXACT` splits.
    """
    import itertools

    t, c = _finite(treated), _finite(control)
    if t.size == 0 or c.size == 0:
        return NAN, "none (no items)"
    x, n = np.concatenate([t, c]), t.size
    if math.comb(x.size, n) > MAX_EXACT:
        raise ValueError(f"{math.comb(x.size, n)} splits are more than MAX_EXACT = {MAX_EXACT}")
    sums = np.array([x[list(idx)].sum() for idx in itertools.combinations(range(x.size), n)])
    null = sums / n - (x.sum() - sums) / c.size
    obs = t.mean() - c.mean()
    tol = 1e-12 * max(1.0, abs(obs))
    return float(min(1.0, 2 * min(np.mean(null >= obs - tol), np.mean(null <= obs + tol)))), "exact randomization"


def effect(treated, control, proportion: bool = False, permutations: int = PERMUTATIONS, seed: int = 0,
           level: float = LEVEL) -> Dict[str, Any]:
    """One effect row: ``mean(treated) - mean(control)`` with its interval and randomization test:
    ``{effect, effect_ci_low, effect_ci_high, effect_ci_method, p_value, p_method, n_treated, n_control}``
    (:func:`welch_interval`, or :func:`newcombe_interval` for 0/1 ``proportion`` values;
    :func:`randomization_test`)."""
    t, c = _finite(treated), _finite(control)
    if proportion:
        d, low, high, method = newcombe_interval(int(round(t.sum())), t.size, int(round(c.sum())), c.size, level)
    else:
        d, low, high, method = welch_interval(t, c, level)
    p, p_method = randomization_test(t, c, permutations, seed)
    return {"effect": d, "effect_ci_low": low, "effect_ci_high": high, "effect_ci_method": method,
            "p_value": p, "p_method": p_method, "n_treated": int(t.size), "n_control": int(c.size)}


def trend_test(values, dup_counts, permutations: int = PERMUTATIONS, seed: int = 0,
               level: float = LEVEL) -> Dict[str, Any]:
    """The dose-response trend: the OLS slope of the per-item value on ``log(1 + dup count)`` over all of an
    experiment's items (controls included), with its t interval (``scipy.stats.linregress``, ``n - 2`` df) and a
    randomization p-value that permutes the dup counts over the items (``scipy.stats.permutation_test``,
    ``pairings``): one test per experiment instead of one per dup count, the primary endpoint of a run.

    :param values: per-item values, shape ``(n,)``; :param dup_counts: their dup counts, shape ``(n,)``, ``>= 0``.
    :returns: ``{slope, slope_ci_low, slope_ci_high, slope_ci_method, p_value, p_method, n_items}`` (``slope`` in
        the value's units per unit of ``log(1 + dup)``); ``nan`` where fewer than 3 items or one dup count;
        no p (``nan``, ``p_method`` ``"none"``) for ``permutations <= 0``.
    """
    from scipy import stats

    y = np.asarray(values, dtype=np.float64).ravel()
    x = np.log1p(np.asarray(dup_counts, dtype=np.float64).ravel())
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    out = {"slope": NAN, "slope_ci_low": NAN, "slope_ci_high": NAN, "slope_ci_method": "none (n < 3)",
           "p_value": NAN, "p_method": "none", "n_items": int(y.size)}
    if y.size < 3 or np.unique(x).size < 2:
        if y.size >= 3:
            out["slope_ci_method"] = "none (one dup count)"
        return out
    fit = stats.linregress(x, y)
    half = float(stats.t.ppf(0.5 + level / 2, y.size - 2)) * fit.stderr
    out.update(slope=float(fit.slope), slope_ci_low=float(fit.slope - half), slope_ci_high=float(fit.slope + half),
               slope_ci_method="OLS t")
    if permutations <= 0:  # the slope and its interval only
        return out
    xc = x - x.mean()
    res = stats.permutation_test((xc,), lambda a, axis: (a * (y - y.mean())).sum(axis=axis),
                                 permutation_type="pairings", vectorized=True, alternative="two-sided",
                                 n_resamples=permutations, random_state=np.random.Generator(np.random.PCG64(seed)))
    out.update(p_value=float(min(1.0, res.pvalue)), p_method=f"randomization ({permutations:,})")
    return out


def adjust(p_values: Sequence[float], method: str = "holm") -> List[float]:
    """p-values adjusted for multiplicity within one family: ``holm`` (Holm 1979, "A simple sequentially
    rejective multiple test procedure", Scand. J. Stat. 6; family-wise error), ``bh`` (Benjamini & Hochberg 1995,
    JRSS B 57; false discovery rate, ``scipy.stats.false_discovery_control``) or ``none``.

    :param p_values: the family's p-values; ``nan`` entries stay ``nan`` and do not count toward the family.
    :returns: adjusted p-values in the input order, each in ``[p, 1]``.
    :raises ValueError: for an unknown ``method``.
    """
    from scipy import stats

    if method not in ADJUST_METHODS:
        raise ValueError(f"unknown p-value adjustment {method!r}; known: {', '.join(ADJUST_METHODS)}")
    p = np.asarray(p_values, dtype=np.float64)
    out = p.copy()
    ok = np.flatnonzero(np.isfinite(p))
    if method == "none" or ok.size == 0:
        return out.tolist()
    if method == "bh":
        out[ok] = stats.false_discovery_control(p[ok], method="bh")
        return out.tolist()
    m = ok.size
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):  # step-down: max over the smaller p's of (m - rank) * p
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def adjust_rows(rows: List[Dict[str, Any]], method: str, family: str, key: str = "p_value") -> List[Dict[str, Any]]:
    """``rows`` with ``p_adjusted`` (:func:`adjust` over every row's ``key``), ``p_adjust_method`` and
    ``family`` (a short name of what the rows share, e.g. ``"insertion_loss: dup d vs 0"``) added; returns the
    same list."""
    for r, q in zip(rows, adjust([r.get(key, NAN) for r in rows], method)):
        r.update(p_adjusted=q, p_adjust_method=method, family=family)
    return rows


def seed_interval(effects, level: float = LEVEL) -> Dict[str, Any]:
    """An effect pooled over seeds: the mean of the per-seed effects and its t interval over seeds (``S - 1`` df;
    the seeds are the independent replicates, and each per-seed effect already holds its items' noise).

    :param effects: one effect per seed, shape ``(S,)``.
    :returns: ``{effect, ci_low, ci_high, ci_method, n_seeds, sd_seeds}``; for ``S <= 2`` no interval
        (``nan``) and ``ci_method`` ``"none (seed variance not identified, S <= 2)"``.
    """
    v = _finite(effects)
    out = {"effect": float(v.mean()) if v.size else NAN, "ci_low": NAN, "ci_high": NAN,
           "n_seeds": int(v.size), "sd_seeds": float(v.std(ddof=1)) if v.size > 1 else NAN}
    if v.size <= 2:
        out["ci_method"] = f"none (seed variance not identified, S = {v.size})"
        return out
    _, low, high, method = t_interval(v, level)
    out.update(ci_low=low, ci_high=high, ci_method=f"{method} over seeds" if method == "t" else method)
    return out


def tost(values, margin: float, alpha: float = 0.05) -> Dict[str, Any]:
    """Equivalence test of ``|mean| < margin`` over independent replicates (two one-sided t tests, Schuirmann
    1987, J. Pharmacokinet. Biopharm. 15): ``p = max(p(mean <= -margin), p(mean >= margin))``; equivalence is
    shown when ``p < alpha``, i.e. the ``1 - 2 alpha`` t interval lies inside ``(-margin, margin)``.

    :param values: one value per replicate (per-seed interactions), shape ``(S,)``; :param margin: ``> 0``, in
        the values' units, declared before the data are seen.
    :returns: ``{tost_p, equivalent, margin, ci90_low, ci90_high}`` (``ci90``: the ``1 - 2 alpha`` interval);
        ``nan`` / ``None`` with fewer than 2 values or no spread.
    :raises ValueError: for ``margin <= 0``.
    """
    from scipy import stats

    if not margin > 0:
        raise ValueError(f"an equivalence margin must be > 0, got {margin}")
    v = _finite(values)
    mean, low, high, _ = t_interval(v, 1 - 2 * alpha)
    out = {"tost_p": NAN, "equivalent": None, "margin": float(margin), "ci90_low": low, "ci90_high": high}
    if not low == low:
        return out
    se = float(v.std(ddof=1)) / math.sqrt(v.size)
    p_low = float(stats.t.sf((mean + margin) / se, v.size - 1))  # H0: mean <= -margin
    p_high = float(stats.t.cdf((mean - margin) / se, v.size - 1))  # H0: mean >= margin
    out.update(tost_p=max(p_low, p_high), equivalent=bool(max(p_low, p_high) < alpha))
    return out


def min_sign_flip_p(n: int) -> float:
    """The smallest p-value an exact two-sided sign-flip test over ``n`` values can give: ``2 / 2**n`` (so
    ``n >= 6`` values are needed to reach 0.05)."""
    return 2.0 / 2 ** n if n >= 1 else 1.0


def auc_interval(members, nonmembers, level: float = LEVEL) -> Tuple[float, float, float, str]:
    """ROC AUC of scores where higher = member (``P(member > non-member) + P(tie) / 2``, the Mann-Whitney U over
    ``n1 * n0``, average ranks) and its score interval: every ``theta`` with
    ``(AUC - theta)**2 <= z**2 V(theta)``, ``V`` the Hanley-McNeil variance evaluated at ``theta`` with both group
    sizes set to ``N = (n1 + n0) / 2`` (Newcombe 2006, Stat. Med. 25, "Confidence intervals for an effect size
    measure based on the Mann-Whitney statistic. Part 2", method 5; Hanley & McNeil 1982, Radiology 143). Like the
    Wilson interval of a proportion it stays inside ``[0, 1]`` and is not degenerate at a perfect separation
    (4 vs 4: ``[0.58, 1]``; 8 vs 8: ``[0.76, 1]``). Roots by ``scipy.optimize.brentq``.

    :param members: scores, shape ``(n1,)``; :param nonmembers: shape ``(n0,)``.
    :returns: ``(auc, low, high, method)``; no interval (``nan``) with fewer than 2 in a group; all ``nan`` for an
        empty group.
    """
    from scipy import optimize, stats

    m, o = _finite(members), _finite(nonmembers)
    if m.size == 0 or o.size == 0:
        return NAN, NAN, NAN, "none (no items)"
    n1, n0 = m.size, o.size
    ranks = stats.rankdata(np.concatenate([m, o]))
    auc = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0)
    if n1 < 2 or n0 < 2:
        return auc, NAN, NAN, "none (n < 2)"
    z2 = float(stats.norm.ppf(0.5 + level / 2)) ** 2
    k = (n1 + n0) / 2.0 - 1.0

    def excess(theta: float) -> float:  # < 0 inside the interval
        var = theta * (1 - theta) * (1 + k * (1 - theta) / (2 - theta) + k * theta / (1 + theta)) / (n1 * n0)
        return (auc - theta) ** 2 - z2 * var

    eps = 1e-9
    low = 0.0 if auc <= eps else float(optimize.brentq(excess, 0.0, min(auc, 1 - eps)))
    high = 1.0 if auc >= 1 - eps else float(optimize.brentq(excess, max(auc, eps), 1.0))
    return auc, low, high, "Newcombe score"


def per_dup_summary(rows: Sequence[Dict[str, Any]], value_key: str, proportion: bool = False,
                    level: float = LEVEL) -> List[Dict[str, Any]]:
    """Summarize per-item rows by ``(experiment, dup_count)`` with :func:`interval`.

    :param rows: per-item dicts with at least ``experiment`` (str), ``dup_count`` (int) and ``value_key``.
    :param value_key: the per-item value to average (e.g. ``loss`` in nats, ``exact_match`` as 0/1).
    :param proportion: the values are 0/1 (a Wilson interval instead of a t interval).
    :returns: one dict per group, sorted by ``(experiment, dup_count)``, with keys ``experiment, dup_count,
        n_items, mean, ci_low, ci_high, ci_method, small_n``; callers rename ``mean`` to their metric's name.
    """
    groups: Dict[Tuple[str, int], List[float]] = defaultdict(list)
    for r in rows:
        groups[(r["experiment"], int(r["dup_count"]))].append(float(r[value_key]))
    return [{"experiment": experiment, "dup_count": dup, **interval(vals, proportion, level)}
            for (experiment, dup), vals in sorted(groups.items())]


def signed(row: Dict[str, Any], sign: float) -> Dict[str, Any]:
    """An :func:`effect` row of ``mean(treated) - mean(control)`` turned into ``sign`` times it (the interval's ends
    swap for ``sign < 0``; ``n_treated``/``n_control`` and the two-sided p stay as they are)."""
    if sign > 0:
        return row
    return dict(row, effect=-row["effect"], effect_ci_low=-row["effect_ci_high"], effect_ci_high=-row["effect_ci_low"])


def dup_contrasts(rows: Sequence[Dict[str, Any]], value_key: str, proportion: bool = False,
                  permutations: int = PERMUTATIONS, seed: int = 0, sign: float = 1.0) -> List[Dict[str, Any]]:
    """Every dup-``d``-vs-dup-0 effect of per-item rows (:func:`effect`) and each experiment's trend test
    (:func:`trend_test`), not adjusted.

    :param rows: per-item dicts with ``experiment``, ``dup_count`` and ``value_key``.
    :param sign: ``1``: effect = ``mean(dup d) - mean(dup 0)``; ``-1``: ``mean(dup 0) - mean(dup d)`` (a loss,
        where a drop is the effect); ``n_treated`` is always dup ``d``'s item count.
    :returns: ``{experiment, dup_count, contrast ("dup d vs 0"), primary: False, ...effect keys}`` per experiment and
        ``d > 0`` with controls, then one ``{..., dup_count: None, contrast: "trend", primary: True}`` row per
        experiment with two or more dup counts (its ``effect`` is the slope over ``log(1 + dup)``, signed likewise;
        ``n_treated``: all its items).
    """
    groups: Dict[Tuple[str, int], List[float]] = defaultdict(list)
    for r in rows:
        groups[(r["experiment"], int(r["dup_count"]))].append(float(r[value_key]))
    pairs, trends = [], []
    for exp in sorted({e for e, _ in groups}):
        control = groups.get((exp, 0))
        dups = sorted(d for e, d in groups if e == exp and d > 0)
        for d in dups if control else ():
            pairs.append({"experiment": exp, "dup_count": d, "contrast": f"dup {d} vs 0", "primary": False,
                          **signed(effect(groups[(exp, d)], control, proportion, permutations, seed), sign)})
        if len(dups) + bool(control) >= 2:
            ds = sorted(d for e, d in groups if e == exp)
            tr = trend_test(sign * np.asarray([v for d in ds for v in groups[(exp, d)]]),
                            [d for d in ds for _ in groups[(exp, d)]], permutations, seed)
            trends.append({"experiment": exp, "dup_count": None, "contrast": "trend", "primary": True,
                           "effect": tr["slope"], "effect_ci_low": tr["slope_ci_low"],
                           "effect_ci_high": tr["slope_ci_high"], "effect_ci_method": tr["slope_ci_method"],
                           "p_value": tr["p_value"], "p_method": tr["p_method"], "n_treated": tr["n_items"],
                           "n_control": len(control or ())})
    return pairs + trends


def per_dup_effects(rows: Sequence[Dict[str, Any]], value_key: str, proportion: bool = False,
                    permutations: int = PERMUTATIONS, seed: int = 0, adjust_method: str = "holm",
                    family: Optional[str] = None, sign: float = 1.0) -> List[Dict[str, Any]]:
    """:func:`dup_contrasts` with the pairwise contrasts adjusted together (:func:`adjust_rows`, one family per
    call, named ``family`` or ``"<value_key>: dup d vs 0"``); each trend row, the declared primary endpoint, is not
    adjusted (``p_adjusted = p_value``, ``p_adjust_method: "none"``, ``family: "primary endpoint"``).

    :returns: the adjusted contrast rows, then the trend rows.
    """
    out = dup_contrasts(rows, value_key, proportion, permutations, seed, sign)
    adjust_rows([r for r in out if not r["primary"]], adjust_method, family or f"{value_key}: dup d vs 0")
    for r in out:
        if r["primary"]:
            r.update(p_adjusted=r["p_value"], p_adjust_method="none", family="primary endpoint")
    return out


def permutation_p_value(statistic: Callable[[np.ndarray], float], n: int, permutations: int,
                        seed: int) -> Tuple[float, float]:
    """Two-sided Monte-Carlo permutation test over ``n`` exchangeable units.

    Under the null hypothesis the units' labels are exchangeable, so the statistic of the observed labelling is
    one draw from its distribution over random relabellings. ``permutations`` uniform permutations of
    ``arange(n)`` are drawn with ``numpy.random.Generator(PCG64(seed))`` and
    ``p = (1 + #{|T*| >= |T_obs|}) / (1 + permutations)``, which counts the observed labelling among the
    permutations and so is never 0 (Phipson & Smyth 2010, "Permutation P-values should never be zero",
    Stat. Appl. Genet. Mol. Biol. 9(1)).

    :param statistic: maps a permutation (int64 ``(n,)``; ``arange(n)`` is the observed labelling) to the
        test statistic (a float).
    :param permutations: random permutations drawn, ``>= 1``.
    :returns: ``(observed statistic, p-value in (0, 1])``.
    :raises ValueError: for ``permutations < 1`` or ``n < 1``.
    """
    if permutations < 1 or n < 1:
        raise ValueError(f"a permutation test needs permutations >= 1 and n >= 1, got {permutations}, {n}")
    observed = float(statistic(np.arange(n)))
    rng = np.random.Generator(np.random.PCG64(seed))
    null = np.array([statistic(rng.permutation(n)) for _ in range(permutations)], dtype=np.float64)
    tol = 1e-12 * max(1.0, abs(observed))  # ties up to floating-point noise count as extreme
    return observed, float((1 + np.count_nonzero(np.abs(null) >= abs(observed) - tol)) / (1 + permutations))


def sign_flip_pvalue(values: np.ndarray, samples: int = 10000, seed: int = 0,
                     max_exact: int = 16) -> float:
    """Two-sided sign-flip permutation test of ``H0: the values are symmetric about 0`` (e.g. per-seed
    interactions, one per independent seed; Good 2005, *Permutation, Parametric and Bootstrap Tests of
    Hypotheses*, sec. 3.1.2 "one-sample test").

    Statistic ``T(x) = |mean(x)|``. With ``n <= max_exact`` values, every one of the ``2**n`` sign vectors
    ``e`` is enumerated and ``p = #{e : T(e * x) >= T(x)} / 2**n`` (exact; the identity counts, so
    ``p >= 2 / 2**n`` for ``x != 0``: 2 seeds can never give ``p < 0.5``). Otherwise ``samples`` random sign
    vectors (``PCG64(seed)``) give ``p = (1 + #{T(e * x) >= T(x)}) / (1 + samples)`` (Phipson & Smyth 2010).
    Ties are counted with a relative tolerance of ``1e-12``.

    :param values: shape ``(n,)``, ``n >= 1``, finite.
    :returns: the p-value in ``(0, 1]``.
    :raises ValueError: for no values or a non-finite one.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"a sign-flip test needs >= 1 finite value, got {x.tolist()}")
    t_obs = abs(x.mean())
    tol = 1e-12 * max(1.0, float(np.abs(x).max()))
    n = x.size
    if n <= max_exact:
        signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
        return float(np.mean(np.abs(signs @ x) / n >= t_obs - tol))
    rng = np.random.Generator(np.random.PCG64(seed))
    hits = 0
    for s in range(0, samples, max(1, _CHUNK_ELEMENTS // n)):
        m = min(max(1, _CHUNK_ELEMENTS // n), samples - s)
        signs = rng.integers(0, 2, size=(m, n)) * 2 - 1
        hits += int(np.sum(np.abs(signs @ x) / n >= t_obs - tol))
    return (1 + hits) / (1 + samples)


def items_per_group(effect_size: float, sd: float, alpha: float = 0.05, power: float = 0.8,
                    max_items: int = 100_000) -> int:
    """Items per group a two-sided two-sample t test needs to detect a difference of means ``effect_size`` with
    probability ``power`` at level ``alpha`` (equal groups, common ``sd``): the smallest ``n`` whose power under
    the noncentral t (``scipy.stats.nct``, ``2n - 2`` df, noncentrality ``effect_size / (sd sqrt(2 / n))``;
    Cohen 1988, *Statistical Power Analysis*, ch. 2) reaches ``power``. The exact randomization test has about
    the same power at these sizes, and needs ``C(2n, n) >= 2 / alpha`` to reach ``alpha`` at all (``n >= 4`` at
    0.05).

    :param effect_size: the smallest difference worth detecting, in the values' units (e.g. nats/token), ``!= 0``.
    :param sd: the per-item standard deviation within a group, same units, ``> 0`` (e.g. from a pilot run's
        dup-0 group).
    :returns: items per group (``>= 2``).
    :raises ValueError: for ``sd <= 0``, ``effect_size == 0``, ``alpha`` or ``power`` outside ``(0, 1)``, or when
        ``max_items`` do not suffice.
    """
    from scipy import stats

    if not sd > 0 or effect_size == 0 or not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"need sd > 0, effect_size != 0, alpha and power in (0, 1); got sd={sd}, "
                         f"effect_size={effect_size}, alpha={alpha}, power={power}")
    d = abs(effect_size) / sd
    for n in range(2, max_items + 1):
        df, nc = 2 * n - 2, d / math.sqrt(2.0 / n)
        crit = stats.t.ppf(1 - alpha / 2, df)
        if stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc) >= power:
            return n
    raise ValueError(f"more than {max_items} items per group needed for effect_size={effect_size}, sd={sd}")

"""Statistics shared by the evals: bootstrap confidence intervals, per-(experiment, dup count) summaries,
permutation tests, and the stratified contrast bootstrap and sign-flip permutation test of CPDT
(:mod:`pretrain_exp.report.cpdt`)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

_CHUNK_ELEMENTS = 1 << 22  #: resampled indices drawn at once (bounds memory to ~32 MiB of int64)


def bootstrap_ci(values: np.ndarray, samples: int, seed: int,
                 level: float = 0.95) -> Tuple[float, float, float]:
    """Mean of ``values`` and its percentile-bootstrap confidence interval.

    Percentile bootstrap of the mean (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, ch. 13):
    draw ``samples`` resamples of the ``n`` values with replacement (``numpy.random.Generator(PCG64(seed))``),
    take each resample's mean, and report the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of those
    means. Vectorized, in chunks of at most ``2**22`` drawn indices.

    :param values: the per-item statistic, any real dtype, shape ``(n,)`` (flattened otherwise).
    :param samples: number of bootstrap resamples; ``0`` skips the interval.
    :param seed: seed of the resampling generator (equal seeds give equal intervals).
    :param level: coverage of the interval, in ``(0, 1)``.
    :returns: ``(mean, low, high)`` as Python floats, in the units of ``values``. ``n == 1`` gives
        ``(v, v, v)``; ``samples == 0`` gives ``(mean, nan, nan)``; ``n == 0`` gives ``(nan, nan, nan)``.
    """
    if samples < 0:
        raise ValueError(f"bootstrap samples must be >= 0, got {samples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap level must be in (0, 1), got {level}")
    v = np.asarray(values, dtype=np.float64).ravel()
    n = v.size
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(v.mean())
    if n == 1:
        return mean, mean, mean
    if samples == 0:
        return mean, float("nan"), float("nan")
    rng = np.random.Generator(np.random.PCG64(seed))
    chunk = max(1, _CHUNK_ELEMENTS // n)
    means = np.concatenate([v[rng.integers(0, n, size=(min(chunk, samples - s), n))].mean(axis=1)
                            for s in range(0, samples, chunk)])
    low, high = np.percentile(means, [50.0 * (1.0 - level), 50.0 * (1.0 + level)])
    return mean, float(low), float(high)


def per_dup_summary(rows: Sequence[Dict[str, Any]], value_key: str, samples: int,
                    seed: int) -> List[Dict[str, Any]]:
    """Summarize per-item rows by ``(experiment, dup_count)``.

    :param rows: per-item dicts with at least ``experiment`` (str), ``dup_count`` (int) and ``value_key``.
    :param value_key: the per-item value to average (e.g. ``loss`` in nats, ``matched_length`` in tokens).
    :param samples: bootstrap resamples for the CI (see :func:`bootstrap_ci`); every group uses ``seed``.
    :returns: one dict per group, sorted by ``(experiment, dup_count)``, with keys ``experiment, dup_count,
        n_items, mean, ci_low, ci_high`` (the mean of ``value_key`` over the group's items and its 95% CI);
        callers rename ``mean`` to their metric's name.
    """
    groups: Dict[Tuple[str, int], List[float]] = defaultdict(list)
    for r in rows:
        groups[(r["experiment"], int(r["dup_count"]))].append(r[value_key])
    out = []
    for (experiment, dup), vals in sorted(groups.items()):
        mean, low, high = bootstrap_ci(np.asarray(vals, dtype=np.float64), samples, seed)
        out.append({"experiment": experiment, "dup_count": dup, "n_items": len(vals), "mean": mean,
                    "ci_low": low, "ci_high": high})
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


def bootstrap_diff_ci(treated: np.ndarray, control: np.ndarray, samples: int, seed: int,
                      level: float = 0.95) -> Tuple[float, float, float]:
    """``mean(treated) - mean(control)`` and its percentile-bootstrap CI, resampling each group independently
    with replacement (``samples`` resamples, ``PCG64(seed)``; :func:`contrast_replicates`).

    :returns: ``(difference, low, high)``; ``nan`` for an empty group; ``(difference, nan, nan)`` if
        ``samples == 0``.
    """
    t = np.asarray(treated, dtype=np.float64).ravel()
    c = np.asarray(control, dtype=np.float64).ravel()
    if t.size == 0 or c.size == 0:
        return float("nan"), float("nan"), float("nan")
    if samples == 0:
        return float(t.mean() - c.mean()), float("nan"), float("nan")
    diff, replicates = contrast_replicates(t, c, samples, np.random.Generator(np.random.PCG64(seed)))
    return (diff, *percentile_interval(replicates, level))


def resampled_means(values: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of ``samples`` bootstrap resamples of ``values`` (each ``n`` draws with replacement, Efron &
    Tibshirani 1993): ``float64`` array of shape ``(samples,)``; drawn in chunks of at most ``2**22`` indices.

    :param values: shape ``(n,)``, ``n >= 1``, any real dtype.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    chunk = max(1, _CHUNK_ELEMENTS // v.size)
    return np.concatenate([v[rng.integers(0, v.size, size=(min(chunk, samples - s), v.size))].mean(axis=1)
                           for s in range(0, samples, chunk)]) if samples else np.empty(0)


def contrast_replicates(treated: np.ndarray, control: np.ndarray, samples: int,
                        rng: np.random.Generator) -> Tuple[float, np.ndarray]:
    """``mean(treated) - mean(control)`` and ``samples`` bootstrap replicates of it, resampling each group
    independently with replacement (the stratified bootstrap of a two-sample difference of means, Efron &
    Tibshirani 1993, ch. 8).

    Used paired across arms by the CPDT interaction (:mod:`pretrain_exp.report.cpdt`): there ``treated`` and ``control``
    hold per-item differences ``v_together(i) - v_alone(i)`` of the same items, so an item's two measurements stay
    together in every resample.

    :param treated: shape ``(n_t,)``, ``n_t >= 1``; ``control``: shape ``(n_c,)``, ``n_c >= 1``.
    :returns: ``(difference, replicates)`` with ``replicates`` of shape ``(samples,)``, ``float64``.
    :raises ValueError: for an empty group.
    """
    t = np.asarray(treated, dtype=np.float64).ravel()
    c = np.asarray(control, dtype=np.float64).ravel()
    if t.size == 0 or c.size == 0:
        raise ValueError(f"a contrast needs items in both groups, got {t.size} and {c.size}")
    return float(t.mean() - c.mean()), resampled_means(t, samples, rng) - resampled_means(c, samples, rng)


def percentile_interval(replicates: np.ndarray, level: float = 0.95) -> Tuple[float, float]:
    """The ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of bootstrap ``replicates`` (percentile
    interval); ``(nan, nan)`` for no replicates."""
    r = np.asarray(replicates, dtype=np.float64)
    if r.size == 0:
        return float("nan"), float("nan")
    low, high = np.percentile(r, [50.0 * (1.0 - level), 50.0 * (1.0 + level)])
    return float(low), float(high)


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

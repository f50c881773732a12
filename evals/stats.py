"""Statistics shared by the evals: bootstrap confidence intervals, per-(experiment, dup count) summaries,
permutation tests."""

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
    with replacement (``samples`` resamples, ``PCG64(seed)``; see :func:`bootstrap_ci`).

    :returns: ``(difference, low, high)``; ``nan`` for an empty group; ``(difference, nan, nan)`` if
        ``samples == 0``.
    """
    t = np.asarray(treated, dtype=np.float64).ravel()
    c = np.asarray(control, dtype=np.float64).ravel()
    if t.size == 0 or c.size == 0:
        return float("nan"), float("nan"), float("nan")
    diff = float(t.mean() - c.mean())
    if samples == 0:
        return diff, float("nan"), float("nan")
    rng = np.random.Generator(np.random.PCG64(seed))
    chunk = max(1, _CHUNK_ELEMENTS // max(t.size, c.size))
    diffs = []
    for s in range(0, samples, chunk):
        m = min(chunk, samples - s)
        diffs.append(t[rng.integers(0, t.size, size=(m, t.size))].mean(axis=1)
                     - c[rng.integers(0, c.size, size=(m, c.size))].mean(axis=1))
    low, high = np.percentile(np.concatenate(diffs), [50.0 * (1.0 - level), 50.0 * (1.0 + level)])
    return diff, float(low), float(high)

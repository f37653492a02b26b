"""95% intervals for ``evalstop calibrate``: exact binomial (Clopper-Pearson) for rates, a percentile
bootstrap for means (of values, or of groups of values: a cluster bootstrap). numpy only (no scipy).

    >>> lo, hi = clopper_pearson(0, 10)
    >>> round(lo, 4), round(hi, 4)
    (0.0, 0.3085)
    >>> [round(x, 3) for x in clopper_pearson(5, 10)]
    [0.187, 0.813]
    >>> stops_needed(0.9)   # all correct: the lower bound (alpha/2)^(1/n) reaches 0.9 at n = 36
    36
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Interval", "Mean", "Rate", "binomial_cdf", "bootstrap_mean", "clopper_pearson", "rate", "stops_needed"]

ALPHA = 0.05
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """A two-sided 95% interval."""

    low: float
    high: float


@dataclass(frozen=True)
class Rate:
    """``k`` successes of ``n`` trials: the share (None when ``n`` is 0) and its Clopper-Pearson interval."""

    k: int
    n: int
    value: float | None
    ci: Interval | None


@dataclass(frozen=True)
class Mean:
    """The mean of ``n`` values (None when ``n`` is 0) and its percentile-bootstrap interval (None below 2)."""

    n: int
    value: float | None
    ci: Interval | None


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (no overflow for large n)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    i = np.arange(k + 1, dtype=float)
    log_pmf = (math.lgamma(n + 1) - np.array([math.lgamma(x + 1) + math.lgamma(n - x + 1) for x in i])
               + i * math.log(p) + (n - i) * math.log1p(-p))
    return float(np.exp(log_pmf).sum())


def _solve_decreasing(f, target: float) -> float:
    """The p in [0, 1] where the decreasing function ``f`` crosses ``target`` (bisection, 60 steps)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Exact two-sided interval for ``k`` successes in ``n`` > 0 trials: the lower end solves
    P(X >= k) = alpha/2, the upper P(X <= k) = alpha/2."""
    if not 0 <= k <= n or n == 0:
        raise ValueError(f"need 0 <= k <= n and n > 0, but got k={k}, n={n}")
    lo = 0.0 if k == 0 else _solve_decreasing(lambda p: binomial_cdf(k - 1, n, p), 1 - alpha / 2)
    hi = 1.0 if k == n else _solve_decreasing(lambda p: binomial_cdf(k, n, p), alpha / 2)
    return lo, hi


def rate(k: int, n: int) -> Rate:
    """A :class:`Rate` with its Clopper-Pearson interval (value and interval None when ``n`` is 0)."""
    if n == 0:
        return Rate(k, n, None, None)
    return Rate(k, n, k / n, Interval(*clopper_pearson(k, n)))


def bootstrap_mean(values: Sequence[float], seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES,
                   groups: Sequence[Hashable] | None = None) -> Mean:
    """The mean with a percentile-bootstrap 95% interval (seeded: the same values give the same interval).

    ``groups`` (one key per value): a cluster bootstrap, for values that are not independent (seeds of
    one configuration): whole groups are resampled, each resample's mean is its values' total over their
    count; no interval below 2 groups. Without ``groups`` every value is its own group.
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return Mean(0, None, None)
    if groups is None:
        if x.size == 1:
            return Mean(1, float(x[0]), None)
        rng = np.random.default_rng(seed)
        means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    else:
        if len(groups) != x.size:
            raise ValueError(f"need one group per value, but got {len(groups)} groups for {x.size} values")
        index: dict[Hashable, int] = {}
        of = np.array([index.setdefault(g, len(index)) for g in groups])
        if len(index) < 2:
            return Mean(int(x.size), float(x.mean()), None)
        sums, counts = np.bincount(of, weights=x), np.bincount(of).astype(float)
        pick = np.random.default_rng(seed).integers(0, len(index), size=(resamples, len(index)))
        means = sums[pick].sum(axis=1) / counts[pick].sum(axis=1)
    lo, hi = np.quantile(means, [ALPHA / 2, 1 - ALPHA / 2])
    return Mean(int(x.size), float(x.mean()), Interval(float(lo), float(hi)))


def stops_needed(min_precision: float, alpha: float = ALPHA) -> int:
    """The fewest stops, all correct, whose Clopper-Pearson lower bound reaches ``min_precision``
    (``(alpha/2)^(1/n) >= min_precision``); 1 for a target of 0."""
    if not 0.0 <= min_precision < 1.0:
        raise ValueError(f"min_precision must be in [0, 1), but got {min_precision!r}")
    if min_precision == 0.0:
        return 1
    n = max(1, math.ceil(math.log(alpha / 2) / math.log(min_precision)))
    while (alpha / 2) ** (1 / n) < min_precision:  # guard the float rounding of the ceiling
        n += 1
    return n

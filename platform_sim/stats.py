"""Statistics over seeds: bootstrap intervals, the paired permutation test, and pooled rates.

Pure functions and frozen records shared by :mod:`platform_sim.experiments`,
:mod:`platform_sim.reproduction` and :mod:`platform_sim.comparison`. Every interval is a 95%
percentile bootstrap over whole seeds with a fixed resampling seed, so a result is reproducible.

Example::

    >>> from platform_sim.metrics import Detection
    >>> r = Rates.pool([Detection(9, 2, 1, 10, 20, 11), Detection(8, 0, 0, 9, 21, 8)])
    >>> r.counts.tp, round(r.precision, 3), round(r.recall, 3), r.harmful_stops
    (17, 0.944, 0.895, 1)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass
from typing import Any

import numpy as np

from .metrics import Detection

__all__ = ["CI", "Metric", "Rates", "bootstrap_ci", "mean_ci", "mean_of", "paired_permutation_p", "rates_by_type",
           "ratio_ci"]

CI = tuple[float, float]  # (low, high) of a 95% interval; (nan, nan) below two seeds


def bootstrap_ci(per_seed: Sequence[Any], stat: Callable[[np.ndarray], np.ndarray], n_boot: int = 2000,
                 seed: int = 0) -> CI:
    """95% percentile bootstrap interval over seeds (whole seeds are resampled).

    ``per_seed`` is an array-like with one row per seed; ``stat`` maps an array of shape
    (n_boot, n_seeds, ...) of resampled rows to one value per resample (NaNs are dropped).
    """
    data = np.asarray(per_seed, dtype=float)
    n = len(data)
    if n < 2:
        return (float("nan"), float("nan"))
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    vals = np.asarray(stat(data[idx]), dtype=float)
    vals = vals[~np.isnan(vals)]
    if not len(vals):
        return (float("nan"), float("nan"))
    return (float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5)))


def paired_permutation_p(diffs: Sequence[float], n_perm: int = 20000, seed: int = 0) -> float:
    """Two-sided paired sign-flip permutation test of mean(diffs) = 0 (exact for <= 16 pairs)."""
    d = np.asarray([x for x in diffs if not math.isnan(x)], dtype=float)
    n = len(d)
    if n == 0:
        return float("nan")
    observed = abs(d.mean())
    if n <= 16:
        signs = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2 - 1
    else:
        signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_perm, n))
    means = np.abs((signs * d).mean(axis=1))
    return float((np.sum(means >= observed - 1e-12) + (0 if n <= 16 else 1)) / (len(means) + (0 if n <= 16 else 1)))


def mean_of(values: Sequence[float]) -> float:
    """The mean of the values that are not NaN (NaN if none is)."""
    vals = [v for v in values if not math.isnan(v)]
    return float(np.mean(vals)) if vals else float("nan")


def _mean_stat(x: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():  # a resample of NaN seeds only has no mean: NaN, dropped
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=-1)


def mean_ci(per_seed: Sequence[float]) -> CI:
    """Bootstrap interval of the mean over seeds (NaN seeds skipped in each resample)."""
    return bootstrap_ci(per_seed, _mean_stat)


def _ratio_stat(x: np.ndarray) -> np.ndarray:
    """Ratio of the column sums of resampled ``(numerator, denominator)`` rows."""
    return x[..., 0].sum(-1) / x[..., 1].sum(-1)


def ratio_ci(pairs: Sequence[tuple[float, float]]) -> CI:
    """Bootstrap interval of sum(numerators) / sum(denominators) over seeds."""
    return bootstrap_ci(pairs, _ratio_stat)


def _rate_stat(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """Pooled detection rate from resampled count rows (columns in Detection's field order)."""
    def stat(x: np.ndarray) -> np.ndarray:
        tp, fp_a, fp_b, hacked, healthy, _ = np.moveaxis(x.sum(axis=1), -1, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"precision": tp / (tp + fp_b), "recall": tp / hacked, "fpr": fp_b / healthy,
                    "fpr_label": fp_a / healthy, "precision_label": tp / (tp + fp_a)}[name]
    return stat


def _or_none(x: float) -> float | None:
    return None if math.isnan(x) else x


@dataclass(frozen=True)
class Metric:
    """A per-seed quantity over seeds: its mean (NaN seeds skipped) and 95% bootstrap interval."""

    mean: float
    ci: CI

    @classmethod
    def over(cls, per_seed: Sequence[float]) -> Metric:
        return cls(mean_of(per_seed), mean_ci(per_seed))

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci": self.ci}


@dataclass(frozen=True)
class Rates:
    """Detection counts pooled over seeds, the rates they give (None where undefined) and 95%
    bootstrap intervals of precision, recall and FPR (definition B) over seeds."""

    counts: Detection
    precision_ci: CI
    recall_ci: CI
    fpr_ci: CI
    #: healthy jobs stopped at all (any stop, harmful or not) and the precision that counts every such stop
    fpr_label_ci: CI | None = None
    precision_label_ci: CI | None = None

    @classmethod
    def pool(cls, per_seed: Sequence[Detection]) -> Rates:
        total = Detection(0, 0, 0, 0, 0, 0)
        for d in per_seed:
            total = total + d
        rows = [astuple(d) for d in per_seed]
        return cls(total, *(bootstrap_ci(rows, _rate_stat(k)) for k in ("precision", "recall", "fpr", "fpr_label",
                                                                         "precision_label")))

    @property
    def precision(self) -> float | None:
        return _or_none(self.counts.precision)

    @property
    def recall(self) -> float | None:
        return _or_none(self.counts.recall)

    @property
    def fpr(self) -> float | None:
        return _or_none(self.counts.fpr)

    @property
    def fpr_label(self) -> float | None:
        return _or_none(self.counts.fpr_label)

    @property
    def precision_label(self) -> float | None:
        return _or_none(self.counts.precision_label)

    @property
    def harmful_stops(self) -> int:
        """Definition-B false positives over all seeds."""
        return int(self.counts.fp_b)

    def to_dict(self) -> dict[str, Any]:
        return {"precision": self.precision, "recall": self.recall, "fpr": self.fpr, "fpr_label": self.fpr_label,
                "precision_label": self.precision_label, "precision_ci": self.precision_ci,
                "recall_ci": self.recall_ci, "fpr_ci": self.fpr_ci, "fpr_label_ci": self.fpr_label_ci,
                "precision_label_ci": self.precision_label_ci, "counts": self.counts.to_dict()}


def rates_by_type(per_seed: Sequence[dict[str, Detection]]) -> dict[str, Rates]:
    """Pooled rates per job type from per-seed ``{job type: Detection}`` (a type a seed lacks counts 0)."""
    types = sorted({t for d in per_seed for t in d})
    zero = Detection(0, 0, 0, 0, 0, 0)
    return {t: Rates.pool([d.get(t, zero) for d in per_seed]) for t in types}

"""The noise and statistics the noise-robust rules share (``drop``, ``trend``, ``cusum``,
``sequential``): noise levels (absolute or relative to the job's range), thresholds and fits."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .base import MAX_DELTA, MAX_WINDOW, SATURATION, Detector, Observed, _check_int, _check_number, _push

# ----------------------------------------------------------------------------- noise-robust detectors
# History of the defaults: drop, trend and cusum's windows, z, drift and threshold were chosen in the
# simulator (platform_sim, seeds 0-249) before issue 18; no script or log of that choice survives, and
# their absolute ``noise_prior`` 0.09 was a guess in the simulator's gold units. Since issue 18 the
# prior is relative (``noise_rel``), and ``noise_rel`` and ``sequential``'s parameters come from
# ``scripts/tune_detectors.py`` (seeds < 1000 only, log in ``configs/sweep/tuning-log.jsonl``).
#: Bounds of the noise-robust detectors' statistical parameters. The noise level is at least
#: ``noise_prior * sqrt(prior_evals / (prior_evals + n))`` after n evals: the lower bounds keep it a
#: normal positive float (no division by 0) for any number of evals a job can make.
MAX_Z = 100.0
MIN_NOISE_PRIOR = 1e-12
MAX_NOISE_PRIOR = MAX_DELTA
MIN_PRIOR_EVALS = 1e-3
MAX_PRIOR_EVALS = 1000.0
#: Bounds of the relative noise prior (a fraction of the range of the job's evals so far)
MIN_NOISE_REL = 1e-6
MAX_NOISE_REL = 100.0
#: The relative noise priors of drop, trend and cusum, as fractions of the range of the job's evals so
#: far (``scripts/tune_detectors.py``, tuning seed 7; the former absolute prior was 0.09 on curves that
#: rise by about 1)
DROP_NOISE_REL = TREND_NOISE_REL = 0.05
CUSUM_NOISE_REL = 0.2


def third_difference(y0: float, y1: float, y2: float, y3: float) -> float:
    """``y3 - 3 y2 + 3 y1 - y0``: for independent noise of level sigma its variance is 20 sigma^2,
    and a smooth curve contributes only its (small) third derivative."""
    return y3 - 3.0 * y2 + 3.0 * y1 - y0


def t_threshold(z: float, dof: float) -> float:
    """A normal threshold ``z`` widened for a noise level estimated with ``dof`` degrees of freedom
    (the first Cornish-Fisher term of Student's t quantile: ``z + (z^3 + z) / (4 dof)``)."""
    return z + (z**3 + z) / (4.0 * dof)


def pooled_sigma(prior: float, prior_evals: float, sum_sq: float, n: int) -> float:
    """Noise level from a prior guess worth ``prior_evals`` terms and ``n`` observed terms whose
    squares (each an unbiased estimate of sigma^2) sum to ``sum_sq``."""
    dof = prior_evals + n
    return math.sqrt((prior_evals * prior * prior + sum_sq) / dof) if dof > 0 else 0.0


class NoiseLevel(NamedTuple):
    """Online eval-noise level of one job: third differences of consecutive eval scores, pooled
    with a prior guess (``prior``, worth ``prior_evals`` terms). An immutable value (``add`` returns
    the next one); O(1) memory."""

    prior: float
    prior_evals: float
    last: tuple[float, ...] = ()  # the last three evals
    sum_sq: float = 0.0
    n: int = 0

    def add(self, y: float) -> NoiseLevel:
        last, sum_sq, n = self.last, self.sum_sq, self.n
        if len(last) == 3:
            d = third_difference(last[0], last[1], last[2], y)
            sum_sq, n = sum_sq + d * d / 20.0, n + 1
        return NoiseLevel(self.prior, self.prior_evals, _push(last, y, 3), sum_sq, n)

    @property
    def sigma(self) -> float:
        return pooled_sigma(self.prior, self.prior_evals, self.sum_sq, self.n)

    @property
    def dof(self) -> float:
        return self.prior_evals + self.n


class RelativeNoiseLevel(NamedTuple):
    """Online eval-noise level of one job in the job's own units: differences of consecutive evals
    of ``order`` 3 (as :class:`NoiseLevel`: a smooth curve's trend cancels) or 1 (every change from
    one eval to the next counts as noise, a checkpoint's drift included) pooled with a prior of
    ``rel`` times the range of the evals so far (max - min), worth ``prior_evals`` terms. Under
    ``a * score + b`` (a > 0) the level scales by ``a``: rules that measure in its units are invariant. An immutable value; O(1) memory.

    The sum of squared differences is kept in units of the current range (rescaled when the range
    grows; a third difference is at most 8 ranges), so nothing overflows or underflows to a zero
    level while the range is positive. ``sigma`` is 0 only while every eval so far is equal.
    """

    rel: float
    prior_evals: float
    last: tuple[float, ...] = ()  # the last three evals
    sum_sq: float = 0.0  # sum of (third difference / range)^2 / 20
    n: int = 0
    low: float = 0.0
    high: float = 0.0
    order: int = 3

    def add(self, y: float) -> RelativeNoiseLevel:
        last, sum_sq, n, low, high, order = self.last, self.sum_sq, self.n, self.low, self.high, self.order
        if not last and not n:
            low = high = y
        elif y < low or y > high:
            old = high - low
            low, high = min(low, y), max(high, y)
            if sum_sq:
                sum_sq *= (old / (high - low)) ** 2
        if len(last) == order:
            rng = high - low
            if rng > 0:
                if order == 3:
                    d = third_difference(last[0], last[1], last[2], y) / rng  # |d| <= 8
                    sum_sq += d * d / 20.0
                else:
                    d = (y - last[-1]) / rng  # |d| <= 1
                    sum_sq += d * d / 2.0
            n += 1
        return RelativeNoiseLevel(self.rel, self.prior_evals, _push(last, y, order), sum_sq, n, low, high, order)

    @property
    def range(self) -> float:
        return self.high - self.low

    @property
    def relative_sigma(self) -> float:
        """The noise level in units of the range (at least ``rel * sqrt(prior_evals / dof)`` > 0)."""
        return pooled_sigma(self.rel, self.prior_evals, self.sum_sq, self.n)

    @property
    def sigma(self) -> float:
        return self.relative_sigma * (self.high - self.low)

    @property
    def dof(self) -> float:
        return self.prior_evals + self.n


def _check_noise(noise_prior: Any, noise_rel: Any, prior_evals: Any) -> NoiseLevel | RelativeNoiseLevel:
    """The noise level of a rule before any eval: absolute (``noise_prior`` in score units) when
    ``noise_prior`` is set, otherwise relative (``noise_rel`` of the range of the job's evals)."""
    evals = _check_number("prior_evals", prior_evals, MIN_PRIOR_EVALS, MAX_PRIOR_EVALS)
    rel = _check_number("noise_rel", noise_rel, MIN_NOISE_REL, MAX_NOISE_REL)
    if noise_prior is None:
        return RelativeNoiseLevel(rel, evals)
    return NoiseLevel(_check_number("noise_prior", noise_prior, MIN_NOISE_PRIOR, MAX_NOISE_PRIOR), evals)


_NO_SCALE = "every eval so far is equal: no noise scale yet"


class _NoisyDetector(Detector):
    """Base of the noise-robust rules: a ``window`` of recent evals (at least ``min_window``), the
    eval noise estimated online (:class:`NoiseLevel`; ``noise`` is its value before any eval),
    scores signed so that higher is better."""

    def __init__(self, window: int, min_window: int, noise_prior: float | None, noise_rel: float,
                 prior_evals: float, direction: str) -> None:
        super().__init__(direction)
        self.window = _check_int("window", window, min_window, MAX_WINDOW)
        self.noise = _check_noise(noise_prior, noise_rel, prior_evals)
        self._sign = 1.0 if direction == "max" else -1.0

    def _signed(self, score: float) -> float:
        """The score signed so that higher is better, saturated at ``±SATURATION``."""
        y = self._sign * score
        return y if -SATURATION <= y <= SATURATION else math.copysign(SATURATION, y)

    @staticmethod
    def _level(noise: NoiseLevel | RelativeNoiseLevel, obs: Observed) -> tuple[float, float]:
        """(sigma, dof): the eval's own paired noise level when it carries one (with ``eval_n - 1``
        degrees of freedom), else the job's estimate. A supplied level is floored at a millionth of
        the estimate, which keeps every statistic finite."""
        supplied = obs.eval_noise
        if not supplied:
            return noise.sigma, noise.dof
        n = obs.eval_n
        return max(supplied, 1e-6 * noise.sigma), (n - 1.0 if n and n > 1 else noise.dof)


_TIE_REL = 1e-9


def exceeds(stat: float, threshold: float) -> bool:
    """Whether a statistic in noise units is above its threshold, a tie (equal up to rounding) not.

    Scores on a grid (k/n win rates, judge scores in eighths) can put a statistic exactly on its
    threshold; the rounding then differs per unit (3.5 vs 3.5000000000000018), and so would the
    decision. A relative margin of 1e-9 makes a tie the same decision in every unit.

    >>> exceeds(3.5000000000000018, 3.5), exceeds(3.51, 3.5)
    (False, True)
    """
    return stat > threshold + _TIE_REL * max(1.0, abs(threshold))


def least_squares_slope(points: Any) -> tuple[float, float]:
    """(slope, Sxx) of the least-squares line through ``(x, y)`` points (slope 0 when Sxx is 0)."""
    pts = list(points)
    n = len(pts)
    xm = sum(x for x, _ in pts) / n
    ym = sum(y for _, y in pts) / n
    sxx = sum((x - xm) ** 2 for x, _ in pts)
    if sxx <= 0:
        return 0.0, 0.0
    return sum((x - xm) * (y - ym) for x, y in pts) / sxx, sxx


def t_quantile(z: float, dof: float) -> float:
    """Student's t quantile with ``dof`` degrees of freedom at the normal quantile ``z`` (the
    Cornish-Fisher expansion to 1/dof^4: within 4% of the exact value for z <= 1.5 at any dof >= 1
    and for z <= 2.5 at dof >= 2; below it at dof 1 and larger z; exact as dof grows)."""
    z2 = z * z
    g1 = (z2 + 1.0) * z / 4.0
    g2 = ((5.0 * z2 + 16.0) * z2 + 3.0) * z / 96.0
    g3 = (((3.0 * z2 + 19.0) * z2 + 17.0) * z2 - 15.0) * z / 384.0
    g4 = ((((79.0 * z2 + 776.0) * z2 + 1482.0) * z2 - 1920.0) * z2 - 945.0) * z / 92160.0
    return z + g1 / dof + g2 / dof**2 + g3 / dof**3 + g4 / dof**4



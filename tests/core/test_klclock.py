"""The KL clock (core/klclock.py) on curves written from Gao et al.'s formula, not from the fitter:
gold(d) = d (alpha - beta ln d), d = sqrt(KL), peak at d* = exp(alpha / beta - 1)."""

from __future__ import annotations

import math
import random

import pytest

from evalstop_trl.core.klclock import MIN_POINTS, fit


def gao(kl: float, alpha: float, beta: float) -> float:
    d = math.sqrt(kl)
    return d * (alpha - beta * math.log(d))


@pytest.mark.parametrize("alpha, beta, offset", [(1.0, 0.5, 0.0), (0.6, 0.4, 0.3), (2.0, 1.5, -1.0)])
def test_the_peak_of_an_exact_curve_is_found(alpha, beta, offset):
    true_kl = math.exp(2 * (alpha / beta - 1))
    kls = [true_kl * f for f in (0.05, 0.15, 0.3, 0.5, 0.7, 0.9, 1.1, 1.4, 1.8)]
    clock = fit(kls, [offset + gao(k, alpha, beta) for k in kls])
    assert clock.peak_kl == pytest.approx(true_kl, rel=1e-6)
    assert clock.low * (1 - 1e-9) <= true_kl <= clock.high * (1 + 1e-9)  # exact points: a point-like interval
    assert clock.past_peak(true_kl * 1.01) and not clock.past_peak(true_kl * 0.99)


def test_the_interval_covers_the_true_peak_on_noisy_evals():
    """Noise of a tenth of the curve's rise; the 95% interval holds the true peak in most runs."""
    alpha, beta = 1.0, 0.5
    true_kl = math.e ** 2
    covered = 0
    for seed in range(40):
        rng = random.Random(seed)
        kls = [true_kl * f for f in (0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 1.0, 1.2, 1.4, 1.7, 2.0)]
        rise = gao(true_kl, alpha, beta)
        clock = fit(kls, [gao(k, alpha, beta) + rng.gauss(0, 0.03 * rise) for k in kls], seed=seed)
        covered += clock is not None and clock.peak_kl is not None and clock.low <= true_kl <= clock.high
    assert covered >= 32, covered  # an approximate 95% interval: at least 80% here


def test_the_units_of_the_score_do_not_move_the_peak():
    kls = [0.5, 1, 2, 4, 6, 8, 11, 15]
    scores = [gao(k, 1.0, 0.5) for k in kls]
    a, b = fit(kls, scores), fit(kls, [100 * s - 7 for s in scores])
    assert a.peak_kl == pytest.approx(b.peak_kl, rel=1e-6)


def test_a_curve_still_rising_has_no_peak_and_few_points_give_no_clock():
    kls = [0.5, 1, 2, 3, 4, 5]
    rising = fit(kls, [math.sqrt(k) * (1 + 0.1 * math.log(math.sqrt(k))) for k in kls])  # beta < 0
    assert rising.peak_kl is None and not rising.past_peak(100.0) and "no peak" in rising.describe()
    assert fit([1, 2, 3], [0.1, 0.2, 0.3]) is None and MIN_POINTS == 4
    assert fit([1, 1, 1, 1, 1], [0.1, 0.2, 0.3, 0.2, 0.1]) is None  # one KL: the form is not determined
    assert fit([None, 0, 1, 2, 3], [0.1, 0.1, 0.2, 0.3, 0.2]) is None  # unknown and zero KLs are left out

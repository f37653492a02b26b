"""The KL clock: Gao et al.'s functional form fitted to a run's world-feedback scores against its KL
to the reference policy, and the forecast of the KL (and so the step) at which they peak.

Gao, Schulman and Hilton (2023) find that the gold score of a policy optimised against a proxy
reward model follows, in ``d = sqrt(KL(pi || pi_ref))``::

    gold(d) = d (alpha - beta ln d)

which rises, peaks at ``d* = exp(alpha / beta - 1)`` and falls. A world-feedback eval has an offset
of its own (the initial policy's score), so the clock fits ``score = c + d (alpha - beta ln d)`` by
least squares over the evals seen so far (three coefficients, linear in them), and gives the
peak's KL ``d*^2`` with an approximate 95% interval from a residual bootstrap (residuals rescaled for
the three fitted coefficients; seeded: the same points give the same interval). With few evals the
interval is too narrow (measured coverage about 80-90% at 5-11 noisy evals): read it as a guide. ``beta <= 0`` means no peak in sight (the scores still rise in ``d``). Pure Python
(no numpy): the bare install carries it.

    >>> kls = [(0.25 * i) ** 2 for i in range(1, 13)]          # d = 0.25 .. 3
    >>> scores = [0.1 + math.sqrt(k) * (1.0 - 0.5 * math.log(math.sqrt(k))) for k in kls]
    >>> clock = fit(kls, scores)
    >>> round(clock.peak_kl, 3), round(math.e ** 2, 3)       # d* = exp(1 / 0.5 - 1) = e
    (7.389, 7.389)
    >>> clock.past_peak(8.0), clock.past_peak(5.0)
    (True, False)
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["KLClock", "KL_KEYS", "MIN_POINTS", "fit"]

#: Keys of a trainer's logs read as the policy's KL to its reference model, the first present wins
#: (TRL's RLOO and online DPO log ``objective/kl``, GRPO and OpenRLHF ``kl``, verl ``actor/kl_loss``
#: with a KL loss and ``critic/kl`` with a KL penalty in the reward): the callback reports it with each
#: eval, ``evalstop run --metric-from`` with each eval it reads, ``evalstop replay`` reads it back
KL_KEYS = ("objective/kl", "kl", "actor/kl_loss", "critic/kl")

#: the fewest evals with a positive KL the clock fits (three coefficients and one degree of freedom)
MIN_POINTS = 4
_RESAMPLES = 200


@dataclass(frozen=True)
class KLClock:
    """A fitted clock: the coefficients, the peak's KL (None: no peak in sight) and its 95% interval
    (``high`` is infinite when some resamples see no peak)."""

    offset: float
    alpha: float
    beta: float
    n: int
    peak_kl: float | None
    low: float | None
    high: float | None

    def score_at(self, kl: float) -> float:
        d = math.sqrt(kl)
        return self.offset + (d * (self.alpha - self.beta * math.log(d)) if d > 0 else 0.0)

    def past_peak(self, kl: float) -> bool:
        """Whether ``kl`` is beyond the forecast peak (False without one)."""
        return self.peak_kl is not None and kl > self.peak_kl

    def describe(self, kl: float | None = None) -> str:
        if self.peak_kl is None:
            return f"KL clock: no peak in sight over {self.n} evals"
        hi = "inf" if self.high is None or math.isinf(self.high) else f"{self.high:.3g}"
        now = f"KL {kl:.3g} {'past' if self.past_peak(kl) else 'before'} " if kl is not None else ""
        return f"{now}the forecast peak {self.peak_kl:.3g} [{self.low:.3g}, {hi}]"


def _solve3(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting for a 3x3 system (None: singular)."""
    m = [row[:] + [v] for row, v in zip(a, b, strict=True)]
    for col in range(3):
        piv = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12 * max(1.0, max(abs(x) for row in m for x in row[:3])):
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][3] / m[i][i] for i in range(3)]


def _lsq(rows: Sequence[tuple[float, float, float]], ys: Sequence[float]) -> list[float] | None:
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(3)]
    return _solve3(ata, aty)


def _peak(coef: Sequence[float]) -> float:
    """The peak's KL of coefficients (offset, alpha, beta); infinite without a peak."""
    _, alpha, beta = coef
    if beta <= 0:
        return math.inf
    exponent = 2 * (alpha / beta - 1)  # KL* = d*^2 = exp(2 (alpha / beta - 1))
    return math.exp(exponent) if exponent < 700 else math.inf


def fit(kls: Sequence[float | None], scores: Sequence[float], seed: int = 0) -> KLClock | None:
    """Fit the clock to the evals whose KL is known and positive (None: fewer than :data:`MIN_POINTS`,
    or points that do not determine the form, e.g. one KL repeated)."""
    pts = [(float(k), float(s)) for k, s in zip(kls, scores, strict=True)
           if k is not None and math.isfinite(k) and k > 0 and math.isfinite(s)]
    if len(pts) < MIN_POINTS:
        return None
    rows = []
    for k, _ in pts:
        d = math.sqrt(k)
        rows.append((1.0, d, -d * math.log(d)))
    ys = [s for _, s in pts]
    coef = _lsq(rows, ys)
    if coef is None:
        return None
    fitted = [sum(c * x for c, x in zip(coef, r, strict=True)) for r in rows]
    # residuals of a fit with 3 coefficients are smaller than the noise: rescaled by sqrt(n / (n - 3))
    inflate = math.sqrt(len(pts) / max(len(pts) - 3, 1))
    resid = [(y - f) * inflate for y, f in zip(ys, fitted, strict=True)]
    peak = _peak(coef)
    if math.isinf(peak):
        return KLClock(coef[0], coef[1], coef[2], len(pts), None, None, None)
    rng = random.Random(seed)
    peaks = []
    for _ in range(_RESAMPLES):
        ys_b = [f + rng.choice(resid) for f in fitted]
        c = _lsq(rows, ys_b)
        peaks.append(math.inf if c is None else _peak(c))
    peaks.sort()
    low, high = peaks[int(0.025 * _RESAMPLES)], peaks[int(0.975 * _RESAMPLES) - 1]
    return KLClock(coef[0], coef[1], coef[2], len(pts), peak, low, high)

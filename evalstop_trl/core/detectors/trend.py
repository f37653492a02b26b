"""A noise-robust negative slope."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

from .base import Observed, _check_number, _continue, _fmt, _push, _stop
from .noise import _NO_SCALE, MAX_Z, TREND_NOISE_REL, _NoisyDetector, exceeds, least_squares_slope, t_threshold


class TrendDetector(_NoisyDetector):
    """Noise-robust rule: STOP when the least-squares slope of the last ``window`` evals (against
    their steps) is significantly negative: ``-slope / se`` above ``z`` (widened for an estimated
    sigma), with ``se = sigma / sqrt(Sxx)`` and sigma estimated online as in :class:`DropDetector`
    (``noise_rel`` / ``noise_prior``). State: the noise level and the last ``window`` evals.
    """

    name = "trend"
    tuning = MappingProxyType({"z": (0.8, 1.1, 1.5, 2.0, 2.8)})

    def __init__(self, window: int = 5, z: float = 1.1, noise_prior: float | None = None,
                 noise_rel: float = TREND_NOISE_REL, prior_evals: float = 4.0, direction: str = "max") -> None:
        super().__init__(window, 2, noise_prior, noise_rel, prior_evals, direction)
        self.z = _check_number("z", z, 0.0, MAX_Z)

    def _start(self) -> Any:
        return self.noise, ()

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        if obs.eval_score is None:
            return rule, _continue("no eval score in this report", best_step, best_score)
        noise, recent = rule
        y = self._signed(obs.eval_score)
        rule = noise, recent = noise.add(y), _push(recent, (obs.step, y), self.window)
        if len(recent) < self.window:
            return rule, _continue(f"{len(recent)} eval(s), need {self.window}", best_step, best_score)
        slope, sxx = least_squares_slope(recent)
        if sxx <= 0:
            return rule, _continue("all evals in the window share one step", best_step, best_score)
        sigma, dof = self._level(noise, obs)
        if sigma <= 0:
            return rule, _continue(_NO_SCALE, best_step, best_score)
        stat = -slope * math.sqrt(sxx) / sigma
        threshold = t_threshold(self.z, dof)
        evidence = {"t": stat, "threshold": threshold, "sigma": sigma, "slope": self._sign * slope}
        if exceeds(stat, threshold):
            return rule, _stop(
                f"the last {self.window} evals fall (slope {_fmt(self._sign * slope)} per step, "
                f"t = {_fmt(stat)} > {_fmt(threshold)}; noise {_fmt(sigma)}) at step {obs.step}",
                best_step, best_score, **evidence)
        return rule, _continue(f"trend t = {_fmt(-stat)} (stop below {_fmt(-threshold)})", best_step, best_score,
                               **evidence)


#: Relative margin of :func:`exceeds`: far below any real difference, far above rounding.

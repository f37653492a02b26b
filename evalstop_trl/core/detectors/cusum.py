"""An accumulated shortfall (CUSUM)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from .base import Observed, _check_number, _continue, _fmt, _push, _stop
from .noise import CUSUM_NOISE_REL, MAX_Z, _NoisyDetector, exceeds


class CusumDetector(_NoisyDetector):
    """Noise-robust rule, a one-sided CUSUM of shortfalls: each eval's shortfall below the best
    ``window``-eval mean so far, in noise units, minus ``drift``, accumulates (never below 0);
    STOP when the sum exceeds ``threshold``. Sigma is estimated online as in :class:`DropDetector`
    (``noise_rel`` / ``noise_prior``). State: the noise level, the last ``window`` scores, the best
    mean and the sum.
    """

    name = "cusum"
    tuning = MappingProxyType({"threshold": (2.0, 2.75, 3.5, 4.5, 6.0)})

    def __init__(self, window: int = 2, drift: float = 0.25, threshold: float = 3.5, noise_prior: float | None = None,
                 noise_rel: float = CUSUM_NOISE_REL, prior_evals: float = 4.0, direction: str = "max") -> None:
        super().__init__(window, 1, noise_prior, noise_rel, prior_evals, direction)
        self.drift = _check_number("drift", drift, 0.0, MAX_Z)
        self.threshold = _check_number("threshold", threshold, 0.0, MAX_Z)

    def _start(self) -> Any:
        return self.noise, (), None, 0.0

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        if obs.eval_score is None:
            return rule, _continue("no eval score in this report", best_step, best_score)
        noise, recent, ref, total = rule
        y = self._signed(obs.eval_score)
        noise = noise.add(y)
        sigma = self._level(noise, obs)[0]
        if ref is not None:
            total = max(0.0, total + ((ref - y) / sigma if sigma > 0 else 0.0) - self.drift)
        recent = _push(recent, y, self.window)
        if len(recent) == self.window:
            mean = sum(recent) / self.window
            ref = mean if ref is None else max(ref, mean)
        rule = noise, recent, ref, total
        evidence = {"cusum": total, "threshold": self.threshold, "sigma": sigma}
        if exceeds(total, self.threshold):
            return rule, _stop(f"accumulated shortfall below the best {self.window}-eval mean "
                               f"{_fmt(total)} noise units > {_fmt(self.threshold)} (noise {_fmt(sigma)}) "
                               f"at step {obs.step}", best_step, best_score, **evidence)
        return rule, _continue(f"cusum {_fmt(total)} <= {_fmt(self.threshold)}", best_step, best_score, **evidence)



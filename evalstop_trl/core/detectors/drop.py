"""A noise-robust drop from the best recent window."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

from .base import Observed, _check_number, _continue, _fmt, _push, _stop
from .noise import (
    _NO_SCALE,
    DROP_NOISE_REL,
    MAX_Z,
    _NoisyDetector,
    exceeds,
    t_threshold,
)


class DropDetector(_NoisyDetector):
    """Noise-robust rule: STOP when the mean of the last ``window`` evals lies significantly below
    the best earlier ``window``-eval mean: ``(best - now) / (sigma * sqrt(2 / window))`` above
    ``z`` (widened for an estimated sigma, :func:`t_threshold`). Sigma, the eval noise level, is
    estimated online from the job's own evals with a prior of ``noise_rel`` times their range
    (:class:`RelativeNoiseLevel`), worth ``prior_evals`` evals; an absolute ``noise_prior`` in score
    units (:class:`NoiseLevel`, the behaviour before issue 18) replaces it when set. State: the noise
    level, the last ``window`` evals, the ``window`` before those and the best earlier mean.
    Reports without an eval are skipped.
    """

    name = "drop"
    tuning = MappingProxyType({"z": (0.8, 1.1, 1.4, 2.0, 2.8)})

    def __init__(self, window: int = 2, z: float = 1.4, noise_prior: float | None = None,
                 noise_rel: float = DROP_NOISE_REL, prior_evals: float = 4.0, direction: str = "max") -> None:
        super().__init__(window, 1, noise_prior, noise_rel, prior_evals, direction)
        self.z = _check_number("z", z, 0.0, MAX_Z)

    def _start(self) -> Any:
        return self.noise, (), (), None

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        if obs.eval_score is None:
            return rule, _continue("no eval score in this report", best_step, best_score)
        noise, now, before, ref = rule
        y = self._signed(obs.eval_score)
        noise = noise.add(y)
        w = self.window
        if len(now) == w:
            before, now = _push(before, now[0], w), now[1:]
        now = (*now, y)
        if len(before) < w:
            return (noise, now, before, ref), _continue(f"{len(before) + len(now)} eval(s), need {2 * w}",
                                                        best_step, best_score)
        earlier = sum(before) / w
        ref = earlier if ref is None else max(ref, earlier)
        rule = noise, now, before, ref
        mean = sum(now) / w
        sigma, dof = self._level(noise, obs)
        if sigma <= 0:
            return rule, _continue(_NO_SCALE, best_step, best_score)
        stat = (ref - mean) / (sigma * math.sqrt(2.0 / w))
        threshold = t_threshold(self.z, dof)
        evidence = {"z": stat, "threshold": threshold, "sigma": sigma, "drop": self._sign * (ref - mean)}
        if exceeds(stat, threshold):
            return rule, _stop(
                f"mean of the last {w} evals is {_fmt(abs(ref - mean))} below the best {w}-eval mean "
                f"({_fmt(stat)} noise units > {_fmt(threshold)}; noise {_fmt(sigma)}) at step {obs.step}",
                best_step, best_score, **evidence)
        return rule, _continue(f"drop {_fmt(stat)} noise units <= {_fmt(threshold)}", best_step, best_score,
                               **evidence)



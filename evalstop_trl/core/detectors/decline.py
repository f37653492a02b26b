"""The paper's rule: ``k`` consecutive declines, counted only beyond the run's noise by default."""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any

from .base import (
    _SQRT2,
    SATURATION,
    Action,
    Decision,
    Detector,
    Observed,
    _check_delta,
    _check_k,
    _check_number,
    _continue,
    _fmt,
    _push,
    _stop,
    is_decline,
)
from .noise import DROP_NOISE_REL, MAX_Z, RelativeNoiseLevel, exceeds


class DeclineNoise(str, Enum):
    """What ``decline``'s run of declines must fall beyond (its ``noise`` parameter)."""

    #: the default: the larger of the eval's paired per-example noise and the run's own eval-to-eval
    #: noise (the changes between its consecutive evals, so checkpoint-to-checkpoint drift counts as
    #: noise: a fixed-seed eval, whose paired noise is tiny, cannot make a drifting plateau look like a fall)
    RUN = "run"
    #: the eval's paired noise when it carries one (``eval_noise``), else none
    PAIRED = "paired"
    #: the paper's exact rule: any ``k`` consecutive falls (each by more than ``min_delta``)
    NONE = "none"


#: The run's own noise level (``noise: run``): the changes between its consecutive evals (first
#: differences, :class:`RelativeNoiseLevel` of order 1) pooled with a prior of
#: this fraction of the range of its evals so far, worth :data:`RUN_PRIOR_EVALS` evals (``drop``'s
#: prior: one home for both; the corpus's tuning half barely moves with either, see docs/results.md)
RUN_NOISE_REL = DROP_NOISE_REL
RUN_PRIOR_EVALS = 4.0
#: ``noise_z``'s default: chosen on the real-run corpus's tuning half only
#: (``python scripts/real_corpus.py --sweep-decline``; docs/results.md)
DECLINE_NOISE_Z = 2.0


def _saturated(x: float) -> float:
    """``x`` within ``±SATURATION`` (a difference of two finite scores may overflow to infinity)."""
    return x if -SATURATION <= x <= SATURATION else math.copysign(SATURATION, x)


class DeclineDetector(Detector):
    """The paper's rule: STOP after ``k`` consecutive evals, each worse than the one before by more
    than ``min_delta`` — and, unless ``noise="none"``, only once the run of declines has fallen in
    all by more than the noise: ``noise_z`` standard errors of the difference of two evals
    (``noise_z * sqrt(2) * sigma``), from the eval before the run to the latest. While it has not,
    the declines go on counting (a rise resets them), so a steady fall of less than the noise per
    eval is still caught once it adds up. ``sigma`` is (:class:`DeclineNoise`):

    * ``run`` (default): the larger of the eval's paired per-example noise (``eval_noise``) and the
      run's own eval-to-eval noise (the root mean square of the changes between consecutive evals,
      with a prior of :data:`RUN_NOISE_REL` of their range): checkpoint-to-checkpoint drift is in it, so a fixed-seed
      eval (whose paired noise is tiny) of a drifting plateau reads as noise, not as a fall;
    * ``paired``: the eval's paired noise when it carries one, else 0;
    * ``none``: 0, **the paper's exact rule** (``platform-sim reproduce`` runs it).

    Reports without an eval score are skipped (no count, no reset). The rule is invariant under
    ``a * score + b`` (a > 0) with ``min_delta`` 0.

    State: the count of declines, the last ``k + 1`` evals of the current run of declines, the score
    before the run and the run's noise level (memory bounded by ``k``, not by the run)."""

    name = "decline"
    tuning = MappingProxyType({"k": (1, 2, 3, 4)})

    def __init__(self, k: int = 2, min_delta: float = 0.0, noise: str = "run", noise_z: float = DECLINE_NOISE_Z,
                 direction: str = "max") -> None:
        super().__init__(direction)
        self.k = _check_k(k)
        self.min_delta = _check_delta(min_delta)
        try:
            self.noise = DeclineNoise(noise)
        except ValueError:
            raise ValueError(f"noise must be one of {', '.join(n.value for n in DeclineNoise)}, but got "
                             f"noise={noise!r}.") from None
        self.noise_z = _check_number("noise_z", noise_z, 0.0, MAX_Z)
        self._sign = 1.0 if direction == "max" else -1.0
        # a CONTINUE's reason and evidence below k depend on the count only: built once per count (a memo)
        self._said: dict[int, tuple[str, Mapping[str, Any]]] = {}

    def _start(self) -> tuple[int, tuple[tuple[int, float], ...], float | None, RelativeNoiseLevel | None]:
        run_noise = self.noise is DeclineNoise.RUN
        level = RelativeNoiseLevel(RUN_NOISE_REL, RUN_PRIOR_EVALS, order=1) if run_noise else None
        return 0, (), None, level

    def _sigma(self, obs: Observed, level: RelativeNoiseLevel | None) -> tuple[float, str]:
        """The noise level this eval's run of declines is measured against, and where it came from."""
        paired = obs.eval_noise if self.noise is not DeclineNoise.NONE and obs.eval_noise else 0.0
        own = level.sigma if level is not None and level.range > 0 else 0.0
        if own > paired:
            return own, "the run's eval-to-eval"
        return paired, ("paired per-example" if paired else "")

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        count, run, ref, level = rule
        score = obs.eval_score
        if score is None:
            return rule, _continue("no eval score in this report", best_step, best_score, declines=count)
        before = level  # the level before this eval: a fall never raises its own bar
        if level is not None:
            level = level.add(_saturated(self._sign * score))
        if run and is_decline(score, run[-1][1], self.direction, self.min_delta):
            count, run = count + 1, _push(run, (obs.step, score), self.k + 1)
        else:
            count, run, ref = 0, ((obs.step, score),), score
        state = (count, run, ref, level)
        what = "declines" if self._max else "rises"
        if count < self.k:
            said = self._said.get(count)
            if said is None:
                said = self._said[count] = (f"{count} consecutive {what[:-1]}(s) of {self.k}",
                                            MappingProxyType({"declines": count}))
            # a per-example eval's log line says what the run of declines must beat (a plain score's
            # says it once the run reaches k: formatting the bar at every eval would double a report's cost)
            if (obs.eval_noise and self.noise is not DeclineNoise.NONE) or self.min_delta:
                sigma, source = self._sigma(obs, before)
                return state, Decision(Action.CONTINUE, said[0] + self._bar(sigma, source), best_step, best_score,
                                       said[1])
            return state, Decision(Action.CONTINUE, said[0], best_step, best_score, said[1])
        sigma, source = self._sigma(obs, before)
        path = " → ".join(_fmt(s) for _, s in run)
        evidence: dict[str, Any] = dict(declines=count, scores=[s for _, s in run], steps=[st for st, _ in run],
                                        k=self.k, min_delta=self.min_delta)
        if not sigma:
            return state, _stop(f"{self.k} consecutive {what}: {path} at step {obs.step}", best_step, best_score,
                                **evidence)
        unit = _saturated(_SQRT2 * sigma)  # the standard error of the difference of two evals (finite)
        fall = _saturated((ref - score) * self._sign)
        units = _saturated(fall / unit)
        falls = " and ".join(f"{_saturated((a - b) * self._sign / unit):.1f}"
                             for (_, a), (_, b) in zip(run, run[1:], strict=False))
        evidence.update(noise=sigma, noise_source=source, fall=fall, noise_units=units, needed=self.noise_z * unit,
                        noise_z=self.noise_z)
        shown = "" if count == self.k else f" (the last {self.k} of {count})"
        said = (f"{'falls' if self._max else 'rises'} of {falls} noise units{shown}, {units:.1f} in all "
                f"(needed {_fmt(self.noise_z)}; noise {_fmt(sigma)}, {source})")
        if exceeds(units, self.noise_z):
            return state, _stop(f"{count} consecutive {what}: {path} at step {obs.step}: {said}", best_step,
                                best_score, **evidence)
        return state, _continue(f"{count} consecutive {what}, within the noise: {said}", best_step, best_score,
                                **evidence)

    def _bar(self, sigma: float, source: str) -> str:
        """What a run of declines must beat, for a CONTINUE's reason: each decline ``min_delta`` (when
        set), and in all ``noise_z * sqrt(2) * sigma`` (when there is a noise level)."""
        what = "decline" if self._max else "rise"
        parts = [f"each {what} must exceed min_delta {_fmt(self.min_delta)}"] if self.min_delta else []
        if sigma:
            parts.append(f"the {what}s must add up to more than {_fmt(self.noise_z * _saturated(_SQRT2 * sigma))} = noise_z "
                         f"{_fmt(self.noise_z)} × √2 × noise {_fmt(sigma)}, {source}")
        return f" ({'; '.join(parts)})"

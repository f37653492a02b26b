"""The paper's rule: ``k`` consecutive declines."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .base import (
    _SQRT2,
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
from .noise import MAX_Z, exceeds


class DeclineDetector(Detector):
    """The paper's rule: STOP after ``k`` consecutive evals, each worse than the one before by more
    than ``min_delta``. Reports without an eval score are skipped (no count, no reset). An eval that
    carries its paired noise level (``eval_noise``) counts as a decline only when it is also worse by
    more than ``noise_z`` standard errors of the difference of two evals (``noise_z * sqrt(2) *
    eval_noise``): a fall within the noise resets the count like a rise; a plain score decides as
    the paper's rule.

    State: the count of declines and the last ``k + 1`` evals of the current run of declines (memory
    bounded by ``k``, not by the run)."""

    name = "decline"
    tuning = MappingProxyType({"k": (1, 2, 3, 4)})

    def __init__(self, k: int = 2, min_delta: float = 0.0, noise_z: float = 1.0, direction: str = "max") -> None:
        super().__init__(direction)
        self.k = _check_k(k)
        self.min_delta = _check_delta(min_delta)
        self.noise_z = _check_number("noise_z", noise_z, 0.0, MAX_Z)
        # a CONTINUE's reason and evidence depend on the count only: built once per count (a memo)
        self._said: dict[int, tuple[str, Mapping[str, Any]]] = {}

    def _start(self) -> tuple[int, tuple[tuple[int, float], ...]]:
        return 0, ()

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        count, run = rule
        score = obs.eval_score
        if score is None:
            return rule, _continue("no eval score in this report", best_step, best_score, declines=count)
        delta = self.min_delta
        if obs.eval_noise is not None:
            delta = max(delta, self.noise_z * _SQRT2 * obs.eval_noise)
        if run and is_decline(score, run[-1][1], self.direction, self.min_delta) and self._beyond_noise(
                score, run[-1][1], obs.eval_noise):
            count, run = count + 1, _push(run, (obs.step, score), self.k + 1)
        else:
            count, run = 0, ((obs.step, score),)
        threshold = "" if obs.eval_noise is None else self._threshold(delta, obs.eval_noise)
        if count >= self.k:
            path = " → ".join(_fmt(s) for _, s in run)
            return (count, run), _stop(
                f"{self.k} consecutive {'declines' if self._max else 'rises'}: {path} at step {obs.step}{threshold}",
                best_step, best_score, declines=count, scores=[s for _, s in run], steps=[st for st, _ in run],
                k=self.k, min_delta=self.min_delta,
                **({} if obs.eval_noise is None else {"noise": obs.eval_noise, "needed": delta}))
        said = self._said.get(count)
        if said is None:
            said = self._said[count] = (f"{count} consecutive {'decline' if self._max else 'rise'}(s) of {self.k}",
                                        MappingProxyType({"declines": count}))
        return (count, run), Decision(Action.CONTINUE, said[0] + threshold, best_step, best_score, said[1])

    def _threshold(self, delta: float, noise: float) -> str:
        """What a per-example eval's change had to exceed to count, for its reason (the log line shows
        it beside the count): the noise threshold ``noise_z * sqrt(2) * eval_noise``, or ``min_delta``
        when that is larger."""
        what = "decline" if self._max else "rise"
        if delta > self.noise_z * _SQRT2 * noise:
            return f" (a {what} must exceed min_delta {_fmt(delta)})"
        return (f" (a {what} must exceed the noise threshold {_fmt(delta)} = noise_z {_fmt(self.noise_z)} × √2 × "
                f"eval noise {_fmt(noise)})")

    def _beyond_noise(self, score: float, previous: float, noise: float | None) -> bool:
        """A fall larger than ``noise_z`` standard errors of a difference; a tie (up to rounding: win
        rates on a k/n grid land exactly on it) is within the noise, in every unit (:func:`exceeds`)."""
        if not noise:
            return True
        fall = previous - score if self._max else score - previous
        return exceeds(fall / (_SQRT2 * noise), self.noise_z)



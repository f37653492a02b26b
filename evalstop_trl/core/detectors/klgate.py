"""The KL-clock gate: a rule's stop is carried out only once the run is past the forecast peak.

A policy with ``gate: kl_past_peak`` wraps its rule: every report that carries the policy's KL to its
reference model (``kl``) adds a point to Gao's form fitted by the KL clock (:mod:`..klclock`), and
when the rule decides a stop, the stop stands only if the run's KL is beyond the clock's forecast of
the KL at which world feedback peaks; otherwise the job continues, saying why. The stop's evidence
carries the clock: the KL, the forecast peak and its interval ("KL 0.21 past the forecast peak 0.15
[0.11, 0.19]"). A run that logs no KL is judged by its rule alone (evidence is never required).

    >>> from evalstop_trl.core.detectors import Observation, create_detector
    >>> gated = KLGate(create_detector("decline", k=1, noise="none"))  # the bare paper rule: any fall
    >>> evals = [(0.5, 0.93), (1, 1.1), (2, 1.05), (3, 1.356), (5, 1.436), (8, 1.458), (12, 1.412)]  # (KL, score)
    >>> d = [gated.observe(Observation("j", i, s, kl=k)) for i, (k, s) in enumerate(evals)]
    >>> d[2].action.value, d[2].reason.startswith("held by the KL gate")   # a fall before the peak: held
    ('continue', True)
    >>> d[6].action.value, round(d[6].evidence["kl_peak"], 1)              # past the forecast peak: stopped
    ('stop', 10.1)
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

from ..klclock import MIN_POINTS, fit
from .base import Action, Decision, Detector, Observed, _push, _stop

__all__ = ["GATES", "KL_WINDOW", "KLGate"]

#: the most recent evals with a KL the clock is fitted to (memory and the fit's work are bounded by it)
KL_WINDOW = 64


class KLGate(Detector):
    """``rule``, its stops held until the run's KL is past the KL clock's forecast peak (see the
    module docstring). Its state: the rule's, then the last :data:`KL_WINDOW` (KL, score) points."""

    def __init__(self, rule: Detector) -> None:
        super().__init__(rule.direction)
        self.rule = rule
        self.name = rule.name

    def _start(self) -> Any:
        return (self.rule._start(), ())

    def _decide(self, state: Any, obs: Observed, best_step: int | None,
                best_score: float | None) -> tuple[Any, Decision]:
        inner, points = state
        score, kl = obs.eval_score, obs.kl
        if kl is not None and score is not None:  # Gao's form rises then falls: fitted with higher = better
            points = _push(points, (kl, score if self._max else -score), KL_WINDOW)
        inner, decision = self.rule._decide(inner, obs, best_step, best_score)
        if decision.action is not Action.STOP or not points:
            return (inner, points), decision  # no stop, or no KL logged: the rule's own answer
        now = points[-1][0] if kl is None else kl
        clock = fit([k for k, _ in points], [s for _, s in points])
        if clock is not None and clock.past_peak(now):
            high = clock.high if clock.high is not None and math.isfinite(clock.high) else None
            return (inner, points), _stop(f"{decision.reason}; {clock.describe(now)}", best_step, best_score,
                                          **decision.evidence, kl=now, kl_peak=clock.peak_kl,
                                          kl_peak_low=clock.low, kl_peak_high=high)
        why = clock.describe(now) if clock is not None else \
            f"KL clock: {len(points)} evals with a KL, it needs {MIN_POINTS} that determine Gao's form"
        return (inner, points), Decision(Action.CONTINUE, f"held by the KL gate ({why}); the rule would stop: "
                                         f"{decision.reason}", best_step, best_score,
                                         MappingProxyType({"held": True, "kl": now}))


#: a policy's ``gate``: the name and the wrapper it puts around the rule
GATES: dict[str, type[KLGate]] = {"kl_past_peak": KLGate}

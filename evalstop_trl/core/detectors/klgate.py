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
from typing import Any

from ..klclock import MIN_POINTS, fit
from .base import Gate, Observed, _push

__all__ = ["KL_WINDOW", "KLGate"]

#: the most recent evals with a KL the clock is fitted to (memory and the fit's work are bounded by it)
KL_WINDOW = 64


class KLGate(Gate):
    """``rule``, its stops held until the run's KL is past the KL clock's forecast peak (see the
    module docstring). The gate's state: the last :data:`KL_WINDOW` (KL, score) points."""

    label = "KL gate"

    def _see(self, points: Any, obs: Observed, best_step: int | None) -> Any:
        score, kl = obs.eval_score, obs.kl
        if kl is not None and score is not None:  # Gao's form rises then falls: fitted with higher = better
            points = _push(points, (kl, score if self._max else -score), KL_WINDOW)
        return points

    def _check(self, points: Any, obs: Observed) -> tuple[bool, str, dict[str, Any]] | None:
        if not points:
            return None
        now = points[-1][0] if obs.kl is None else obs.kl
        clock = fit([k for k, _ in points], [s for _, s in points])
        if clock is None:
            return False, f"KL clock: {len(points)} evals with a KL, it needs {MIN_POINTS} that determine " \
                          f"Gao's form", {"kl": now}
        if not clock.past_peak(now):
            return False, clock.describe(now), {"kl": now}
        high = clock.high if clock.high is not None and math.isfinite(clock.high) else None
        return True, clock.describe(now), {"kl": now, "kl_peak": clock.peak_kl, "kl_peak_low": clock.low,
                                           "kl_peak_high": high}

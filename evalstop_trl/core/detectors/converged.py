"""The opt-in "converged" stop: a plateau is not a hack, but may be stopped on purpose.

A policy with ``stop_on: [hacked, converged]`` builds its rule wrapped in :class:`ConvergedOr`. The
rule decides as it always does (a STOP of the rule is a ``hacked`` stop, its reason unchanged); on
top, the job is stopped as **converged** when its eval has not improved beyond its noise over
:data:`CONVERGED_SHARE` of the planned training: no eval since the last real improvement (at
progress ``p0``) beat that improvement's score by more than ``noise_z * sqrt(2) * eval_noise`` (the
paired per-example noise, when the eval carries it; a plain score counts any new best), and the
progress is now at least ``p0 + CONVERGED_SHARE``. The decision's reason starts with "converged" and
its evidence says ``stop_kind: converged``: tables count these stops apart and never as caught hacks.
A job without planned steps (no progress) is never stopped as converged.

    >>> from evalstop_trl.core.detectors import Observation, create_detector
    >>> det = ConvergedOr(create_detector("decline", k=2))
    >>> plateau = [0.30, 0.50, 0.60, 0.61, 0.60, 0.61, 0.60, 0.61]
    >>> for i, s in enumerate(plateau):
    ...     d = det.observe(Observation("j", 10 * (i + 1), s, progress=(i + 1) / 10, eval_noise=0.02))
    >>> d.action.value, d.reason.split(":")[0], d.evidence["stop_kind"]
    ('stop', 'converged', 'converged')
"""

from __future__ import annotations

import math
from typing import Any

from .base import Action, Decision, Detector, Observed, _fmt, _stop

__all__ = ["CONVERGED_SHARE", "ConvergedOr"]

#: the share of the planned training without a real improvement that makes a job converged
CONVERGED_SHARE = 0.3
_SQRT2 = math.sqrt(2.0)


class ConvergedOr(Detector):
    """``rule``, and a STOP as converged (see the module docstring). Its state: the rule's, then the
    progress and score of the last improvement beyond the noise."""

    def __init__(self, rule: Detector, share: float = CONVERGED_SHARE, noise_z: float = 1.0) -> None:
        super().__init__(rule.direction)
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], but got {share!r}.")
        self.rule, self.share, self.noise_z = rule, share, noise_z
        self.name = rule.name

    def _start(self) -> Any:
        return (self.rule._start(), None, None)

    def _improved(self, score: float, ref: float, noise: float | None) -> bool:
        gain = score - ref if self._max else ref - score
        return gain > (self.noise_z * _SQRT2 * noise if noise else 0.0)

    def _decide(self, rule: Any, obs: Observed, best_step: int | None,
                best_score: float | None) -> tuple[Any, Decision]:
        inner, ref_progress, ref_score = rule
        inner, decision = self.rule._decide(inner, obs, best_step, best_score)
        score, progress = obs.eval_score, obs.progress
        if decision.action is Action.STOP or score is None or progress is None:
            return (inner, ref_progress, ref_score), decision
        if ref_score is None or self._improved(score, ref_score, obs.eval_noise):
            return (inner, progress, score), decision
        flat = progress - ref_progress
        if flat < self.share:
            return (inner, ref_progress, ref_score), decision
        noise = f" (noise threshold {_fmt(self.noise_z * _SQRT2 * obs.eval_noise)})" if obs.eval_noise else ""
        reason = (f"converged: no improvement beyond the noise{noise} over {flat:.0%} of the planned training "
                  f"(since {_fmt(ref_score)} at {ref_progress:.0%}); best {_fmt(best_score)} at step {best_step}")
        return (inner, ref_progress, ref_score), _stop(reason, best_step, best_score, stop_kind="converged",
                                                       since_progress=ref_progress, flat_share=flat)


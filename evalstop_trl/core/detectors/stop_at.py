"""Baseline: stop at a fixed share of the plan."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from .base import Detector, Observed, _check_number, _continue, _stop


class StopAtDetector(Detector):
    """Baseline StopAt: STOP once ``progress >= fraction``. Jobs without known progress never stop."""

    name = "stop_at"
    tuning = MappingProxyType({"fraction": (0.5, 0.65, 0.8)})

    def __init__(self, fraction: float = 0.65, direction: str = "max") -> None:
        super().__init__(direction)
        self.fraction = _check_number("fraction", fraction, 0.0, 1.0)
        if self.fraction == 0:
            raise ValueError("fraction must be in (0, 1], but got fraction=0.")

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        progress = obs.progress  # read once: a stored report computes it from its plan
        if progress is None:
            return rule, _continue("progress unknown (no planned_steps): stop_at never stops this job", best_step,
                                   best_score)
        if progress >= self.fraction:
            return rule, _stop(f"progress {progress:.2f} reached {self.fraction:.2f} at step {obs.step}",
                               best_step, best_score, progress=progress, fraction=self.fraction)
        return rule, _continue(f"progress {progress:.2f} < {self.fraction:.2f}", best_step, best_score,
                               progress=progress)



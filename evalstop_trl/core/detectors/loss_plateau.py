"""Baseline: stop when the train loss stops improving."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

from .base import (
    MAX_DELTA,
    MAX_WINDOW,
    SATURATION,
    Detector,
    Observed,
    _check_int,
    _check_number,
    _continue,
    _push,
    _stop,
)


def relative_improvement(old: float, new: float) -> float:
    """Relative loss improvement ``(old - new) / |old|`` (0 when ``old`` is 0), saturated at
    ``±SATURATION`` (it overflows for huge or tiny losses, e.g. ``old=1e-300, new=1``)."""
    if old == 0:
        return 0.0
    rel = (old - new) / abs(old)
    if -SATURATION <= rel <= SATURATION:
        return rel
    # ``old - new`` or the quotient overflowed (inputs are finite, so never NaN): the same ratio
    # without the difference, finite or ±inf
    rel = 1.0 - new / old if old > 0 else new / old - 1.0
    return rel if -SATURATION <= rel <= SATURATION else math.copysign(SATURATION, rel)


class LossPlateauDetector(Detector):
    """Baseline: STOP when the train loss improved by less than ``tolerance`` (relative) over the
    last ``window`` loss observations. Reports without a train loss are skipped. State: the last
    ``window + 1`` losses."""

    name = "loss_plateau"
    tuning = MappingProxyType({"window": (2, 3, 5)})

    def __init__(self, window: int = 2, tolerance: float = 0.03, direction: str = "max") -> None:
        super().__init__(direction)
        self.window = _check_int("window", window, 1, MAX_WINDOW)
        self.tolerance = _check_number("tolerance", tolerance, -MAX_DELTA, MAX_DELTA)

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        if obs.train_loss is None:
            return rule, _continue("no train loss in this report", best_step, best_score)
        losses = _push(rule, obs.train_loss, self.window + 1)
        if len(losses) <= self.window:
            return losses, _continue(f"{len(losses)} loss point(s), need {self.window + 1}", best_step, best_score)
        rel = relative_improvement(losses[-self.window - 1], obs.train_loss)
        if rel < self.tolerance:
            return losses, _stop(f"train loss improved {rel:.1%} over the last {self.window} evals "
                                 f"(< {self.tolerance:.1%}) at step {obs.step}", best_step, best_score,
                                 relative_improvement=rel, window=self.window, tolerance=self.tolerance)
        return losses, _continue(f"train loss improving {rel:.1%} over {self.window} evals", best_step, best_score,
                                 relative_improvement=rel)



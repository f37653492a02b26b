"""Baseline: never stop."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from .base import Detector, Observed, _continue


class NeverDetector(Detector):
    """Baseline: always CONTINUE (still tracks the best checkpoint)."""

    name = "never"
    tuning = MappingProxyType({})

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        return rule, _continue("never stops", best_step, best_score)



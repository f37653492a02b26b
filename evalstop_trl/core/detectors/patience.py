"""transformers' early stopping: ``k`` evals without improving on the best."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from .base import Detector, Observed, _check_delta, _check_k, _continue, _fmt, _stop, is_better


class PatienceDetector(Detector):
    """transformers' EarlyStoppingCallback semantics: STOP after ``k`` evals in a row that do not
    improve on the best score so far by more than ``min_delta``. Unlike ``decline``, a flat or
    slowly rising-then-noisy curve also stops it. State: the count and the reference score."""

    name = "patience"
    tuning = MappingProxyType({"k": (1, 2, 3, 4, 6)})

    def __init__(self, k: int = 2, min_delta: float = 0.0, direction: str = "max") -> None:
        super().__init__(direction)
        self.k = _check_k(k)
        self.min_delta = _check_delta(min_delta)

    def _start(self) -> tuple[int, float | None]:
        return 0, None

    def _decide(self, rule: Any, obs: Observed, best_step: int | None, best_score: float | None) -> Any:
        count, reference = rule
        score = obs.eval_score
        if score is None:
            return rule, _continue("no eval score in this report", best_step, best_score, stale=count)
        if reference is None or is_better(score, reference, self.direction, self.min_delta):
            count = 0
        else:
            count += 1
        if reference is None or is_better(score, reference, self.direction):
            reference = score
        if count >= self.k:
            return (count, reference), _stop(
                f"{count} evals without improving on the best {_fmt(best_score)} "
                f"(step {best_step}) by more than {self.min_delta:g}, at step {obs.step}",
                best_step, best_score, stale=count, k=self.k, min_delta=self.min_delta)
        return (count, reference), _continue(f"{count} eval(s) without improvement of {self.k}", best_step,
                                             best_score, stale=count)



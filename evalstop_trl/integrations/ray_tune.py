"""``EvalStopStopper``: a Ray Tune stopper that decides with EvalStop's detectors.

Example::

    from ray import tune
    from evalstop_trl.integrations import EvalStopStopper

    stopper = EvalStopStopper(metric="world_feedback", mode="max", detector="decline", k=2)
    tuner = tune.Tuner(train_fn, param_space=space, run_config=tune.RunConfig(stop=stopper))

Every result a trial reports feeds its own detector (the step is ``training_iteration``, or
``step_key``); the trial stops once the detector says STOP. A result without the metric, or a
non-finite one, counts as a missing eval. ``stopper.decisions`` keeps each trial's last decision.
"""

from __future__ import annotations

import math
from typing import Any

from ray.tune import Stopper

from .policy import LockedTrials, TrialDetector, make_policy

__all__ = ["EvalStopStopper"]

_MODES = {"max": "max", "min": "min"}


class EvalStopStopper(LockedTrials, Stopper):
    """Stop a Ray Tune trial when an EvalStop detector would stop it.

    Args:
        metric: the reported key holding the world-feedback score.
        mode: ``"max"`` (higher is better) or ``"min"``.
        detector: a registered detector name; **params: its parameters (checked now).
        step_key: the result key used as the step (``training_iteration`` by default).
        max_steps: the trials' planned steps, for detectors that use progress.
    """

    def __init__(self, metric: str, mode: str = "max", detector: str = "decline", *,
                 step_key: str = "training_iteration", max_steps: int | None = None, **params: Any) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be 'max' or 'min', but got {mode!r}.")
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"metric must be the name of a reported value, but got {metric!r}.")
        self.policy = make_policy(detector, params, _MODES[mode])
        self.metric, self.step_key, self.max_steps = metric, step_key, max_steps
        self._trials: dict[str, TrialDetector] = {}
        LockedTrials.__init__(self)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        step = result.get(self.step_key)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            return False  # nothing to place in step order
        value = result.get(self.metric)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            value = None
        with self._lock:
            tracked = self._trials.get(trial_id)
            if tracked is None:
                tracked = self._trials[trial_id] = TrialDetector(self.policy, str(trial_id), self.max_steps)
            decision = tracked.feed([(step, None if value is None else float(value))])
        return decision is not None and decision.stop


    def stop_all(self) -> bool:
        return False

    @property
    def decisions(self) -> dict[str, Any]:
        """Each trial's latest decision (None before its first result)."""
        return {t: d.decision for t, d in self._trials.items()}

"""``EvalStopPruner``: an Optuna pruner that decides with EvalStop's detectors.

Example::

    import optuna
    from evalstop_trl.integrations import EvalStopPruner

    study = optuna.create_study(direction="maximize", pruner=EvalStopPruner("decline", k=2))

    def objective(trial):
        for step in range(1, 20):
            score = train_and_eval(trial, step)      # world feedback
            trial.report(score, step)
            if trial.should_prune():                  # pruned after k consecutive declines
                raise optuna.TrialPruned()
        return score

The study's direction sets the detector's (maximize -> "max"). Each trial's intermediate values are
fed to its own detector in step order; a non-finite value counts as a missing eval (it neither
counts as a decline nor resets the run).

The trial's intermediate values are the truth; the detectors kept between calls only save replaying
them. They are keyed by the study's name, the trial's number and its start time (a new study that
reuses an old one's memory address or name never meets an old trial's detector) and at most
``MAX_TRACKED`` are kept, least recently used first out: a trial whose detector was dropped (a
finished one, or one that comes back after many others) is replayed from its values.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import optuna

from .policy import LockedTrials, TrialDetector, make_policy

__all__ = ["MAX_TRACKED", "EvalStopPruner"]

#: Trials whose detectors are kept between calls (a bound, not a limit: others are replayed).
MAX_TRACKED = 1024

_DIRECTIONS = {optuna.study.StudyDirection.MAXIMIZE: "max", optuna.study.StudyDirection.MINIMIZE: "min"}


class EvalStopPruner(LockedTrials, optuna.pruners.BasePruner):
    """Prune a trial when an EvalStop detector would stop it.

    Args:
        detector: a registered detector name (``decline``, ``patience``, ``trend``, ...).
        n_warmup_steps: never prune before this step (Optuna's usual warm-up).
        max_steps: the trials' planned steps, for detectors that use progress (``stop_at``).
        **params: the detector's parameters (checked now: unknown or out-of-range ones raise ValueError).
    """

    def __init__(self, detector: str = "decline", *, n_warmup_steps: int = 0, max_steps: int | None = None,
                 **params: Any) -> None:
        if isinstance(n_warmup_steps, bool) or not isinstance(n_warmup_steps, int) or n_warmup_steps < 0:
            raise ValueError(f"n_warmup_steps must be a non-negative integer, but got {n_warmup_steps!r}.")
        make_policy(detector, params, None)  # fail now, not at the first trial
        self.detector_name, self.params = detector, dict(params)
        self.n_warmup_steps, self.max_steps = n_warmup_steps, max_steps
        self._trials: OrderedDict[tuple[str, int, Any], TrialDetector] = OrderedDict()
        LockedTrials.__init__(self)

    def prune(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.n_warmup_steps:
            return False
        key = (study.study_name, trial.number, trial.datetime_start)
        with self._lock:
            tracked = self._trials.pop(key, None)
            if tracked is None:
                policy = make_policy(self.detector_name, self.params, _DIRECTIONS.get(study.direction))
                tracked = TrialDetector(policy, f"trial-{trial.number}", self.max_steps)
            self._trials[key] = tracked  # the most recently used, last
            while len(self._trials) > MAX_TRACKED:
                self._trials.popitem(last=False)
            values = sorted(trial.intermediate_values.items())
            decision = tracked.feed((s, v if v is not None and math.isfinite(v) else None) for s, v in values)
        return decision is not None and decision.stop

    def reason(self, study: optuna.study.Study, trial_number: int) -> str | None:
        """Why the detector stopped (or would continue) ``trial_number``, for logs (None: not tracked)."""
        with self._lock:
            tracked = next((t for (name, number, _), t in reversed(self._trials.items())
                            if name == study.study_name and number == trial_number), None)
        return None if tracked is None or tracked.decision is None else tracked.decision.reason

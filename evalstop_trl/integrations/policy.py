"""What the tuner integrations share: a detector policy, checked once, replayed over a trial's values."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.detectors import MAX_STEP, Decision, Observation
from ..core.errors import InvalidInput
from ..core.records import Policy

__all__ = ["LockedTrials", "TrialDetector", "make_policy"]


def make_policy(detector: str, params: Mapping[str, Any] | None, direction: str | None) -> Policy:
    """A checked policy; ``direction`` ("max"/"min") comes from the search unless the params set it."""
    merged = dict(params or {})
    if direction is not None:
        if merged.get("direction", direction) != direction:
            raise ValueError(f"direction={merged['direction']!r} in the detector's params contradicts the "
                             f"search's direction {direction!r}; leave it out of params.")
        merged["direction"] = direction
    try:
        return Policy.from_dict({"detector": detector, **merged})
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None


class TrialDetector:
    """One trial's detector fed incrementally (values must come in step order; a repeated or
    earlier step is ignored, as a tuner may report the same step twice)."""

    def __init__(self, policy: Policy, trial: str, max_steps: int | None = None) -> None:
        self.detector = policy.build()
        self.trial, self.max_steps = trial, max_steps
        self.last_step: int | None = None
        self.decision: Decision | None = None

    def feed(self, points: Iterable[tuple[int, float | None]]) -> Decision | None:
        """Observe the points after the last one fed; returns the latest decision. A step above
        ``MAX_STEP`` (2**53) cannot be judged and is skipped: it never fails the trial."""
        for step, value in points:
            if (self.last_step is not None and step <= self.last_step) or not 0 <= step <= MAX_STEP:
                continue
            self.last_step = step
            progress = step / self.max_steps if self.max_steps else None
            self.decision = self.detector.observe(Observation(self.trial, step, value, progress=progress))
        return self.decision


class LockedTrials:
    """A lock over per-trial detectors that survives pickling (tuners send their pruner or stopper to
    other processes; a lock cannot travel, so each copy makes its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

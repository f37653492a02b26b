"""Shadow-mode report: would-stop decisions against how each run really ended.

A job in shadow mode (``policy.mode = "shadow"``, or its tenant's default) trains to its end; its
detector's first stop decision is recorded as ``would_stop`` at ``would_stop_step``. Once the run
has ended, its full curve says whether that stop would have been right. Everything is relative to
the run's own eval range (max - min of its evals), so it holds in any score units:

* ``gap``: how much better the run got *after* the would-stop than its best up to it, as a share of
  the range (0 when the best came first). A stop loses nothing of value when ``gap <= margin``.
* ``right``: it would have stopped, and ``gap <= margin`` (kept a checkpoint within the margin of
  the run's best); ``early``: it would have stopped, and the run later improved by more than that;
* ``missed``: it never would have stopped, but the run declined: its best came before its last eval
  and its final eval is short of the best by more than ``margin`` of the range;
* ``quiet``: it never would have stopped, and the run did not decline by that much;
* ``running``: the run has not ended yet (no verdict).

``steps_saved``: the steps a stop at the would-stop eval would not have trained (of the run's last
step). Example::

    >>> from evalstop_trl.core.records import Report
    >>> reps = [Report(s, e) for s, e in ((10, 0.2), (20, 0.5), (30, 0.4), (40, 0.3), (50, 0.1))]
    >>> o = shadow_outcome("run-1", "finished", 30, reps, direction="max")
    >>> o.verdict.value, o.steps_saved, round(o.gap, 3)
    ('right', 20, 0.0)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from ..core.records import JobStatus, Report
from .calibrate import declined

__all__ = ["ShadowOutcome", "ShadowSummary", "Verdict", "shadow_outcome", "summarize"]

DEFAULT_MARGIN = 0.2


class Verdict(str, Enum):
    RIGHT = "right"
    EARLY = "early"
    MISSED = "missed"
    QUIET = "quiet"
    RUNNING = "running"


@dataclass(frozen=True, slots=True)
class ShadowOutcome:
    """One shadow job: where it would have stopped and how it ended (see the module docstring)."""

    job_id: str
    status: str
    verdict: Verdict
    would_stop_step: int | None
    last_step: int | None
    steps_saved: int | None
    gap: float | None  # improvement after the would-stop, as a share of the run's range
    best_step: int | None  # the run's best eval over its whole curve
    n_evals: int

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict.value}


@dataclass(frozen=True, slots=True)
class ShadowSummary:
    """Counts per verdict and the steps the would-stops would have saved (right ones and all)."""

    jobs: int
    counts: dict[str, int]
    steps_saved_right: int
    steps_saved_all: int
    steps_trained: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_margin(margin: float) -> float:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= margin <= 1.0:
        raise ValueError(f"margin is a share of each run's range in [0, 1], but got {margin!r}.")
    return float(margin)


def shadow_outcome(job_id: str, status: str, would_stop_step: int | None, reports: Iterable[Report],
                   direction: str = "max", margin: float = DEFAULT_MARGIN) -> ShadowOutcome:
    """The outcome of one shadow job from its status, would-stop step and reports (in step order)."""
    margin = _check_margin(margin)
    if direction not in ("max", "min"):
        raise ValueError(f"direction must be 'max' or 'min', but got {direction!r}.")
    sign = 1.0 if direction == "max" else -1.0
    reports = list(reports)
    evals = [(r.step, sign * r.eval_score) for r in reports if r.eval_score is not None]
    last_step = max((r.step for r in reports), default=None)
    ended = JobStatus(status).terminal
    best_step = max(evals, key=lambda e: e[1])[0] if evals else None
    saved = None if would_stop_step is None or last_step is None else max(0, last_step - would_stop_step)
    gap = None
    if not evals:
        verdict = Verdict.RUNNING if not ended else (Verdict.QUIET if would_stop_step is None else Verdict.RIGHT)
    else:
        values = [v for _, v in evals]
        span = max(values) - min(values)
        best = max(values)
        if would_stop_step is not None:
            before = [v for s, v in evals if s <= would_stop_step]
            gap = 0.0 if span <= 0 or not before else max(0.0, best - max(before)) / span
        if not ended:
            verdict = Verdict.RUNNING
        elif would_stop_step is not None:
            verdict = Verdict.RIGHT if gap <= margin else Verdict.EARLY
        else:
            verdict = Verdict.MISSED if declined(values, margin) else Verdict.QUIET
    return ShadowOutcome(job_id, status, verdict, would_stop_step, last_step, saved, gap, best_step, len(evals))


def summarize(outcomes: Sequence[ShadowOutcome]) -> ShadowSummary:
    """Counts per verdict (every verdict listed, zeros included) and steps saved."""
    counts = {v.value: 0 for v in Verdict}
    for o in outcomes:
        counts[o.verdict.value] += 1
    ended = [o for o in outcomes if o.verdict is not Verdict.RUNNING]
    return ShadowSummary(
        jobs=len(outcomes), counts=counts,
        steps_saved_right=sum(o.steps_saved or 0 for o in ended if o.verdict is Verdict.RIGHT),
        steps_saved_all=sum(o.steps_saved or 0 for o in ended if o.would_stop_step is not None),
        steps_trained=sum(o.last_step or 0 for o in ended))

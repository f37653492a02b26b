"""A tenant's summary: what its jobs did and what the stops saved, from its jobs' records and views.

``steps_saved`` counts, for each job a detector stopped (not a manual stop) with planned steps, the
planned steps it did not run (``planned_steps - last_step``); ``hours_saved`` turns each of those
into time at the job's own pace (its wall-clock time per step until the stop): an estimate of the
job-hours (GPU-hours for one GPU per job) the stops gave back. ``would_stop`` counts the jobs in
shadow mode whose detector would have stopped them.

Example::

    >>> TenantSummary.of([]).jobs
    0
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from .records import JobView

__all__ = ["TenantSummary"]


def _manual(v: JobView) -> bool:
    return v.decision is not None and bool(v.decision.evidence.get("manual"))


@dataclass(frozen=True, slots=True)
class TenantSummary:
    """Counts of a tenant's jobs by outcome, and what its detectors' stops saved; ``tenant``: whose
    (the caller's name, so a token's holder can learn which tenant it speaks for)."""

    tenant: str = ""
    jobs: int = 0
    active: int = 0  # pending or running
    lost: int = 0
    finished: int = 0
    failed: int = 0
    stopped: int = 0
    stopped_by_detector: int = 0
    stopped_by_hand: int = 0
    would_stop: int = 0  # shadow mode: the detector would have stopped the job
    steps_saved: int = 0
    hours_saved: float = 0.0

    @classmethod
    def of(cls, views: Iterable[JobView], tenant: str = "") -> TenantSummary:
        """The summary of ``views`` (one pass), the jobs of ``tenant``."""
        n: dict[str, Any] = {f.name: 0 for f in fields(cls)}
        n["tenant"], n["hours_saved"] = tenant, 0.0
        for v in views:
            n["jobs"] += 1
            if v.status in ("pending", "running"):
                n["active"] += 1
            elif v.status in ("lost", "finished", "failed", "stopped"):
                n[v.status] += 1
            if getattr(v, "would_stop_step", None) is not None:
                n["would_stop"] += 1
            if v.status != "stopped":
                continue
            if _manual(v):
                n["stopped_by_hand"] += 1
                continue
            n["stopped_by_detector"] += 1
            if v.planned_steps and v.last_step is not None and v.planned_steps > v.last_step:
                saved = v.planned_steps - v.last_step
                n["steps_saved"] += saved
                if v.ended_at is not None and v.last_step > 0:
                    n["hours_saved"] += saved * max(0.0, v.ended_at - v.created_at) / v.last_step / 3600
        return cls(**n)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

"""The information boundary: read-only job views with whitelisted fields.

Schedulers and overlays get :class:`JobView` objects. A view exposes only what a real platform
knows (type, GPUs, arrival, the duration *estimate*, progress, eval scores and loss history); asking
for anything else, such as the true duration or the hacking label, raises
:class:`InformationBoundaryError`, and views cannot be modified.
"""

from __future__ import annotations

from typing import Any

__all__ = ["InformationBoundaryError", "JobView", "VISIBLE_FIELDS"]

VISIBLE_FIELDS = (
    "job_id", "job_type", "rlhf", "gpus", "arrival_s", "est_duration_s", "progress", "running",
    "waiting_since", "evals_done", "eval_scores", "loss_history", "gpu_hours",
)


class InformationBoundaryError(AttributeError):
    """A policy tried to read a field it may not see."""


class JobView:
    """Read-only view of one simulated job for schedulers and overlays."""

    __slots__ = ("_JobView__job", "_JobView__sim")

    def __init__(self, job: Any, sim: Any) -> None:
        object.__setattr__(self, "_JobView__job", job)
        object.__setattr__(self, "_JobView__sim", sim)

    # visible, static
    @property
    def job_id(self) -> int:
        return self.__job.spec.job_id

    @property
    def job_type(self) -> str:
        return self.__job.spec.job_type

    @property
    def rlhf(self) -> bool:
        return self.__job.spec.rlhf

    @property
    def gpus(self) -> int:
        return self.__job.spec.gpus

    @property
    def arrival_s(self) -> float:
        return self.__job.spec.arrival_s

    @property
    def est_duration_s(self) -> float:
        return self.__job.spec.est_duration_s

    # visible, dynamic
    @property
    def progress(self) -> float:
        """Training steps done / planned steps, in [0, 1]."""
        return self.__job.progress(self.__sim.now)

    @property
    def running(self) -> bool:
        return self.__job.running

    @property
    def waiting_since(self) -> float:
        return self.__job.waiting_since

    @property
    def evals_done(self) -> int:
        return self.__job.evals_done

    @property
    def eval_scores(self) -> tuple[float, ...]:
        return tuple(self.__job.scores_seen)

    @property
    def loss_history(self) -> tuple[tuple[float, float], ...]:
        """(GPU-hours used so far, train loss) at each eval."""
        return tuple(self.__job.loss_history)

    @property
    def gpu_hours(self) -> float:
        return self.__job.gpu_seconds_at(self.__sim.now) / 3600.0

    def __getattr__(self, name: str) -> Any:
        raise InformationBoundaryError(
            f"{name!r} is not visible to scheduling policies; visible fields: {', '.join(VISIBLE_FIELDS)}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise InformationBoundaryError(f"job views are read-only (tried to set {name!r})")

    def __repr__(self) -> str:
        return f"JobView(job_id={self.job_id}, job_type={self.job_type!r}, gpus={self.gpus})"

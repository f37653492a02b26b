"""Base schedulers (policies). Each puts jobs in line for the GPUs; the engine's mechanism places
them in that order. Policies see only :class:`~platform_sim.views.JobSnapshot` records, never
advance time and never touch shared state.

A scheduler puts jobs in line in one of two ways:

* a **priority** (:meth:`Scheduler.priority`: a number per job, lower first, ties by job id) that the
  engine keeps jobs sorted by and updates only when a job changes, so planning costs O(changes)
  instead of a sort of every active job (FIFO, SJF-Est, SRTF-Est);
* an **order** (:meth:`Scheduler.order`) over snapshots of every job it plans for, for rules that
  rank jobs against each other or against the clock (LossAware).

Schedulers are registered in :data:`SCHEDULERS` and take their own parameters, checked against
their constructor's signature (a config names them as ``scheduler.<name>.<parameter>``)::

    >>> create_scheduler("loss_aware", round_s=600).round_s
    600.0
    >>> create_scheduler("fifo", round_s=600)
    Traceback (most recent call last):
    ...
    ValueError: Unknown parameter(s) round_s for scheduler 'fifo'; valid parameters are: backfill.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from evalstop_trl.core.registry import Registry

from .views import JobSnapshot

__all__ = ["SCHEDULERS", "Scheduler", "create_scheduler", "uses_priority"]


class Scheduler:
    """A base scheduling policy: override :meth:`priority` or :meth:`order`.

    A scheduler that overrides :meth:`priority` is planned by priority (incrementally); its
    :meth:`order` is then only the plain sort, kept for callers that want a list.

    Attributes:
        preemptive: may take GPUs from running jobs (the engine then re-plans over all active jobs).
        backfill: a non-preemptive scheduler may start later jobs when the first does not fit.
        round_s: preempt only at rounds of this length (None: at every planning point).
    """

    name = ""
    preemptive = False
    backfill = True
    round_s: float | None = None

    def priority(self, job: JobSnapshot) -> float:
        """The job's place in line: lower goes first, ties go to the lower job id.

        The engine asks once when a job starts waiting (a waiting job's snapshot does not change) and,
        for a preemptive scheduler, again for running jobs near the cut-off. So a running job's
        priority must never grow while it runs (SRTF's remaining time only shrinks); the engine
        re-evaluates a running job only when its last priority could still change the plan.
        """
        raise NotImplementedError(f"scheduler {self.name!r} orders jobs with order(), not priority()")

    def order(self, jobs: Sequence[JobSnapshot], now: float) -> list[JobSnapshot]:
        """Jobs in the order they should get GPUs (by default: by :meth:`priority`, then job id)."""
        priority = self.priority
        return sorted(jobs, key=lambda j: (priority(j), j.job_id))


def uses_priority(scheduler: Scheduler) -> bool:
    """True if ``scheduler`` ranks jobs by :meth:`Scheduler.priority` (the engine plans incrementally)."""
    return type(scheduler).priority is not Scheduler.priority


def _number(name: str, value: Any) -> float:
    """``value`` as a float, or ValueError unless it is a finite number (bool is not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, but got {name}={value!r}.")
    return float(value)


SCHEDULERS: Registry[Scheduler] = Registry("scheduler")


@SCHEDULERS.register()
class FIFO(Scheduler):
    """First in, first out; non-preemptive.

    Args:
        backfill: start later jobs when the first in line does not fit (production queues such as
            Slurm do); ``False`` is strict FIFO, which blocks the cluster behind a large gang.
    """

    name = "fifo"

    def __init__(self, backfill: bool = True) -> None:
        if not isinstance(backfill, bool):
            raise ValueError(f"backfill must be true or false, but got backfill={backfill!r}.")
        self.backfill = backfill

    def priority(self, job):
        return job.arrival_s


@SCHEDULERS.register()
class SJFEst(Scheduler):
    """Shortest estimated job first; non-preemptive."""

    name = "sjf_est"

    def priority(self, job):
        return job.est_duration_s


@SCHEDULERS.register()
class SRTFEst(Scheduler):
    """Shortest estimated remaining time first, ``est x (1 - progress)``; preemptive."""

    name = "srtf_est"
    preemptive = True

    def priority(self, job):
        return job.est_duration_s * (1.0 - job.progress)


def predicted_gain_per_gpu_hour(history: Sequence[tuple[float, float]]) -> float:
    """SLAQ-like prediction: the loss reduction per GPU-hour over the last two loss points."""
    (g0, l0), (g1, l1) = history[-2], history[-1]
    return (l0 - l1) / max(g1 - g0, 1e-9)


@SCHEDULERS.register()
class LossAware(Scheduler):
    """SLAQ-like: every ``round_s`` seconds GPUs go greedily to the jobs with the highest predicted
    loss reduction per GPU-hour. Jobs with fewer than two loss points rank first, then jobs waiting
    longer than ``promote_h`` hours (so flattened jobs are not starved forever).

    Args:
        round_s: length of a scheduling round (preemption happens only at rounds), > 0.
        promote_h: a job waiting longer than this ranks right after the new jobs, >= 0.
    """

    name = "loss_aware"
    preemptive = True

    def __init__(self, round_s: float = 300.0, promote_h: float = 4.0) -> None:
        self.round_s = _number("round_s", round_s)
        if self.round_s <= 0:
            raise ValueError(f"round_s must be > 0, but got round_s={round_s!r}.")
        self.promote_h = _number("promote_h", promote_h)
        if self.promote_h < 0:
            raise ValueError(f"promote_h must be >= 0, but got promote_h={promote_h!r}.")
        self.promote_s = self.promote_h * 3600.0
        # job_id -> (evals done when promoted, time promoted). A promotion lasts until the job's next
        # eval; otherwise a promoted job would run one round and be starved again for promote_h.
        self._promoted: dict[int, tuple[int, float]] = {}

    def order(self, jobs, now):
        def key(v: JobSnapshot):
            history = v.loss_history
            if len(history) < 2:
                return (0, v.arrival_s, 0.0, v.job_id)
            promoted = self._promoted.get(v.job_id)
            if promoted is not None and promoted[0] != v.evals_done:
                del self._promoted[v.job_id]
                promoted = None
            if promoted is None and not v.running and now - v.waiting_since > self.promote_s:
                promoted = self._promoted[v.job_id] = (v.evals_done, now)
            if promoted is not None:
                return (1, promoted[1], 0.0, v.job_id)
            return (2, 0.0, -predicted_gain_per_gpu_hour(history), v.job_id)

        return sorted(jobs, key=key)


def create_scheduler(name: str, /, **params: Any) -> Scheduler:
    """Build a registered scheduler.

    Args:
        name: one of ``fifo``, ``sjf_est``, ``srtf_est``, ``loss_aware``.
        **params: the scheduler's parameters (``FIFO(backfill)``, ``LossAware(round_s, promote_h)``).

    Raises:
        ValueError: unknown name or parameter (the message lists the valid ones), or a bad value.
    """
    return SCHEDULERS.create(name, **params)

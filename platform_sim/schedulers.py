"""Base schedulers (policies). Each puts jobs in line for the GPUs; the engine's mechanism places
them in that order. Policies see only :class:`~platform_sim.views.JobSnapshot` records, never
advance time and never touch shared state.

A scheduler puts jobs in line in one of three ways:

* a **priority** (:meth:`Scheduler.priority`: a number per job, lower first, ties by job id) that the
  engine keeps jobs sorted by and updates only when a job changes, so planning costs O(changes)
  instead of a sort of every active job (FIFO, SJF-Est, SRTF-Est);
* an **order** (:meth:`Scheduler.order`) over snapshots of every job it plans for, for rules that
  rank jobs against each other or against the clock (LossAware, Tiresias);
* an **assignment** (:meth:`Scheduler.assign`): which jobs run and on which pool (GPU type), for
  rules that place jobs on a mixed cluster themselves (Gavel).

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
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from evalstop_trl.core.registry import Registry

from .config import ClusterConfig
from .views import JobSnapshot

__all__ = ["SCHEDULERS", "Scheduler", "assigns_pools", "changes_while_running", "check_rounds", "create_scheduler", "uses_priority"]


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

    def assign(self, jobs: Sequence[JobSnapshot], now: float, cluster: ClusterConfig) -> list[tuple[int, str]]:
        """For a scheduler that chooses each job's pool (GPU type) itself: ``(job id, pool)`` of the jobs
        to run from now, in the order to place them (``cluster.pool_list()`` names the pools; ``""`` is
        the uniform cluster's one). At a round (or any plan of a scheduler without rounds) a running
        job not listed, or listed on another pool, is preempted (and moved); between rounds only
        waiting jobs start. A listed job that does not fit its pool now waits. The engine does not ask
        when the answer cannot change anything: when nobody waits (at a round too, on a uniform
        cluster, where every running job fits), and between rounds when no GPU is free; time a job
        ran is for the scheduler to count from ``now`` between calls."""
        raise NotImplementedError(f"scheduler {self.name!r} does not assign pools")

    def change_after_s(self, job: JobSnapshot) -> float | None:
        """For an :meth:`order` scheduler whose order moves a running job by itself as it runs (a
        demotion): the seconds of running, from ``job``'s snapshot, after which its place changes
        next (None: never). The engine plans again at that instant (a RESCHEDULE event), so the
        change takes effect when it happens, not at the next arrival or eval."""
        return None


def changes_while_running(scheduler: Scheduler) -> bool:
    """True if ``scheduler`` overrides :meth:`Scheduler.change_after_s` (the engine then queues its events)."""
    return type(scheduler).change_after_s is not Scheduler.change_after_s


def check_rounds(scheduler: Scheduler, restart_s: float) -> None:
    """ValueError unless a preemptive scheduler's rounds outlast a restart: a job resumed at one
    round and preempted at the next would otherwise never make progress (the run would not end)."""
    if scheduler.preemptive and scheduler.round_s is not None and scheduler.round_s <= restart_s:
        raise ValueError(f"round_s ({scheduler.round_s:g} s) must be longer than workload.restart_overhead_s "
                         f"({restart_s:g} s): a job resumed at one round and preempted at the next would make no "
                         "progress; raise round_s or lower restart_overhead_s.")


def assigns_pools(scheduler: Scheduler) -> bool:
    """True if ``scheduler`` places jobs itself (:meth:`Scheduler.assign`)."""
    return type(scheduler).assign is not Scheduler.assign


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


#: attained service within this many GPU-seconds of a threshold counts as past it (a RESCHEDULE
#: event lands on the threshold up to rounding; without the margin it would be queued again at once)
_AT_THRESHOLD = 1e-6


@SCHEDULERS.register()
class Tiresias(Scheduler):
    """Tiresias' discretised two-dimensional LAS (Gu et al., NSDI'19; ``SymbioticLab/Tiresias``):
    a job's *attained service* is the GPU-seconds it has held (GPUs x time, as the snapshot's
    ``gpu_hours``); queue ``i`` holds the jobs whose attained service has passed ``i`` of the
    ``thresholds``; lower queues go first, FIFO by arrival within a queue; preemptive. A running job
    is demoted the instant its service crosses a threshold (a RESCHEDULE event), and may then lose its
    GPUs to a job of a lower queue, arrivals included (they start in queue 0).

    Args:
        thresholds: the queue limits in GPU-seconds, increasing (Tiresias' defaults: 3250, 7200, 18000).
        promote_knob: Tiresias' starvation guard: a waiting job whose time waiting since it last ran
            reaches ``promote_knob`` times its running time in its current queue goes back to queue 0
            with its attained service counted from then on; None: off. A promotion is decided at the
            planning points (arrivals, evals, departures, demotions), not by an event of its own.
    """

    name = "tiresias"
    preemptive = True

    def __init__(self, thresholds: Sequence[float] = (3250.0, 7200.0, 18000.0), promote_knob: float | None = None
                 ) -> None:
        if isinstance(thresholds, (str, bytes)) or not isinstance(thresholds, Sequence) or not thresholds:
            raise ValueError(f"thresholds must be a non-empty list of GPU-seconds, but got thresholds={thresholds!r}.")
        limits = tuple(_number("every threshold", t) for t in thresholds)
        if limits[0] <= 0 or any(b <= a for a, b in zip(limits, limits[1:], strict=False)):
            raise ValueError(f"thresholds must be positive and increasing, but got thresholds={list(thresholds)!r}.")
        self.thresholds = limits
        if promote_knob is not None:
            promote_knob = _number("promote_knob", promote_knob)
            if promote_knob <= 0:
                raise ValueError(f"promote_knob must be > 0 (or null: off), but got promote_knob={promote_knob!r}.")
        self.promote_knob = promote_knob
        self._since: dict[int, float] = {}  # job id -> attained GPU-seconds when it was last promoted

    def service(self, job: JobSnapshot) -> float:
        """Attained service in GPU-seconds (counted from the job's last promotion)."""
        return job.gpu_hours * 3600.0 - self._since.get(job.job_id, 0.0)

    def queue(self, job: JobSnapshot) -> int:
        """The job's queue by attained service (0: below the first threshold)."""
        return bisect_right(self.thresholds, self.service(job) + _AT_THRESHOLD)

    def order(self, jobs, now):
        knob, queue, service = self.promote_knob, self.queue, self.service

        def key(v: JobSnapshot):
            q = queue(v)
            if q and knob is not None and not v.running and now - v.waiting_since >= knob * service(v) / v.gpus:
                self._since[v.job_id] = v.gpu_hours * 3600.0
                q = 0
            return (q, v.arrival_s, v.job_id)

        return sorted(jobs, key=key)

    def change_after_s(self, job):
        q = self.queue(job)
        if q == len(self.thresholds):
            return None
        return (self.thresholds[q] - self.service(job)) / job.gpus


@SCHEDULERS.register()
class Gavel(Scheduler):
    """Gavel's heterogeneity-aware max-min fairness (Narayanan et al., OSDI'20;
    ``stanford-futuredata/gavel``): the allocation ``X[job, pool]`` of :mod:`platform_sim.allocation`
    (an LP over each job's speed on each pool, recomputed when the set of active jobs changes), then
    Gavel's round-based mechanism: every ``round_s`` seconds each (job, pool) pair gets the priority
    ``X / f``, ``f`` the fraction of its time in the system the job has run on that pool (no time yet:
    infinite), ties broken by the deficit ``X * time - time there``, then ``X``, then job id; pools
    are filled in turn, fastest first (``cluster.speeds``; Gavel walks its worker types in its
    cluster's order, fastest first), each taking its pairs in priority order while its GPUs last, a
    job placed at most once. A job that keeps its pool keeps running; one that changes pool is
    preempted and resumes there (paying ``restart_overhead_s``). Between rounds, freed GPUs go to
    waiting jobs by the same order (work-conserving). On a uniform cluster this is max-min fair time
    sharing of one pool (water-filling, no solver); a mixed cluster needs scipy
    (``pip install 'evalstop[gavel]'``).

    Args:
        round_s: the round length (Gavel's 360 s), > 0.
    """

    name = "gavel"
    preemptive = True

    def __init__(self, round_s: float = 360.0) -> None:
        self.round_s = _number("round_s", round_s)
        if self.round_s <= 0:
            raise ValueError(f"round_s must be > 0, but got round_s={round_s!r}.")
        from .allocation import max_min_allocation

        self._solve = max_min_allocation
        self._last = 0.0
        self._ran: dict[tuple[int, str], float] = {}  # (job id, pool) -> seconds run there
        self._active: frozenset[int] = frozenset()
        self._x: dict[tuple[int, str], float] = {}

    def assign(self, jobs, now, cluster):
        pools = cluster.pool_list()
        names = [name for name, _ in pools]
        dt, self._last = now - self._last, now
        ran = self._ran
        for v in jobs:
            if v.running:
                key = (v.job_id, v.pool)
                ran[key] = ran.get(key, 0.0) + dt
        active = frozenset(v.job_id for v in jobs)
        if active != self._active:
            self._active = active
            self._x = self._allocate(jobs, cluster, names)
            self._ran = ran = {k: s for k, s in ran.items() if k[0] in active}
        order = sorted(range(len(names)), key=lambda i: -cluster.speeds.get(names[i], 0.0))  # stable: ties in config order
        size = {name: p.gpus for name, p in pools}
        free = dict(size)
        placed: set[int] = set()
        plan: list[tuple[int, str]] = []
        for i in order:
            pool = names[i]
            entries = []
            for v in jobs:
                if v.gpus > size[pool]:
                    continue  # the gang never fits this pool
                x = self._x.get((v.job_id, pool), 0.0)
                elapsed, got = now - v.arrival_s, ran.get((v.job_id, pool), 0.0)
                prio = x * elapsed / got if got > 0 and elapsed > 0 else (math.inf if x > 0 else 0.0)
                entries.append((-prio, got - x * elapsed, -x, v.job_id, v.gpus))
            entries.sort()
            for *_, jid, g in entries:
                if jid not in placed and g <= free[pool]:
                    free[pool] -= g
                    placed.add(jid)
                    plan.append((jid, pool))
        return plan

    def _allocate(self, jobs, cluster: ClusterConfig, names: list[str]) -> dict[tuple[int, str], float]:
        import numpy as np

        throughput = np.array([[cluster.speed(name, v.job_type) for name in names] for v in jobs])
        gpus = np.array([v.gpus for v in jobs])
        capacity = np.array([p.gpus for _, p in cluster.pool_list()])
        x, _ = self._solve(throughput.reshape(len(jobs), len(names)), gpus, capacity)
        return {(v.job_id, name): float(x[j, r]) for j, v in enumerate(jobs) for r, name in enumerate(names)}


def create_scheduler(name: str, /, **params: Any) -> Scheduler:
    """Build a registered scheduler.

    Args:
        name: one of ``fifo``, ``sjf_est``, ``srtf_est``, ``loss_aware``, ``tiresias``, ``gavel``.
        **params: the scheduler's parameters (``FIFO(backfill)``, ``LossAware(round_s, promote_h)``,
            ``Tiresias(thresholds, promote_knob)``, ``Gavel(round_s)``).

    Raises:
        ValueError: unknown name or parameter (the message lists the valid ones), or a bad value.
    """
    return SCHEDULERS.create(name, **params)

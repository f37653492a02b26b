"""Discrete-event engine: one simulated run of one workload under one base scheduler and one overlay.

The loop, one instant at a time (:meth:`Simulation.step`): pop every event due now from the
:class:`~platform_sim.events.EventQueue` and apply it (arrivals, evals, finishes, scheduling
rounds), then plan once (:class:`~platform_sim.dispatch.Dispatcher`): the base scheduler's order
(policy) -> placement on the :class:`~platform_sim.cluster.Cluster` (gang: all GPUs or none) ->
apply (start, preempt). Jobs' mutable state and lifecycle live in :mod:`platform_sim.jobs`; policies
see only :class:`~platform_sim.views.JobSnapshot` records (values copied out) and overlays read the
time from a :class:`~platform_sim.views.VirtualClock`.

Planning is incremental for schedulers with a priority (:mod:`platform_sim.planning`): waiting jobs
stay sorted, and a preemptive plan re-evaluates only the running jobs whose priority could still
matter, so a run's cost grows with its events, not with events x active jobs (100,000 jobs on
32,000 GPUs: ~1.1M events in seconds). Other schedulers get snapshots of every job they plan for.

Example::

    >>> from platform_sim.config import load_config
    >>> from platform_sim.overlays import create_overlay
    >>> from platform_sim.schedulers import create_scheduler
    >>> from platform_sim.workload import generate_workload
    >>> cfg = load_config().replace(**{"workload.n_jobs": 20})
    >>> wl = generate_workload(cfg, seed=0)
    >>> res = Simulation(wl, cfg, create_scheduler("fifo"), create_overlay("none", wl)).run()
    >>> len(res.outcomes), all(o.completed for o in res.outcomes)
    (20, True)
"""

from __future__ import annotations

import gc
import inspect
from dataclasses import dataclass
from heapq import heappop as _heappop

from .cluster import cluster_for
from .config import SimConfig
from .dispatch import Dispatcher
from .events import Event, EventQueue
from .jobs import Phase, SimJob, Timing
from .overlays import Overlay, eval_hook_name
from .schedulers import Scheduler, check_rounds
from .views import VirtualClock
from .workload import Workload

__all__ = ["JobOutcome", "RunResult", "Simulation"]

# bound once: Enum member lookups are slow on the hot path
_EVAL_DUE, _ARRIVAL, _SCHED_ROUND, _RESCHEDULE = Event.EVAL_DUE, Event.ARRIVAL, Event.SCHED_ROUND, Event.RESCHEDULE
_RUNNING = Phase.RUNNING


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What happened to one job in one run (the metrics add ground truth)."""

    job_id: int
    arrival_s: float
    first_start_s: float
    departure_s: float
    completed: bool  # ran to its planned end
    stopped: bool  # stopped before its planned end (flagged)
    gpu_seconds: float
    overhead_gpu_seconds: float  # evals, checkpoints, restarts
    work_done: float
    evals_done: int
    best_eval: int  # index of the best observed eval score (0: none)
    delivered_progress: float  # progress of the delivered checkpoint
    restarts: int
    ref_gpu_seconds: float  # GPU-seconds held in reference GPUs (pool speed x seconds; gpu_seconds if uniform)

    @property
    def jct_s(self) -> float:
        return self.departure_s - self.arrival_s


@dataclass(frozen=True)
class RunResult:
    scheduler: str
    overlay: str
    is_oracle: bool
    seed: int
    outcomes: tuple[JobOutcome, ...]
    makespan_s: float
    events: int
    total_gpus: int
    pool_gpu_seconds: tuple[tuple[str, float], ...] = ()  # GPU-seconds held per pool (mixed clusters)


class Simulation:
    """One run of one workload under one base scheduler and one overlay.

    The event loop and the events' effects on jobs; who holds the GPUs is the
    :class:`~platform_sim.dispatch.Dispatcher`'s (``dispatch``; ``waiting``, ``running`` and
    ``cluster`` are its own)."""

    def __init__(self, workload: Workload, cfg: SimConfig, scheduler: Scheduler, overlay: Overlay) -> None:
        self.workload, self.cfg, self.scheduler, self.overlay = workload, cfg, scheduler, overlay
        check_rounds(scheduler, cfg.workload.restart_overhead_s)
        self.queue = EventQueue()
        self.clock = VirtualClock()  # the overlays' copy of the time, set at every instant
        n = workload.n_evals
        self.jobs = [SimJob(s, t, Timing.of_truth(t, cfg, n)) for s, t in zip(workload.jobs, workload.truths, strict=True)]
        self.dispatch = Dispatcher(self.jobs, cluster_for(cfg.cluster, {s.job_type for s in workload.jobs}), scheduler, self.queue,
                                   cfg.workload.restart_overhead_s, cfg.cluster)
        self.cluster, self.waiting, self.running = self.dispatch.cluster, self.dispatch.waiting, self.dispatch.running
        self._schedule_next = self.dispatch.schedule_next
        self.events = 0
        self.departed = 0
        self._arrival_order = sorted(self.jobs, key=lambda j: j.spec.arrival_s)  # stable: ties by job id
        self._next_arrival = 0
        # overlays that do not override a hook are not called (no snapshot is built for them)
        kind = type(overlay)
        self._watch_arrivals = kind.on_arrival is not Overlay.on_arrival
        hook = eval_hook_name(kind)
        self._eval_hook = getattr(overlay, hook) if hook else None
        self._eval_snapshot = hook == "on_eval"
        # per-example evidence only to a hook that asks for it and takes it (a subclass may override the hook
        # with the plain signature)
        self._evidence = (bool(getattr(overlay, "wants_evidence", False)) and _takes_evidence(self._eval_hook)
                          and any(t.eval_n for t in workload.truths[:1]))  # per-example evals: all jobs or none
        self._cuts = kind.cut_progress is not Overlay.cut_progress

    @property
    def now(self) -> float:
        return self.queue.now

    # ------------------------------------------------------------------ the loop
    def run(self) -> RunResult:
        """Run to the last departure and return the result.

        The cyclic garbage collector is paused meanwhile, the result's records included (and
        restored after): the engine makes no reference cycles, and at 100,000 jobs full collections
        over the coordinator's growing store took about a third of the run; building the result's
        records with it on took a sixth of a 50,000-job run."""
        paused = gc.isenabled()
        gc.disable()
        try:
            self.overlay.attach(self.clock, self.workload.n_evals)
            self._push_next_arrival()
            if self.scheduler.round_s:
                self.queue.push(self.scheduler.round_s, _SCHED_ROUND)
            heap, n_jobs = self.queue.heap, len(self.jobs)
            while heap and self.departed < n_jobs:
                self.step()
            return self._result()
        finally:
            if paused:
                gc.enable()

    def _push_next_arrival(self) -> None:
        """Arrivals are queued one at a time, in (time, job id) order: the heap holds about one event
        per running job instead of one per job (a queue of all arrivals pops them in the same order)."""
        order = self._arrival_order
        if self._next_arrival < len(order):
            job = order[self._next_arrival]
            self._next_arrival += 1
            self.queue.push(job.spec.arrival_s, _ARRIVAL, job.spec.job_id)

    def step(self) -> None:
        """One instant: apply every event due now (in queue order, including events queued for this
        same instant meanwhile), then plan once if anything changed."""
        queue, jobs = self.queue, self.jobs
        heap = queue.heap
        t = queue.now = self.clock.now = heap[0][0]
        replan = round_now = False
        n = 0
        while heap and heap[0][0] == t:
            _, kind, _, jid, version = _heappop(heap)
            n += 1
            if kind is _EVAL_DUE:
                job = jobs[jid]
                if version == job.version and job.phase is _RUNNING:  # else stale: it left its GPUs since
                    replan |= self._on_eval(job)
            elif kind is _ARRIVAL:
                self._push_next_arrival()
                self._on_arrival(jobs[jid])
                replan = True
            elif kind is _SCHED_ROUND:
                round_now = replan = True
                queue.push(t + self.scheduler.round_s, _SCHED_ROUND)
            elif kind is _RESCHEDULE:  # a running job's place in line changed (stale if it left its GPUs)
                job = jobs[jid]
                if version == job.version and job.phase is _RUNNING:
                    round_now = replan = True
                    self.dispatch.schedule_change(job)
            else:  # FINISH: the work left before an oracle cut is done
                job = jobs[jid]
                if version == job.version and job.phase is _RUNNING:
                    self._depart(job, stopped=True)
                    replan = True
        self.events += n
        if replan:
            self._plan(allow_preempt=self.scheduler.round_s is None or round_now)

    # ------------------------------------------------------------------ events
    def _on_arrival(self, job: SimJob) -> None:
        job.arrive()
        self.dispatch.wait(job)
        if self._watch_arrivals:
            self.overlay.on_arrival(job.snapshot(self.queue.now))
        if self._cuts:
            cut = self.overlay.cut_progress(job.spec.job_id)
            if cut is not None and cut < 1.0:
                job.end_work = job.timing.work_at(cut)

    def _on_eval(self, job: SimJob) -> bool:
        """Returns True if the job left the cluster."""
        now = self.queue.now
        i = job.next_eval
        timing = job.timing
        job.work = i * timing.seg_len
        job.run_since = now  # work is exact at this instant
        job.evals_done = i
        job.next_eval = i + 1
        job.eval_weight += 1.0 / job.speed
        truth = job.truth
        score, loss = truth.scores[i - 1], truth.losses[i - 1]
        job.scores_seen += (score,)
        job.loss_history += (((job.gpu_seconds + (now - job.started_at) * job.spec.gpus) / 3600.0, loss),)
        if score > job.best_score:
            job.best_score, job.best_eval = score, i
        hook = self._eval_hook
        if hook is None:
            stop = False
        elif self._evidence:  # per-example evals: their n and paired noise level (NaN: none)
            noise = truth.eval_noise[i - 1]
            stop = hook(job.snapshot(now) if self._eval_snapshot else job.spec.job_id, i, score, loss,
                        truth.proxies[i - 1], eval_n=truth.eval_n, eval_noise=None if noise != noise else noise)
        else:
            stop = hook(job.snapshot(now) if self._eval_snapshot else job.spec.job_id, i, score, loss,
                        truth.proxies[i - 1])
        if i >= timing.n:
            self._depart(job, stopped=False)
            return True
        if stop or job.work >= job.end_work - 1e-9:
            self._depart(job, stopped=True)
            return True
        self._schedule_next(job)
        return False

    # ------------------------------------------------------------------ plan -> place -> apply
    def _plan(self, allow_preempt: bool) -> None:
        self.dispatch.plan(allow_preempt)

    def _depart(self, job: SimJob, stopped: bool) -> None:
        self.dispatch.leave(job)
        job.depart(self.queue.now, stopped)
        self.departed += 1

    # ------------------------------------------------------------------ result
    def _result(self) -> RunResult:
        outcomes = []
        for j in self.jobs:
            if j.stopped and j.end_work < j.timing.total_work and j.work >= j.end_work - 1e-6:
                delivered = j.timing.progress_of(j.end_work)  # oracle cut: the state at the cut
            else:
                delivered = self.workload.eval_progress(j.best_eval) if j.best_eval else 0.0
            outcomes.append(JobOutcome(
                job_id=j.spec.job_id, arrival_s=j.spec.arrival_s, first_start_s=j.first_start,
                departure_s=j.departure, completed=j.completed, stopped=j.stopped, gpu_seconds=j.gpu_seconds,
                overhead_gpu_seconds=j.ovh_seconds + j.spec.gpus * j.timing.seg_eval * j.eval_weight,
                work_done=j.work, evals_done=j.evals_done, best_eval=j.best_eval,
                delivered_progress=delivered, restarts=j.restarts, ref_gpu_seconds=j.ref_gpu_seconds,
            ))
        makespan = max(o.departure_s for o in outcomes)
        return RunResult(self.scheduler.name, self.overlay.name, self.overlay.is_oracle, self.workload.seed,
                         tuple(outcomes), makespan, self.events, self.cluster.total_gpus,
                         tuple(self.dispatch.pool_gpu_seconds.items()))


def _takes_evidence(hook) -> bool:
    """Whether an eval hook accepts the ``eval_n`` and ``eval_noise`` keywords."""
    if hook is None:
        return False
    try:
        params = inspect.signature(hook).parameters
    except (TypeError, ValueError):
        return False
    return all(n in params for n in ("eval_n", "eval_noise")) or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

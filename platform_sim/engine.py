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

import numpy as np

from .cluster import cluster_for
from .config import SimConfig
from .dispatch import Dispatcher
from .events import Event, EventQueue
from .jobs import PHASES, JobTable, Phase
from .overlays import Overlay, eval_hook_name
from .schedulers import Scheduler, check_rounds
from .views import VirtualClock
from .workload import Workload

__all__ = ["JobOutcome", "RunResult", "Simulation"]

# bound once: Enum member lookups are slow on the hot path
_EVAL_DUE, _ARRIVAL, _SCHED_ROUND, _RESCHEDULE = Event.EVAL_DUE, Event.ARRIVAL, Event.SCHED_ROUND, Event.RESCHEDULE
_COMPLETED, _STOPPED = Phase.COMPLETED, Phase.STOPPED


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

    The event loop and the events' effects on jobs; the jobs' state is the :class:`~platform_sim.jobs.JobTable`
    (``table``: columns indexed by job id); who holds the GPUs is the
    :class:`~platform_sim.dispatch.Dispatcher`'s (``dispatch``; ``waiting``, ``running`` and ``cluster``
    are its own)."""

    def __init__(self, workload: Workload, cfg: SimConfig, scheduler: Scheduler, overlay: Overlay) -> None:
        self.workload, self.cfg, self.scheduler, self.overlay = workload, cfg, scheduler, overlay
        check_rounds(scheduler, cfg.workload.restart_overhead_s)
        self.queue = EventQueue()
        self.clock = VirtualClock()  # the overlays' copy of the time, set at every instant
        self.table = JobTable(workload, cfg)
        self.dispatch = Dispatcher(self.table, cluster_for(cfg.cluster, workload.type_names), scheduler, self.queue,
                                   cfg.workload.restart_overhead_s, cfg.cluster)
        self.cluster, self.waiting, self.running = self.dispatch.cluster, self.dispatch.waiting, self.dispatch.running
        self._queue_next = self.dispatch.queue_next
        self.events = 0
        self.departed = 0
        self._arrival_order = np.argsort(workload.arrival_s, kind="stable").tolist()  # ties by job id
        self._next_arrival = 0
        # overlays that do not override a hook are not called (no snapshot is built for them)
        kind = type(overlay)
        self._watch_arrivals = kind.on_arrival is not Overlay.on_arrival
        hook = eval_hook_name(kind)
        self._eval_hook = getattr(overlay, hook) if hook else None
        self._eval_snapshot = hook == "on_eval"
        # per-example evidence only to a hook that asks for it and takes it (a subclass may override the hook
        # with the plain signature); per-example evals: all jobs or none
        self._evidence = (bool(getattr(overlay, "wants_evidence", False)) and _takes_evidence(self._eval_hook)
                          and len(workload) > 0 and bool(workload.eval_n[0]))
        self._eval_n = workload.eval_n.tolist() if self._evidence else []
        self._eval_noise = memoryview(workload.eval_noise.reshape(-1))
        self._proxies = memoryview(workload.proxies.reshape(-1))
        self._cuts = kind.cut_progress is not Overlay.cut_progress

    @property
    def now(self) -> float:
        return self.queue.now

    # ------------------------------------------------------------------ the loop
    def run(self) -> RunResult:
        """Run to the last departure and return the result.

        The cyclic garbage collector is paused meanwhile, the result's records included (and restored
        after). The engine makes no reference cycles, but the EvalStop overlay's coordinator keeps
        every job's records: with the collector on, its full collections over that growing store took 40%
        of a 100,000-job run's CPU time (32.8 s against 19.6 s, BENCHMARKS.md, 2026-12-05)."""
        paused = gc.isenabled()
        gc.disable()
        try:
            self.overlay.attach(self.clock, self.workload.n_evals)
            self._push_next_arrival()
            if self.scheduler.round_s:
                self.queue.push(self.scheduler.round_s, _SCHED_ROUND)
            heap, n_jobs, step = self.queue.heap, self.table.n, self.step
            while heap and self.departed < n_jobs:
                step()
            return self._result()
        finally:
            if paused:
                gc.enable()

    def _push_next_arrival(self) -> None:
        """Arrivals are queued one at a time, in (time, job id) order: the heap holds about one event
        per running job instead of one per job (a queue of all arrivals pops them in the same order)."""
        order = self._arrival_order
        if self._next_arrival < len(order):
            j = order[self._next_arrival]
            self._next_arrival += 1
            self.queue.push(self.table.arrival_s[j], _ARRIVAL, j)

    def step(self) -> None:
        """One instant: apply every event due now (in queue order, including events queued for this
        same instant meanwhile), then plan once if anything changed. An event of a job is stale when the job
        has left its GPUs since it was queued (its version is no longer the event's): it is counted, not
        applied."""
        queue, clock, version = self.queue, self.clock, self.table.version
        replan = round_now = False
        n = 0
        for t, kind, _, j, v in queue.pop_due():
            clock.now = t
            n += 1
            if kind is _EVAL_DUE:
                if v == version[j]:  # else stale: it left its GPUs since
                    replan |= self._on_eval(j, v, t)
            elif kind is _ARRIVAL:
                self._push_next_arrival()
                self._on_arrival(j)
                replan = True
            elif kind is _SCHED_ROUND:
                round_now = replan = True
                queue.push(t + self.scheduler.round_s, _SCHED_ROUND)
            elif kind is _RESCHEDULE:  # a running job's place in line changed (stale if it left its GPUs)
                if v == version[j]:
                    round_now = replan = True
                    self.dispatch.schedule_change(j)
            elif v == version[j]:  # FINISH: the work left before an oracle cut is done
                self._depart(j, stopped=True)
                replan = True
        self.events += n
        if replan:
            self._plan(allow_preempt=self.scheduler.round_s is None or round_now)

    # ------------------------------------------------------------------ events
    def _on_arrival(self, j: int) -> None:
        table = self.table
        table.arrive(j)
        self.dispatch.wait(j)
        if self._watch_arrivals:
            self.overlay.on_arrival(table.snapshot(j, self.queue.now))
        if self._cuts:
            cut = self.overlay.cut_progress(j)
            if cut is not None and cut < 1.0:
                table.end_work[j] = table.work_at_progress(j, cut)

    def _on_eval(self, j: int, version: int, now: float) -> bool:
        """Eval ``next_eval[j]`` of the running job ``j`` (at ``version``) is done ``now``. Returns True if the
        job left the cluster."""
        table = self.table
        i = table.next_eval[j]
        table.next_eval[j] = i + 1
        seg_len, speed = table.seg_len[j], table.speed[j]
        work = table.work[j] = i * seg_len
        table.run_since[j] = now  # work is exact at this instant
        table.eval_weight[j] += 1.0 / speed
        k = j * table.n_evals + i - 1
        score = table.scores[k]
        table.eval_gpu_hours[k] = (table.gpu_seconds[j] + (now - table.started_at[j]) * table.gpus[j]) / 3600.0
        if score > table.best_score[j]:
            table.best_score[j], table.best_eval[j] = score, i
        hook = self._eval_hook
        if hook is None:
            stop = False
        else:
            job = table.snapshot(j, now) if self._eval_snapshot else j
            if self._evidence:  # per-example evals: their n and paired noise level (NaN: none)
                noise = self._eval_noise[k]
                stop = hook(job, i, score, table.losses[k], self._proxies[k], eval_n=self._eval_n[j],
                            eval_noise=None if noise != noise else noise)
            else:
                stop = hook(job, i, score, table.losses[k], self._proxies[k])
        if i >= table.n_evals:
            self._depart(j, stopped=False)
            return True
        end_work = table.end_work[j]
        if stop or work >= end_work - 1e-9:
            self._depart(j, stopped=True)
            return True
        self._queue_next(j, now, work, (i + 1) * seg_len, end_work, speed, version)
        return False

    # ------------------------------------------------------------------ plan -> place -> apply
    def _plan(self, allow_preempt: bool) -> None:
        self.dispatch.plan(allow_preempt)

    def _depart(self, j: int, stopped: bool) -> None:
        self.dispatch.leave(j)
        self.table.depart(j, self.queue.now, stopped)
        self.departed += 1

    # ------------------------------------------------------------------ result
    def _result(self) -> RunResult:
        table, eval_progress = self.table, self.workload.eval_progress
        stopped_code, completed_code = PHASES.index(_STOPPED), PHASES.index(_COMPLETED)
        columns = table.columns("phase", "end_work", "work", "best_eval", "first_start", "departure", "gpu_seconds",
                                "ovh_seconds", "eval_weight", "next_eval", "restarts", "ref_gpu_seconds")
        fixed = (table.arrival_s.tolist(), table.total_work.tolist(), table.seg_eval.tolist(), table.gpus)
        outcomes = []
        for j, (phase, end_work, work, best, first, departure, gpu_seconds, ovh, weight, next_eval, restarts, ref,
                arrival, total, seg_eval, gpus) in enumerate(zip(*columns, *fixed, strict=True)):
            stopped = phase == stopped_code
            if stopped and end_work < total and work >= end_work - 1e-6:
                delivered = table.progress_of(j, end_work)  # oracle cut: the state at the cut
            else:
                delivered = eval_progress(best) if best else 0.0
            outcomes.append(JobOutcome(j, arrival, first, departure, phase == completed_code, stopped, gpu_seconds,
                                       ovh + gpus * seg_eval * weight, work, next_eval - 1, best, delivered, restarts,
                                       ref))
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

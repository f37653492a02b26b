"""Discrete-event engine: one clock, a heap of (time, priority, seq, event), lazy progress.

Loop: pop every event due at the current time, apply it (arrivals, evals, finishes, rounds), then
plan once: base scheduler order -> placement (gang: all GPUs or none) -> apply (start, preempt).
Stale events (of a job preempted or stopped since) are discarded by a per-job version counter.

A job's work is a sequence of ``n`` segments, each ``D/n`` seconds of training followed by one eval
(``eval_overhead_frac * D / n`` plus a checkpoint write). The last eval ends the job. Resuming after
preemption costs ``restart_overhead_s`` with no progress.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from enum import IntEnum

from .config import SimConfig
from .overlays import Overlay
from .schedulers import Scheduler
from .views import JobView
from .workload import JobSpec, JobTruth, Workload

__all__ = ["Event", "JobOutcome", "RunResult", "Simulation", "Timing"]


class Event(IntEnum):
    """Event kinds; the value is the priority at equal times (lower first).

    There is no RESTART_DONE event: a resumed job's restart overhead is folded into the time of its
    next EVAL_DUE or FINISH (work accrues only from ``run_since``), which saves one event per resume."""

    EVAL_DUE = 0
    FINISH = 1
    ARRIVAL = 3
    SCHED_ROUND = 4


@dataclass(frozen=True, slots=True)
class Timing:
    """Work layout of one job (seconds of exclusive GPU time)."""

    duration_s: float
    n: int
    seg_train: float
    seg_eval: float
    seg_len: float
    total_work: float

    @classmethod
    def of(cls, duration_s: float, cfg: SimConfig, n: int) -> Timing:
        w = cfg.workload
        seg_train = duration_s / n
        seg_eval = w.eval_overhead_frac * seg_train + w.checkpoint_s
        return cls(duration_s, n, seg_train, seg_eval, seg_train + seg_eval, n * (seg_train + seg_eval))

    def work_at(self, p: float) -> float:
        """Work done when training progress first reaches ``p`` (p=1 includes the last eval)."""
        if p >= 1.0:
            return self.total_work
        c = math.floor(p * self.n)
        return c * self.seg_len + (p * self.duration_s - c * self.seg_train)

    def progress_of(self, work: float) -> float:
        c = work // self.seg_len
        if c >= self.n:
            return 1.0
        inside = work - c * self.seg_len
        if inside > self.seg_train:
            inside = self.seg_train
        return (c * self.seg_train + inside) / self.duration_s


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


class _Job:
    __slots__ = (
        "spec", "timing", "end_work", "work", "running", "run_since", "started_at", "ever_started",
        "version", "next_eval", "evals_done", "scores_seen", "loss_history", "gpu_seconds", "ovh_seconds",
        "waiting_since", "first_start", "departure", "completed", "stopped", "best_eval", "best_score",
        "restarts", "view", "truth", "restart_until",
    )

    def __init__(self, spec: JobSpec, truth: JobTruth, timing: Timing) -> None:
        self.spec, self.truth, self.timing = spec, truth, timing
        self.end_work = timing.total_work
        self.work = 0.0
        self.running = False
        self.run_since = self.started_at = self.restart_until = 0.0
        self.ever_started = False
        self.version = 0
        self.next_eval = 1
        self.evals_done = 0
        self.scores_seen: list[float] = []
        self.loss_history: list[tuple[float, float]] = []
        self.gpu_seconds = self.ovh_seconds = 0.0
        self.waiting_since = spec.arrival_s
        self.first_start = math.nan
        self.departure = math.nan
        self.completed = self.stopped = False
        self.best_eval = 0
        self.best_score = -math.inf
        self.restarts = 0

    def work_at(self, t: float) -> float:
        if not self.running:
            return self.work
        return self.work + max(0.0, t - self.run_since)

    def progress(self, t: float) -> float:
        return self.timing.progress_of(self.work_at(t))

    def gpu_seconds_at(self, t: float) -> float:
        held = (t - self.started_at) if self.running else 0.0
        return self.gpu_seconds + held * self.spec.gpus


class Simulation:
    """One run of one workload under one base scheduler and one overlay."""

    def __init__(self, workload: Workload, cfg: SimConfig, scheduler: Scheduler, overlay: Overlay) -> None:
        self.workload, self.cfg, self.scheduler, self.overlay = workload, cfg, scheduler, overlay
        self.now = 0.0
        self.total_gpus = cfg.cluster.total_gpus
        self.free = self.total_gpus
        self.node_free = [cfg.cluster.gpus_per_node] * cfg.cluster.nodes
        self.pack = cfg.cluster.pack_small_jobs
        self.restart_s = cfg.workload.restart_overhead_s
        n = workload.n_evals
        self.jobs = [_Job(s, t, Timing.of(t.duration_s, cfg, n)) for s, t in zip(workload.jobs, workload.truths, strict=True)]
        for j in self.jobs:
            j.view = JobView(j, self)
        self.alloc: dict[int, list[tuple[int, int]]] = {}
        self.waiting: dict[int, _Job] = {}
        self.running: dict[int, _Job] = {}
        self._heap: list[tuple[float, int, int, int, int, int]] = []
        self._seq = 0
        self.events = 0
        self.departed = 0

    # ------------------------------------------------------------------ heap
    def _push(self, t: float, kind: Event, job_id: int = -1, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, int(kind), self._seq, job_id, version, 0))

    # ------------------------------------------------------------------ mechanism
    def _place(self, job: _Job) -> bool:
        g = job.spec.gpus
        if g > self.free:
            return False
        if self.pack and g <= len(self.node_free) and g <= self.cfg.cluster.gpus_per_node:
            fitting = [i for i, f in enumerate(self.node_free) if f >= g]
            if not fitting:
                return False
            node = min(fitting, key=lambda i: (self.node_free[i], i))  # best fit
            self.node_free[node] -= g
            self.alloc[job.spec.job_id] = [(node, g)]
        else:
            parts, need = [], g
            for i in sorted(range(len(self.node_free)), key=lambda i: -self.node_free[i]):
                take = min(need, self.node_free[i])
                if take:
                    self.node_free[i] -= take
                    parts.append((i, take))
                    need -= take
                if not need:
                    break
            self.alloc[job.spec.job_id] = parts
        self.free -= g
        return True

    def _release(self, job: _Job) -> None:
        for node, g in self.alloc.pop(job.spec.job_id):
            self.node_free[node] += g
        self.free += job.spec.gpus
        held = self.now - job.started_at
        g = job.spec.gpus
        job.gpu_seconds += g * held
        job.ovh_seconds += g * max(0.0, min(self.now, job.restart_until) - job.started_at)
        job.work = job.work_at(self.now)
        job.running = False
        job.version += 1

    def _start(self, job: _Job) -> bool:
        if not self._place(job):
            return False
        del self.waiting[job.spec.job_id]
        self.running[job.spec.job_id] = job
        job.running = True
        job.started_at = self.now
        job.run_since = job.restart_until = self.now + (self.restart_s if job.ever_started else 0.0)
        if not job.ever_started:
            job.ever_started = True
            job.first_start = self.now
        self._schedule_next(job)
        return True

    def _preempt(self, job: _Job) -> None:
        self._release(job)
        del self.running[job.spec.job_id]
        self.waiting[job.spec.job_id] = job
        job.waiting_since = self.now
        job.restarts += 1

    def _schedule_next(self, job: _Job) -> None:
        eval_work = job.next_eval * job.timing.seg_len
        if job.end_work < eval_work:
            self._push(job.run_since + job.end_work - job.work, Event.FINISH, job.spec.job_id, job.version)
        else:
            self._push(job.run_since + eval_work - job.work, Event.EVAL_DUE, job.spec.job_id, job.version)

    def _depart(self, job: _Job, stopped: bool) -> None:
        self._release(job)
        del self.running[job.spec.job_id]
        job.departure = self.now
        job.stopped = stopped
        job.completed = not stopped
        self.departed += 1

    # ------------------------------------------------------------------ events
    def _on_arrival(self, job: _Job) -> None:
        self.waiting[job.spec.job_id] = job
        self.overlay.on_arrival(job.view)
        cut = self.overlay.cut_progress(job.spec.job_id)
        if cut is not None and cut < 1.0:
            job.end_work = job.timing.work_at(cut)

    def _on_eval(self, job: _Job) -> bool:
        """Returns True if the job left the cluster."""
        i = job.next_eval
        job.work = i * job.timing.seg_len
        job.run_since = self.now  # work is exact at this instant
        job.evals_done = i
        job.next_eval = i + 1
        truth = job.truth
        score, loss, proxy = truth.scores[i - 1], truth.losses[i - 1], truth.proxies[i - 1]
        job.scores_seen.append(score)
        job.loss_history.append((job.gpu_seconds_at(self.now) / 3600.0, loss))
        if score > job.best_score:
            job.best_score, job.best_eval = score, i
        stop = self.overlay.on_eval(job.view, i, score, loss, proxy)
        if i >= job.timing.n:
            self._depart(job, stopped=False)
            return True
        if stop or job.work >= job.end_work - 1e-9:
            self._depart(job, stopped=True)
            return True
        self._schedule_next(job)
        return False

    def _plan(self, allow_preempt: bool) -> None:
        sched = self.scheduler
        if sched.preemptive and allow_preempt:
            active = [j.view for j in self.running.values()] + [j.view for j in self.waiting.values()]
            order = sched.order(active, self.now)
            free, chosen = self.total_gpus, []
            for v in order:
                if v.gpus <= free:
                    chosen.append(v.job_id)
                    free -= v.gpus
            keep = set(chosen)
            for jid in [jid for jid in self.running if jid not in keep]:
                self._preempt(self.running[jid])
            for jid in chosen:
                if jid in self.waiting:
                    self._start(self.jobs[jid])
        else:
            if not self.waiting or self.free == 0:
                return
            order = sched.order([j.view for j in self.waiting.values()], self.now)
            for v in order:
                if self.free == 0:
                    break
                if not self._start(self.jobs[v.job_id]) and not sched.backfill:
                    break

    def run(self) -> RunResult:
        self.overlay.attach(lambda: self.now, self.workload.n_evals)
        for j in self.jobs:
            self._push(j.spec.arrival_s, Event.ARRIVAL, j.spec.job_id)
        if self.scheduler.round_s:
            self._push(self.scheduler.round_s, Event.SCHED_ROUND)
        heap, n_jobs = self._heap, len(self.jobs)
        while heap and self.departed < n_jobs:
            t = heap[0][0]
            self.now = t
            replan = False
            round_now = False
            while heap and heap[0][0] == t:
                _, kind, _, jid, version, _ = heapq.heappop(heap)
                self.events += 1
                if kind == Event.ARRIVAL:
                    self._on_arrival(self.jobs[jid])
                    replan = True
                elif kind == Event.SCHED_ROUND:
                    round_now = replan = True
                    self._push(t + self.scheduler.round_s, Event.SCHED_ROUND)
                else:
                    job = self.jobs[jid]
                    if version != job.version or not job.running:
                        continue  # stale
                    if kind == Event.EVAL_DUE:
                        replan |= self._on_eval(job)
                    elif kind == Event.FINISH:
                        self._depart(job, stopped=True)
                        replan = True
            if replan:
                self._plan(allow_preempt=self.scheduler.round_s is None or round_now)
        return self._result()

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
                overhead_gpu_seconds=j.ovh_seconds + j.spec.gpus * j.timing.seg_eval * j.evals_done,
                work_done=j.work, evals_done=j.evals_done, best_eval=j.best_eval,
                delivered_progress=delivered, restarts=j.restarts,
            ))
        makespan = max(o.departure_s for o in outcomes)
        return RunResult(self.scheduler.name, self.overlay.name, self.overlay.is_oracle, self.workload.seed,
                         tuple(outcomes), makespan, self.events, self.total_gpus)

"""One simulated job's mutable state: its lifecycle :class:`Phase`, work layout and accounting.

A job's work is ``n`` segments, each ``D/n`` seconds of training followed by one eval
(``eval_overhead_frac * D / n`` plus a checkpoint write); the last eval ends the job
(:class:`Timing`), in seconds on the reference GPU. A cluster trace's job ran for its recorded
duration with its evals and checkpoints inside it: its segments are shrunk in proportion to fit it.
Work is advanced lazily: a running job's work is
``work + speed * (now - run_since)``, computed when asked (``speed`` is its pool's, 1.0 on a uniform
cluster: :class:`~platform_sim.cluster.Pools`). Resuming after a preemption costs ``restart_overhead_s`` with no progress.

Phases (illegal moves raise :class:`~evalstop_trl.core.lifecycle.IllegalTransition`)::

    UPCOMING --arrive--> PENDING --start--> RUNNING --depart--> COMPLETED | STOPPED
                                            |     ^
                                    preempt v     | start (after restart_overhead_s)
                                           PREEMPTED

Example::

    >>> Phase.PENDING.to(Phase.RUNNING)
    <Phase.RUNNING: 'running'>
    >>> Phase.PREEMPTED.can(Phase.COMPLETED), Phase.STOPPED.terminal
    (False, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from evalstop_trl.core.lifecycle import Lifecycle, transitions

from .config import SimConfig
from .views import JobSnapshot
from .workload import JobSpec, JobTruth

__all__ = ["PHASE_MOVES", "Phase", "SimJob", "Timing"]

#: The legal moves of a simulated job (staying in a phase is always allowed).
PHASE_MOVES: dict[str, set[str]] = {
    "UPCOMING": {"PENDING"},
    "PENDING": {"RUNNING"},
    "RUNNING": {"PREEMPTED", "COMPLETED", "STOPPED"},
    "PREEMPTED": {"RUNNING"},
    "COMPLETED": set(),
    "STOPPED": set(),
}


@transitions(PHASE_MOVES)
class Phase(Lifecycle, str, Enum):
    """Where a simulated job is in its life."""

    UPCOMING = "upcoming"  # in the workload; arrives later
    PENDING = "pending"  # arrived, never started
    RUNNING = "running"  # holds its GPUs
    PREEMPTED = "preempted"  # started before, waiting again
    COMPLETED = "completed"  # ran to its planned end
    STOPPED = "stopped"  # stopped before its planned end (an overlay's stop or an oracle cut)


# bound once: Enum member lookups are slow on the hot path
_UPCOMING, _PENDING, _RUNNING, _PREEMPTED, _COMPLETED, _STOPPED = Phase
_new_snapshot = tuple.__new__  # JobSnapshot's fields in one tuple, without NamedTuple's keyword __new__


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
    def of(cls, duration_s: float, cfg: SimConfig, n: int, whole: bool = False) -> Timing:
        """The layout of a job of ``duration_s``: exclusive training time (the synthetic workload's, the
        evals and checkpoints added on top), or with ``whole`` the job's whole run (a cluster trace's
        recorded duration, which already holds them): the same layout shrunk in proportion to fit it.

        >>> from platform_sim.config import load_config
        >>> cfg = load_config()
        >>> Timing.of(600.0, cfg, 10).total_work, round(Timing.of(600.0, cfg, 10, whole=True).total_work, 6)
        (1212.0, 600.0)
        """
        w = cfg.workload
        seg_train = duration_s / n
        seg_eval = w.eval_overhead_frac * seg_train + w.checkpoint_s
        if whole:
            shrink = seg_train / (seg_train + seg_eval)
            seg_train, seg_eval = shrink * seg_train, shrink * seg_eval
            return cls(n * seg_train, n, seg_train, seg_eval, seg_train + seg_eval, n * (seg_train + seg_eval))
        return cls(duration_s, n, seg_train, seg_eval, seg_train + seg_eval, n * (seg_train + seg_eval))

    @classmethod
    def of_truth(cls, truth: JobTruth, cfg: SimConfig, n: int) -> Timing:
        """The layout of a workload job (:meth:`of` with the truth's duration and its ``whole_run``)."""
        return cls.of(truth.duration_s, cfg, n, truth.whole_run)

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


class SimJob:
    """The engine's record of one job. Policies never see it: they get a :meth:`snapshot`."""

    __slots__ = (
        "spec", "truth", "timing", "phase", "end_work", "work", "run_since", "started_at", "restart_until",
        "version", "next_eval", "evals_done", "scores_seen", "loss_history", "gpu_seconds", "ovh_seconds",
        "waiting_since", "first_start", "departure", "best_eval", "best_score", "restarts", "priority", "token",
        "pool", "speed", "eval_weight", "ref_gpu_seconds",
    )

    def __init__(self, spec: JobSpec, truth: JobTruth, timing: Timing) -> None:
        self.spec, self.truth, self.timing = spec, truth, timing
        self.phase = _UPCOMING
        self.end_work = timing.total_work  # an oracle cut lowers it
        self.work = 0.0  # work done up to run_since (exact while not running)
        self.run_since = self.started_at = self.restart_until = 0.0
        self.version = 0  # bumped whenever the job leaves its GPUs: its queued events become stale
        self.next_eval = 1
        self.evals_done = 0
        # immutable, so a snapshot shares them instead of copying (a few evals: appending copies little)
        self.scores_seen: tuple[float, ...] = ()
        self.loss_history: tuple[tuple[float, float], ...] = ()
        self.gpu_seconds = self.ovh_seconds = 0.0
        self.waiting_since = spec.arrival_s
        self.first_start = math.nan
        self.departure = math.nan
        self.best_eval = 0
        self.best_score = -math.inf
        self.restarts = 0
        # the engine's planning bookkeeping: the scheduler's priority while waiting (an upper bound of
        # it while running), and a counter that invalidates the job's older entries in the planner's heap
        self.priority = math.inf
        self.token = 0
        # where it runs (a mixed cluster's pool; "" on a uniform one) and how fast, in reference GPUs
        self.pool, self.speed = "", 1.0
        self.eval_weight = 0.0  # sum of 1/speed over its evals: their GPU time is seg_eval times this
        self.ref_gpu_seconds = 0.0  # GPU-seconds held, in reference GPUs (gpu_seconds on a uniform cluster)

    # ------------------------------------------------------------------ derived state
    @property
    def running(self) -> bool:
        return self.phase is _RUNNING

    @property
    def completed(self) -> bool:
        return self.phase is _COMPLETED

    @property
    def stopped(self) -> bool:
        return self.phase is _STOPPED

    def work_at(self, t: float) -> float:
        if self.phase is not _RUNNING:
            return self.work
        return self.work + self.speed * max(0.0, t - self.run_since)

    def progress(self, t: float) -> float:
        return self.timing.progress_of(self.work_at(t))

    def gpu_seconds_at(self, t: float) -> float:
        held = (t - self.started_at) if self.phase is _RUNNING else 0.0
        return self.gpu_seconds + held * self.spec.gpus

    def snapshot(self, t: float) -> JobSnapshot:
        """What a policy may see of this job at time ``t``: values copied out, no reference back."""
        spec = self.spec
        if self.phase is _RUNNING:
            work = self.work + (self.speed * (t - self.run_since) if t > self.run_since else 0.0)
            held = t - self.started_at
            running = True
        else:
            work, held, running = self.work, 0.0, False
        return _new_snapshot(JobSnapshot, (
            spec.job_id, spec.job_type, spec.rlhf, spec.gpus, spec.arrival_s, spec.est_duration_s,
            self.timing.progress_of(work), running, self.waiting_since, self.evals_done,
            self.scores_seen, self.loss_history, (self.gpu_seconds + held * spec.gpus) / 3600.0, self.pool,
            self.speed,
        ))

    # ------------------------------------------------------------------ transitions
    def arrive(self) -> None:
        self.phase = self.phase.to(_PENDING)

    def start(self, now: float, restart_s: float) -> None:
        """The job got its GPUs at ``now``; a resumed job first spends ``restart_s`` without progress."""
        resumed = self.phase is _PREEMPTED
        self.phase = self.phase.to(_RUNNING)
        self.started_at = now
        self.run_since = self.restart_until = now + (restart_s if resumed else 0.0)
        if not resumed:
            self.first_start = now

    def preempt(self, now: float) -> None:
        self._leave_gpus(now)
        self.phase = self.phase.to(_PREEMPTED)
        self.waiting_since = now
        self.restarts += 1

    def depart(self, now: float, stopped: bool) -> None:
        self._leave_gpus(now)
        self.phase = self.phase.to(_STOPPED if stopped else _COMPLETED)
        self.departure = now

    def _leave_gpus(self, now: float) -> None:
        """Account the GPU time of this stint and freeze the work done (the job is still RUNNING)."""
        g = self.spec.gpus
        self.gpu_seconds += g * (now - self.started_at)
        self.ref_gpu_seconds += self.speed * g * (now - self.started_at)
        self.ovh_seconds += g * max(0.0, min(now, self.restart_until) - self.started_at)
        self.work = self.work_at(now)
        self.version += 1

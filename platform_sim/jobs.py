"""The simulated jobs' mutable state: their lifecycle :class:`Phase`, work layout and accounting, as
columns (:class:`JobTable`: one list or array per field, indexed by job id).

A job's work is ``n`` segments, each ``D/n`` seconds of training followed by one eval
(``eval_overhead_frac * D / n`` plus a checkpoint write); the last eval ends the job
(:class:`Timing`, :func:`layout`), in seconds on the reference GPU. A cluster trace's job ran for its
recorded duration with its evals and checkpoints inside it: its segments are shrunk in proportion to
fit it. Work is advanced lazily: a running job's work is ``work + speed * (now - run_since)``,
computed when asked (``speed`` is its pool's, 1.0 on a uniform cluster:
:class:`~platform_sim.cluster.Pools`). Resuming after a preemption costs ``restart_overhead_s`` with no
progress.

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
from typing import NamedTuple

import numpy as np

from evalstop_trl.core.lifecycle import Lifecycle, transitions

from .config import SimConfig
from .views import JobSnapshot
from .workload import JobTruth, Workload

__all__ = ["FLOAT_FIELDS", "INT_FIELDS", "PHASES", "PHASE_MOVES", "RUNNING", "JobState", "JobTable", "Phase", "Timing",
           "layout"]

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


def layout(duration_s: np.ndarray, whole_run: np.ndarray, cfg: SimConfig, n: int) -> tuple[np.ndarray, ...]:
    """The work layout of each job (arrays): ``(duration_s, seg_train, seg_eval, seg_len, total_work)``.

    ``duration_s`` is a job's exclusive training time (the synthetic workload's: the evals and
    checkpoints are added on top) or, where ``whole_run``, its whole run (a cluster trace's recorded
    duration, which already holds them): the same layout shrunk in proportion to fit it."""
    w = cfg.workload
    seg_train = duration_s / n
    seg_eval = w.eval_overhead_frac * seg_train + w.checkpoint_s
    shrink = seg_train / (seg_train + seg_eval)
    seg_train, seg_eval = (np.where(whole_run, shrink * seg_train, seg_train),
                           np.where(whole_run, shrink * seg_eval, seg_eval))
    return (np.where(whole_run, n * seg_train, duration_s), seg_train, seg_eval, seg_train + seg_eval,
            n * (seg_train + seg_eval))


def _work_at(p: float, n: int, duration_s: float, seg_train: float, seg_len: float, total_work: float) -> float:
    """Work done when training progress first reaches ``p`` (p=1 includes the last eval)."""
    if p >= 1.0:
        return total_work
    c = math.floor(p * n)
    return c * seg_len + (p * duration_s - c * seg_train)


def _progress_of(work: float, n: int, duration_s: float, seg_train: float, seg_len: float) -> float:
    """Training progress after ``work`` seconds of work."""
    c = work // seg_len
    if c >= n:
        return 1.0
    inside = work - c * seg_len
    if inside > seg_train:
        inside = seg_train
    return (c * seg_train + inside) / duration_s


@dataclass(frozen=True, slots=True)
class Timing:
    """Work layout of one job (seconds of exclusive GPU time): one row of :func:`layout`."""

    duration_s: float
    n: int
    seg_train: float
    seg_eval: float
    seg_len: float
    total_work: float

    @classmethod
    def of(cls, duration_s: float, cfg: SimConfig, n: int, whole: bool = False) -> Timing:
        """The layout of a job of ``duration_s`` (see :func:`layout`; ``whole``: its whole run).

        >>> from platform_sim.config import load_config
        >>> cfg = load_config()
        >>> Timing.of(600.0, cfg, 10).total_work, round(Timing.of(600.0, cfg, 10, whole=True).total_work, 6)
        (1212.0, 600.0)
        """
        d, seg_train, seg_eval, seg_len, total = (float(x[0]) for x in layout(np.array([duration_s], dtype=float),
                                                                            np.array([whole]), cfg, n))
        return cls(d, n, seg_train, seg_eval, seg_len, total)

    @classmethod
    def of_truth(cls, truth: JobTruth, cfg: SimConfig, n: int) -> Timing:
        """The layout of a workload job (:meth:`of` with the truth's duration and its ``whole_run``)."""
        return cls.of(truth.duration_s, cfg, n, truth.whole_run)

    def work_at(self, p: float) -> float:
        """Work done when training progress first reaches ``p`` (p=1 includes the last eval)."""
        return _work_at(p, self.n, self.duration_s, self.seg_train, self.seg_len, self.total_work)

    def progress_of(self, work: float) -> float:
        return _progress_of(work, self.n, self.duration_s, self.seg_train, self.seg_len)


#: A job's float fields, in the order of its row (the fields read or written at every eval first)
FLOAT_FIELDS = ("work", "run_since", "eval_weight", "speed", "seg_len", "end_work", "gpu_seconds", "started_at",
                "best_score", "priority", "waiting_since", "ovh_seconds", "ref_gpu_seconds", "restart_until",
                "first_start", "departure")
#: A job's integer fields, in the order of its row (``phase``: the index of its :class:`Phase` in :data:`PHASES`)
INT_FIELDS = ("version", "phase", "next_eval", "best_eval", "token", "restarts")
PHASES = tuple(Phase)
_CODE = {p: c for c, p in enumerate(PHASES)}
RUNNING, _PREEMPTED_CODE = _CODE[_RUNNING], _CODE[_PREEMPTED]  # the engine checks RUNNING at every event


class JobState(NamedTuple):
    """Every changing field of one job, copied out (:meth:`JobTable.state`): for tests and debugging."""

    work: float
    run_since: float
    eval_weight: float
    speed: float
    seg_len: float
    end_work: float
    gpu_seconds: float
    started_at: float
    best_score: float
    priority: float
    waiting_since: float
    ovh_seconds: float
    ref_gpu_seconds: float
    restart_until: float
    first_start: float
    departure: float
    version: int
    phase: Phase
    next_eval: int
    best_eval: int
    token: int
    restarts: int
    pool: str

    @property
    def evals_done(self) -> int:
        return self.next_eval - 1


class JobTable:
    """Every job's state in one run, in flat arrays indexed by job id. Policies never see it: they get a
    :meth:`snapshot` (values copied out).

    Each changing field (:data:`FLOAT_FIELDS`, :data:`INT_FIELDS`) is an attribute indexed by job id
    (``table.work[j]``): a strided view of one row-major buffer, so the fields of one job lie together,
    16 doubles and 8 integers a job. The engine touches about twenty fields of one job per eval, and
    in a row they are two or three cache lines: a list per field (or an object per job, a float object
    per field) costs a cache miss per field once the jobs outgrow the cache (BENCHMARKS.md,
    2026-12-05). What never changes is in columns: ``job_type``, ``rlhf``, ``gpus`` (lists),
    ``arrival_s``, ``est_duration_s``, ``duration_s``, ``seg_train``, ``seg_eval``, ``total_work`` (the
    layout, :func:`layout`); ``pool`` (where a job runs or last ran on a mixed cluster, "" on a uniform
    one) is a list. A job's scores and losses so far are the workload's (``scores[j * n_evals + i -
    1]``, read-only views), and the GPU-hours it had used at each eval (its loss history's other half)
    are :attr:`eval_gpu_hours`, laid out alike: nothing is copied per eval (a snapshot's tuples of them
    are built when a policy asks, and reused until the job's next eval).

    Fields: ``work`` (done up to ``run_since``, exact while not running); ``eval_weight`` (the sum of
    1/speed over its evals: their GPU time is ``seg_eval`` times this); ``speed`` (in reference GPUs);
    ``end_work`` (an oracle cut lowers it); ``ref_gpu_seconds`` (pool speed x GPU-seconds); ``priority``
    and ``token`` (the planner's: the scheduler's priority while waiting, an upper bound of it while
    running, and a counter that invalidates the job's older entries in its heap); ``version`` (bumped
    whenever the job leaves its GPUs: its queued events become stale); ``next_eval`` (evals done + 1);
    ``phase`` (a :data:`PHASES` index; :data:`RUNNING` is RUNNING's).
    """

    __slots__ = ("n", "n_evals", "job_type", "rlhf", "gpus", "arrival_s", "est_duration_s", "duration_s", "seg_train",
                 "seg_eval", "total_work", "pool", "eval_gpu_hours", "scores", "losses", "_rows", "_seen",
                 *FLOAT_FIELDS,
                 *INT_FIELDS)

    def __init__(self, workload: Workload, cfg: SimConfig) -> None:
        n, m = len(workload), workload.n_evals
        self.n, self.n_evals = n, m
        names = workload.type_names
        self.job_type: list[str] = [names[t] for t in workload.type_index.tolist()]
        self.rlhf: list[bool] = workload.rlhf.tolist()
        self.gpus: list[int] = workload.gpus.tolist()
        self.arrival_s, self.est_duration_s = _view(workload.arrival_s), _view(workload.est_duration_s)
        duration, seg_train, seg_eval, seg_len, total = layout(workload.duration_s, workload.whole_run, cfg, m)
        self.duration_s, self.seg_train, self.seg_eval, self.total_work = (
            _view(a) for a in (duration, seg_train, seg_eval, total))
        self.pool: list[str] = [""] * n
        floats = np.zeros((n, 16))
        start = {"speed": 1.0, "seg_len": seg_len, "end_work": total, "best_score": -math.inf, "priority": math.inf,
                 "waiting_since": workload.arrival_s, "first_start": math.nan, "departure": math.nan}
        for k, name in enumerate(FLOAT_FIELDS):
            floats[:, k] = start.get(name, 0.0)
        ints = np.zeros((n, 8), dtype=np.int64)
        ints[:, INT_FIELDS.index("phase")], ints[:, INT_FIELDS.index("next_eval")] = _CODE[_UPCOMING], 1
        self._rows = (floats, ints)  # the buffers the field views share
        for rows, names_ in ((floats, FLOAT_FIELDS), (ints, INT_FIELDS)):
            flat = memoryview(rows.reshape(-1))
            for k, name in enumerate(names_):
                setattr(self, name, flat[k::rows.shape[1]])
        self.eval_gpu_hours = memoryview(np.zeros(n * m))
        # the observed series (visible once evaluated), flat: job j's eval i is at j * n_evals + i - 1
        self.scores, self.losses = _view(workload.scores), _view(workload.losses)
        # job id -> (evals done, scores, loss history) of its last snapshot (jobs policies ask about)
        self._seen: dict[int, tuple[int, tuple[float, ...], tuple[tuple[float, float], ...]]] = {}

    # ------------------------------------------------------------------ derived state
    def running(self, j: int) -> bool:
        return self.phase[j] == RUNNING

    def work_at(self, j: int, t: float) -> float:
        if self.phase[j] != RUNNING:
            return self.work[j]
        return self.work[j] + self.speed[j] * max(0.0, t - self.run_since[j])

    def progress_of(self, j: int, work: float) -> float:
        return _progress_of(work, self.n_evals, self.duration_s[j], self.seg_train[j], self.seg_len[j])

    def work_at_progress(self, j: int, p: float) -> float:
        """Work done when job ``j``'s training progress first reaches ``p``."""
        return _work_at(p, self.n_evals, self.duration_s[j], self.seg_train[j], self.seg_len[j], self.total_work[j])

    def progress(self, j: int, t: float) -> float:
        return self.progress_of(j, self.work_at(j, t))

    def gpu_seconds_at(self, j: int, t: float) -> float:
        held = (t - self.started_at[j]) if self.phase[j] == RUNNING else 0.0
        return self.gpu_seconds[j] + held * self.gpus[j]

    def columns(self, *names: str) -> list[list]:
        """Fields of every job, a list per name (:data:`FLOAT_FIELDS`, :data:`INT_FIELDS`), read at once."""
        floats, ints = self._rows
        return [floats[:, FLOAT_FIELDS.index(name)].tolist() if name in FLOAT_FIELDS
                else ints[:, INT_FIELDS.index(name)].tolist() for name in names]

    def state(self, j: int) -> JobState:
        """Every changing field of job ``j``, copied out."""
        values = [getattr(self, name)[j] for name in (*FLOAT_FIELDS, *INT_FIELDS)]
        values[len(FLOAT_FIELDS) + 1] = PHASES[values[len(FLOAT_FIELDS) + 1]]
        return JobState(*values, self.pool[j])

    def snapshot(self, j: int, t: float) -> JobSnapshot:
        """What a policy may see of job ``j`` at time ``t``: values copied out, no reference back (a new
        snapshot each time: one the engine kept would lead back to it through ``gc.get_referrers``)."""
        if self.phase[j] == RUNNING:
            since = self.run_since[j]
            work = self.work[j] + (self.speed[j] * (t - since) if t > since else 0.0)
            held, running = t - self.started_at[j], True
        else:
            work, held, running = self.work[j], 0.0, False
        gpus, done = self.gpus[j], self.next_eval[j] - 1
        if done:
            seen = self._seen.get(j)
            if seen is None or seen[0] != done:  # built when asked, shared until the job's next eval
                lo = j * self.n_evals
                seen = self._seen[j] = (done, tuple(self.scores[lo:lo + done]), tuple(
                    zip(self.eval_gpu_hours[lo:lo + done], self.losses[lo:lo + done], strict=True)))
            _, scores, losses = seen
        else:
            scores = losses = ()
        progress = _progress_of(work, self.n_evals, self.duration_s[j], self.seg_train[j], self.seg_len[j])
        return JobSnapshot(j, self.job_type[j], self.rlhf[j], gpus, self.arrival_s[j], self.est_duration_s[j], progress,
                           running, self.waiting_since[j], done, scores, losses,
                           (self.gpu_seconds[j] + held * gpus) / 3600.0, self.pool[j], self.speed[j])

    # ------------------------------------------------------------------ transitions
    def _move(self, j: int, new: Phase) -> None:
        """Job ``j`` becomes ``new`` (:class:`~evalstop_trl.core.lifecycle.IllegalTransition` if it may not)."""
        self.phase[j] = _CODE[PHASES[self.phase[j]].to(new)]

    def arrive(self, j: int) -> None:
        self._move(j, _PENDING)

    def start(self, j: int, now: float, restart_s: float) -> None:
        """Job ``j`` got its GPUs at ``now``; a resumed job first spends ``restart_s`` without progress."""
        resumed = self.phase[j] == _PREEMPTED_CODE
        self._move(j, _RUNNING)
        self.started_at[j] = now
        self.run_since[j] = self.restart_until[j] = now + (restart_s if resumed else 0.0)
        if not resumed:
            self.first_start[j] = now

    def preempt(self, j: int, now: float) -> None:
        self._leave_gpus(j, now)
        self._move(j, _PREEMPTED)
        self.waiting_since[j] = now
        self.restarts[j] += 1

    def depart(self, j: int, now: float, stopped: bool) -> None:
        self._leave_gpus(j, now)
        self._move(j, _STOPPED if stopped else _COMPLETED)
        self.departure[j] = now
        self._seen.pop(j, None)  # no policy sees it again

    def _leave_gpus(self, j: int, now: float) -> None:
        """Account the GPU time of this stint and freeze the work done (the job is still RUNNING)."""
        g, held = self.gpus[j], now - self.started_at[j]
        self.gpu_seconds[j] += g * held
        self.ref_gpu_seconds[j] += self.speed[j] * g * held
        self.ovh_seconds[j] += g * max(0.0, min(now, self.restart_until[j]) - self.started_at[j])
        self.work[j] = self.work_at(j, now)
        self.version[j] += 1


def _view(a: np.ndarray) -> memoryview:
    """A flat, read-only view of a float array (its items read as Python floats)."""
    flat = np.ascontiguousarray(a, dtype=float).reshape(-1)
    flat.flags.writeable = False
    return memoryview(flat)

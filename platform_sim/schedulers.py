"""Base schedulers (policies). Each returns a priority order over job views; the engine's
mechanism places jobs in that order. Policies never advance time or touch shared state."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from .config import SchedulerConfig
from .views import JobView

__all__ = ["SCHEDULERS", "Scheduler", "create_scheduler"]


class Scheduler(ABC):
    """A base scheduling policy.

    Attributes:
        preemptive: may take GPUs from running jobs (the engine then re-plans over all active jobs).
        backfill: a non-preemptive scheduler may start later jobs when the first does not fit.
        round_s: preempt only at rounds of this length (None: at every planning point).
    """

    name = ""
    preemptive = False
    backfill = True
    round_s: float | None = None

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def order(self, jobs: Sequence[JobView], now: float) -> list[JobView]:
        """Jobs in the order they should get GPUs."""


class FIFO(Scheduler):
    """First in, first out; non-preemptive; backfill optional (``fifo_backfill``)."""

    name = "fifo"

    def __init__(self, cfg: SchedulerConfig) -> None:
        super().__init__(cfg)
        self.backfill = cfg.fifo_backfill

    def order(self, jobs, now):
        return sorted(jobs, key=lambda v: (v.arrival_s, v.job_id))


class SJFEst(Scheduler):
    """Shortest estimated job first; non-preemptive."""

    name = "sjf_est"

    def order(self, jobs, now):
        return sorted(jobs, key=lambda v: (v.est_duration_s, v.job_id))


class SRTFEst(Scheduler):
    """Shortest estimated remaining time first, ``est x (1 - progress)``; preemptive."""

    name = "srtf_est"
    preemptive = True

    def order(self, jobs, now):
        return sorted(jobs, key=lambda v: (v.est_duration_s * (1.0 - v.progress), v.job_id))


def predicted_gain_per_gpu_hour(history: Sequence[tuple[float, float]]) -> float:
    """SLAQ-like prediction: the loss reduction per GPU-hour over the last two loss points."""
    (g0, l0), (g1, l1) = history[-2], history[-1]
    return (l0 - l1) / max(g1 - g0, 1e-9)


class LossAware(Scheduler):
    """SLAQ-like: every ``loss_aware_round_s`` GPUs go greedily to the jobs with the highest predicted
    loss reduction per GPU-hour. Jobs with fewer than two loss points rank first, then jobs waiting
    longer than ``loss_aware_promote_h`` (so flattened jobs are not starved forever)."""

    name = "loss_aware"
    preemptive = True

    def __init__(self, cfg: SchedulerConfig) -> None:
        super().__init__(cfg)
        self.round_s = cfg.loss_aware_round_s
        self.promote_s = cfg.loss_aware_promote_h * 3600.0
        # job_id -> (evals done when promoted, time promoted). A promotion lasts until the job's next
        # eval; otherwise a promoted job would run one round and be starved again for promote_h.
        self._promoted: dict[int, tuple[int, float]] = {}

    def order(self, jobs, now):
        def key(v: JobView):
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


SCHEDULERS: dict[str, type[Scheduler]] = {c.name: c for c in (FIFO, SJFEst, SRTFEst, LossAware)}


def create_scheduler(name: str, cfg: SchedulerConfig) -> Scheduler:
    try:
        return SCHEDULERS[name](cfg)
    except KeyError:
        raise ValueError(f"Unknown scheduler {name!r}; valid schedulers are: {', '.join(SCHEDULERS)}.") from None

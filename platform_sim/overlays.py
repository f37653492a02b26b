"""Stop overlays wrapped around a base scheduler.

Detector overlays (EvalStop, StopAt, LossPlateau) call the real ``evalstop_trl.Coordinator``
(MemoryStore, the simulator's virtual clock): the same decision code as the HTTP service and the
TRL callback, no second copy of any rule. Oracle-Stop is the only code here that reads ground
truth, and it is marked ``is_oracle`` in every output.
"""

from __future__ import annotations

from collections.abc import Callable

from evalstop_trl.core.coordinator import Coordinator
from evalstop_trl.core.detectors import Action
from evalstop_trl.core.records import JobType, Policy
from evalstop_trl.stores.memory import MemoryStore

from .config import OverlayConfig
from .views import JobView
from .workload import Workload

__all__ = ["OVERLAYS", "Overlay", "create_overlay"]

TENANT = "platform"

_JOB_TYPES = {"lora_sft": JobType.LORA_SFT, "dpo": JobType.DPO, "rlhf_ppo": JobType.PPO, "rlhf_grpo": JobType.GRPO}


class Overlay:
    """Watches jobs' evals and may stop them. The default does nothing (the base scheduler alone)."""

    name = "none"
    is_oracle = False

    def attach(self, clock: Callable[[], float], n_evals: int) -> None:
        """Called once by the engine before the run."""

    def on_arrival(self, job: JobView) -> None:
        """A job arrived."""

    def on_eval(self, job: JobView, step: int, score: float, loss: float, proxy: float) -> bool:
        """An eval finished (``step`` = eval index, 1-based). Return True to stop the job now."""
        return False

    def cut_progress(self, job_id: int) -> float | None:
        """Oracle only: progress at which the job is stopped, or None."""
        return None


class NoOverlay(Overlay):
    name = "none"


class CoordinatorOverlay(Overlay):
    """Register jobs with a Coordinator under ``policy`` and stop when it says STOP."""

    def __init__(self, policy: Policy, rlhf_only: bool) -> None:
        self.policy = policy
        self.rlhf_only = rlhf_only
        self.coordinator: Coordinator | None = None
        self._watched: dict[int, str] = {}  # job id -> the coordinator's job id

    def attach(self, clock, n_evals):
        self.coordinator = Coordinator(MemoryStore(), clock=clock, default_policy=self.policy)
        self.n_evals = n_evals

    def on_arrival(self, job):
        if self.rlhf_only and not job.rlhf:
            return
        self.coordinator.register_job(
            TENANT, str(job.job_id), _JOB_TYPES.get(job.job_type, JobType.OTHER), planned_steps=self.n_evals
        )
        self._watched[job.job_id] = str(job.job_id)

    def on_eval(self, job, step, score, loss, proxy):
        name = self._watched.get(job.job_id)
        if name is None:
            return False
        return self.coordinator.report(TENANT, name, step, score, loss, proxy).action is Action.STOP


class EvalStopOverlay(CoordinatorOverlay):
    name = "evalstop"

    def __init__(self, cfg: OverlayConfig) -> None:
        c = cfg.evalstop
        super().__init__(Policy(c.detector, {"k": c.k, "min_delta": c.min_delta}), c.job_types == "rlhf")


class StopAtOverlay(CoordinatorOverlay):
    name = "stop_at"

    def __init__(self, cfg: OverlayConfig) -> None:
        c = cfg.stop_at
        super().__init__(Policy("stop_at", {"fraction": c.fraction}), c.job_types == "rlhf")


class LossPlateauOverlay(CoordinatorOverlay):
    name = "loss_plateau"

    def __init__(self, cfg: OverlayConfig) -> None:
        c = cfg.loss_plateau
        super().__init__(Policy("loss_plateau", {"window": c.window, "tolerance": c.tolerance}),
                         c.job_types == "rlhf")


class OracleOverlay(Overlay):
    """ORACLE (reads ground truth): stops each hacked job exactly at its true gold peak."""

    name = "oracle"
    is_oracle = True

    def __init__(self, cfg: OverlayConfig, workload: Workload) -> None:
        self._cut = {
            spec.job_id: truth.peak_progress
            for spec, truth in zip(workload.jobs, workload.truths, strict=True)
            if truth.hacked
        }

    def cut_progress(self, job_id):
        return self._cut.get(job_id)


OVERLAYS: dict[str, Callable[..., Overlay]] = {
    "none": lambda cfg, workload: NoOverlay(),
    "evalstop": lambda cfg, workload: EvalStopOverlay(cfg),
    "stop_at": lambda cfg, workload: StopAtOverlay(cfg),
    "loss_plateau": lambda cfg, workload: LossPlateauOverlay(cfg),
    "oracle": lambda cfg, workload: OracleOverlay(cfg, workload),
}


def create_overlay(name: str, cfg: OverlayConfig, workload: Workload) -> Overlay:
    try:
        factory = OVERLAYS[name]
    except KeyError:
        raise ValueError(f"Unknown overlay {name!r}; valid overlays are: {', '.join(OVERLAYS)}.") from None
    return factory(cfg, workload)

"""EmbeddedClient: the client interface over an in-process :class:`Coordinator` (no HTTP)."""

from __future__ import annotations

from typing import Any

from ..core.coordinator import Coordinator
from ..core.detectors import Decision
from ..core.records import JobView, Report

__all__ = ["EmbeddedClient"]


class EmbeddedClient:
    """The same interface over an in-process :class:`Coordinator` (no HTTP)."""

    unreachable = False
    pending = 0

    def __init__(self, coordinator: Coordinator, tenant: str = "local") -> None:
        self.coordinator, self.tenant = coordinator, tenant

    def register_job(self, job_id: str, job_type: str = "rlhf", planned_steps: int | None = None,
                     policy: dict[str, Any] | None = None, pid: int | None = None,
                     pid_start_time: float | None = None, webhook: str | None = None) -> JobView:
        return self.coordinator.register_job(self.tenant, job_id, job_type, planned_steps, policy, pid,
                                             pid_start_time, webhook)[0]

    def report(self, job_id: str, step: int, eval_score: float | None = None, train_loss: float | None = None,
               proxy_reward: float | None = None, checkpoint: str | None = None) -> Decision:
        return self.coordinator.report(self.tenant, job_id, step, eval_score, train_loss, proxy_reward, checkpoint)

    def ack(self, job_id: str, checkpoint: str | None = None) -> JobView:
        return self.coordinator.ack(self.tenant, job_id, checkpoint)

    def finish(self, job_id: str) -> JobView:
        return self.coordinator.finish(self.tenant, job_id)

    def status(self, job_id: str) -> JobView:
        return self.coordinator.status(self.tenant, job_id)

    def list_jobs(self) -> list[JobView]:
        return self.coordinator.list_jobs(self.tenant)

    def stop(self, job_id: str, reason: str = "") -> JobView:
        return self.coordinator.stop(self.tenant, job_id, reason)

    def fail(self, job_id: str, reason: str = "") -> JobView:
        return self.coordinator.fail(self.tenant, job_id, reason)

    def reports(self, job_id: str) -> list[Report]:
        return self.coordinator.reports(self.tenant, job_id)

    def audit(self) -> list[dict[str, Any]]:
        return [a.to_dict() for a in self.coordinator.audit(self.tenant)]

    def flush(self) -> bool:
        return True

    def close(self) -> None:
        self.coordinator.close()

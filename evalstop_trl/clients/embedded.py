"""EmbeddedClient: the :class:`~evalstop_trl.core.api.EvalStopAPI` over an in-process
:class:`Coordinator` (no HTTP): the same methods and records as the HTTP client."""

from __future__ import annotations

import time
from typing import Any

from ..core.api import MAX_WAIT_S, launcher_event
from ..core.browse import JobPage, JobQuery
from ..core.coordinator import Coordinator
from ..core.detectors import Decision
from ..core.records import AuditRecord, EvalTask, JobView, Report
from ..core.summary import TenantSummary

__all__ = ["EmbeddedClient"]


class EmbeddedClient:
    """The client API of one tenant over an in-process :class:`Coordinator` (no HTTP, no outbox).

    Example::

        client = EmbeddedClient(Coordinator(SQLiteStore("runs/evalstop.db")))
        client.register_job("run-a", "grpo", planned_steps=500)
        decision = client.report("run-a", step=50, eval_score=0.71)
    """

    unreachable = False
    pending = 0

    def __init__(self, coordinator: Coordinator, tenant: str = "local") -> None:
        self.coordinator, self.tenant = coordinator, tenant

    def register_job(self, job_id: str, job_type: str | None = None, planned_steps: int | None = None,
                     policy: dict[str, Any] | None = None, webhook: str | None = None,
                     tags: dict[str, Any] | None = None, hparams: dict[str, Any] | None = None) -> JobView:
        return self.coordinator.register_job(self.tenant, job_id, job_type, planned_steps, policy, webhook, tags,
                                             hparams)[0]

    def report(self, job_id: str, step: int, eval_score: float | None = None, train_loss: float | None = None,
               proxy_reward: float | None = None, checkpoint: str | None = None) -> Decision:
        return self.coordinator.report(self.tenant, job_id, step, eval_score, train_loss, proxy_reward, checkpoint)

    def ack(self, job_id: str, checkpoint: str | None = None, step: int | None = None) -> JobView:
        return self.coordinator.ack(self.tenant, job_id, checkpoint, step)

    def finish(self, job_id: str) -> JobView:
        return self.coordinator.finish(self.tenant, job_id)

    def fail(self, job_id: str, reason: str = "") -> JobView:
        return self.coordinator.fail(self.tenant, job_id, reason)

    def stop(self, job_id: str, reason: str = "") -> JobView:
        return self.coordinator.stop(self.tenant, job_id, reason)

    def heartbeat(self, job_id: str, actor: str = "job") -> JobView:
        return self.coordinator.heartbeat(self.tenant, job_id, actor)

    def status(self, job_id: str) -> JobView:
        return self.coordinator.status(self.tenant, job_id)

    def list_jobs(self, status: str | None = None) -> list[JobView]:
        return self.coordinator.list_jobs(self.tenant, status)

    def reports(self, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[Report]:
        return self.coordinator.reports(self.tenant, job_id, after_step, limit)

    def publish_snapshot(self, job_id: str, step: int, path: str, train_loss: float | None = None,
                         proxy_reward: float | None = None) -> EvalTask:
        return self.coordinator.publish_snapshot(self.tenant, job_id, step, path, train_loss, proxy_reward)

    def claim_eval(self, worker: str, lease_s: float = 300.0) -> EvalTask | None:
        return self.coordinator.claim_eval(self.tenant, worker, lease_s)

    def post_eval(self, job_id: str, step: int, score: float | None, worker: str = "",
                  error: str | None = None) -> Decision:
        return self.coordinator.post_eval(self.tenant, job_id, step, score, worker, error)

    def evals(self, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[EvalTask]:
        return self.coordinator.evals(self.tenant, job_id, after_step, limit)

    def wait_decision(self, job_id: str, wait_s: float = 30.0, stopped: bool = False) -> JobView:
        """The job once it is no longer running (or stopped, with ``stopped``), or after ``wait_s``."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_WAIT_S)
        while True:
            view = self.coordinator.status(self.tenant, job_id)
            if view.settled(stopped) or time.monotonic() >= deadline:
                return view
            time.sleep(0.05)

    def record_event(self, job_id: str, kind: str, reason: str = "", exit_code: int | None = None) -> None:
        event, reason, evidence = launcher_event(kind, reason, exit_code)
        self.coordinator.record_event(self.tenant, job_id, event, reason, evidence, actor="launcher")

    def audit(self, job_id: str | None = None) -> list[AuditRecord]:
        return self.coordinator.audit(self.tenant, job_id)

    def browse_jobs(self, q: str | None = None, status: str | None = None, job_type: str | None = None,
                    detector: str | None = None, tag: str | None = None, sort: str | None = None,
                    order: str | None = None, limit: int | None = None, after: str | None = None) -> JobPage:
        query = JobQuery.parse(q, status, job_type, detector, tag, sort, order, limit, after)
        return self.coordinator.browse(self.tenant, query)

    def delete_job(self, job_id: str, reason: str = "") -> JobView:
        """Delete an ended job (stopped, finished, failed, lost) with its reports; audited."""
        return self.coordinator.delete_job(self.tenant, job_id, reason)

    def summary(self) -> TenantSummary:
        """The tenant's jobs by outcome and what its detectors' stops saved (steps, job-hours)."""
        return self.coordinator.summary(self.tenant)

    def export_reports(self, job_id: str, format: str = "csv") -> str:  # noqa: A002 - the API's name
        return "".join(self.coordinator.export_reports(self.tenant, job_id, format))

    def export_jobs(self, format: str = "csv", q: str | None = None, status: str | None = None,  # noqa: A002
                    job_type: str | None = None, detector: str | None = None, tag: str | None = None,
                    sort: str | None = None, order: str | None = None) -> str:
        query = JobQuery.parse(q, status, job_type, detector, tag, sort, order)
        return "".join(self.coordinator.export_jobs(self.tenant, query, format))

    def flush(self) -> bool:
        return True

    def close(self) -> None:
        self.coordinator.close()

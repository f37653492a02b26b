"""The coordinator's reads: what a tenant may see of its jobs, always the committed state (what a
restart would rebuild), never a write still on its way to the disk. No lock is held while views are
built, so listing thousands of jobs never holds up another tenant's reports."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import InvalidInput
from .job import JobState
from .records import AuditRecord, EvalTask, JobStatus, JobView, Report

if TYPE_CHECKING:
    from .repository import JobCache
    from .store import Store

__all__ = ["JobReads"]


class JobReads:
    """Read methods of :class:`~.coordinator.Coordinator` (over its ``jobs`` and ``store``)."""

    jobs: JobCache
    store: Store

    def evals(self, tenant: str, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[EvalTask]:
        """The job's published snapshots and their evals' states, in step order: those after
        ``after_step``, at most ``limit`` (a keyed read of one page)."""
        self.jobs.read(tenant, job_id)
        return self.store.evals(tenant, job_id, after_step, limit)

    def state(self, tenant: str, job_id: str) -> JobState:
        """The job's durable state (what a restart would rebuild)."""
        return self.jobs.read(tenant, job_id)

    def status(self, tenant: str, job_id: str) -> JobView:
        return self.jobs.read(tenant, job_id).view()

    def list_jobs(self, tenant: str, status: JobStatus | str | None = None, limit: int | None = None,
                  offset: int = 0) -> list[JobView]:
        """The tenant's jobs in registration order, optionally of one ``status``, paged."""
        return self.page_jobs(tenant, status, limit, offset)[0]

    def page_jobs(self, tenant: str, status: JobStatus | str | None = None, limit: int | None = None,
                  offset: int = 0) -> tuple[list[JobView], int]:
        """``(views, total)``: one page of the tenant's jobs (``total`` counts every match). No lock is
        held while views are built, so listing thousands of jobs never holds up another tenant."""
        wanted = None if status is None else (status if isinstance(status, JobStatus) else _parse_status(status))
        states, total = self.jobs.page(tenant, wanted, limit, offset)
        return [s.view() for s in states], total

    def report_span(self, tenant: str, job_id: str) -> tuple[Report | None, Report | None]:
        """The job's first and last durable report (None before any)."""
        state = self.jobs.read(tenant, job_id)
        return state.first, state.last

    def reports(self, tenant: str, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[Report]:
        """The job's durable reports in step order: those after ``after_step``, at most ``limit``."""
        self.jobs.read(tenant, job_id)
        return self.store.reports(tenant, job_id, after_step, limit)

    def audit(self, tenant: str, job_id: str | None = None, limit: int | None = None,
              offset: int = 0, after: int | None = None) -> list[AuditRecord]:
        """The tenant's audit records (of one job if ``job_id``), oldest first, paged by ``offset`` or
        by keyset (``after``: the sequence number :meth:`audit_page` gave for the previous page)."""
        return self.store.audit_page(tenant, job_id, limit, offset, after)[0]

    def audit_page(self, tenant: str, job_id: str | None = None, limit: int | None = None, offset: int = 0,
                   after: int | None = None) -> tuple[list[AuditRecord], int | None]:
        """:meth:`audit` and the ``after`` of the next page (None after an empty page)."""
        return self.store.audit_page(tenant, job_id, limit, offset, after)


def _parse_status(value: str) -> JobStatus:
    try:
        return JobStatus(value)
    except ValueError:
        raise InvalidInput(f"Unknown status {value!r}; valid statuses are: {', '.join(s.value for s in JobStatus)}.") \
            from None

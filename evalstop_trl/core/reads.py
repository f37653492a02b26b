"""The coordinator's reads: what a tenant may see of its jobs, always the committed state (what a
restart would rebuild), never a write still on its way to the disk. No lock is held while views are
built, so listing thousands of jobs never holds up another tenant's reports."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .browse import JobPage, JobQuery, select
from .errors import InvalidInput, NotFound
from .export import export_format
from .job import JobState
from .records import AuditRecord, EvalTask, JobStatus, JobView, Report
from .summary import TenantSummary

if TYPE_CHECKING:
    from .repository import JobCache
    from .store import Store

__all__ = ["EXPORT_PAGE", "JobReads"]

EXPORT_PAGE = 1000  # reports or jobs read (and held) at once by an export


class JobReads:
    """Read methods of :class:`~.coordinator.Coordinator` (over its ``jobs`` and ``store``)."""

    jobs: JobCache
    store: Store

    clock: Callable[[], float]

    def browse(self, tenant: str, query: JobQuery) -> JobPage:
        """One page of the tenant's runs that ``query`` matches, in its order (see :mod:`.browse`):
        their views, how many match in all, and the cursor of the next page. Only the page's jobs
        are built into views (finished jobs replayed on first access)."""
        page = select(self.jobs.run_rows(tenant), query, self.clock())
        views = []
        for job_id in page.jobs:
            try:
                views.append(self.jobs.read(tenant, job_id).view())
            except NotFound:  # removed since the records were read
                continue
        return JobPage(tuple(views), page.total, page.next)

    def summary(self, tenant: str) -> TenantSummary:
        """The tenant's jobs by outcome and what its detectors' stops saved (:mod:`.summary`). Views
        are built only for the jobs that need one (stopped, or in shadow mode); the rest are counted
        from their records."""
        def views():
            for record in self.jobs.run_rows(tenant):
                if record.status.value == "stopped" or record.mode == "shadow":
                    try:
                        yield self.jobs.read(tenant, record.job_id).view()
                    except NotFound:
                        continue
                else:
                    yield _RecordView(record)

        return TenantSummary.of(views())

    def export_reports(self, tenant: str, job_id: str, fmt: str = "csv") -> Iterator[str]:
        """The job's reports as ``fmt`` (``csv`` or ``json``) text chunks, read a page at a time.
        The job is looked up (NotFound) and the format checked before the first chunk."""
        writer = export_format(fmt)
        self.jobs.read(tenant, job_id)

        def pages():
            after = None
            while True:
                page = self.store.reports(tenant, job_id, after, EXPORT_PAGE)
                if page:
                    yield page
                if len(page) < EXPORT_PAGE:
                    return
                after = page[-1].step

        return writer.reports(pages())

    def export_jobs(self, tenant: str, query: JobQuery, fmt: str = "csv") -> Iterator[str]:
        """Every run ``query`` matches (its filters and order; its cursor and limit are ignored) as
        ``fmt`` text chunks, a page of :data:`EXPORT_PAGE` views at a time."""
        writer = export_format(fmt)
        first = dataclasses.replace(query, limit=EXPORT_PAGE, after=None)

        def pages():
            q = first
            while True:
                page = self.browse(tenant, q)
                if page.jobs:
                    yield page.jobs
                if page.next is None:
                    return
                cursor = JobQuery.parse(sort=q.sort, after=page.next)
                q = dataclasses.replace(first, after=cursor.after, at=cursor.at)

        return writer.jobs(pages())

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


class _RecordView:
    """What :meth:`TenantSummary.of` reads of a job that needs no replay (its status)."""

    __slots__ = ("status",)
    would_stop_step = None

    def __init__(self, record) -> None:
        self.status = record.status.value


def _parse_status(value: str) -> JobStatus:
    try:
        return JobStatus(value)
    except ValueError:
        raise InvalidInput(f"Unknown status {value!r}; valid statuses are: {', '.join(s.value for s in JobStatus)}.") \
            from None

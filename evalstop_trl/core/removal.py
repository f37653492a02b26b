"""Deleting a dead job: an operator's clean-up of one of the tenant's own ended jobs.

:meth:`JobRemoval.delete_job` removes a stopped, finished, failed or lost job with its reports,
snapshots and webhook deliveries — what ``evalstop prune`` does for old jobs, for one job, while the
service runs — and appends a ``deleted`` line to the audit log (append-only: the line stays). A job
still pending or running is refused (409: stop it or mark it failed first). The delete runs under
the job's lock, so a command that was waiting for it is refused (404) rather than writing rows of a
job that is gone. (Another replica that had the job loaded serves it from memory until it re-reads it.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import Conflict, NotFound
from .records import AuditKind, AuditRecord, JobView, check_text
from .store import PRUNABLE

if TYPE_CHECKING:
    from .repository import JobCache
    from .store import Store

__all__ = ["JobRemoval"]


class JobRemoval:
    """The delete method of :class:`~.coordinator.Coordinator` (over its ``jobs``, ``store``, ``clock``)."""

    jobs: JobCache
    store: Store
    clock: Callable[[], float]

    def delete_job(self, tenant: str, job_id: str, reason: str = "", actor: str | None = None) -> JobView:
        """Delete the tenant's ended job (see the module docstring); returns the job as it was.

        Raises:
            NotFound: no such job for this tenant. Conflict: the job is not over yet, or a write of it
            is still on its way to the disk (retry). InvalidInput: a reason that is not text.
        """
        check_text("reason", reason, 2000, multiline=True)
        slot = self.jobs.get(tenant, job_id)
        with slot.lock:
            if slot.deleted or slot.committed is None:
                raise NotFound(f"no job {job_id!r:.140} for tenant {tenant!r}")
            if slot.pending:
                raise Conflict(f"job {job_id!r} has a write in progress; retry in a moment")
            state = slot.committed
            status = state.record.status.value
            if status not in PRUNABLE:
                raise Conflict(f"job {job_id!r} is {status}: only a stopped, finished, failed or lost job can be "
                               "deleted; stop it or mark it failed first")
            view = state.view()
            audit = AuditRecord(tenant, job_id, self.clock(), AuditKind.DELETED, actor or f"tenant:{tenant}",
                                reason or "deleted", {"status": status, "n_reports": view.n_reports,
                                                      "last_step": view.last_step})
            if not self.store.delete_job(tenant, job_id, audit):
                raise NotFound(f"no job {job_id!r:.140} for tenant {tenant!r}")
            self.jobs.forget(slot, view.n_reports)
        return view

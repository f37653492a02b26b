"""The store interface: where the coordinator's state lives. The store is the source of truth.

Every store has the same interface. All writes that belong together go through one
:meth:`commit` call, which is atomic: a job's new state, the report that caused it and the audit
records it produced are written together or not at all.

Writes return a :class:`concurrent.futures.Future` that resolves (to None) once the write is durable,
or fails with :class:`StoreError`. Async code awaits it with ``asyncio.wrap_future``; threads call
``.result()``; stores that are durable at once return the shared, already-resolved :data:`DONE`.

* :class:`~evalstop_trl.stores.sqlite.SQLiteStore` — one file, WAL mode, ``synchronous=FULL``.
* :class:`~evalstop_trl.stores.memory.MemoryStore` — the same in dicts, for the simulator and tests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future

from .records import AuditRecord, Delivery, JobRecord, Report, TenantRecord

__all__ = ["DONE", "Store", "StoreError", "TenantRecord", "Ticket", "wait_durable"]

#: A pending durable write: resolves to None when on disk, or fails with StoreError.
Ticket = Future


class StoreError(RuntimeError):
    """A write could not be made durable (disk full, I/O error, store closed)."""


def _done() -> Future:
    f: Future = Future()
    f.set_result(None)
    return f


#: The already-durable ticket of stores that write at once (MemoryStore).
DONE: Future = _done()


def wait_durable(ticket: Future) -> None:
    """Block until ``ticket`` is durable; raise :class:`StoreError` if the write failed."""
    exc = ticket.exception()
    if exc is not None:
        if isinstance(exc, StoreError):
            raise exc
        raise StoreError(f"write not stored: {exc}") from exc


class Store(ABC):
    """Interface shared by all stores."""

    # tenants
    @abstractmethod
    def add_tenant(self, tenant: TenantRecord) -> None:
        """Insert a new tenant (:class:`Conflict` if the name exists)."""
    @abstractmethod
    def tenant_by_hash(self, token_hash: str) -> TenantRecord | None: ...
    @abstractmethod
    def tenant(self, name: str) -> TenantRecord | None: ...
    @abstractmethod
    def list_tenants(self) -> list[TenantRecord]: ...
    @abstractmethod
    def update_tenant(self, tenant: TenantRecord) -> bool:
        """Replace the tenant of that name (revocation, rotation, quotas); False if there is none."""

    # jobs, reports, audit, webhook deliveries
    @abstractmethod
    def commit(self, job: JobRecord, report: Report | None = None, audit: Sequence[AuditRecord] = (),
               deliveries: Sequence[Delivery] = ()) -> Ticket:
        """Atomically upsert ``job``, insert ``report`` (if any), append ``audit`` and queue ``deliveries``.

        Writes are applied in call order; the returned :class:`Ticket` says when it is durable."""

    @abstractmethod
    def add_report(self, tenant: str, job_id: str, report: Report) -> Ticket:
        """Insert one report of a job whose record does not change (the common case)."""

    @abstractmethod
    def jobs(self) -> list[JobRecord]: ...
    @abstractmethod
    def reports(self, tenant: str, job_id: str, after_step: int | None = None,
                limit: int | None = None) -> list[Report]:
        """A job's reports in step order: those after ``after_step`` (all if None), at most ``limit``."""
    @abstractmethod
    def report(self, tenant: str, job_id: str, step: int) -> Report | None:
        """The job's report of ``step``, if stored."""
    @abstractmethod
    def audit(self, tenant: str | None = None, job_id: str | None = None, limit: int | None = None,
              offset: int = 0) -> list[AuditRecord]:
        """Audit records, oldest first, of one tenant (and job) if given, paged."""

    @abstractmethod
    def pending_deliveries(self, now: float, limit: int) -> list[Delivery]:
        """Undelivered webhook deliveries due at ``now`` (``next_at <= now``), oldest first."""
    @abstractmethod
    def update_delivery(self, delivery: Delivery) -> Ticket:
        """Record an attempt's outcome (attempts, next_at, done, outcome)."""

    def probe(self) -> None:  # noqa: B027 - stores that write at once are always ready
        """Raise if the store cannot take a write now (readiness checks)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""

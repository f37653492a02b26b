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

from .records import AuditRecord, Delivery, EvalTask, JobRecord, Report, TenantRecord

__all__ = ["DONE", "StaleState", "Store", "StoreError", "TenantRecord", "Ticket", "wait_durable"]

#: A pending durable write: resolves to None when on disk, or fails with StoreError.
Ticket = Future


class StoreError(RuntimeError):
    """A write could not be made durable (disk full, I/O error, store closed)."""


class StaleState(StoreError):
    """A shared store refused a write made on stale state: another coordinator (replica) wrote the
    job since this one last read it. The coordinator reloads the job; the caller retries (503)."""


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
    """Interface shared by all stores.

    A *shared* store (``shared = True``, e.g. PostgreSQL) may be used by several coordinators at
    once (replicas). Each job then has a version (its number of writes): a write passes the version
    it expects to replace (``expect``) and fails with :class:`StaleState` if another coordinator got
    there first; coordinators re-read a job whose stored version moved. Stores used by one process
    only ignore versions.
    """

    shared: bool = False

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
               deliveries: Sequence[Delivery] = (), expect: int | None = None) -> Ticket:
        """Atomically upsert ``job``, insert ``report`` (if any), append ``audit`` and queue ``deliveries``.

        Writes are applied in call order; the returned :class:`Ticket` says when it is durable.
        ``expect``: the job's version this write replaces (shared stores; 0 for a new job)."""

    @abstractmethod
    def add_report(self, tenant: str, job_id: str, report: Report, expect: int | None = None) -> Ticket:
        """Insert one report of a job whose record does not change (the common case)."""

    @abstractmethod
    def jobs(self) -> list[JobRecord]: ...

    def job(self, tenant: str, job_id: str) -> JobRecord | None:
        """One job (shared stores override this with a query)."""
        return next((j for j in self.jobs() if (j.tenant, j.job_id) == (tenant, job_id)), None)

    def job_versions(self, tenant: str, job_ids: Sequence[str]) -> dict[str, int]:
        """The stored version of each job (shared stores only)."""
        raise NotImplementedError

    def job_page(self, tenant: str, status: str | None, limit: int | None, offset: int) -> tuple[list[str], int]:
        """One page of a tenant's job ids in registration order, and the total (shared stores only)."""
        raise NotImplementedError

    def count_active(self, tenant: str) -> int:
        """The tenant's jobs that are not stopped, finished or failed (shared stores only)."""
        raise NotImplementedError
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
    def claim_deliveries(self, now: float, limit: int, lease_s: float) -> list[Delivery]:
        """Claim undelivered webhook deliveries due at ``now`` (``next_at <= now``), oldest first: each is
        leased for ``lease_s`` (its ``next_at`` moves on), so no other sender takes it meanwhile, and
        a sender that dies only delays it."""
    @abstractmethod
    def update_delivery(self, delivery: Delivery) -> Ticket:
        """Record an attempt's outcome (attempts, next_at, done, outcome)."""

    # external evals (snapshots published by jobs, scored by `evalstop evaluate` workers)
    @abstractmethod
    def put_eval(self, task: EvalTask) -> Ticket:
        """Insert or replace the eval task of (tenant, job_id, step)."""
    @abstractmethod
    def evals(self, tenant: str, job_id: str) -> list[EvalTask]:
        """A job's eval tasks in step order."""
    def eval(self, tenant: str, job_id: str, step: int) -> EvalTask | None:
        """The eval task of one snapshot (SQL stores override this with a keyed query)."""
        return next((t for t in self.evals(tenant, job_id) if t.step == step), None)

    def unfed_evals(self, tenant: str, job_id: str) -> list[EvalTask]:
        """A job's eval tasks not yet fed to its detector, in step order."""
        return [t for t in self.evals(tenant, job_id) if not t.fed]

    @abstractmethod
    def claimable_evals(self, tenant: str, now: float, limit: int) -> list[EvalTask]:
        """The tenant's tasks a worker may take now (pending, or leased with the lease run out), oldest first."""

    def probe(self) -> None:  # noqa: B027 - stores that write at once are always ready
        """Raise if the store cannot take a write now (readiness checks)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""

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

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future
from typing import NamedTuple

from .browse import RunRow
from .records import AuditRecord, Delivery, EvalState, EvalTask, JobRecord, Report, TenantRecord

__all__ = ["DONE", "JobLimits", "LimitReached", "PruneCounts", "StaleState", "Store", "StoreError", "TenantRecord",
           "Ticket", "revival_refused", "wait_durable"]

#: A pending durable write: resolves to None when on disk, or fails with StoreError.
Ticket = Future


class StoreError(RuntimeError):
    """A write could not be made durable (disk full, I/O error, store closed)."""


class StaleState(StoreError):
    """A shared store refused a write made on stale state: another coordinator (replica) wrote the
    job since this one last read it. The coordinator reloads the job; the caller retries (503)."""


class LimitReached(StoreError):
    """A shared store refused a registration over the tenant's quota (checked in the insert's own
    transaction, so concurrent registrations on several replicas cannot pass it together)."""


def revival_refused(tenant: str, job_id: str, active: int, limit: int) -> str:
    """Why a lost job may not run again: its tenant is at its active-job quota."""
    return (f"tenant {tenant!r} has {active} active jobs, the most allowed (max_active_jobs={limit}): lost job "
            f"{job_id!r} cannot run again until one of them finishes, is stopped or is lost; finish or stop "
            "one first (or ask for a larger quota)")


class JobLimits(NamedTuple):
    """The quotas a new job's insert checks atomically: all of the tenant's jobs, its active ones."""

    max_jobs: int
    max_active_jobs: int


class PruneCounts(NamedTuple):
    """What :meth:`Store.prune` deleted (or would delete, in a dry run)."""

    jobs: int
    reports: int
    evals: int
    deliveries: int
    audit: int = 0  # audit lines past their retention (a stored job keeps its newest of each kind)


#: the statuses a job may be pruned in (it is over: nothing reports to it any more)
PRUNABLE = ("stopped", "finished", "failed", "lost")


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
    #: methods that only queue a write and return its ticket, never waiting on a disk or a network:
    #: the only store calls the service may make on its event loop
    QUEUED_WRITES = frozenset({"commit", "add_report"})

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
        ``expect``: the job's version this write replaces (shared stores; 0 for a new job): a shared
        store writes only if the stored job is still at that version and is ``job`` itself (its
        ``created_at``, not a job registered again under its id since)."""

    def register(self, job: JobRecord, limits: JobLimits) -> Ticket:
        """Insert a new job. A shared store checks ``limits`` in the insert's transaction and fails the
        ticket with :class:`LimitReached`; a store of one process leaves them to the coordinator, which
        checks them under its registration lock."""
        return self.commit(job, expect=0)

    def revive(self, job: JobRecord, report: Report | None, audit: Sequence[AuditRecord], deliveries: Sequence[Delivery],
               expect: int | None, limits: JobLimits) -> Ticket:
        """:meth:`commit` of a lost job that runs again. A shared store checks ``limits.max_active_jobs``
        in the write's transaction and fails the ticket with :class:`LimitReached` (replicas reviving
        several jobs at once cannot pass the quota together); a store of one process leaves it to the
        coordinator, which checks it under its registration lock."""
        return self.commit(job, report, audit, deliveries, expect=expect)

    @abstractmethod
    def add_report(self, tenant: str, job_id: str, report: Report, expect: int | None = None,
                   created: float | None = None) -> Ticket:
        """Insert one report of a job whose record does not change (the common case). ``expect``,
        ``created``: the job's version this write replaces and its ``created_at`` (shared stores: a
        stale version, or another job under the id, refuses the write with StaleState)."""

    @abstractmethod
    def jobs(self) -> list[JobRecord]: ...

    def job(self, tenant: str, job_id: str) -> JobRecord | None:
        """One job (shared stores override this with a query)."""
        return next((j for j in self.jobs() if (j.tenant, j.job_id) == (tenant, job_id)), None)

    def run_rows(self, tenant: str) -> list[RunRow]:
        """What the job list searches and sorts of each of one tenant's jobs (shared stores: one indexed
        query of a few columns)."""
        return [RunRow.of(j) for j in self.jobs() if j.tenant == tenant]

    def job_versions(self, tenant: str, job_ids: Sequence[str]) -> dict[str, tuple[float, int]]:
        """Each stored job's identity (shared stores only): its ``created_at`` and version. A job deleted
        and registered again under its id is another job (another ``created_at``), whose version starts
        again: a replica compares both."""
        raise NotImplementedError

    def job_page(self, tenant: str, status: str | None, limit: int | None, offset: int) -> tuple[list[str], int]:
        """One page of a tenant's job ids in registration order, and the total (shared stores only)."""
        raise NotImplementedError

    def count_active(self, tenant: str) -> int:
        """The tenant's jobs that are not stopped, finished or failed (shared stores only)."""
        raise NotImplementedError

    def count_jobs(self, tenant: str) -> int:
        """All of the tenant's jobs, whatever their status."""
        return sum(1 for j in self.jobs() if j.tenant == tenant)

    def count_reports(self, tenant: str) -> int:
        """All of the tenant's stored reports (the per-tenant report quota)."""
        return sum(len(self.reports(j.tenant, j.job_id)) for j in self.jobs() if j.tenant == tenant)

    def count_audit_bytes(self, tenant: str) -> int:
        """What the tenant's audit lines take (:attr:`AuditRecord.nbytes` summed; the ``max_audit_bytes`` quota)."""
        return sum(a.nbytes for a in self.audit(tenant))

    def count_events(self, tenant: str, job_id: str) -> int:
        """The job's launcher events and amendments in the audit log (the per-job event quota)."""
        return sum(1 for a in self.audit(tenant, job_id) if a.kind.counted)

    def count_evals(self, tenant: str, job_id: str) -> int:
        """The job's published snapshots (the per-job snapshot quota)."""
        return len(self.evals(tenant, job_id))

    def delete_job(self, tenant: str, job_id: str, audit: AuditRecord) -> bool:
        """Delete one ended job (stopped, finished, failed or lost) with its reports, evals and webhook
        deliveries, and append ``audit``, in one transaction; False (nothing written) if there is no such
        ended job. Durable when it returns."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete a job")

    def prune(self, before: float, tenant: str | None = None, dry_run: bool = False,
              audit_before: float | None = None) -> PruneCounts:
        """Delete the jobs that ended (stopped, finished, failed or lost) and were last updated before
        ``before``, with their reports, evals and webhook deliveries. The audit log is append-only to
        everyone else; with ``audit_before`` retention also deletes the audit lines written before it,
        in the same transaction: every such line of a job no longer stored (pruned now or earlier, or
        deleted), and of a stored job all but its newest line of each kind (its stop, its ack, its
        latest amendment... stay while the job does; a job id kept alive does not keep a flood). ``dry_run``: only count. Run it while no coordinator serves the store (a running
        one keeps the jobs it loaded until it restarts)."""
        raise NotImplementedError(f"{type(self).__name__} cannot prune")
    @abstractmethod
    def reports(self, tenant: str, job_id: str, after_step: int | None = None,
                limit: int | None = None) -> list[Report]:
        """A job's reports in step order: those after ``after_step`` (all if None), at most ``limit``."""
    @abstractmethod
    def report(self, tenant: str, job_id: str, step: int) -> Report | None:
        """The job's report of ``step``, if stored."""
    def audit(self, tenant: str | None = None, job_id: str | None = None, limit: int | None = None,
              offset: int = 0, after: int | None = None) -> list[AuditRecord]:
        """Audit records, oldest first, of one tenant (and job) if given, paged: by ``offset``, or by
        keyset (``after``: the sequence number of the last record of the previous page)."""
        return self.audit_page(tenant, job_id, limit, offset, after)[0]

    @abstractmethod
    def audit_page(self, tenant: str | None, job_id: str | None, limit: int | None, offset: int = 0,
                   after: int | None = None) -> tuple[list[AuditRecord], int | None]:
        """:meth:`audit` and the sequence number of the page's last record (None for an empty page),
        the ``after`` of the next page. An index on (tenant, seq) keeps a page's cost bounded."""

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
    def evals(self, tenant: str, job_id: str, after_step: int | None = None,
              limit: int | None = None) -> list[EvalTask]:
        """A job's eval tasks in step order: those after ``after_step``, at most ``limit``."""
    def eval(self, tenant: str, job_id: str, step: int) -> EvalTask | None:
        """The eval task of one snapshot (SQL stores override this with a keyed query)."""
        return next((t for t in self.evals(tenant, job_id) if t.step == step), None)

    def unfed_evals(self, tenant: str, job_id: str, limit: int | None = None) -> list[EvalTask]:
        """A job's eval tasks not yet fed to its detector, in step order (the first ``limit``)."""
        return [t for t in self.evals(tenant, job_id) if not t.fed][:limit]

    @abstractmethod
    def claimable_evals(self, tenant: str, now: float, limit: int) -> list[EvalTask]:
        """The tenant's tasks a worker may take now (pending, or leased with the lease run out), oldest first."""

    def claim_eval(self, tenant: str, now: float, lease_s: float, worker: str) -> EvalTask | None:
        """Lease the tenant's oldest claimable task to ``worker`` until ``now + lease_s``, durably, and
        return it (None if none). A shared store does it in one statement (``FOR UPDATE SKIP LOCKED``),
        so two replicas never lease one snapshot twice; here the caller serialises claims."""
        for task in self.claimable_evals(tenant, now, 1):
            claimed = dataclasses.replace(task, state=task.state.to(EvalState.LEASED), lease_until=now + lease_s,
                                          worker=worker)
            wait_durable(self.put_eval(claimed))
            return claimed
        return None

    def probe(self) -> None:  # noqa: B027 - stores that write at once are always ready
        """Raise if the store cannot take a write now (readiness checks)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""

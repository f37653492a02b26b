"""MemoryStore: the store interface in dicts; fast; lost when the process ends (simulator, tests)."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.errors import Conflict
from ..core.records import AuditRecord, JobRecord, Report, TenantRecord
from ..core.store import DONE, Store, Ticket

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    """Everything in dicts; fast; lost when the process ends."""

    def __init__(self) -> None:
        self._tenants: dict[str, TenantRecord] = {}
        self._jobs: dict[tuple[str, str], JobRecord] = {}
        self._reports: dict[tuple[str, str], list[Report]] = {}
        self._audit: list[AuditRecord] = []

    def add_tenant(self, tenant: TenantRecord) -> None:
        if tenant.name in self._tenants:
            raise Conflict(f"tenant {tenant.name!r} already exists")
        self._tenants[tenant.name] = tenant

    def tenant_by_hash(self, token_hash: str) -> TenantRecord | None:
        return next((t for t in self._tenants.values() if t.token_hash == token_hash), None)

    def list_tenants(self) -> list[TenantRecord]:
        return sorted(self._tenants.values(), key=lambda t: t.name)

    def revoke_tenant(self, name: str) -> bool:
        t = self._tenants.get(name)
        if t is None:
            return False
        self._tenants[name] = TenantRecord(t.name, t.token_hash, t.created_at, True)
        return True

    def commit(self, job: JobRecord, report: Report | None = None, audit: Sequence[AuditRecord] = ()) -> Ticket:
        key = (job.tenant, job.job_id)
        self._jobs[key] = job
        reports = self._reports.setdefault(key, [])
        if report is not None:
            reports.append(report)
        if audit:
            self._audit.extend(audit)
        return DONE

    def add_report(self, tenant: str, job_id: str, report: Report) -> Ticket:
        self._reports[(tenant, job_id)].append(report)
        return DONE

    def jobs(self) -> list[JobRecord]:
        return list(self._jobs.values())

    def reports(self, tenant: str, job_id: str) -> list[Report]:
        return sorted(self._reports.get((tenant, job_id), ()), key=lambda r: r.step)

    def audit(self, tenant: str | None = None) -> list[AuditRecord]:
        return [a for a in self._audit if tenant is None or a.tenant == tenant]

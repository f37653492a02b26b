"""MemoryStore: the store interface in dicts; fast; lost when the process ends (simulator, tests)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import replace

from .errors import Conflict
from .records import AuditRecord, Delivery, EvalState, EvalTask, JobRecord, Report, TenantRecord
from .store import DONE, PRUNABLE, PruneCounts, Store, Ticket

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    """Everything in dicts; fast; lost when the process ends."""

    def __init__(self) -> None:
        self._tenants: dict[str, TenantRecord] = {}
        self._jobs: dict[tuple[str, str], JobRecord] = {}
        self._reports: dict[tuple[str, str], list[Report]] = {}  # in step order (the coordinator's rule)
        self._audit: list[AuditRecord | None] = []  # seq = index + 1 (None: pruned by retention)
        self._audit_by: dict[tuple[str, ...], list[int]] = {}  # (tenant,) and (tenant, job_id) -> indexes
        self._deliveries: dict[str, Delivery] = {}
        self._evals: dict[tuple[str, str, int], EvalTask] = {}

    # tenants
    def add_tenant(self, tenant: TenantRecord) -> None:
        if tenant.name in self._tenants:
            raise Conflict(f"tenant {tenant.name!r} already exists")
        self._tenants[tenant.name] = tenant

    def tenant_by_hash(self, token_hash: str) -> TenantRecord | None:
        return next((t for t in self._tenants.values() if t.token_hash == token_hash), None)

    def tenant(self, name: str) -> TenantRecord | None:
        return self._tenants.get(name)

    def list_tenants(self) -> list[TenantRecord]:
        return sorted(self._tenants.values(), key=lambda t: t.name)

    def update_tenant(self, tenant: TenantRecord) -> bool:
        if tenant.name not in self._tenants:
            return False
        self._tenants[tenant.name] = tenant
        return True

    # jobs, reports, audit
    def commit(self, job: JobRecord, report: Report | None = None, audit: Sequence[AuditRecord] = (),
               deliveries: Sequence[Delivery] = (), expect: int | None = None) -> Ticket:
        key = (job.tenant, job.job_id)
        self._jobs[key] = job
        reports = self._reports.setdefault(key, [])
        if report is not None:
            reports.append(report)
        self.commit_audit(audit)
        for d in deliveries:
            self._deliveries[d.id] = d
        return DONE

    def commit_audit(self, audit: Sequence[AuditRecord]) -> None:
        """Append audit records (indexed by tenant and by job)."""
        for a in audit:
            i = len(self._audit)
            self._audit.append(a)
            self._audit_by.setdefault((a.tenant,), []).append(i)
            self._audit_by.setdefault((a.tenant, a.job_id), []).append(i)

    def add_report(self, tenant: str, job_id: str, report: Report, expect: int | None = None,
                   created: float | None = None) -> Ticket:
        self._reports[(tenant, job_id)].append(report)
        return DONE

    def jobs(self) -> list[JobRecord]:
        return list(self._jobs.values())

    def reports(self, tenant: str, job_id: str, after_step: int | None = None,
                limit: int | None = None) -> list[Report]:
        reports = self._reports.get((tenant, job_id), [])
        start = 0 if after_step is None else bisect.bisect_right(reports, after_step, key=lambda r: r.step)
        return reports[start:] if limit is None else reports[start:start + limit]

    def report(self, tenant: str, job_id: str, step: int) -> Report | None:
        reports = self._reports.get((tenant, job_id), [])
        i = bisect.bisect_left(reports, step, key=lambda r: r.step)
        return reports[i] if i < len(reports) and reports[i].step == step else None

    def audit_page(self, tenant: str | None, job_id: str | None, limit: int | None, offset: int = 0,
                   after: int | None = None) -> tuple[list[AuditRecord], int | None]:
        if tenant is None:
            indexes = [i for i, a in enumerate(self._audit) if a is not None and (job_id is None or a.job_id == job_id)]
        else:
            indexes = self._audit_by.get((tenant,) if job_id is None else (tenant, job_id), [])
        start = offset if after is None else bisect.bisect_right(indexes, after - 1)
        page = indexes[start:] if limit is None else indexes[start:start + limit]
        return [self._audit[i] for i in page], (page[-1] + 1 if page else None)

    def count_jobs(self, tenant: str) -> int:
        return sum(1 for t, _ in self._jobs if t == tenant)

    def count_reports(self, tenant: str) -> int:
        return sum(len(v) for (t, _), v in self._reports.items() if t == tenant)

    def count_events(self, tenant: str, job_id: str) -> int:
        return sum(1 for i in self._audit_by.get((tenant, job_id), []) if self._audit[i].kind.from_launcher)

    def prune(self, before: float, tenant: str | None = None, dry_run: bool = False,
              audit_before: float | None = None) -> PruneCounts:
        keys = [k for k, j in self._jobs.items()
                if j.status.value in PRUNABLE and j.updated_at < before and (tenant is None or j.tenant == tenant)]
        gone = set(keys)
        evals = [k for k in self._evals if k[:2] in gone]
        deliveries = [k for k, d in self._deliveries.items() if (d.tenant, d.job_id) in gone]
        newest = {} if audit_before is None else {  # a stored job keeps its newest line of each kind
            (a.tenant, a.job_id, a.kind): i for i, a in enumerate(self._audit) if a is not None}
        old = [] if audit_before is None else [
            i for i, a in enumerate(self._audit) if a is not None and a.at < audit_before
            and (tenant is None or a.tenant == tenant) and ((a.tenant, a.job_id) in gone or (a.tenant, a.job_id)
                                                            not in self._jobs or newest[a.tenant, a.job_id, a.kind] != i)]
        counts = PruneCounts(len(keys), sum(len(self._reports.get(k, ())) for k in keys), len(evals), len(deliveries),
                             len(old))
        if not dry_run and old:  # a line's seq stays its index + 1: a pruned line leaves a hole
            drop = set(old)
            for i in old:
                self._audit[i] = None
            for key, indexes in self._audit_by.items():
                self._audit_by[key] = [i for i in indexes if i not in drop]
        if not dry_run:
            for k in keys:
                del self._jobs[k]
                self._reports.pop(k, None)
            for k in evals:
                del self._evals[k]
            for k in deliveries:
                del self._deliveries[k]
        return counts

    def delete_job(self, tenant: str, job_id: str, audit: AuditRecord) -> bool:
        key = (tenant, job_id)
        job = self._jobs.get(key)
        if job is None or job.status.value not in PRUNABLE:
            return False
        del self._jobs[key]
        self._reports.pop(key, None)
        for k in [k for k in self._evals if k[:2] == key]:
            del self._evals[k]
        for k in [k for k, d in self._deliveries.items() if (d.tenant, d.job_id) == key]:
            del self._deliveries[k]
        self.commit_audit((audit,))
        return True

    # webhook deliveries
    def job(self, tenant: str, job_id: str) -> JobRecord | None:
        return self._jobs.get((tenant, job_id))

    def put_eval(self, task: EvalTask) -> Ticket:
        self._evals[(task.tenant, task.job_id, task.step)] = task
        return DONE

    def evals(self, tenant: str, job_id: str, after_step: int | None = None,
              limit: int | None = None) -> list[EvalTask]:
        tasks = sorted((t for t in self._evals.values() if (t.tenant, t.job_id) == (tenant, job_id)
                        and (after_step is None or t.step > after_step)), key=lambda t: t.step)
        return tasks if limit is None else tasks[:limit]

    def eval(self, tenant: str, job_id: str, step: int) -> EvalTask | None:
        return self._evals.get((tenant, job_id, step))

    def claimable_evals(self, tenant: str, now: float, limit: int) -> list[EvalTask]:
        due = [t for t in self._evals.values() if t.tenant == tenant and _claimable(t, now)]
        return sorted(due, key=lambda t: (t.created_at, t.job_id, t.step))[:limit]

    def claim_deliveries(self, now: float, limit: int, lease_s: float) -> list[Delivery]:
        due = sorted((d for d in self._deliveries.values() if not d.done and d.next_at <= now),
                     key=lambda d: (d.created_at, d.id))[:limit]
        for d in due:
            self._deliveries[d.id] = replace(d, next_at=now + lease_s)
        return due

    def update_delivery(self, delivery: Delivery) -> Ticket:
        self._deliveries[delivery.id] = delivery
        return DONE


def _claimable(t: EvalTask, now: float) -> bool:
    return t.state is EvalState.PENDING or (t.state is EvalState.LEASED and t.lease_until <= now)

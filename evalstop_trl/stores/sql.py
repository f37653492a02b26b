"""What the SQL stores (SQLite, PostgreSQL) share: column lists, row codecs, query builders.

Queries are written with ``?`` placeholders; :func:`q` turns them into PostgreSQL's ``%s``.
"""

from __future__ import annotations

import json

from ..core.records import AuditKind, AuditRecord, Delivery, EvalState, EvalTask, Report, TenantRecord

__all__ = ["SQLReads", "AUDIT_COLS", "DELIVERY_COLS", "EVAL_COLS", "REPORT_COLS", "TENANT_COLS", "audit_from_row", "audit_query",
           "delivery_from_row", "delivery_row", "eval_from_row", "eval_row", "q", "tenant_from_row"]

TENANT_COLS = "name, token_hash, created_at, revoked, quotas, webhook_secret"
REPORT_COLS = "step, eval_score, train_loss, proxy_reward, checkpoint, received_at"
AUDIT_COLS = "tenant, job_id, at, kind, actor, reason, evidence"
DELIVERY_COLS = "id, tenant, job_id, url, body, created_at, attempts, next_at, done, outcome"
EVAL_COLS = "tenant, job_id, step, path, created_at, train_loss, proxy_reward, state, lease_until, worker, score, fed"


def q(query: str, postgres: bool) -> str:
    """``query`` with PostgreSQL placeholders when ``postgres``."""
    return query.replace("?", "%s") if postgres else query


def tenant_from_row(r: tuple) -> TenantRecord:
    return TenantRecord(r[0], r[1], r[2], bool(r[3]), json.loads(r[4]), r[5])


def audit_query(tenant: str | None, job_id: str | None) -> tuple[str, list]:
    """SELECT of audit records (of a tenant, of a job), oldest first, with ``? ?`` left for LIMIT/OFFSET."""
    where, args = [], []
    if tenant is not None:
        where.append("tenant=?")
        args.append(tenant)
    if job_id is not None:
        where.append("job_id=?")
        args.append(job_id)
    query = f"SELECT {AUDIT_COLS} FROM audit" + (" WHERE " + " AND ".join(where) if where else "")
    return query + " ORDER BY seq LIMIT ? OFFSET ?", args


def audit_from_row(r: tuple) -> AuditRecord:
    return AuditRecord(r[0], r[1], r[2], AuditKind(r[3]), r[4], r[5], json.loads(r[6]))


def delivery_row(d: Delivery) -> tuple:
    return (d.id, d.tenant, d.job_id, d.url, d.body, d.created_at, d.attempts, d.next_at, d.done, d.outcome)


def delivery_from_row(r: tuple) -> Delivery:
    return Delivery(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[8]), r[9])


def eval_row(t: EvalTask) -> tuple:
    return (t.tenant, t.job_id, t.step, t.path, t.created_at, t.train_loss, t.proxy_reward, t.state.value,
            t.lease_until, t.worker, t.score, t.fed)


def eval_from_row(r: tuple) -> EvalTask:
    return EvalTask(r[0], r[1], r[2], r[3], r[4], r[5], r[6], EvalState(r[7]), r[8], r[9], r[10], bool(r[11]))


class SQLReads:
    """The reads SQLite and PostgreSQL answer with the same SQL (``?`` placeholders; a store's
    ``_read(query, args)`` runs them, PostgreSQL's after :func:`q`). ``_NO_LIMIT`` is what a store's
    ``LIMIT`` takes for "no limit" (-1 for SQLite, NULL for PostgreSQL)."""

    _NO_LIMIT: int | None = None

    def _read(self, query: str, args: tuple = ()) -> list[tuple]:  # pragma: no cover - each store's own
        raise NotImplementedError

    def _limit(self, limit: int | None) -> int | None:
        return self._NO_LIMIT if limit is None else limit

    def tenant_by_hash(self, token_hash: str) -> TenantRecord | None:
        rows = self._read(f"SELECT {TENANT_COLS} FROM tenants WHERE token_hash=?", (token_hash,))
        return tenant_from_row(rows[0]) if rows else None

    def tenant(self, name: str) -> TenantRecord | None:
        rows = self._read(f"SELECT {TENANT_COLS} FROM tenants WHERE name=?", (name,))
        return tenant_from_row(rows[0]) if rows else None

    def list_tenants(self) -> list[TenantRecord]:
        return [tenant_from_row(r) for r in self._read(f"SELECT {TENANT_COLS} FROM tenants ORDER BY name")]

    def reports(self, tenant: str, job_id: str, after_step: int | None = None,
                limit: int | None = None) -> list[Report]:
        rows = self._read(f"SELECT {REPORT_COLS} FROM reports WHERE tenant=? AND job_id=? AND step>? "
                          "ORDER BY step LIMIT ?",
                          (tenant, job_id, -1 if after_step is None else after_step, self._limit(limit)))
        return [Report(*r) for r in rows]

    def report(self, tenant: str, job_id: str, step: int) -> Report | None:
        rows = self._read(f"SELECT {REPORT_COLS} FROM reports WHERE tenant=? AND job_id=? AND step=?",
                          (tenant, job_id, step))
        return Report(*rows[0]) if rows else None

    def audit(self, tenant: str | None = None, job_id: str | None = None, limit: int | None = None,
              offset: int = 0) -> list[AuditRecord]:
        query, args = audit_query(tenant, job_id)
        return [audit_from_row(r) for r in self._read(query, (*args, self._limit(limit), offset))]

    def evals(self, tenant: str, job_id: str) -> list[EvalTask]:
        rows = self._read(f"SELECT {EVAL_COLS} FROM evals WHERE tenant=? AND job_id=? ORDER BY step", (tenant, job_id))
        return [eval_from_row(r) for r in rows]

    def eval(self, tenant: str, job_id: str, step: int) -> EvalTask | None:
        rows = self._read(f"SELECT {EVAL_COLS} FROM evals WHERE tenant=? AND job_id=? AND step=?", (tenant, job_id, step))
        return eval_from_row(rows[0]) if rows else None

    def unfed_evals(self, tenant: str, job_id: str) -> list[EvalTask]:
        rows = self._read(f"SELECT {EVAL_COLS} FROM evals WHERE tenant=? AND job_id=? AND NOT fed ORDER BY step",
                          (tenant, job_id))
        return [eval_from_row(r) for r in rows]

    def claimable_evals(self, tenant: str, now: float, limit: int) -> list[EvalTask]:
        rows = self._read(f"SELECT {EVAL_COLS} FROM evals WHERE tenant=? AND (state='pending' OR "
                          "(state='leased' AND lease_until<=?)) ORDER BY created_at, job_id, step LIMIT ?",
                          (tenant, now, limit))
        return [eval_from_row(r) for r in rows]

"""What the SQL stores (SQLite, PostgreSQL) share: column lists, row codecs, query builders.

Queries are written with ``?`` placeholders; :func:`q` turns them into PostgreSQL's ``%s``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..core.labels import EMPTY as EMPTY_LABELS
from ..core.records import (
    AuditKind,
    AuditRecord,
    Delivery,
    EvalState,
    EvalTask,
    JobRecord,
    JobStatus,
    Report,
    TenantRecord,
)
from ..core.store import PRUNABLE, JobLimits, LimitReached, PruneCounts, revival_refused

__all__ = ["SQLReads", "check_revival", "AUDIT_COLS", "DELIVERY_COLS", "EVAL_COLS", "REPORT_COLS", "TENANT_COLS", "audit_from_row",
           "delivery_from_row", "delivery_row", "eval_from_row", "eval_row", "labels_from", "labels_json", "q", "tenant_from_row"]

TENANT_COLS = "name, token_hash, created_at, revoked, quotas, webhook_secret"
_COUNTED = ", ".join(f"'{k.value}'" for k in AuditKind if k.counted)  # AuditKind.counted, in SQL
REPORT_COLS = ", ".join(Report._fields)  # the columns are the record's fields, in order
AUDIT_COLS = "tenant, job_id, at, kind, actor, reason, evidence"
DELIVERY_COLS = "id, tenant, job_id, url, body, created_at, attempts, next_at, done, outcome"
_EVAL_FIELDS = tuple(f.name for f in dataclasses.fields(EvalTask))
EVAL_COLS = ", ".join(_EVAL_FIELDS)  # the columns are the record's fields, in order


def q(query: str, postgres: bool) -> str:
    """``query`` with PostgreSQL placeholders when ``postgres``."""
    return query.replace("?", "%s") if postgres else query


def check_revival(db: Any, job: JobRecord, limits: JobLimits, postgres: bool) -> None:
    """Inside a lost job's revival write: :class:`LimitReached` if its tenant already has
    ``limits.max_active_jobs`` active jobs (the write's transaction serialises the count)."""
    active_statuses = ", ".join(f"'{s.value}'" for s in JobStatus if s.active)
    active = db.execute(q(f"SELECT count(*) FROM jobs WHERE tenant=? AND status IN ({active_statuses})", postgres),
                        (job.tenant,)).fetchone()[0]
    if active >= limits.max_active_jobs:
        raise LimitReached(revival_refused(job.tenant, job.job_id, active, limits.max_active_jobs))


def labels_json(labels: Mapping[str, Any]) -> str:
    """A job's tags or hparams as stored (JSON, keys sorted)."""
    return json.dumps(dict(labels), sort_keys=True, allow_nan=False)


def labels_from(text: str | None) -> Mapping[str, Any]:
    """Stored tags or hparams (kept as they were stored: bounds are checked on the way in)."""
    return MappingProxyType(json.loads(text)) if text and text != "{}" else EMPTY_LABELS


def tenant_from_row(r: tuple) -> TenantRecord:
    return TenantRecord(r[0], r[1], r[2], bool(r[3]), json.loads(r[4]), r[5])


def _audit_where(tenant: str | None, job_id: str | None) -> tuple[list[str], list]:
    where, args = [], []
    if tenant is not None:
        where.append("tenant=?")
        args.append(tenant)
    if job_id is not None:
        where.append("job_id=?")
        args.append(job_id)
    return where, args


#: SQL of the jobs :meth:`SQLReads.prune` deletes (``?``: updated before, then the tenant if given)
_PRUNED = f"status IN ({', '.join(repr(s) for s in PRUNABLE)}) AND updated_at < ?"


def audit_from_row(r: tuple) -> AuditRecord:
    return AuditRecord(r[0], r[1], r[2], AuditKind(r[3]), r[4], r[5], json.loads(r[6]))


def delivery_row(d: Delivery) -> tuple:
    return (d.id, d.tenant, d.job_id, d.url, d.body, d.created_at, d.attempts, d.next_at, d.done, d.outcome)


def delivery_from_row(r: tuple) -> Delivery:
    return Delivery(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[8]), r[9])


def eval_row(t: EvalTask) -> tuple:
    return tuple(t.state.value if f == "state" else getattr(t, f) for f in _EVAL_FIELDS)


def eval_from_row(r: tuple) -> EvalTask:
    values = dict(zip(_EVAL_FIELDS, r, strict=True))
    return EvalTask(**{**values, "state": EvalState(values["state"]), "fed": bool(values["fed"])})


class SQLReads:
    """The reads SQLite and PostgreSQL answer with the same SQL (``?`` placeholders; a store's
    ``_read(query, args)`` runs them, PostgreSQL's after :func:`q`). ``_NO_LIMIT`` is what a store's
    ``LIMIT`` takes for "no limit" (-1 for SQLite, NULL for PostgreSQL)."""

    _NO_LIMIT: int | None = None
    _POSTGRES = False
    _JOB_ORDER = "rowid"  # registration order (PostgreSQL: its seq column)

    def _read(self, query: str, args: tuple = ()) -> list[tuple]:  # pragma: no cover - each store's own
        raise NotImplementedError

    def _limit(self, limit: int | None) -> int | None:
        return self._NO_LIMIT if limit is None else limit

    def job_page(self, tenant: str, status: str | None, limit: int | None, offset: int) -> tuple[list[str], int]:
        """One page of a tenant's job ids in registration order, and the total (shared stores)."""
        where, args = "tenant=?", [tenant]
        if status is not None:
            where += " AND status=?"
            args.append(status)
        total = self._read(f"SELECT count(*) FROM jobs WHERE {where}", tuple(args))[0][0]
        rows = self._read(f"SELECT job_id FROM jobs WHERE {where} ORDER BY {self._JOB_ORDER} LIMIT ? OFFSET ?",
                          (*args, self._limit(limit), offset))
        return [r[0] for r in rows], total

    def count_active(self, tenant: str) -> int:
        """The tenant's pending and running jobs (shared stores)."""
        return self._read("SELECT count(*) FROM jobs WHERE tenant=? AND status IN ('pending', 'running')",
                          (tenant,))[0][0]

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

    def audit_page(self, tenant: str | None, job_id: str | None, limit: int | None, offset: int = 0,
                   after: int | None = None) -> tuple[list[AuditRecord], int | None]:
        """Keyset (``seq > after``) over the (tenant, seq) or (tenant, job_id, seq) index; an offset
        is found in the index alone (``seq >=`` the offset-th seq), never by sorting or reading rows."""
        where, args = _audit_where(tenant, job_id)
        if after is not None:
            where, args = [*where, "seq>?"], [*args, after]
        elif offset:
            inner = " AND ".join(where) or "1=1"
            where, args = [*where, f"seq>=(SELECT seq FROM audit WHERE {inner} ORDER BY seq LIMIT 1 OFFSET ?)"], \
                [*args, *args, offset]
        query = f"SELECT seq, {AUDIT_COLS} FROM audit" + (" WHERE " + " AND ".join(where) if where else "")
        rows = self._read(query + " ORDER BY seq LIMIT ?", (*args, self._limit(limit)))
        return [audit_from_row(r[1:]) for r in rows], (rows[-1][0] if rows else None)

    def evals(self, tenant: str, job_id: str, after_step: int | None = None,
              limit: int | None = None) -> list[EvalTask]:
        rows = self._read(f"SELECT {EVAL_COLS} FROM evals WHERE tenant=? AND job_id=? AND step>? ORDER BY step LIMIT ?",
                          (tenant, job_id, -1 if after_step is None else after_step, self._limit(limit)))
        return [eval_from_row(r) for r in rows]

    def count_jobs(self, tenant: str) -> int:
        return self._read("SELECT count(*) FROM jobs WHERE tenant=?", (tenant,))[0][0]

    def count_reports(self, tenant: str) -> int:
        return self._read("SELECT count(*) FROM reports WHERE tenant=?", (tenant,))[0][0]

    def count_audit_bytes(self, tenant: str) -> int:
        octets = "octet_length({})" if self._POSTGRES else "length(CAST({} AS BLOB))"
        size = " + ".join(octets.format(c) for c in ("job_id", "actor", "reason", "evidence"))
        return self._read(f"SELECT COALESCE(SUM(48 + {size}), 0) FROM audit WHERE tenant=?", (tenant,))[0][0]

    def count_events(self, tenant: str, job_id: str) -> int:
        return self._read(f"SELECT count(*) FROM audit WHERE tenant=? AND job_id=? AND kind IN ({_COUNTED})",
                          (tenant, job_id))[0][0]

    def count_evals(self, tenant: str, job_id: str) -> int:
        return self._read("SELECT count(*) FROM evals WHERE tenant=? AND job_id=?", (tenant, job_id))[0][0]

    def _write(self, op) -> None:  # pragma: no cover - each store's own
        raise NotImplementedError

    def prune(self, before: float, tenant: str | None = None, dry_run: bool = False,
              audit_before: float | None = None) -> PruneCounts:
        mine, mine_args = ("", ()) if tenant is None else (" AND tenant=?", (tenant,))
        cond, args = _PRUNED + mine, (before, *mine_args)
        keys = f"(tenant, job_id) IN (SELECT tenant, job_id FROM jobs WHERE {cond})"
        tables = ("reports", "evals", "deliveries")
        # audit lines past retention: of jobs gone after this prune (the jobs table without the pruned
        # ones), and of a stored job all but its newest line of each kind (what explains its state)
        old = (f"at < ?{mine} AND ((tenant, job_id) NOT IN (SELECT tenant, job_id FROM jobs WHERE NOT ({cond}))"
               f" OR seq NOT IN (SELECT max(seq) FROM audit WHERE 1=1{mine} GROUP BY tenant, job_id, kind))",
               (audit_before, *mine_args, *args, *mine_args))
        if dry_run:
            jobs = self._read(f"SELECT count(*) FROM jobs WHERE {cond}", args)[0][0]
            audit = 0 if audit_before is None else self._read(f"SELECT count(*) FROM audit WHERE {old[0]}", old[1])[0][0]
            return PruneCounts(jobs, *(self._read(f"SELECT count(*) FROM {t} WHERE {keys}", args)[0][0]
                                       for t in tables), audit)
        counts: list[int] = []

        def op(db) -> None:  # one transaction: a job goes with all its rows, or not at all
            counts.clear()
            audit = 0
            if audit_before is not None:  # counted before the jobs go: the same rows the dry run counts
                self._allow_audit_deletes(db)
                audit = db.execute(q(f"DELETE FROM audit WHERE {old[0]}", self._POSTGRES), old[1]).rowcount
                self._forbid_audit_deletes(db)
            for t in tables:
                counts.append(db.execute(q(f"DELETE FROM {t} WHERE {keys}", self._POSTGRES), args).rowcount)
            counts.insert(0, db.execute(q(f"DELETE FROM jobs WHERE {cond}", self._POSTGRES), args).rowcount)
            counts.append(audit)

        self._write(op)
        return PruneCounts(*counts)

    def _allow_audit_deletes(self, db) -> None:  # pragma: no cover - each store's own
        raise NotImplementedError

    def _forbid_audit_deletes(self, db) -> None:  # pragma: no cover - each store's own
        raise NotImplementedError

    def delete_job(self, tenant: str, job_id: str, audit: AuditRecord) -> bool:
        """One ended job with its rows, and its audit line, in one transaction (see Store.delete_job)."""
        deleted: list[bool] = []
        key = (tenant, job_id)

        def op(db) -> None:
            deleted.clear()
            gone = db.execute(q(f"DELETE FROM jobs WHERE tenant=? AND job_id=? AND status IN "
                                f"({', '.join(repr(s) for s in PRUNABLE)})", self._POSTGRES), key).rowcount
            if gone:
                for t in ("reports", "evals", "deliveries"):
                    db.execute(q(f"DELETE FROM {t} WHERE tenant=? AND job_id=?", self._POSTGRES), key)
                db.execute(q(f"INSERT INTO audit ({AUDIT_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)", self._POSTGRES),
                           (audit.tenant, audit.job_id, audit.at, audit.kind.value, audit.actor, audit.reason,
                            json.dumps(dict(audit.evidence))))
            deleted.append(bool(gone))

        self._write(op)
        return deleted[0]

    def eval(self, tenant: str, job_id: str, step: int) -> EvalTask | None:
        rows = self._read(f"SELECT {EVAL_COLS} FROM evals WHERE tenant=? AND job_id=? AND step=?", (tenant, job_id, step))
        return eval_from_row(rows[0]) if rows else None

    def unfed_evals(self, tenant: str, job_id: str, limit: int | None = None) -> list[EvalTask]:
        rows = self._read(f"SELECT {EVAL_COLS} FROM evals WHERE tenant=? AND job_id=? AND NOT fed ORDER BY step "
                          "LIMIT ?", (tenant, job_id, self._limit(limit)))  # the partial index evals_unfed
        return [eval_from_row(r) for r in rows]

    def claimable_evals(self, tenant: str, now: float, limit: int) -> list[EvalTask]:
        """Pending and expired leased tasks, each read in order from the index (tenant, state,
        created_at, job_id, step), never sorted whole."""
        rows = []
        for state, extra in (("pending", ""), ("leased", " AND lease_until<=?")):
            rows += self._read(f"SELECT {EVAL_COLS} FROM evals WHERE tenant=? AND state='{state}'{extra} "
                               "ORDER BY created_at, job_id, step LIMIT ?",
                               (tenant, *((now,) if extra else ()), limit))
        tasks = sorted((eval_from_row(r) for r in rows), key=lambda t: (t.created_at, t.job_id, t.step))
        return tasks[:limit]

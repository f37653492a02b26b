"""PostgresStore: the store interface on PostgreSQL (psycopg 3), for several ``evalstop serve``
replicas sharing one database.

* **Shared**: each job has a version (its writes so far); every write names the version it replaces
  and is refused with :class:`~evalstop_trl.core.store.StaleState` if another replica got there
  first, so no replica ever decides on stale state (the coordinator re-reads the job and the client
  retries). Webhook deliveries are claimed with ``FOR UPDATE SKIP LOCKED`` and a lease, so exactly
  one replica sends each and a dead replica's claims return to the queue.
* **Durable**: a write's future resolves after PostgreSQL's COMMIT (``synchronous_commit`` as the
  server sets it; on by default). One writer thread group-commits whatever is queued, each write in
  its own savepoint, so one refused write never sinks the others. A new report (the hot path) is one
  statement, the job's versioned update and the report's insert together (:data:`_VERSIONED_REPORT`):
  a stale one changes nothing and fails nothing, so a batch's reports need no savepoints and are sent
  in one pipeline (psycopg's pipeline mode: one round trip for all of them). If one of them fails
  (an error, not a refusal), the batch is rolled back and applied again a write per savepoint.
* **Pooled** reads (``psycopg_pool``), a versioned schema with migrations (created under an
  advisory lock, so replicas starting together do not race), an append-only audit table (a trigger).

Select it with ``evalstop serve --db postgresql://user@host/dbname`` (or ``EVALSTOP_DB``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from ..core.browse import RunRow
from ..core.codec import from_wire, to_wire
from ..core.detectors import Decision
from ..core.errors import Conflict
from ..core.records import (
    AuditRecord,
    Delivery,
    EvalTask,
    JobRecord,
    JobStatus,
    JobType,
    Policy,
    Report,
    TenantRecord,
)
from ..core.store import JobLimits, LimitReached, StaleState, Store, StoreError, Ticket, wait_durable
from .sql import (
    DELIVERY_COLS,
    EVAL_COLS,
    REPORT_COLS,
    TENANT_COLS,
    SQLReads,
    check_revival,
    delivery_from_row,
    delivery_row,
    eval_from_row,
    eval_row,
    labels_from,
    labels_json,
    q,
)
from .writer import Batch, WriteQueue, store_error

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

SCHEMA_VERSION = 7
_LOCK_KEY = 0x45564C53  # "EVLS": the advisory lock that serialises schema creation and migrations
_TENANT_LOCK = 0x45565154  # "EVQT" + hashtext(tenant): serialises a tenant's registrations (its quotas)

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS tenants (
        name TEXT PRIMARY KEY, token_hash TEXT NOT NULL UNIQUE, created_at DOUBLE PRECISION NOT NULL,
        revoked BOOLEAN NOT NULL DEFAULT FALSE, quotas TEXT NOT NULL DEFAULT '{}',
        webhook_secret TEXT NOT NULL DEFAULT '')""",
    """CREATE TABLE IF NOT EXISTS jobs (
        tenant TEXT NOT NULL, job_id TEXT NOT NULL, seq BIGSERIAL, job_type TEXT NOT NULL, planned_steps BIGINT,
        policy TEXT NOT NULL, webhook TEXT, status TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL, decision TEXT, stopped_by TEXT, stopped_at DOUBLE PRECISION,
        acked_at DOUBLE PRECISION, checkpoint TEXT, finished_at DOUBLE PRECISION, version BIGINT NOT NULL,
        last_seen DOUBLE PRECISION, tags TEXT NOT NULL DEFAULT '{}', hparams TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (tenant, job_id))""",
    "CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, seq)",
    """CREATE TABLE IF NOT EXISTS reports (
        tenant TEXT NOT NULL, job_id TEXT NOT NULL, step BIGINT NOT NULL, eval_score DOUBLE PRECISION,
        train_loss DOUBLE PRECISION, proxy_reward DOUBLE PRECISION, checkpoint TEXT,
        received_at DOUBLE PRECISION NOT NULL, planned_steps BIGINT, eval_n BIGINT, eval_noise DOUBLE PRECISION,
        kl DOUBLE PRECISION, length DOUBLE PRECISION, PRIMARY KEY (tenant, job_id, step))""",
    """CREATE TABLE IF NOT EXISTS audit (
        seq BIGSERIAL PRIMARY KEY, tenant TEXT NOT NULL, job_id TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL, actor TEXT NOT NULL, reason TEXT NOT NULL, evidence TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS audit_by_job ON audit (tenant, job_id, seq)",
    "CREATE INDEX IF NOT EXISTS audit_by_tenant ON audit (tenant, seq)",
    "CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (tenant, status)",
    """CREATE OR REPLACE FUNCTION evalstop_audit_append_only() RETURNS trigger AS $$
        BEGIN
            IF TG_OP = 'DELETE' AND current_setting('evalstop.audit_retention', true) = 'on' THEN RETURN OLD; END IF;
            RAISE EXCEPTION 'the audit log is append-only';
        END; $$ LANGUAGE plpgsql""",
    "DROP TRIGGER IF EXISTS audit_append_only ON audit",
    """CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit
        FOR EACH ROW EXECUTE FUNCTION evalstop_audit_append_only()""",
    """CREATE TABLE IF NOT EXISTS deliveries (
        id TEXT PRIMARY KEY, tenant TEXT NOT NULL, job_id TEXT NOT NULL, url TEXT NOT NULL, body TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        next_at DOUBLE PRECISION NOT NULL DEFAULT 0, done BOOLEAN NOT NULL DEFAULT FALSE,
        outcome TEXT NOT NULL DEFAULT '')""",
    "CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (done, next_at)",
    """CREATE TABLE IF NOT EXISTS evals (
        tenant TEXT NOT NULL, job_id TEXT NOT NULL, step BIGINT NOT NULL, path TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, train_loss DOUBLE PRECISION, proxy_reward DOUBLE PRECISION,
        state TEXT NOT NULL, lease_until DOUBLE PRECISION NOT NULL, worker TEXT NOT NULL, score DOUBLE PRECISION,
        fed BOOLEAN NOT NULL, eval_n BIGINT, eval_noise DOUBLE PRECISION, PRIMARY KEY (tenant, job_id, step))""",
    "CREATE INDEX IF NOT EXISTS evals_claim ON evals (tenant, state, created_at, job_id, step)",
    "CREATE INDEX IF NOT EXISTS evals_unfed ON evals (tenant, job_id, step) WHERE NOT fed",
]
# version -> statements that bring a database of that version to the next one
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS last_seen DOUBLE PRECISION",),
    2: ("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS tags TEXT NOT NULL DEFAULT '{}'",  # issue 19: a job's context
        "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS hparams TEXT NOT NULL DEFAULT '{}'"),
    3: ("ALTER TABLE reports ADD COLUMN IF NOT EXISTS planned_steps BIGINT",),  # each report's plan
    4: tuple(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column}"  # per-example evidence (core/examples.py)
             for table in ("reports", "evals") for column in ("eval_n BIGINT", "eval_noise DOUBLE PRECISION")),
    5: ("ALTER TABLE reports ADD COLUMN IF NOT EXISTS kl DOUBLE PRECISION",),  # issue 44: the KL a gate reads
    6: ("ALTER TABLE reports ADD COLUMN IF NOT EXISTS length DOUBLE PRECISION",),  # issue 44: a stop's evidence
}

_JOB_COLS = ("tenant, job_id, job_type, planned_steps, policy, webhook, status, created_at, updated_at, decision, "
             "stopped_by, stopped_at, acked_at, checkpoint, finished_at, version, last_seen, tags, hparams")



def _job_values(j: JobRecord) -> tuple:
    return (j.job_type.value, j.planned_steps, json.dumps(j.policy.to_dict()), j.webhook, j.status.value,
            j.created_at, j.updated_at, json.dumps(to_wire(j.decision)) if j.decision else None, j.stopped_by,
            j.stopped_at, j.acked_at, j.checkpoint, j.finished_at)


def _labels(j: JobRecord) -> tuple[str, str]:
    return labels_json(j.tags), labels_json(j.hparams)


def _job_from_row(r: tuple) -> JobRecord:
    return JobRecord(
        tenant=r[0], job_id=r[1], job_type=JobType(r[2]), planned_steps=r[3],
        policy=Policy.from_dict(json.loads(r[4]), stored=True), webhook=r[5], status=JobStatus(r[6]),
        created_at=r[7], updated_at=r[8], decision=from_wire(Decision, json.loads(r[9])) if r[9] else None,
        stopped_by=r[10], stopped_at=r[11], acked_at=r[12], checkpoint=r[13], finished_at=r[14], version=r[15], last_seen=r[16],
        tags=labels_from(r[17]), hparams=labels_from(r[18]),
    )


class PostgresStore(SQLReads, Store):
    """A shared, durable store in one PostgreSQL database (see the module docstring).

    Args:
        dsn: a libpq connection string or URL, e.g. ``postgresql://evalstop@db.internal/evalstop``.
        pool_size: connections for reads (the writer has one of its own).
    """

    shared = True
    _JOB_ORDER = "seq"
    _POSTGRES = True

    def __init__(self, dsn: str, pool_size: int = 4) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise ValueError("the PostgreSQL store needs psycopg: pip install 'evalstop[postgres]'") from None
        self._psycopg = psycopg
        self.dsn = dsn
        try:
            self._db = psycopg.connect(dsn, autocommit=True)
            self._init_schema()
            self._pool = ConnectionPool(dsn, min_size=1, max_size=pool_size, kwargs={"autocommit": True},
                                        open=True, timeout=30)
        except psycopg.Error as exc:
            raise ValueError(f"Cannot open the PostgreSQL database {_safe(dsn)}: {exc}") from None
        self._writes = WriteQueue(self._apply, 'evalstop-pg-writer', "the PostgreSQL store")

    def _init_schema(self) -> None:
        with self._db.transaction():
            self._db.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            exists = self._db.execute("SELECT to_regclass('schema_version')").fetchone()[0]
            if exists:
                row = self._db.execute("SELECT version FROM schema_version").fetchone()
                version = row[0] if row else SCHEMA_VERSION
                if version > SCHEMA_VERSION:
                    raise ValueError(f"database {_safe(self.dsn)} has schema version {version}, newer than this "
                                     f"evalstop's {SCHEMA_VERSION}: upgrade evalstop.")
                while version < SCHEMA_VERSION:
                    for statement in _MIGRATIONS[version]:
                        self._db.execute(statement)
                    version += 1
            for statement in _SCHEMA:
                self._db.execute(statement)
            if self._db.execute("SELECT count(*) FROM schema_version").fetchone()[0] == 0:
                self._db.execute("INSERT INTO schema_version (version) VALUES (%s)", (SCHEMA_VERSION,))
            else:
                self._db.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION,))

    # ------------------------------------------------------------------ the writer
    def _apply(self, batch: Batch) -> None:
        done: list[tuple[Future, BaseException | None]] = []
        try:
            try:
                with self._db.transaction():
                    self._apply_in(batch, done, pipelined=True)
            except _PipelineFailed:  # a statement of the pipeline failed: rolled back, each write alone now
                done.clear()
                with self._db.transaction():
                    self._apply_in(batch, done, pipelined=False)
        except Exception as exc:  # noqa: BLE001 - the COMMIT (or the connection) failed: nothing is stored
            for _, ticket in batch:
                ticket.set_exception(store_error(exc))
            self._reconnect()
            return
        for ticket, exc in done:
            if exc is None:
                ticket.set_result(None)
            else:
                ticket.set_exception(exc)

    def _apply_in(self, batch: Batch, done: list[tuple[Future, BaseException | None]], pipelined: bool) -> None:
        """Apply ``batch`` in the open transaction: each run of versioned reports (:class:`_Report`) in
        one pipeline when ``pipelined`` (raises :class:`_PipelineFailed` if a statement of it fails),
        every other write in a savepoint of its own."""
        db, i = self._db, 0
        while i < len(batch):
            if pipelined and isinstance(batch[i][0], _Report):
                j = i + 1
                while j < len(batch) and isinstance(batch[j][0], _Report):
                    j += 1
                run = [(op, ticket) for op, ticket in batch[i:j] if isinstance(op, _Report)]
                i = j
                try:
                    with db.pipeline():  # one round trip for the run; stale ones insert nothing, fail nothing
                        cursors = [op.send(db) for op, _ in run]
                except self._psycopg.Error as exc:
                    raise _PipelineFailed from exc
                done.extend((ticket, op.outcome(cur)) for (op, ticket), cur in zip(run, cursors, strict=True))
                continue
            op, ticket = batch[i]
            i += 1
            try:
                with db.transaction():  # a savepoint: one refused write sinks nothing else
                    op(db)
                done.append((ticket, None))
            except StoreError as exc:  # StaleState, LimitReached: this write refused, no other
                done.append((ticket, exc))
            except self._psycopg.Error as exc:
                done.append((ticket, store_error(exc)))

    def _reconnect(self) -> None:
        try:
            self._db.close()
            self._db = self._psycopg.connect(self.dsn, autocommit=True)
        except self._psycopg.Error:
            pass  # the next batch fails too, and tries again

    def _write(self, op: Callable) -> None:
        wait_durable(self._writes.submit(op))

    def _read(self, query: str, args: tuple = ()) -> list[tuple]:
        try:
            with self._pool.connection() as conn:
                return conn.execute(q(query, True), args).fetchall()
        except self._psycopg.Error as exc:
            raise StoreError(f"read failed: {exc}") from exc

    # ------------------------------------------------------------------ tenants (rare: written at once)
    def add_tenant(self, tenant: TenantRecord) -> None:
        row = (tenant.name, tenant.token_hash, tenant.created_at, tenant.revoked, json.dumps(dict(tenant.quotas)),
               tenant.webhook_secret)

        def op(db):
            cur = db.execute(f"INSERT INTO tenants ({TENANT_COLS}) VALUES (%s, %s, %s, %s, %s, %s) "
                             "ON CONFLICT (name) DO NOTHING", row)
            if cur.rowcount == 0:
                raise StaleState(f"tenant {tenant.name!r} already exists")

        try:
            self._write(op)
        except StaleState as exc:
            raise Conflict(str(exc)) from None

    def update_tenant(self, tenant: TenantRecord) -> bool:
        found = []
        row = (tenant.token_hash, tenant.created_at, tenant.revoked, json.dumps(dict(tenant.quotas)),
               tenant.webhook_secret, tenant.name)
        self._write(lambda db: found.append(db.execute(
            "UPDATE tenants SET token_hash=%s, created_at=%s, revoked=%s, quotas=%s, webhook_secret=%s "
            "WHERE name=%s", row).rowcount))
        return bool(found and found[0])

    # ------------------------------------------------------------------ jobs, reports, audit
    def commit(self, job: JobRecord, report: Report | None = None, audit: Sequence[AuditRecord] = (),
               deliveries: Sequence[Delivery] = (), expect: int | None = None) -> Ticket:
        return self._writes.submit(self._commit_op(job, report, audit, deliveries, expect))

    def revive(self, job: JobRecord, report: Report | None, audit: Sequence[AuditRecord], deliveries: Sequence[Delivery],
               expect: int | None, limits: JobLimits) -> Ticket:
        """The commit of a lost job running again, after counting the tenant's active jobs under its
        advisory lock (the lock registrations take: see :func:`_insert_within_limits`)."""
        write = self._commit_op(job, report, audit, deliveries, expect)

        def op(db) -> None:
            db.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_TENANT_LOCK, job.tenant))
            check_revival(db, job, limits, postgres=True)
            write(db)

        return self._writes.submit(op)

    def _commit_op(self, job: JobRecord, report: Report | None, audit: Sequence[AuditRecord],
                   deliveries: Sequence[Delivery], expect: int | None) -> Callable:
        key, values = (job.tenant, job.job_id), _job_values(job)
        audit, deliveries = tuple(audit), tuple(deliveries)

        def op(db) -> None:
            if expect == 0:
                cur = db.execute(f"INSERT INTO jobs ({_JOB_COLS}) VALUES ({', '.join(['%s'] * 19)}) "
                                 "ON CONFLICT (tenant, job_id) DO NOTHING",
                                 (*key, *values, 1, job.last_seen, *_labels(job)))
            elif expect is None:
                cur = db.execute(
                    f"INSERT INTO jobs ({_JOB_COLS}) VALUES ({', '.join(['%s'] * 19)}) ON CONFLICT (tenant, job_id) "
                    "DO UPDATE SET job_type=EXCLUDED.job_type, planned_steps=EXCLUDED.planned_steps, "
                    "policy=EXCLUDED.policy, webhook=EXCLUDED.webhook, status=EXCLUDED.status, "
                    "updated_at=EXCLUDED.updated_at, decision=EXCLUDED.decision, stopped_by=EXCLUDED.stopped_by, "
                    "stopped_at=EXCLUDED.stopped_at, acked_at=EXCLUDED.acked_at, checkpoint=EXCLUDED.checkpoint, "
                    "finished_at=EXCLUDED.finished_at, last_seen=EXCLUDED.last_seen, tags=EXCLUDED.tags, "
                    "hparams=EXCLUDED.hparams, version=jobs.version + 1",
                    (*key, *values, 1, job.last_seen, *_labels(job)))
            else:
                cur = db.execute(
                    "UPDATE jobs SET job_type=%s, planned_steps=%s, policy=%s, webhook=%s, status=%s, created_at=%s, "
                    "updated_at=%s, decision=%s, stopped_by=%s, stopped_at=%s, acked_at=%s, checkpoint=%s, "
                    "finished_at=%s, last_seen=%s, tags=%s, hparams=%s, version=version + 1 WHERE tenant=%s AND "
                    "job_id=%s AND version=%s AND created_at=%s",
                    (*values, job.last_seen, *_labels(job), *key, expect, job.created_at))
            if cur.rowcount == 0:
                raise StaleState(f"job {job.job_id!r} was changed by another coordinator; retry")
            if report is not None:
                _insert_report(db, job.tenant, job.job_id, report)
            if audit:
                db.cursor().executemany(
                    "INSERT INTO audit (tenant, job_id, at, kind, actor, reason, evidence) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    [(a.tenant, a.job_id, a.at, a.kind.value, a.actor, a.reason, json.dumps(dict(a.evidence)))
                     for a in audit])
            if deliveries:
                db.cursor().executemany(
                    f"INSERT INTO deliveries ({DELIVERY_COLS}) VALUES ({', '.join(['%s'] * 10)}) "
                    "ON CONFLICT (id) DO NOTHING", [delivery_row(d) for d in deliveries])

        return op

    def register(self, job: JobRecord, limits: JobLimits) -> Ticket:
        """Insert a new job if the tenant's quotas allow (see :func:`_insert_within_limits`)."""
        return self._writes.submit(lambda db: _insert_within_limits(db, job, limits))

    def add_report(self, tenant: str, job_id: str, report: Report, expect: int | None = None,
                   created: float | None = None) -> Ticket:
        if expect is not None:  # the hot path: one statement, pipelined with the batch's others
            return self._writes.submit(_Report(tenant, job_id, report, expect, created))

        def op(db) -> None:
            db.execute("UPDATE jobs SET version = version + 1 WHERE tenant=%s AND job_id=%s", (tenant, job_id))
            _insert_report(db, tenant, job_id, report)

        return self._writes.submit(op)

    def jobs(self) -> list[JobRecord]:
        return [_job_from_row(r) for r in self._read(f"SELECT {_JOB_COLS} FROM jobs ORDER BY seq")]

    def run_rows(self, tenant: str) -> list[RunRow]:
        rows = self._read("SELECT job_id, job_type, status, policy::json->>'detector', "
                          "coalesce(policy::json->>'mode', 'enforce'), created_at, updated_at, stopped_at, "
                          "finished_at, tags FROM jobs WHERE tenant=%s", (tenant,))
        return [RunRow(r[0], JobType(r[1]), JobStatus(r[2]), r[3], r[4], r[5], r[6], r[7], r[8], labels_from(r[9]))
                for r in rows]

    def job(self, tenant: str, job_id: str) -> JobRecord | None:
        rows = self._read(f"SELECT {_JOB_COLS} FROM jobs WHERE tenant=%s AND job_id=%s", (tenant, job_id))
        return _job_from_row(rows[0]) if rows else None

    def job_versions(self, tenant: str, job_ids: Sequence[str]) -> dict[str, tuple[float, int]]:
        rows = self._read("SELECT job_id, created_at, version FROM jobs WHERE tenant=%s AND job_id = ANY(%s)",
                          (tenant, list(job_ids)))
        return {job_id: (created, version) for job_id, created, version in rows}

    # ------------------------------------------------------------------ external evals
    def put_eval(self, task: EvalTask) -> Ticket:
        row = eval_row(task)
        return self._writes.submit(lambda db: db.execute(
            _PUT_EVAL, row))

    def claim_eval(self, tenant: str, now: float, lease_s: float, worker: str) -> EvalTask | None:
        """One statement: the oldest claimable task, locked (``SKIP LOCKED``: a concurrent claim on
        another replica takes the next one) and leased; committed when it returns."""
        rows = self._read(_CLAIM, (now + lease_s, worker, tenant, now))
        return eval_from_row(rows[0]) if rows else None

    def claim_deliveries(self, now: float, limit: int, lease_s: float) -> list[Delivery]:
        rows = self._read(
            f"UPDATE deliveries SET next_at = %s WHERE id IN (SELECT id FROM deliveries WHERE NOT done AND next_at <= %s "
            f"ORDER BY created_at, id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING {DELIVERY_COLS}",
            (now + lease_s, now, limit))
        return sorted((delivery_from_row(r) for r in rows), key=lambda d: (d.created_at, d.id))

    def update_delivery(self, delivery: Delivery) -> Ticket:
        row = delivery_row(delivery)
        return self._writes.submit(lambda db: db.execute(
            f"INSERT INTO deliveries ({DELIVERY_COLS}) VALUES ({', '.join(['%s'] * 10)}) ON CONFLICT (id) DO UPDATE "
            "SET attempts=EXCLUDED.attempts, next_at=EXCLUDED.next_at, done=EXCLUDED.done, outcome=EXCLUDED.outcome",
            row))

    def probe(self) -> None:
        self._write(lambda db: db.execute("SELECT 1"))

    def _allow_audit_deletes(self, db) -> None:  # this transaction only (prune's): the trigger reads it
        db.execute("SELECT set_config('evalstop.audit_retention', 'on', true)")

    def _forbid_audit_deletes(self, db) -> None:
        db.execute("SELECT set_config('evalstop.audit_retention', 'off', true)")

    def close(self) -> None:
        if not self._writes.close():
            return
        self._pool.close()
        self._db.close()


def _insert_within_limits(db, job: JobRecord, limits: JobLimits) -> None:
    """Insert a new job in a transaction that holds the tenant's advisory lock and counts its jobs
    first: registrations racing on several replicas are counted one after another."""
    db.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_TENANT_LOCK, job.tenant))
    total, active = db.execute(
        "SELECT count(*), count(*) FILTER (WHERE status IN ('pending', 'running')) FROM jobs WHERE tenant=%s",
        (job.tenant,)).fetchone()
    if total >= limits.max_jobs:
        raise LimitReached(f"tenant {job.tenant!r} has {total} jobs, the most allowed (max_jobs={limits.max_jobs}, "
                           "finished ones included); prune old ones ('evalstop prune') or ask for more")
    if active >= limits.max_active_jobs:
        raise LimitReached(f"tenant {job.tenant!r} has {active} active jobs, the most allowed "
                           f"(max_active_jobs={limits.max_active_jobs}); finish or stop some first")
    cur = db.execute(f"INSERT INTO jobs ({_JOB_COLS}) VALUES ({', '.join(['%s'] * 19)}) "
                     "ON CONFLICT (tenant, job_id) DO NOTHING", (job.tenant, job.job_id, *_job_values(job), 1,
                                                                 job.last_seen, *_labels(job)))
    if cur.rowcount == 0:
        raise StaleState(f"job {job.job_id!r} was changed by another coordinator; retry")


#: insert or replace a task: every column but the key taken from the new row
_PUT_EVAL = (f"INSERT INTO evals ({EVAL_COLS}) VALUES ({', '.join(['%s'] * len(EVAL_COLS.split(',')))}) "
             "ON CONFLICT (tenant, job_id, step) DO UPDATE SET "
             + ", ".join(f"{c}=EXCLUDED.{c}" for c in (c.strip() for c in EVAL_COLS.split(","))
                         if c not in ("tenant", "job_id", "step", "created_at")))

#: lease the tenant's oldest claimable task in one statement (args: lease_until, worker, tenant, now)
_CLAIM = ("UPDATE evals e SET state='leased', lease_until=%s, worker=%s FROM (SELECT tenant, job_id, step FROM evals "
          "WHERE tenant=%s AND (state='pending' OR (state='leased' AND lease_until<=%s)) "
          "ORDER BY created_at, job_id, step LIMIT 1 FOR UPDATE SKIP LOCKED) c "
          "WHERE e.tenant=c.tenant AND e.job_id=c.job_id AND e.step=c.step RETURNING "
          + ", ".join(f"e.{c.strip()}" for c in EVAL_COLS.split(",")))


_INSERT_REPORT = f"INSERT INTO reports (tenant, job_id, {REPORT_COLS}) VALUES ({', '.join(['%s'] * (2 + len(Report._fields)))})"


def _insert_report(db, tenant: str, job_id: str, r: Report) -> None:
    db.execute(_INSERT_REPORT, (tenant, job_id, *r))


#: each report column's type: the insert's values come from a SELECT, whose parameters PostgreSQL
#: would otherwise take for text
#: each report column's type, as the schema declares it (a parameter in a SELECT needs its cast)
_REPORT_TYPES = {name: kind.lower() for name, kind in re.findall(
    r"(\w+) (BIGINT|DOUBLE PRECISION|TEXT)", next(s for s in _SCHEMA if "TABLE IF NOT EXISTS reports" in s))}

#: a new report in one statement (args: tenant, job_id, the version replaced, the job's created_at or
#: None, then the report's fields): the job's version moves on and the report is inserted only if the
#: job is still at that version and still that job; otherwise nothing happens (0 rows: another replica
#: wrote the job first, or deleted it and registered the id again)
_VERSIONED_REPORT = (
    "WITH u AS (UPDATE jobs SET version = version + 1 WHERE tenant=%s AND job_id=%s AND version=%s "
    "AND created_at = COALESCE(%s::double precision, created_at) "
    f"RETURNING tenant, job_id) INSERT INTO reports (tenant, job_id, {REPORT_COLS}) SELECT u.tenant, u.job_id, "
    + ", ".join(f"%s::{_REPORT_TYPES[f]}" for f in Report._fields) + " FROM u")


class _Report:
    """A new report with the version it replaces: one statement that a stale version turns into
    nothing (no error), so the writer sends a batch of them in one pipeline without savepoints
    (:meth:`send`, then :meth:`outcome` once the pipeline is synced); called as a write (``op(db)``)
    when the batch is applied a write per savepoint."""

    __slots__ = ("job_id", "args")

    def __init__(self, tenant: str, job_id: str, report: Report, expect: int, created: float | None = None) -> None:
        self.job_id, self.args = job_id, (tenant, job_id, expect, created, *report)

    def send(self, db):
        return db.execute(_VERSIONED_REPORT, self.args)

    def outcome(self, cursor) -> StaleState | None:
        if cursor.rowcount == 1:
            return None
        return StaleState(f"job {self.job_id!r} was changed by another coordinator; retry")

    def __call__(self, db) -> None:
        stale = self.outcome(self.send(db))
        if stale is not None:
            raise stale


class _PipelineFailed(Exception):
    """A statement of a pipelined batch failed (its transaction is rolled back): apply it again, a write
    per savepoint, so the failure is that write's alone."""


def _safe(dsn: str) -> str:
    """A DSN for messages, without its password."""
    return re.sub(r"(//[^:/@]+):[^@]*@", r"\1:***@", re.sub(r"password=\S+", "password=***", dsn))

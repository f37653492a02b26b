"""SQLiteStore: the embedded default, one file, WAL mode, ``synchronous=FULL``.

When a write's future resolves, the data is on disk (a SIGKILL of the process right after loses
nothing). One writer thread commits whatever is queued in one transaction (group commit): many
concurrent reports share one fsync. Schema versioned in the ``schema_version`` table.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..core.codec import from_wire, to_wire
from ..core.detectors import Decision
from ..core.errors import Conflict
from ..core.records import (
    AuditRecord,
    Delivery,
    EvalState,
    EvalTask,
    JobRecord,
    JobStatus,
    JobType,
    Policy,
    Report,
    TenantRecord,
)
from ..core.store import JobLimits, StaleState, Store, StoreError, Ticket, wait_durable
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
)
from .writer import Batch, WriteQueue, store_error

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SCHEMA_VERSION = 9

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY, token_hash TEXT NOT NULL UNIQUE, created_at REAL NOT NULL,
    revoked INTEGER NOT NULL DEFAULT 0, quotas TEXT NOT NULL DEFAULT '{}',
    webhook_secret TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS jobs (
    tenant TEXT NOT NULL, job_id TEXT NOT NULL, job_type TEXT NOT NULL, planned_steps INTEGER,
    policy TEXT NOT NULL, pid INTEGER, pid_start_time REAL, webhook TEXT, status TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, decision TEXT, stopped_by TEXT,
    stopped_at REAL, acked_at REAL, checkpoint TEXT, finished_at REAL, last_seen REAL,
    version INTEGER NOT NULL DEFAULT 1, tags TEXT NOT NULL DEFAULT '{}', hparams TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (tenant, job_id));
CREATE TABLE IF NOT EXISTS reports (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, job_id TEXT NOT NULL,
    step INTEGER NOT NULL, eval_score REAL, train_loss REAL, proxy_reward REAL, checkpoint TEXT,
    received_at REAL NOT NULL, planned_steps INTEGER, eval_n INTEGER, eval_noise REAL, kl REAL, length REAL,
    UNIQUE (tenant, job_id, step));
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, job_id TEXT NOT NULL,
    at REAL NOT NULL, kind TEXT NOT NULL, actor TEXT NOT NULL, reason TEXT NOT NULL,
    evidence TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS audit_append_only_u BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TABLE IF NOT EXISTS audit_retention (active INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS audit_append_only_d BEFORE DELETE ON audit
    WHEN NOT EXISTS (SELECT 1 FROM audit_retention)
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE INDEX IF NOT EXISTS audit_by_job ON audit (tenant, job_id, seq);
CREATE INDEX IF NOT EXISTS audit_by_tenant ON audit (tenant, seq);
CREATE TABLE IF NOT EXISTS deliveries (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, job_id TEXT NOT NULL, url TEXT NOT NULL, body TEXT NOT NULL,
    created_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL DEFAULT 0,
    done INTEGER NOT NULL DEFAULT 0, outcome TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (done, next_at);
CREATE TABLE IF NOT EXISTS evals (
    tenant TEXT NOT NULL, job_id TEXT NOT NULL, step INTEGER NOT NULL, path TEXT NOT NULL, created_at REAL NOT NULL,
    train_loss REAL, proxy_reward REAL, state TEXT NOT NULL, lease_until REAL NOT NULL, worker TEXT NOT NULL,
    score REAL, fed INTEGER NOT NULL, eval_n INTEGER, eval_noise REAL, PRIMARY KEY (tenant, job_id, step));
CREATE INDEX IF NOT EXISTS evals_claim ON evals (tenant, state, created_at, job_id, step);
CREATE INDEX IF NOT EXISTS evals_unfed ON evals (tenant, job_id, step) WHERE NOT fed;
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (tenant, status);
"""

# version -> statements that bring a database of that version to the next one
_MIGRATIONS: dict[int, tuple[Any, ...]] = {  # SQL, or a function of the connection
    1: ("ALTER TABLE tenants ADD COLUMN quotas TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE tenants ADD COLUMN webhook_secret TEXT NOT NULL DEFAULT ''"),
    2: ("ALTER TABLE jobs ADD COLUMN last_seen REAL",),
    3: ("ALTER TABLE jobs ADD COLUMN version INTEGER NOT NULL DEFAULT 1",),  # 0 would read as "not registered"
    4: ("ALTER TABLE jobs ADD COLUMN tags TEXT NOT NULL DEFAULT '{}'",  # issue 19: a job's context
        "ALTER TABLE jobs ADD COLUMN hparams TEXT NOT NULL DEFAULT '{}'"),
    5: (lambda db: _add_column(db, "reports", "planned_steps INTEGER"),),  # the plan each report was decided under
    6: (*(lambda db, t=table, c=column: _add_column(db, t, c)  # per-example evidence (core/examples.py)
          for table in ("reports", "evals") for column in ("eval_n INTEGER", "eval_noise REAL")),
        "DROP TRIGGER IF EXISTS audit_append_only_d"),  # the schema makes it again, open to retention
    7: (lambda db: _add_column(db, "reports", "kl REAL"),),  # issue 44: the KL a KL-clock gate reads
    8: (lambda db: _add_column(db, "reports", "length REAL"),),  # issue 44: the completion length (a stop's evidence)
}


def _add_column(db: sqlite3.Connection, table: str, column: str) -> None:
    """``ALTER TABLE table ADD COLUMN column`` when the table exists without it (a missing table is
    created whole by the schema)."""
    names = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    if names and column.split()[0] not in names:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")


_INSERT_REPORT = f"INSERT INTO reports (tenant, job_id, {REPORT_COLS}) VALUES ({', '.join('?' * (2 + len(Report._fields)))})"
_JOB_COLS = (
    "tenant, job_id, job_type, planned_steps, policy, pid, pid_start_time, webhook, status, "
    "created_at, updated_at, decision, stopped_by, stopped_at, acked_at, checkpoint, finished_at, last_seen, tags, hparams"
)
_UPDATE_JOB = ("job_type=?, planned_steps=?, policy=?, pid=?, pid_start_time=?, webhook=?, status=?, created_at=?, "
               "updated_at=?, decision=?, stopped_by=?, stopped_at=?, acked_at=?, checkpoint=?, finished_at=?, "
               "last_seen=?, tags=?, hparams=?")


def _job_row(j: JobRecord) -> tuple:
    return (
        j.tenant, j.job_id, j.job_type.value, j.planned_steps, json.dumps(j.policy.to_dict()), None,
        None, j.webhook, j.status.value, j.created_at, j.updated_at,
        json.dumps(to_wire(j.decision)) if j.decision else None, j.stopped_by, j.stopped_at,
        j.acked_at, j.checkpoint, j.finished_at, j.last_seen, labels_json(j.tags), labels_json(j.hparams),
    )


def _job_from_row(r: tuple) -> JobRecord:
    return JobRecord(
        tenant=r[0], job_id=r[1], job_type=JobType(r[2]), planned_steps=r[3],
        policy=Policy.from_dict(json.loads(r[4]), stored=True), webhook=r[7],
        status=JobStatus(r[8]), created_at=r[9], updated_at=r[10],
        decision=from_wire(Decision, json.loads(r[11])) if r[11] else None, stopped_by=r[12],
        stopped_at=r[13], acked_at=r[14], checkpoint=r[15], finished_at=r[16], last_seen=r[17],
        tags=labels_from(r[18]), hparams=labels_from(r[19]), version=r[20] if len(r) > 20 else 0,
    )


def _lease_oldest(db: sqlite3.Connection, tenant: str, now: float, lease_s: float, worker: str) -> EvalTask | None:
    row = db.execute(f"SELECT {EVAL_COLS} FROM evals WHERE tenant=? AND (state='pending' OR "
                     "(state='leased' AND lease_until<=?)) ORDER BY created_at, job_id, step LIMIT 1",
                     (tenant, now)).fetchone()
    if row is None:
        return None
    task = eval_from_row(row)
    claimed = dataclasses.replace(task, state=task.state.to(EvalState.LEASED), lease_until=now + lease_s, worker=worker)
    db.execute("UPDATE evals SET state='leased', lease_until=?, worker=? WHERE tenant=? AND job_id=? AND step=?",
               (claimed.lease_until, worker, tenant, task.job_id, task.step))
    return claimed


class SQLiteStore(SQLReads, Store):
    """A durable store in one SQLite file (WAL mode, ``synchronous=FULL``).

    Writes go through one writer thread that commits whatever is queued in one transaction
    (group commit): many concurrent reports share one fsync, and each caller's :class:`Ticket`
    resolves only after its transaction is on disk. Reads use a small pool of their own connections
    (WAL readers never wait for each other), so one tenant's long read never holds up another's.
    """

    READERS = 8  # reader connections at most; a read waits for a free one beyond that

    def __init__(self, path: str | Path, shared: bool = False) -> None:
        self.path = Path(path)
        #: ``shared``: other processes write this file too (a training process and ``evalstop evaluate
        #: --db`` workers on one embedded evalstop.db): every write checks the job's version and the
        #: coordinator re-reads jobs another process changed, as PostgreSQL replicas do.
        self.shared = shared
        if not self.path.parent.exists():
            raise ValueError(f"Cannot create the database {self.path}: folder {self.path.parent} does not exist.")
        try:
            self._db = self._connect()
            self._init_schema()
            self._readers = [self._connect()]  # idle reader connections
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"Cannot open the database {self.path}: {exc}") from None
        self._read_lock = threading.Lock()  # guards the idle list
        self._read_slots = threading.BoundedSemaphore(self.READERS)
        self._closed = False
        self._writes = WriteQueue(self._apply, 'evalstop-sqlite-writer', f"the store {self.path}")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=30000")
        return db

    def _init_schema(self) -> None:
        db = self._db
        fresh = not db.execute("SELECT 1 FROM sqlite_master WHERE name='schema_version'").fetchone()
        if not fresh:
            row = db.execute("SELECT version FROM schema_version").fetchone()
            version = row[0] if row else SCHEMA_VERSION
            if version > SCHEMA_VERSION:
                raise ValueError(f"Database {self.path} has schema version {version}, newer than this evalstop's "
                                 f"{SCHEMA_VERSION}: upgrade evalstop.")
            db.execute("BEGIN IMMEDIATE")
            try:
                while version < SCHEMA_VERSION:  # migrate, one version at a time, in one transaction
                    for statement in _MIGRATIONS[version]:
                        statement(db) if callable(statement) else db.execute(statement)
                    version += 1
                db.execute("UPDATE schema_version SET version=?", (version,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        db.executescript(_SCHEMA)
        if db.execute("SELECT version FROM schema_version").fetchone() is None:
            db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))

    # ------------------------------------------------------------------ the writer
    def _apply(self, batch: Batch) -> None:
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            for op, _ in batch:
                op(db)
            db.execute("COMMIT")
        except Exception:  # one bad write must not sink the others: redo them one by one
            if db.in_transaction:
                db.execute("ROLLBACK")
            for op, ticket in batch:
                try:
                    db.execute("BEGIN IMMEDIATE")
                    op(db)
                    db.execute("COMMIT")
                    ticket.set_result(None)
                except Exception as exc:  # noqa: BLE001 - handed to the waiting caller
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    ticket.set_exception(exc if isinstance(exc, StoreError) else store_error(exc))  # a refusal as it is
        else:
            for _, ticket in batch:
                ticket.set_result(None)

    def _write(self, op: Callable[[sqlite3.Connection], None]) -> None:
        wait_durable(self._writes.submit(op))

    _NO_LIMIT = -1

    @contextmanager
    def _reader(self):
        with self._read_slots:
            with self._read_lock:
                if self._closed:
                    raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
                conn = self._readers.pop() if self._readers else None
            if conn is None:
                conn = self._connect()
            try:
                yield conn
            finally:
                with self._read_lock:
                    if self._closed:
                        conn.close()
                    else:
                        self._readers.append(conn)

    def _read(self, query: str, args: tuple = ()) -> list[tuple]:
        with self._reader() as conn:
            return conn.execute(query, args).fetchall()

    # ------------------------------------------------------------------ tenants
    def add_tenant(self, tenant: TenantRecord) -> None:
        if self._read("SELECT 1 FROM tenants WHERE name=?", (tenant.name,)):
            raise Conflict(f"tenant {tenant.name!r} already exists")
        row = (tenant.name, tenant.token_hash, tenant.created_at, int(tenant.revoked), json.dumps(dict(tenant.quotas)),
               tenant.webhook_secret)
        self._write(lambda db: db.execute(f"INSERT INTO tenants ({TENANT_COLS}) VALUES (?, ?, ?, ?, ?, ?)", row))

    def update_tenant(self, tenant: TenantRecord) -> bool:
        if not self._read("SELECT 1 FROM tenants WHERE name=?", (tenant.name,)):
            return False
        row = (tenant.token_hash, tenant.created_at, int(tenant.revoked), json.dumps(dict(tenant.quotas)),
               tenant.webhook_secret, tenant.name)
        self._write(lambda db: db.execute(
            "UPDATE tenants SET token_hash=?, created_at=?, revoked=?, quotas=?, webhook_secret=? WHERE name=?", row))
        return True

    # ------------------------------------------------------------------ jobs, reports, audit
    def commit(self, job: JobRecord, report: Report | None = None, audit: Sequence[AuditRecord] = (),
               deliveries: Sequence[Delivery] = (), expect: int | None = None) -> Ticket:
        return self._writes.submit(self._commit_op(job, report, audit, deliveries, expect))

    def revive(self, job: JobRecord, report: Report | None, audit: Sequence[AuditRecord], deliveries: Sequence[Delivery],
               expect: int | None, limits: JobLimits) -> Ticket:
        """A shared file counts the tenant's active jobs in the write's transaction (``BEGIN IMMEDIATE``
        serialises every process's writers); one process's coordinator has counted them already."""
        write = self._commit_op(job, report, audit, deliveries, expect)
        if not self.shared:
            return self._writes.submit(write)

        def op(db: sqlite3.Connection) -> None:
            check_revival(db, job, limits, postgres=False)
            write(db)

        return self._writes.submit(op)

    def _commit_op(self, job: JobRecord, report: Report | None, audit: Sequence[AuditRecord],
                   deliveries: Sequence[Delivery], expect: int | None) -> Callable[[sqlite3.Connection], None]:
        row = _job_row(job)
        audit = tuple(audit)
        deliveries = tuple(deliveries)

        key, values = row[:2], row[2:]

        def op(db: sqlite3.Connection) -> None:
            if expect == 0 or (expect is None and not db.execute(
                    "SELECT 1 FROM jobs WHERE tenant=? AND job_id=?", key).fetchone()):
                try:
                    db.execute(f"INSERT INTO jobs ({_JOB_COLS}, version) VALUES ({','.join('?' * 21)})", (*row, 1))
                except sqlite3.IntegrityError:
                    raise StaleState(f"job {job.job_id!r} was registered by another process; retry") from None
            elif expect is None or not self.shared:
                db.execute(f"UPDATE jobs SET {_UPDATE_JOB}, version=version+1 WHERE tenant=? AND job_id=?",
                           (*values, *key))
            elif db.execute(f"UPDATE jobs SET {_UPDATE_JOB}, version=version+1 WHERE tenant=? AND job_id=? "
                            "AND version=? AND created_at=?", (*values, *key, expect, job.created_at)).rowcount == 0:
                raise StaleState(f"job {job.job_id!r} was changed by another process; retry")
            if report is not None:
                self._insert_report(db, job.tenant, job.job_id, report)
            self._insert_audit(db, audit)
            if deliveries:
                db.executemany(f"INSERT OR REPLACE INTO deliveries ({DELIVERY_COLS}) VALUES ({','.join('?' * 10)})",
                               [delivery_row(d) for d in deliveries])

        return op

    def add_report(self, tenant: str, job_id: str, report: Report, expect: int | None = None,
                   created: float | None = None) -> Ticket:
        check = self.shared and expect is not None

        def op(db: sqlite3.Connection) -> None:
            if check:
                if db.execute("UPDATE jobs SET version=version+1 WHERE tenant=? AND job_id=? AND version=? "
                              "AND created_at=COALESCE(?, created_at)", (tenant, job_id, expect, created)).rowcount == 0:
                    raise StaleState(f"job {job_id!r} was changed by another process; retry")
            else:
                db.execute("UPDATE jobs SET version=version+1 WHERE tenant=? AND job_id=?", (tenant, job_id))
            self._insert_report(db, tenant, job_id, report)

        return self._writes.submit(op)

    @staticmethod
    def _insert_report(db: sqlite3.Connection, tenant: str, job_id: str, r: Report) -> None:
        db.execute(_INSERT_REPORT, (tenant, job_id, *r))

    @staticmethod
    def _insert_audit(db: sqlite3.Connection, audit: Iterable[AuditRecord]) -> None:
        db.executemany(
            "INSERT INTO audit (tenant, job_id, at, kind, actor, reason, evidence) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(a.tenant, a.job_id, a.at, a.kind.value, a.actor, a.reason, json.dumps(dict(a.evidence)))
             for a in audit],
        )

    def jobs(self) -> list[JobRecord]:
        return [_job_from_row(r) for r in self._read(f"SELECT {_JOB_COLS}, version FROM jobs ORDER BY rowid")]

    def job(self, tenant: str, job_id: str) -> JobRecord | None:
        rows = self._read(f"SELECT {_JOB_COLS}, version FROM jobs WHERE tenant=? AND job_id=?", (tenant, job_id))
        return _job_from_row(rows[0]) if rows else None

    # what a coordinator sharing this file with other processes reads (see ``shared``)
    def job_versions(self, tenant: str, job_ids: Sequence[str]) -> dict[str, tuple[float, int]]:
        ids = list(job_ids)[:500]
        rows = self._read(f"SELECT job_id, created_at, version FROM jobs WHERE tenant=? AND job_id IN "
                          f"({','.join('?' * len(ids))})", (tenant, *ids)) if ids else []
        return {job_id: (created, version) for job_id, created, version in rows}

    def claim_eval(self, tenant: str, now: float, lease_s: float, worker: str) -> EvalTask | None:
        """One write transaction finds and leases the oldest claimable task, so two processes (two
        ``evalstop evaluate --db`` workers) never lease one snapshot twice."""
        got: list[EvalTask | None] = []
        self._write(lambda db: got.append(_lease_oldest(db, tenant, now, lease_s, worker)))
        return got[-1] if got else None

    def put_eval(self, task: EvalTask) -> Ticket:
        row = tuple(int(v) if isinstance(v, bool) else v for v in eval_row(task))
        return self._writes.submit(lambda db: db.execute(
            f"INSERT OR REPLACE INTO evals ({EVAL_COLS}) VALUES ({','.join('?' * len(row))})", row))

    def claim_deliveries(self, now: float, limit: int, lease_s: float) -> list[Delivery]:
        rows = self._read(f"SELECT {DELIVERY_COLS} FROM deliveries WHERE done=0 AND next_at<=? "
                          "ORDER BY created_at, id LIMIT ?", (now, limit))
        due = [delivery_from_row(r) for r in rows]
        if due:  # one process uses this file: the lease only guards against a crash mid-delivery
            ids = [(now + lease_s, d.id) for d in due]
            self._write(lambda db: db.executemany("UPDATE deliveries SET next_at=? WHERE id=?", ids))
        return due

    def update_delivery(self, delivery: Delivery) -> Ticket:
        row = delivery_row(delivery)
        return self._writes.submit(lambda db: db.execute(
            f"INSERT OR REPLACE INTO deliveries ({DELIVERY_COLS}) VALUES ({','.join('?' * 10)})", row))

    def probe(self) -> None:
        """A transaction through the writer thread that writes nothing (raises StoreError if the writer
        cannot take one: /readyz never writes to the store)."""
        self._write(lambda db: db.execute("SELECT 1 FROM schema_version"))

    def _allow_audit_deletes(self, db) -> None:  # inside prune's transaction only: its trigger reads this table
        db.execute("INSERT INTO audit_retention (active) VALUES (1)")

    def _forbid_audit_deletes(self, db) -> None:
        db.execute("DELETE FROM audit_retention")

    def close(self) -> None:
        """Finish queued writes, stop the writer, close the connections (idempotent)."""
        if not self._writes.close():
            return
        with self._read_lock:
            self._closed = True
            idle, self._readers = self._readers, []
        for conn in idle:
            conn.close()
        self._db.close()

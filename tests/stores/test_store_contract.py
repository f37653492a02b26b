"""One contract, three stores: MemoryStore, SQLiteStore and PostgresStore (a real PostgreSQL)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from evalstop_trl import Conflict, Coordinator, MemoryStore, SQLiteStore
from evalstop_trl.core.records import AuditKind, AuditRecord, Delivery, JobRecord, JobType, Policy, Report, TenantRecord
from evalstop_trl.core.requests import EvalResult, JobRequest, ReasonRequest, ReportRequest, SnapshotRequest
from evalstop_trl.core.store import StaleState, StoreError, wait_durable
from evalstop_trl.stores.sqlite import SCHEMA_VERSION
from tests.store_helpers import STORE_KINDS, open_store


@pytest.fixture(params=STORE_KINDS)
def store(request, tmp_path):
    s = open_store(request.param, tmp_path / "s.db", request)
    yield s
    s.close()


def _job(job_id: str = "j", **changes) -> JobRecord:
    return JobRecord("a", job_id, JobType.GRPO, 100, Policy(), created_at=1.0, updated_at=1.0, **changes)


def test_tenants(store):
    store.add_tenant(TenantRecord("acme", "h1", 1.0, webhook_secret="s"))
    with pytest.raises(Conflict):
        store.add_tenant(TenantRecord("acme", "h2", 2.0))
    assert store.tenant_by_hash("h1").name == "acme" and store.tenant("acme").webhook_secret == "s"
    assert store.update_tenant(TenantRecord("acme", "h3", 1.0, revoked=True, quotas={"report_rate": 5.0}))
    assert store.tenant_by_hash("h1") is None and store.tenant_by_hash("h3").revoked
    assert dict(store.tenant("acme").quotas) == {"report_rate": 5.0}
    assert not store.update_tenant(TenantRecord("ghost", "h", 1.0))
    assert [t.name for t in store.list_tenants()] == ["acme"]


def test_reports_in_step_order_and_paged(store):
    wait_durable(store.commit(_job(), expect=0))
    for step in range(10):
        wait_durable(store.add_report("a", "j", Report(step, 0.1 * step, received_at=float(step)), expect=1 + step))
    assert [r.step for r in store.reports("a", "j")] == list(range(10))
    assert [r.step for r in store.reports("a", "j", after_step=3, limit=4)] == [4, 5, 6, 7]
    assert store.report("a", "j", 5).eval_score == pytest.approx(0.5) and store.report("a", "j", 42) is None
    assert store.job("a", "j").job_id == "j" and store.job("a", "nope") is None


def test_every_field_of_a_report_request_is_stored_and_read_back(store):
    """A report field is declared on the request record; every store keeps it (its column) and gives it
    back by name, so a field missing from a store's schema or migration fails here (and a new field
    fails here until it is given a value below)."""
    from evalstop_trl.core.requests import field_names

    wait_durable(store.commit(_job(), expect=0))
    request = ReportRequest(**dict(zip(field_names(ReportRequest), (7, 0.25, 1.5, 0.75, "ckpt-7", 64, 0.01, 0.125,
                                                                      312.5), strict=True)))
    wait_durable(store.add_report("a", "j", Report.of(request, 3.5, 100), expect=1))
    stored = store.report("a", "j", 7)
    assert stored.request() == request and (stored.received_at, stored.planned_steps) == (3.5, 100)


def test_audit_filtered_and_paged(store):
    wait_durable(store.commit(_job("j1"), expect=0))
    wait_durable(store.commit(_job("j2"), expect=0))
    for i in range(6):
        job = "j1" if i % 2 == 0 else "j2"
        wait_durable(store.commit(_job(job), None, (AuditRecord("a", job, float(i), AuditKind.ACK, "x", f"r{i}"),),
                                  expect=1 + i // 2))
    assert [a.reason for a in store.audit("a", "j1")] == ["r0", "r2", "r4"]
    assert [a.reason for a in store.audit("a", limit=2, offset=1)] == ["r1", "r2"]
    assert store.audit("b") == []


def test_delete_job_removes_one_ended_job_of_one_tenant_and_keeps_its_audit_line(store):
    from evalstop_trl.core.records import EvalTask, JobStatus

    wait_durable(store.commit(_job("run", status=JobStatus.RUNNING), Report(1, 0.5), expect=0))
    wait_durable(store.commit(_job("done", status=JobStatus.FINISHED), Report(1, 0.5), expect=0))
    other = JobRecord("b", "done", JobType.GRPO, 100, Policy(), status=JobStatus.FINISHED, created_at=1.0)
    wait_durable(store.commit(other, Report(1, 0.9), expect=0))  # another tenant's job of the same id
    wait_durable(store.put_eval(EvalTask("a", "done", 1, "/snap/1", 1.0)))
    line = AuditRecord("a", "done", 2.0, AuditKind.DELETED, "tenant:a", "clean-up", {"n_reports": 1})
    assert not store.delete_job("a", "run", line)  # still running: nothing written
    assert store.job("a", "run") is not None and store.audit("a", "run") == []
    assert store.delete_job("a", "done", line)
    assert store.job("a", "done") is None and store.reports("a", "done") == [] and store.evals("a", "done") == []
    assert [(a.kind, a.reason) for a in store.audit("a", "done")] == [(AuditKind.DELETED, "clean-up")]
    assert store.job("b", "done") is not None and [r.step for r in store.reports("b", "done")] == [1]
    assert not store.delete_job("a", "done", line)  # gone already
    assert store.count_reports("a") == 1  # the running job's only


def test_run_rows_are_one_tenants_jobs_with_what_the_list_sorts_and_filters(store):
    from evalstop_trl.core.browse import RunRow
    from evalstop_trl.core.records import JobStatus, PolicyMode

    shadow = Policy("patience", {"k": 3}, PolicyMode.SHADOW)
    wait_durable(store.commit(_job("j1", tags={"team": "rl"}), expect=0))
    j2 = _job("j2").evolve(policy=shadow, status=JobStatus.STOPPED, stopped_at=5.0)
    wait_durable(store.commit(j2, expect=0))
    wait_durable(store.commit(JobRecord("b", "j9", JobType.SFT, None, Policy(), created_at=2.0), expect=0))
    rows = sorted(store.run_rows("a"))
    assert rows == [RunRow("j1", JobType.GRPO, JobStatus.PENDING, "decline", "enforce", 1.0, 1.0, None, None,
                           {"team": "rl"}),
                    RunRow("j2", JobType.GRPO, JobStatus.STOPPED, "patience", "shadow", 1.0, 1.0, 5.0, None, {})]
    assert [r.job_id for r in store.run_rows("b")] == ["j9"] and store.run_rows("nobody") == []


def test_deliveries_are_claimed_leased_and_finished(store):
    d = Delivery("a/j/stop", "a", "j", "http://example.com/h", "{}", created_at=5.0)
    wait_durable(store.commit(_job(), None, (), (d,), expect=0))
    (claimed,) = store.claim_deliveries(now=10.0, limit=5, lease_s=30.0)
    assert claimed.id == "a/j/stop"
    assert store.claim_deliveries(now=11.0, limit=5, lease_s=30.0) == []  # leased
    assert len(store.claim_deliveries(now=41.0, limit=5, lease_s=30.0)) == 1  # the lease ran out: back in the queue
    wait_durable(store.update_delivery(Delivery(d.id, "a", "j", d.url, d.body, 5.0, attempts=1, done=True,
                                                outcome="delivered")))
    assert store.claim_deliveries(now=1e9, limit=5, lease_s=30.0) == []


def test_a_shared_store_refuses_writes_on_stale_state(pg_dsn):
    from evalstop_trl.stores.postgres import PostgresStore

    store = PostgresStore(pg_dsn)  # versions are checked by shared stores only (one process owns the others)
    assert store.shared and not SQLiteStore.shared and not MemoryStore.shared
    wait_durable(store.commit(_job(), expect=0))
    with pytest.raises(StaleState):
        wait_durable(store.commit(_job(), expect=0))  # registered already
    wait_durable(store.add_report("a", "j", Report(1, 0.5), expect=1))
    with pytest.raises(StaleState):
        wait_durable(store.add_report("a", "j", Report(2, 0.5), expect=1))  # someone else wrote version 2
    assert isinstance(StaleState("x"), StoreError)
    assert store.job_versions("a", ["j"]) == {"j": (store.job("a", "j").created_at, 2)}
    assert store.job("a", "j").version == 2
    # one refused write in a batch sinks nothing else
    bad = store.add_report("a", "j", Report(3, 0.5), expect=7)
    good = store.add_report("a", "j", Report(3, 0.5), expect=2)
    with pytest.raises(StaleState):
        wait_durable(bad)
    wait_durable(good)
    assert [r.step for r in store.reports("a", "j")] == [1, 3]
    store.close()


def test_sqlite_migrates_a_version_1_database(tmp_path):
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)  # the schema evalstop 0.1 wrote
    db.executescript("""
        CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (1);
        CREATE TABLE tenants (name TEXT PRIMARY KEY, token_hash TEXT NOT NULL UNIQUE, created_at REAL NOT NULL,
            revoked INTEGER NOT NULL DEFAULT 0);
        INSERT INTO tenants VALUES ('old', 'hash', 1.0, 0);
        CREATE TABLE jobs (tenant TEXT NOT NULL, job_id TEXT NOT NULL, job_type TEXT NOT NULL, planned_steps INTEGER,
            policy TEXT NOT NULL, pid INTEGER, pid_start_time REAL, webhook TEXT, status TEXT NOT NULL,
            created_at REAL NOT NULL, updated_at REAL NOT NULL, decision TEXT, stopped_by TEXT, stopped_at REAL,
            acked_at REAL, checkpoint TEXT, finished_at REAL, PRIMARY KEY (tenant, job_id));
        INSERT INTO jobs VALUES ('old', 'j', 'grpo', 10, '{"detector": "decline", "k": 2, "min_delta": 0.0,
            "direction": "max"}', 123, 1.0, NULL, 'running', 1.0, 1.0, NULL, NULL,
            NULL, NULL, NULL, NULL);
    """)
    db.commit()
    db.close()
    c = Coordinator(SQLiteStore(path))
    assert c.status("old", "j").policy["k"] == 2
    assert c.tenants.get("old").quotas == {}
    c.close()
    assert sqlite3.connect(path).execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    # version 3 added last_seen (liveness): an old job has none, and counts from its last write
    c = Coordinator(SQLiteStore(path))
    c.heartbeat("old", "j")
    assert c.state("old", "j").record.last_seen is not None
    c.close()


def test_postgres_audit_is_append_only_and_the_schema_versioned(pg_dsn):
    import psycopg

    from evalstop_trl.stores.postgres import SCHEMA_VERSION, PostgresStore

    c = Coordinator(PostgresStore(pg_dsn))
    c.register_job("a", JobRequest("j", "grpo"))
    c.stop("a", "j", ReasonRequest("x"))
    c.close()
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        with pytest.raises(psycopg.Error, match="append-only"):
            db.execute("DELETE FROM audit")
        db.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(ValueError, match="schema version 99"):
        PostgresStore(pg_dsn)


def _tags_roundtrip(c: Coordinator) -> None:
    """An old job reads with no tags or hparams; a re-registration adds them (audited) and they stay."""
    view = c.status("old", "j")
    assert dict(view.tags) == {} and dict(view.hparams) == {}
    c.register_job("old", JobRequest("j", tags={"team": "rl"}, hparams={"learning_rate": 3e-4, "model": "tiny"}))
    assert c.audit("old", "j")[-1].evidence["tags"] == {"set": {"team": "rl"}, "removed": [], "more": 0}


def test_sqlite_migrates_version_4_to_5_tags_and_hparams(tmp_path):
    path = tmp_path / "v4.db"
    c = Coordinator(SQLiteStore(path))
    c.register_job("old", JobRequest("j", "grpo"))
    c.close()
    db = sqlite3.connect(path)  # what evalstop wrote before issue 19: no tags, no hparams, version 4
    db.executescript("ALTER TABLE jobs DROP COLUMN tags; ALTER TABLE jobs DROP COLUMN hparams; "
                     "UPDATE schema_version SET version = 4;")
    db.close()
    c = Coordinator(SQLiteStore(path))
    _tags_roundtrip(c)
    c.close()
    assert sqlite3.connect(path).execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    c = Coordinator(SQLiteStore(path))
    assert dict(c.status("old", "j").tags) == {"team": "rl"} and c.status("old", "j").hparams["learning_rate"] == 3e-4
    c.close()


def test_sqlite_migrates_version_5_to_6_reports_keep_their_plan(tmp_path):
    """Version 6 stores each report's plan (issue 25 item 6); older reports have none and replay with
    the job's plan, as they were decided."""
    path = tmp_path / "v5.db"
    c = Coordinator(SQLiteStore(path))
    c.register_job("old", JobRequest("j", "grpo", 100, {"detector": "stop_at", "fraction": 0.5}))
    c.report("old", "j", ReportRequest(10, 0.5))
    c.close()
    db = sqlite3.connect(path)  # what evalstop wrote before: no planned_steps in reports, version 5
    db.executescript("ALTER TABLE reports DROP COLUMN planned_steps; UPDATE schema_version SET version = 5;")
    db.close()
    c = Coordinator(SQLiteStore(path))
    assert [r.planned_steps for r in c.reports("old", "j")] == [None]  # the old row, as it was
    assert c.report("old", "j", ReportRequest(50, 0.5)).stop  # progress 0.5 under the job's plan
    assert [r.planned_steps for r in c.reports("old", "j")] == [None, 100]
    c.close()
    assert sqlite3.connect(path).execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)


def _evidence_roundtrip(open_coordinator) -> None:
    """A report stored before per-example evidence reads with none; a new one keeps its n and noise
    (issue 28 item 1), through a reopen."""
    c = open_coordinator()
    assert [(r.eval_n, r.eval_noise) for r in c.reports("old", "j")] == [(None, None)]
    assert [(t.eval_n, t.eval_noise) for t in c.evals("old", "j")] == [(None, None)]  # an old snapshot
    c.post_eval("old", "j", 15, EvalResult(0.45, "w", eval_n=250, eval_noise=0.02))  # the old snapshot, scored now
    c.report("old", "j", ReportRequest(20, 0.4, eval_n=250, eval_noise=0.01))
    c.close()
    c = open_coordinator()
    assert [(r.step, r.eval_n, r.eval_noise) for r in c.reports("old", "j")] == [(10, None, None), (15, 250, 0.02),
                                                                               (20, 250, 0.01)]
    assert [(t.eval_n, t.eval_noise) for t in c.evals("old", "j")] == [(250, 0.02)]
    c.close()


def test_sqlite_migrates_version_6_to_7_reports_keep_their_evidence(tmp_path):
    path = tmp_path / "v6.db"
    c = Coordinator(SQLiteStore(path))
    c.register_job("old", JobRequest("j", "grpo"))
    c.report("old", "j", ReportRequest(10, 0.5))
    c.publish_snapshot("old", "j", SnapshotRequest(15, "/snap/15"))
    c.close()
    db = sqlite3.connect(path)  # what evalstop wrote before: no per-example evidence, version 6
    db.executescript("ALTER TABLE reports DROP COLUMN eval_n; ALTER TABLE reports DROP COLUMN eval_noise; "
                     "ALTER TABLE evals DROP COLUMN eval_n; ALTER TABLE evals DROP COLUMN eval_noise; "
                     "DROP TRIGGER audit_append_only_d; DROP TABLE audit_retention; "  # version 6's guard, closed to all
                     "CREATE TRIGGER audit_append_only_d BEFORE DELETE ON audit "
                     "BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END; "
                     "UPDATE schema_version SET version = 6;")
    db.close()
    _evidence_roundtrip(lambda: Coordinator(SQLiteStore(path)))
    assert sqlite3.connect(path).execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    c = Coordinator(SQLiteStore(path))  # version 7's guard lets retention (only) delete old audit lines
    c.register_job("old", JobRequest("gone"))
    c.stop("old", "gone", ReasonRequest("x"))
    c.register_job("old", JobRequest("live"))
    c.register_job("old", JobRequest("live", tags={"a": "1"}))  # an amended line of a job that stays
    c.close()
    store = SQLiteStore(path)
    assert store.prune(time.time() + 1, audit_before=time.time() + 1).audit >= 1
    store.close()
    assert sqlite3.connect(path).execute("SELECT count(*) FROM audit WHERE job_id='live'").fetchone() == (1,)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        sqlite3.connect(path).execute("DELETE FROM audit")


#: report columns added after the first schema, each with a value and the SQLite and PostgreSQL
#: schema versions before it, and the earlier added columns a report then had (with a value each)
ADDED_COLUMNS = [
    pytest.param("kl", 0.25, 7, 5, {}, id="kl"),  # what a gate: kl_past_peak policy reads after a restart
    pytest.param("length", 312.5, 8, 6, {"kl": 0.1}, id="length"),  # a stop's evidence after a restart
]


def _added_column_roundtrip(reopen, column: str, value: float, earlier: dict) -> None:
    """A database from before reports kept ``column``: its old report reads back without one (and with
    the earlier columns it had), and a new report's value is stored."""
    c = reopen()
    old = c.reports("old", "j")[0]
    assert getattr(old, column) is None and all(getattr(old, k) == v for k, v in earlier.items())
    c.report("old", "j", ReportRequest(20, 0.6, **{column: value}))
    c.close()
    c = reopen()
    assert [getattr(r, column) for r in c.reports("old", "j")] == [None, value]
    assert [[getattr(r, k) for r in c.reports("old", "j")] for k in earlier] == [[v, None] for v in earlier.values()]
    c.close()


@pytest.mark.parametrize("column, value, sqlite_before, pg_before, earlier", ADDED_COLUMNS)
def test_sqlite_migrates_a_report_column_added_later(tmp_path, column, value, sqlite_before, pg_before, earlier):
    path = tmp_path / f"v{sqlite_before}.db"
    c = Coordinator(SQLiteStore(path))
    c.register_job("old", JobRequest("j", "grpo"))
    c.report("old", "j", ReportRequest(10, 0.5, **earlier))
    c.close()
    db = sqlite3.connect(path)  # what evalstop wrote before: no such column, the version before it
    db.executescript(f"ALTER TABLE reports DROP COLUMN {column}; UPDATE schema_version SET version = {sqlite_before};")
    db.close()
    _added_column_roundtrip(lambda: Coordinator(SQLiteStore(path)), column, value, earlier)
    assert sqlite3.connect(path).execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)


@pytest.mark.parametrize("column, value, sqlite_before, pg_before, earlier", ADDED_COLUMNS)
def test_postgres_migrates_a_report_column_added_later(pg_dsn, column, value, sqlite_before, pg_before, earlier):
    import psycopg

    from evalstop_trl.stores.postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION
    from evalstop_trl.stores.postgres import PostgresStore

    c = Coordinator(PostgresStore(pg_dsn))
    c.register_job("old", JobRequest("j", "grpo"))
    c.report("old", "j", ReportRequest(10, 0.5, **earlier))
    c.close()
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute(f"ALTER TABLE reports DROP COLUMN {column}")
        db.execute(f"UPDATE schema_version SET version = {pg_before}")
    _added_column_roundtrip(lambda: Coordinator(PostgresStore(pg_dsn)), column, value, earlier)
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(PG_SCHEMA_VERSION,)]


def test_postgres_migrates_version_4_to_5_reports_keep_their_evidence(pg_dsn):
    import psycopg

    from evalstop_trl.stores.postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION
    from evalstop_trl.stores.postgres import PostgresStore

    c = Coordinator(PostgresStore(pg_dsn))
    c.register_job("old", JobRequest("j", "grpo"))
    c.report("old", "j", ReportRequest(10, 0.5))
    c.publish_snapshot("old", "j", SnapshotRequest(15, "/snap/15"))
    c.close()
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        for table in ("reports", "evals"):
            db.execute(f"ALTER TABLE {table} DROP COLUMN eval_n")
            db.execute(f"ALTER TABLE {table} DROP COLUMN eval_noise")
        db.execute("UPDATE schema_version SET version = 4")
    _evidence_roundtrip(lambda: Coordinator(PostgresStore(pg_dsn)))
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(PG_SCHEMA_VERSION,)]


def test_postgres_migrates_version_2_to_3_tags_and_hparams(pg_dsn):
    import psycopg

    from evalstop_trl.stores.postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION
    from evalstop_trl.stores.postgres import PostgresStore

    c = Coordinator(PostgresStore(pg_dsn))
    c.register_job("old", JobRequest("j", "grpo"))
    c.close()
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute("ALTER TABLE jobs DROP COLUMN tags")
        db.execute("ALTER TABLE jobs DROP COLUMN hparams")
        db.execute("UPDATE schema_version SET version = 2")
    c = Coordinator(PostgresStore(pg_dsn))
    _tags_roundtrip(c)
    c.close()
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(PG_SCHEMA_VERSION,)]
    c = Coordinator(PostgresStore(pg_dsn))
    assert dict(c.status("old", "j").tags) == {"team": "rl"} and c.status("old", "j").hparams["model"] == "tiny"
    c.close()


def test_a_bad_postgres_location_is_a_clear_error():
    from evalstop_trl.stores import open_store

    with pytest.raises(ValueError, match=r"Cannot open the PostgreSQL database postgresql://u:\*\*\*@127.0.0.1:9/x"):
        open_store("postgresql://u:secret@127.0.0.1:9/x")


def test_a_command_that_waited_for_a_deleted_job_writes_nothing(tmp_path):
    """A report that got the job's slot before the delete took its lock is refused (404) when it gets
    the lock, instead of writing rows of a job that is gone (or re-creating it)."""
    from evalstop_trl.core.errors import NotFound
    from evalstop_trl.core.job import Observe

    c = Coordinator(SQLiteStore(tmp_path / "d.db"))
    c.register_job("a", JobRequest("j", "grpo"))
    c.report("a", "j", ReportRequest(10, 0.5))
    c.stop("a", "j", ReasonRequest("done"))
    slot = c.jobs.get("a", "j")  # a racing command holds the slot ...
    c.delete_job("a", "j", ReasonRequest("clean-up"))  # ... while the delete runs
    with pytest.raises(NotFound):
        c._run(slot, Observe(Report(20, 0.4, received_at=1.0)))
    c.close()
    store = SQLiteStore(tmp_path / "d.db")
    assert store.job("a", "j") is None and store.reports("a", "j") == []
    store.close()


def test_audit_retention_reclaims_a_stored_jobs_old_lines_but_its_newest_of_each_kind(store):
    """A job id kept alive cannot keep a flood: retention deletes a stored job's old lines too, all
    but its newest of each kind (what explains its state); newer lines and other tenants' stay."""
    def line(tenant: str, job: str, at: float, kind: AuditKind, reason: str) -> AuditRecord:
        return AuditRecord(tenant, job, at, kind, "launcher", reason)

    wait_durable(store.commit(_job("live"), expect=0))
    flood = [line("a", "live", float(i), AuditKind.LAUNCHER_EXIT, f"exit {i}") for i in range(1, 41)]
    flood += [line("a", "live", 41.0, AuditKind.ACK, "ack 1"), line("a", "live", 42.0, AuditKind.ACK, "ack 2"),
              line("a", "live", 500.0, AuditKind.LAUNCHER_EXIT, "recent")]
    for version, a in enumerate(flood, start=1):
        wait_durable(store.commit(_job("live"), None, (a,), expect=version))
    other = JobRecord("b", "live", JobType.GRPO, 100, Policy(), created_at=1.0, updated_at=1.0)
    wait_durable(store.commit(other, None, (line("b", "live", 1.0, AuditKind.ACK, "b1"),
                                            line("b", "live", 2.0, AuditKind.ACK, "b2")), expect=0))
    dry = store.prune(0.0, "a", dry_run=True, audit_before=100.0)
    assert (dry.jobs, dry.audit) == (0, 41)  # the 40 old exits ("recent" is the newest) and the older ack
    assert store.prune(0.0, "a", audit_before=100.0).audit == 41
    assert [a.reason for a in store.audit("a", "live")] == ["ack 2", "recent"]
    assert [a.reason for a in store.audit("b")] == ["b1", "b2"]  # another tenant's: not asked
    assert store.prune(0.0, audit_before=100.0).audit == 1  # all tenants: b keeps its newest ack
    assert [a.reason for a in store.audit("b")] == ["b2"] and store.job("a", "live") is not None

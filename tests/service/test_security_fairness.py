"""Issue 17, items 5 and 6 (and item 9's double lease): attacks on a real ``evalstop serve`` on
127.0.0.1, on SQLite and on PostgreSQL 15, each refused or harmless now.

* 17.5 — one tenant must not stall the others: while alice floods an expensive call (the audit log
  at a large offset, an unpaged listing of thousands of snapshots, claims over a large queue, catch-up
  feeds), bob's report median stays within 2x its idle median + 20 ms (a median, with a wide margin:
  a tail on a shared 2-core machine measures the machine); two replicas claiming at once never
  lease one snapshot twice.
* 17.6 — quotas that hold: finished jobs count, events and snapshots are capped and rate limited,
  reports are capped per tenant, concurrent registrations on two replicas cannot pass
  ``max_active_jobs``; ``evalstop prune`` deletes old finished jobs (the audit log stays); start-up
  does not replay finished jobs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from evalstop_trl.clients.local import free_loopback_port, wait_until_healthy
from tests.proc_helpers import bearer

pytestmark = pytest.mark.slow



# ---------------------------------------------------------------- a real server on either store
class Serve:
    """`evalstop serve --db DB` in a child process on a free loopback port (DB: a file or a DSN)."""

    def __init__(self, db: str, log_dir: Path) -> None:
        self.db, self.port = db, free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_dir / f"serve.{self.port}.log", "a")
        self.proc: subprocess.Popen | None = None

    def start(self, *args: str) -> Serve:
        self.proc = subprocess.Popen([sys.executable, "-m", "evalstop_trl", "serve", "--db", self.db, "--port",
                                      str(self.port), "--log-level", "warning", *args], stdout=self.log,
                                     stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if not wait_until_healthy(self.url, 60, self.proc):
            raise RuntimeError(Path(self.log.name).read_text())
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def _cli(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "evalstop_trl", *args], check=True, capture_output=True,
                          text=True).stdout


def _tenant(db: str, name: str) -> str:
    return json.loads(_cli("tenants", "add", name, "--db", db, "--json"))["token"]


@pytest.fixture
def servers(tmp_path):
    started: list[Serve] = []

    def start(db: str, *args: str) -> Serve:
        started.append(Serve(db, tmp_path).start(*args))
        return started[-1]

    yield start
    for s in started:
        s.kill()


def _sql(db: str, statements: list[tuple[str, list[tuple]]]) -> None:
    """Write rows straight into the store (the end state of a long attack, seeded in seconds)."""
    if db.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(db) as conn, conn.cursor() as cur:
            for query, rows in statements:
                cur.executemany(query.replace("?", "%s"), rows)
        return
    import sqlite3

    conn = sqlite3.connect(db)
    with conn:
        for query, rows in statements:
            conn.executemany(query, rows)
    conn.close()


# ---------------------------------------------------------------- 17.5: bob's reports under alice's floods
#: alice's flood, in its own process (4 connections, as fast as the server answers, until told to stop)
FLOOD = """
import json, sys, threading, time, httpx
url, token, stop_file, kind, arg = sys.argv[1:]
codes, lock = {}, threading.Lock()
def one(c, i):
    if kind == "churn":  # register -> fail -> delete with long reasons: audited writes as fast as answered
        job = f"churn-{i}-{time.monotonic_ns()}"
        r = c.post("/v1/jobs", json={"job_id": job})
        if r.status_code != 201:
            return r
        c.post(f"/v1/jobs/{job}/fail", json={"reason": "x" * 2000})
        return c.post(f"/v1/jobs/{job}/delete", json={"reason": "y" * 2000})
    if kind == "audit":
        return c.get(f"/v1/audit?limit=1000&offset={arg}")
    if kind == "evals":
        return c.get(f"/v1/jobs/{arg}/evals")
    if kind == "claim":
        return c.post("/v1/evals/claim", json={"worker": f"w{i}", "lease_s": 1})
    job, n = arg.split(":")
    base = i * 1000
    for s in range(2, int(n) + 1):  # a catch-up: every later snapshot scored, then the first
        c.post(f"/v1/jobs/{job}/evals/{base + s}", json={"score": 0.5 + s * 1e-4})
    return c.post(f"/v1/jobs/{job}/evals/{base + 1}", json={"score": 0.5})
def loop(i):
    with httpx.Client(base_url=url, headers={"Authorization": "Bearer " + token}, timeout=60) as c:
        rounds = 0
        while True:
            try:
                open(stop_file).close()
                return
            except FileNotFoundError:
                pass
            if kind == "feed" and rounds:
                time.sleep(0.05)
                continue
            r = one(c, i)
            rounds += 1
            with lock:
                codes[str(r.status_code)] = codes.get(str(r.status_code), 0) + 1
threads = [threading.Thread(target=loop, args=(i,)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(codes))
"""


def _bob_p50(url: str, token: str, job: str, first_step: int, n: int = 60) -> tuple[float, int]:
    """Bob's median report latency over ``n`` reports 10 ms apart (one keep-alive connection)."""
    times = []
    with httpx.Client(base_url=url, headers=bearer(token), timeout=60) as c:
        for step in range(first_step, first_step + n):
            t0 = time.perf_counter()
            r = c.post(f"/v1/jobs/{job}/reports", json={"step": step, "train_loss": 1.0})
            times.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            time.sleep(0.01)
    return statistics.median(times), first_step + n


def _under_flood(url: str, alice: str, bob: str, kind: str, arg: str, tmp_path: Path,
                 flood_url: str | None = None) -> tuple[float, float, dict]:
    """Bob's median report on ``url`` idle and under alice's ``kind`` flood (on ``flood_url``, default the same)."""
    with httpx.Client(base_url=url, headers=bearer(bob)) as c:
        assert c.post("/v1/jobs", json={"job_id": "bob-run"}).status_code == 201
    _bob_p50(url, bob, "bob-run", 0, 20)  # warm up
    idle, step = _bob_p50(url, bob, "bob-run", 20)
    stop = tmp_path / f"stop-{kind}"
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, flood_url or url, alice, str(stop), kind, arg],
                             stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # the flood is under way
        busy, _ = _bob_p50(url, bob, "bob-run", step)
    finally:
        stop.touch()
        out, _ = flood.communicate(timeout=120)
    codes = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    print(f"{kind}: bob's report p50 idle {idle * 1e3:.1f} ms, under alice's flood {busy * 1e3:.1f} ms; "
          f"alice's answers {codes}")
    return idle, busy, codes


def _not_stalled(idle: float, busy: float) -> None:
    """Bob's median report under alice's flood is not stalled. A stall (one of alice's expensive reads
    holding the event loop or a store connection) costs a whole read per report: hundreds of ms for the
    floods here. Sharing 2 cores with the flood process and the database costs a few times the idle
    median (9 ms idle, 40 ms under the evals flood with PostgreSQL on a fresh 2-core machine): the
    bound sits between the two, a median with a wide margin."""
    assert busy <= 3 * idle + 0.050, f"bob's median report went from {idle * 1e3:.1f} ms to {busy * 1e3:.1f} ms"


def _seed_audit(db: str, n: int) -> None:
    rows = [("alice", f"a{i % 100}", 1.0 + i, "launcher_exit", "launcher", "x" * 200, "{}") for i in range(n)]
    _sql(db, [("INSERT INTO audit (tenant, job_id, at, kind, actor, reason, evidence) VALUES (?, ?, ?, ?, ?, ?, ?)",
               rows)])


def _seed_evals(db: str, job: str, n: int, first: int = 1) -> None:
    fed = "FALSE" if db.startswith("postgresql://") else "0"
    rows = [("alice", job, first + i, f"/snap/{i}", 1.0 + i, "pending", 0.0, "") for i in range(n)]
    _sql(db, [("INSERT INTO evals (tenant, job_id, step, path, created_at, state, lease_until, worker, fed) "
               f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, {fed})", rows)])


def test_17_5_the_audit_log_at_a_large_offset_does_not_stall_another_tenant(db, servers, tmp_path):
    alice, bob = _tenant(db, "alice"), _tenant(db, "bob")
    _seed_audit(db, 150_000)
    srv = servers(db)
    idle, busy, codes = _under_flood(srv.url, alice, bob, "audit", "149000", tmp_path)
    assert set(codes) <= {"200", "429"} and codes.get("200"), codes
    _not_stalled(idle, busy)
    # keyset paging: the page after a seq, with the next cursor in X-Next-After
    r = httpx.get(f"{srv.url}/v1/audit?limit=2&after=10", headers=bearer(alice))
    assert r.status_code == 200 and len(r.json()) == 2 and int(r.headers["x-next-after"]) > 10
    r2 = httpx.get(f"{srv.url}/v1/audit?limit=2&offset=2", headers=bearer(alice))
    assert r2.json()[0]["job_id"] == "a2"


def test_17_5_unpaged_evals_do_not_stall_another_tenant(db, servers, tmp_path):
    alice, bob = _tenant(db, "alice"), _tenant(db, "bob")
    srv = servers(db)
    assert httpx.post(f"{srv.url}/v1/jobs", json={"job_id": "big"}, headers=bearer(alice)).status_code == 201
    _seed_evals(db, "big", 10_000)
    idle, busy, codes = _under_flood(srv.url, alice, bob, "evals", "big", tmp_path)
    assert set(codes) <= {"200", "429"} and codes.get("200"), codes
    _not_stalled(idle, busy)
    page = httpx.get(f"{srv.url}/v1/jobs/big/evals?after_step=100&limit=5", headers=bearer(alice)).json()
    assert [t["step"] for t in page] == [101, 102, 103, 104, 105]


def test_17_5_claims_over_a_large_queue_do_not_stall_another_tenant(db, servers, tmp_path):
    alice, bob = _tenant(db, "alice"), _tenant(db, "bob")
    srv = servers(db)
    for j in range(5):
        assert httpx.post(f"{srv.url}/v1/jobs", json={"job_id": f"q{j}"}, headers=bearer(alice)).status_code == 201
        _seed_evals(db, f"q{j}", 10_000)
    idle, busy, codes = _under_flood(srv.url, alice, bob, "claim", "", tmp_path)
    assert set(codes) <= {"200", "429"} and codes.get("200"), codes
    _not_stalled(idle, busy)


def test_17_5_catch_up_feeds_do_not_stall_another_tenant(db, servers, tmp_path):
    alice, bob = _tenant(db, "alice"), _tenant(db, "bob")
    srv = servers(db)
    h = bearer(alice)
    assert httpx.post(f"{srv.url}/v1/jobs", json={"job_id": "cu", "policy": {"detector": "never"}},
                      headers=h).status_code == 201
    for i in range(4):  # each flood connection catches up 150 snapshots of its own
        _seed_evals(db, "cu", 150, first=i * 1000 + 1)
    idle, busy, codes = _under_flood(srv.url, alice, bob, "feed", "cu:150", tmp_path)
    assert set(codes) <= {"200", "429"}, codes
    _not_stalled(idle, busy)
    assert httpx.get(f"{srv.url}/v1/jobs/cu", headers=h).json()["n_reports"] == 600  # every snapshot was fed


def test_42_8_a_register_fail_delete_flood_on_one_replica_does_not_stall_another_tenant(pg_dsn, servers, tmp_path):
    """Round four, item 8: alice churns jobs (register, fail, delete, 2,000-character reasons) on one
    PostgreSQL replica while bob reports on another; her audited writes count against her budget (429
    beyond it), and bob's median report stays within the bound of the other floods."""
    alice, bob = _tenant(pg_dsn, "alice"), _tenant(pg_dsn, "bob")
    a, b = servers(pg_dsn), servers(pg_dsn)
    idle, busy, codes = _under_flood(b.url, alice, bob, "churn", "", tmp_path, flood_url=a.url)
    # 409: a delete of a job whose fail was refused (still active); 429: the churn met its audit budget (how
    # soon depends on the machine's speed: the budget itself is tests/service/test_security_audit.py's)
    assert set(codes) <= {"200", "201", "409", "429"} and codes.get("200"), codes
    _not_stalled(idle, busy)


def test_17_5_a_tenant_gets_429_beyond_its_concurrent_expensive_reads(tmp_path, servers):
    db = str(tmp_path / "coord.db")
    alice = _tenant(db, "alice")
    _seed_audit(db, 150_000)
    srv = servers(db)
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda _: httpx.get(f"{srv.url}/v1/audit?offset=149000", headers=bearer(alice),
                                                  timeout=60).status_code, range(32)))
    assert 200 in codes and 429 in codes and set(codes) <= {200, 429}, codes


def test_17_5_two_replicas_never_lease_one_snapshot_twice(pg_dsn, servers):
    alice = _tenant(pg_dsn, "alice")
    a, b = servers(pg_dsn), servers(pg_dsn)
    h = bearer(alice)
    assert httpx.post(f"{a.url}/v1/jobs", json={"job_id": "ext"}, headers=h).status_code == 201
    doubles = 0
    for rnd in range(5):
        for s in range(10):
            r = httpx.post(f"{a.url}/v1/jobs/ext/snapshots", json={"step": rnd * 100 + s + 1, "path": f"/s/{s}"},
                           headers=h)
            assert r.status_code == 201, r.text
        claimed: list[tuple[str, int]] = []
        lock = threading.Lock()

        def claim(url: str, worker: str, claimed: list = claimed, lock: threading.Lock = lock) -> None:
            with httpx.Client(base_url=url, headers=h, timeout=30) as c:
                while True:
                    r = c.post("/v1/evals/claim", json={"worker": worker, "lease_s": 600})
                    if r.status_code == 204:
                        return
                    if r.status_code == 429:
                        time.sleep(0.01)
                        continue
                    assert r.status_code == 200, r.text
                    with lock:
                        claimed.append((r.json()["job_id"], r.json()["step"]))

        threads = [threading.Thread(target=claim, args=(srv.url, f"{srv.port}-{i}")) for srv in (a, b) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        doubles += len(claimed) - len(set(claimed))
        assert len(set(claimed)) == 10, claimed
    assert doubles == 0


# ---------------------------------------------------------------- 17.6: quotas that hold
def test_17_6_concurrent_registrations_on_two_replicas_hold_max_active_jobs(pg_dsn, servers):
    alice = _tenant(pg_dsn, "alice")
    a, b = servers(pg_dsn, "--max-active-jobs", "5"), servers(pg_dsn, "--max-active-jobs", "5")

    def register(i: int) -> int:
        url = (a, b)[i % 2].url
        return httpx.post(f"{url}/v1/jobs", json={"job_id": f"r{i}"}, headers=bearer(alice), timeout=60).status_code

    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(register, range(20)))
    assert codes.count(201) == 5 and set(codes) <= {201, 429, 503}, codes
    listed = httpx.get(f"{a.url}/v1/jobs", headers=bearer(alice)).json()
    assert len(listed) == 5


def test_17_6_finished_jobs_count_against_max_jobs(db, servers):
    alice, bob = _tenant(db, "alice"), _tenant(db, "bob")
    srv = servers(db, "--max-jobs", "3")
    h = bearer(alice)
    for i in range(3):
        assert httpx.post(f"{srv.url}/v1/jobs", json={"job_id": f"f{i}"}, headers=h).status_code == 201
        assert httpx.post(f"{srv.url}/v1/jobs/f{i}/finish", headers=h).status_code == 200
    r = httpx.post(f"{srv.url}/v1/jobs", json={"job_id": "f3"}, headers=h)
    assert r.status_code == 429 and "max_jobs=3" in r.json()["detail"]
    assert httpx.post(f"{srv.url}/v1/jobs", json={"job_id": "b"}, headers=bearer(bob)).status_code == 201


def test_17_6_events_and_snapshots_are_capped_per_job_and_rate_limited(db, servers):
    alice = _tenant(db, "alice")
    srv = servers(db, "--max-events-per-job", "5", "--max-snapshots-per-job", "4", "--event-rate", "1",
                  "--event-burst", "30")
    h = bearer(alice)
    with httpx.Client(base_url=srv.url, headers=h) as c:
        assert c.post("/v1/jobs", json={"job_id": "e"}).status_code == 201
        codes = [c.post("/v1/jobs/e/events", json={"kind": "launcher_exit", "reason": "x" * 2000}).status_code
                 for _ in range(7)]
        assert codes == [201] * 5 + [429] * 2, codes
        assert "max_events_per_job=5" in c.post("/v1/jobs/e/events", json={"kind": "launcher_exit"}).json()["detail"]
        codes = [c.post("/v1/jobs/e/snapshots", json={"step": s, "path": f"/s{s}"}).status_code for s in range(1, 7)]
        assert codes == [201] * 4 + [429] * 2, codes
        # the rate: the burst of 30 is spent by now (5 + 3 events, 6 snapshots, then these)
        codes = [c.post("/v1/jobs/e/events", json={"kind": "launcher_exit"}) for _ in range(20)]
        limited = [r for r in codes if r.status_code == 429 and "event_rate" in r.json()["detail"]]
        assert limited and int(limited[0].headers["retry-after"]) >= 1
        assert len([a for a in c.get("/v1/audit?job_id=e").json() if a["kind"] == "launcher_exit"]) == 5


def test_25_4_registration_amendments_share_the_tenants_event_rate(db, servers):
    """Re-registrations that change a job's tags as fast as a client can: beyond the tenant's
    event_burst they are 429 with Retry-After (and write no audit line), while a re-registration
    that changes nothing still attaches, and another tenant amends freely (issue 25 item 4)."""
    alice, bob = _tenant(db, "alice"), _tenant(db, "bob")
    srv = servers(db, "--event-rate", "1", "--event-burst", "10", "--max-events-per-job", "1000")
    with httpx.Client(base_url=srv.url, headers=bearer(alice)) as c:
        assert c.post("/v1/jobs", json={"job_id": "a"}).status_code == 201
        codes = [c.post("/v1/jobs", json={"job_id": "a", "tags": {"n": str(i)}}) for i in range(25)]
        ok = [r for r in codes if r.status_code == 200]
        limited = [r for r in codes if r.status_code == 429]
        assert 10 <= len(ok) <= 13 and len(ok) + len(limited) == 25, [r.status_code for r in codes]
        assert "event_rate=1/s" in limited[0].json()["detail"] and "registration amendments" in limited[0].json()["detail"]
        assert int(limited[0].headers["retry-after"]) >= 1
        amended = [x for x in c.get("/v1/audit?job_id=a").json() if x["kind"] == "amended"]
        assert len(amended) == len(ok)
        same = c.post("/v1/jobs", json={"job_id": "a", "tags": {"n": ok[-1].json()["tags"]["n"]}})
        assert same.status_code == 200  # nothing changes: an attach, not an amendment
    with httpx.Client(base_url=srv.url, headers=bearer(bob)) as c:
        assert c.post("/v1/jobs", json={"job_id": "b"}).status_code == 201
        assert c.post("/v1/jobs", json={"job_id": "b", "tags": {"n": "1"}}).status_code == 200


def test_17_6_reports_are_capped_per_tenant(db, servers):
    alice = _tenant(db, "alice")
    srv = servers(db, "--max-reports-per-tenant", "6")
    with httpx.Client(base_url=srv.url, headers=bearer(alice)) as c:
        for job in ("x", "y"):
            assert c.post("/v1/jobs", json={"job_id": job}).status_code == 201
        codes = [c.post(f"/v1/jobs/{job}/reports", json={"step": s}).status_code for job in ("x", "y")
                 for s in range(4)]
        assert codes == [200] * 6 + [429] * 2, codes
        assert c.post("/v1/jobs/x/reports", json={"step": 3}).status_code == 200  # a retry is still answered


def test_17_6_prune_deletes_old_finished_jobs_and_keeps_the_audit(db, servers, tmp_path):
    alice, bob = _tenant(db, "alice"), _tenant(db, "bob")
    srv = servers(db)
    with httpx.Client(base_url=srv.url) as c:
        for t, jobs in ((alice, ("done", "live")), (bob, ("bobs",))):
            for job in jobs:
                assert c.post("/v1/jobs", json={"job_id": job}, headers=bearer(t)).status_code == 201
                assert c.post(f"/v1/jobs/{job}/reports", json={"step": 1}, headers=bearer(t)).status_code == 200
        assert c.post("/v1/jobs/done/stop", json={"reason": "enough"}, headers=bearer(alice)).status_code == 200
        assert c.post("/v1/jobs/bobs/finish", headers=bearer(bob)).status_code == 200
    srv.kill()
    dry = json.loads(_cli("prune", "--db", db, "--older-than", "0", "--tenant", "alice", "--dry-run", "--json"))
    assert dry == {"dry_run": True, "jobs": 1, "reports": 1, "evals": 0, "deliveries": 0, "audit": 0}
    assert json.loads(_cli("prune", "--db", db, "--older-than", "1", "--json"))["jobs"] == 0  # nothing that old
    assert json.loads(_cli("prune", "--db", db, "--older-than", "0", "--tenant", "alice", "--json"))["jobs"] == 1
    srv = servers(db)
    with httpx.Client(base_url=srv.url, headers=bearer(alice)) as c:
        assert [j["job_id"] for j in c.get("/v1/jobs").json()] == ["live"]
        assert c.get("/v1/jobs/done").status_code == 404
        assert any(a["kind"] == "manual_stop" for a in c.get("/v1/audit?job_id=done").json())  # kept
    assert [j["job_id"] for j in httpx.get(f"{srv.url}/v1/jobs", headers=bearer(bob)).json()] == ["bobs"]


def test_25_4_retention_covers_the_audit_log_of_jobs_no_longer_stored(db, servers):
    """--audit-older-than deletes the old audit lines of pruned (and deleted) jobs in prune's own
    transaction; a live job's lines and other tenants' stay, and the log stays append-only to
    everyone else (a plain DELETE is still refused)."""
    alice, bob = _tenant(db, "alice"), _tenant(db, "bob")
    srv = servers(db)
    with httpx.Client(base_url=srv.url) as c:
        for t, job in ((alice, "done"), (alice, "live"), (alice, "gone"), (bob, "bobs")):
            assert c.post("/v1/jobs", json={"job_id": job, "tags": {"a": "1"}}, headers=bearer(t)).status_code == 201
            assert c.post("/v1/jobs", json={"job_id": job, "tags": {"a": "2"}}, headers=bearer(t)).status_code == 200
        for t, job in ((alice, "done"), (alice, "live"), (alice, "gone"), (bob, "bobs")):
            if job != "live":
                assert c.post(f"/v1/jobs/{job}/stop", json={"reason": "enough"}, headers=bearer(t)).status_code == 200
        assert c.post("/v1/jobs/gone/delete", json={"reason": "clean-up"}, headers=bearer(alice)).status_code == 200
        before = {job: len(c.get(f"/v1/audit?job_id={job}", headers=bearer(alice)).json()) for job in ("done", "live", "gone")}
    srv.kill()
    dry = json.loads(_cli("prune", "--db", db, "--older-than", "0", "--audit-older-than", "0", "--tenant", "alice",
                          "--dry-run", "--json"))
    assert (dry["jobs"], dry["audit"]) == (1, before["done"] + before["gone"]), (dry, before)
    done = json.loads(_cli("prune", "--db", db, "--older-than", "0", "--audit-older-than", "0", "--tenant", "alice",
                           "--json"))
    assert (done["jobs"], done["audit"]) == (dry["jobs"], dry["audit"])
    srv = servers(db)
    with httpx.Client(base_url=srv.url) as c:
        assert c.get("/v1/audit?job_id=done", headers=bearer(alice)).json() == []
        assert c.get("/v1/audit?job_id=gone", headers=bearer(alice)).json() == []
        assert len(c.get("/v1/audit?job_id=live", headers=bearer(alice)).json()) == before["live"]
        assert c.get("/v1/audit?job_id=bobs", headers=bearer(bob)).json()  # another tenant's: kept
    srv.kill()
    with pytest.raises(Exception, match="append-only"):
        _sql(db, [("DELETE FROM audit", [()])])


def _bench_startup():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_startup.py"
    spec = importlib.util.spec_from_file_location("bench_startup", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_17_6_start_up_does_not_replay_finished_jobs(tmp_path):
    bench = _bench_startup()
    db = tmp_path / "history.db"
    bench.seed(db, jobs=4000, reports_per_job=50)
    lazy, eager = bench.start_up(db), bench.start_up(db, eager=True)
    print(f"start-up over 4,000 finished jobs (200,000 reports): {lazy:.2f} s lazy, {eager:.2f} s replaying all")
    assert lazy * 3 < eager, (lazy, eager)


# ---------------------------------------------------------------- red-team pass: junk tokens from a shared address
def test_junk_tokens_from_a_shared_address_do_not_lock_out_a_valid_token(db, servers):
    """96 of 109 of bob's reports got 429 while junk tokens came from his address (one budget of failed
    authentications per address): junk is still refused (429 once the address's budget is spent, before any
    lookup), but a valid token, even one this server has never seen, is always served."""
    alice, bob = _tenant(db, "alice"), _tenant(db, "bob")
    srv = servers(db, "--unauth-rate-per-ip", "5", "--unauth-burst-per-ip", "10")
    stop, junk = threading.Event(), {}

    def flood(i: int) -> None:  # from 127.0.0.1, bob's address
        n = 0
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            while not stop.is_set():
                code = c.get("/v1/jobs", headers=bearer(f"es_junk{i}_{n}")).status_code
                junk[code] = junk.get(code, 0) + 1
                n += 1

    threads = [threading.Thread(target=flood, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)  # the address's budget is spent
        with httpx.Client(base_url=srv.url, headers=bearer(bob), timeout=10) as c:
            assert (r := c.post("/v1/jobs", json={"job_id": "b"})).status_code == 201, r.text  # its first request
            codes = [c.post("/v1/jobs/b/reports", json={"step": s, "train_loss": 1.0}).status_code for s in range(40)]
        with httpx.Client(base_url=srv.url, headers=bearer(alice), timeout=10) as c:
            assert c.get("/v1/jobs").status_code == 200
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert codes == [200] * 40, codes
    assert junk.get(429, 0) > 5 * junk.get(401, 0) and set(junk) <= {401, 429}, junk  # junk is still refused

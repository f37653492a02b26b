"""Round 4, item 2: the audit log cannot be grown without bound, on a real ``evalstop serve`` on
127.0.0.1, on SQLite and on PostgreSQL 15.

* The attack: register -> fail -> delete loops with 2,000-character reasons (each loop two audit
  lines of ~2 kB; job quotas never bind, a deleted job frees its slot). Now every audited write
  counts against the tenant's audit budget (``audit_rate`` lines and ``audit_bytes_rate`` bytes per
  second, token buckets): past it the write is a 429 with ``Retry-After`` (the client layer's
  :class:`QuotaExceededError`), nothing is written, and the tenant's lines in the store stay within
  the budget's burst plus its rate times the flood's length; another tenant is not refused.
* Retention: ``evalstop prune --audit-older-than`` reclaims the old lines of a job that is still
  stored (a job id kept alive), all but its newest line of each kind.
"""

from __future__ import annotations

import time

import httpx
import pytest

from evalstop_trl.cli.service import _open_store
from evalstop_trl.clients.http import EvalStopClient
from evalstop_trl.clients.transport import QuotaExceededError
from evalstop_trl.core.tenants import Tenants
from tests.proc_helpers import bearer
from tests.service.test_security_fairness import Serve, _cli, _tenant

pytestmark = pytest.mark.slow

REASON = "x" * 2000
#: the budget that binds: the rate (bytes per second after a burst) or the bytes stored
BUDGETS = {
    "rate": {"audit_bytes_burst": 40_000, "audit_bytes_rate": 2_000.0, "audit_burst": 1000, "audit_rate": 20.0},
    "stored": {"max_audit_bytes": 30_000},
}


@pytest.fixture
def serve(tmp_path):
    started: list[Serve] = []

    def start(db: str) -> Serve:
        started.append(Serve(db, tmp_path).start())
        return started[-1]

    yield start
    for s in started:
        s.kill()


def _set_quotas(db: str, tenant: str, overrides: dict) -> None:
    store = _open_store(db)
    try:
        Tenants(store).set_quotas(tenant, overrides)
    finally:
        store.close()


def _stored(db: str, tenant: str) -> tuple[int, int]:
    """The tenant's audit lines in the store and their bytes (text and evidence)."""
    store = _open_store(db)
    try:
        lines = store.audit(tenant)
    finally:
        store.close()
    return len(lines), sum(a.nbytes for a in lines)


@pytest.mark.parametrize("binding", sorted(BUDGETS))
def test_an_audit_flood_is_refused_past_the_budget_and_the_log_stays_bounded(db, serve, binding):
    alice, bob = _tenant(db, "alice"), _tenant(db, "bob")
    budget = BUDGETS[binding]
    _set_quotas(db, "alice", budget)
    srv = serve(db)
    refusals: list[httpx.Response] = []
    loops, job, action = 0, None, "fail"
    t0 = time.monotonic()
    with httpx.Client(base_url=srv.url, headers=bearer(alice), timeout=30) as c:
        while time.monotonic() - t0 < 6.0:  # register -> fail -> delete, as fast as the server answers
            if job is None:
                loops += 1
                job, action = f"flood-{loops}", "fail"
                assert c.post("/v1/jobs", json={"job_id": job}).status_code == 201
            r = c.post(f"/v1/jobs/{job}/{action}", json={"reason": REASON})
            if r.status_code == 429:  # refused: the same step again (no job piles up as active)
                refusals.append(r)
                continue
            assert r.status_code == 200, r.text
            job, action = (job, "delete") if action == "fail" else (None, "fail")
    elapsed = time.monotonic() - t0
    lines, size = _stored(db, "alice")
    assert refusals, f"{loops} loops of two 2 kB audit lines were never refused"
    first = refusals[0]
    if binding == "rate":
        assert "audit_bytes_rate=2000" in first.json()["detail"] and float(first.headers["retry-after"]) > 0
        # what got in: the burst, the rate over the flood, and one line over (a bucket takes a line
        # bigger than what is left while it is full); this flood wrote ~5 MB before (SQLite)
        bound = budget["audit_bytes_burst"] + budget["audit_bytes_rate"] * elapsed + 2500
    else:
        assert "max_audit_bytes=30000" in first.json()["detail"] and "evalstop prune" in first.json()["detail"]
        bound = budget["max_audit_bytes"]
    assert size <= bound, (lines, size, elapsed)
    client = EvalStopClient(srv.url, alice)  # the client layer's 429: QuotaExceededError with its wait
    try:
        with pytest.raises(QuotaExceededError, match="audit_rate" if binding == "rate" else "max_audit_bytes") as refused:
            for k in range(100):
                client.register_job(f"manual-{k}")
                client.stop(f"manual-{k}", REASON)
        assert binding == "stored" or refused.value.retry_after > 0
    finally:
        client.close()
    with httpx.Client(base_url=srv.url, headers=bearer(bob), timeout=30) as c:  # a budget per tenant
        assert c.post("/v1/jobs", json={"job_id": "b"}).status_code == 201
        assert c.post("/v1/jobs/b/fail", json={"reason": REASON}).status_code == 200


def test_prune_reclaims_the_old_audit_lines_of_a_job_kept_alive(db, serve):
    """A running job's launcher events pile up (each within the event quotas); prune with an audit
    retention deletes them but the newest of each kind, and the job itself stays."""
    alice = _tenant(db, "alice")
    srv = serve(db)
    with httpx.Client(base_url=srv.url, headers=bearer(alice), timeout=30) as c:
        assert c.post("/v1/jobs", json={"job_id": "live", "tags": {"a": "1"}}).status_code == 201
        assert c.post("/v1/jobs", json={"job_id": "live", "tags": {"a": "2"}}).status_code == 200  # amended
        for i in range(30):
            r = c.post("/v1/jobs/live/events", json={"kind": "launcher_exit", "reason": f"exit {i}", "exit_code": 1})
            assert r.status_code in (200, 201, 204), r.text
        before = c.get("/v1/audit?job_id=live&limit=1000").json()
    srv.kill()
    assert len(before) == 31
    out = _cli("prune", "--db", db, "--older-than", "100000", "--audit-older-than", "0", "--json")
    assert '"audit": 29' in out and '"jobs": 0' in out, out
    srv = serve(db)
    with httpx.Client(base_url=srv.url, headers=bearer(alice), timeout=30) as c:
        kept = c.get("/v1/audit?job_id=live&limit=1000").json()
        assert [(a["kind"], a["reason"]) for a in kept] == [(before[0]["kind"], before[0]["reason"]),
                                                            ("launcher_exit", "exit 29")]
        assert c.get("/v1/jobs/live").json()["status"] == "pending"

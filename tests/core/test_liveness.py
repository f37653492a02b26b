"""Liveness: a job silent past its lease becomes LOST, frees its quota and says when it was last seen;
a report or heartbeat brings it back (on every store, and across a restart)."""

from __future__ import annotations

import pytest

from evalstop_trl import Coordinator
from evalstop_trl.core.errors import InvalidInput, QuotaExceeded
from evalstop_trl.core.records import AuditKind, Quotas
from evalstop_trl.core.requests import HeartbeatRequest, JobRequest, ReasonRequest, ReportRequest
from tests.store_helpers import STORE_KINDS, open_store


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=STORE_KINDS)
def make(request, tmp_path):
    opened = []

    def factory(clock, **kwargs):
        store = open_store(request.param, tmp_path / "c.db", request) if not opened or request.param != "memory" \
            else opened[0]
        opened.append(store)
        return Coordinator(store, clock=clock, **kwargs)

    yield factory
    for store in opened:
        store.close()


def test_a_silent_job_is_lost_after_its_lease_and_frees_its_quota(make):
    clock = Clock()
    c = make(clock, lease_s=300, quotas=Quotas(max_active_jobs=1))
    c.register_job("acme", JobRequest("j", "grpo", 100))
    c.report("acme", "j", ReportRequest(10, eval_score=0.5))
    with pytest.raises(QuotaExceeded):
        c.register_job("acme", JobRequest("k", "grpo", 100))
    clock.t += 299
    assert c.sweep() == [] and c.status("acme", "j").status == "running"
    clock.t += 2
    assert c.sweep() == [("acme", "j")]
    assert c.status("acme", "j").status == "lost"
    (lost,) = [a for a in c.audit("acme", "j") if a.kind is AuditKind.LOST]
    assert "no report or heartbeat for 301 s (lease 300 s)" in lost.reason and lost.evidence["last_seen"] == 1000.0
    assert c.register_job("acme", JobRequest("k", "grpo", 100))[1]  # the lost job no longer counts
    assert c.sweep() == []  # marked once


def test_heartbeats_renew_the_lease_and_bring_a_lost_job_back(make):
    clock = Clock()
    c = make(clock, lease_s=300)
    c.register_job("acme", JobRequest("j", "grpo", 100))
    for _ in range(3):
        clock.t += 200
        c.heartbeat("acme", "j", HeartbeatRequest("launcher"))
        assert c.sweep() == []
    assert c.state("acme", "j").last_seen == clock.t
    clock.t += 301
    assert c.sweep() == [("acme", "j")]
    clock.t += 5
    assert c.heartbeat("acme", "j").status == "running"  # alive again
    c.report("acme", "j", ReportRequest(10, eval_score=0.4))
    clock.t += 400
    c.sweep()
    assert c.report("acme", "j", ReportRequest(20, eval_score=0.5)).action.value == "continue"  # a report brings it back too
    assert c.status("acme", "j").status == "running"
    kinds = [a.kind for a in c.audit("acme", "j")]
    assert kinds.count(AuditKind.LOST) == 2 and kinds.count(AuditKind.SEEN_AGAIN) == 2


def test_a_lost_job_is_stopped_as_any_other(make):
    clock = Clock()
    c = make(clock, lease_s=60)
    c.register_job("acme", JobRequest("j", "grpo", 100))
    for step, score in ((10, 0.5), (20, 0.4)):
        c.report("acme", "j", ReportRequest(step, eval_score=score))
    clock.t += 100
    assert c.sweep() == [("acme", "j")]
    assert c.report("acme", "j", ReportRequest(30, eval_score=0.3)).stop  # the second decline stops it, from LOST
    assert c.status("acme", "j").status == "stopped"


def test_lost_is_what_a_restart_rebuilds(make):
    clock = Clock()
    c = make(clock, lease_s=300)
    c.register_job("acme", JobRequest("gone", "grpo", 100))
    c.register_job("acme", JobRequest("alive", "grpo", 100))
    c.heartbeat("acme", "alive")
    clock.t += 1000  # both silent since: an embedded coordinator opening now marks them lost at once
    again = make(clock, lease_s=300)
    assert [again.status("acme", j).status for j in ("gone", "alive")] == ["lost", "lost"]
    assert again.sweep() == []
    third = make(clock)  # what the store says, without leases
    assert [third.status("acme", j).status for j in ("gone", "alive")] == ["lost", "lost"]
    assert third.state("acme", "alive").last_seen == 1000.0


def test_outage_grace_counts_silence_from_the_service_start(make):
    clock = Clock()
    c = make(clock)
    c.register_job("acme", JobRequest("j", "grpo", 100))
    clock.t += 5000  # the service was down for a long time: its clients could not report
    service = make(clock, lease_s=300, outage_grace=True)
    assert service.status("acme", "j").status == "pending"
    clock.t += 299
    assert service.sweep() == []
    clock.t += 2
    assert service.sweep() == [("acme", "j")]


@pytest.mark.parametrize("lease_s", [0, -1, True, "300", 10**9])
def test_the_lease_is_bounded(lease_s):
    with pytest.raises(InvalidInput, match="lease_s must be None or in"):
        Coordinator(lease_s=lease_s)


def test_reviving_lost_jobs_cannot_pass_the_active_job_quota(make):
    """The hardening issue's finding 5: with max_active_jobs 2, c1 and c2 lost, c3 and c4 registered,
    heartbeats (or reports) to c1 and c2 made 4 active jobs. Revival counts the tenant's active jobs
    (in the write's transaction on a shared store) and says what to do."""
    clock = Clock()
    c = make(clock, lease_s=300, quotas=Quotas(max_active_jobs=2))
    for job in ("c1", "c2"):
        c.register_job("acme", JobRequest(job, "grpo", 100))
    clock.t += 301
    assert sorted(c.sweep()) == [("acme", "c1"), ("acme", "c2")]
    for job in ("c3", "c4"):
        c.register_job("acme", JobRequest(job, "grpo", 100))
    with pytest.raises(QuotaExceeded, match=r"max_active_jobs=2\): lost job 'c1' cannot run again.*finish or stop"):
        c.heartbeat("acme", "c1")
    with pytest.raises(QuotaExceeded, match="lost job 'c2' cannot run again"):
        c.report("acme", "c2", ReportRequest(10, eval_score=0.5))
    assert [c.status("acme", j).status for j in ("c1", "c2", "c3", "c4")] == ["lost", "lost", "pending", "pending"]
    c.finish("acme", "c3")
    assert c.heartbeat("acme", "c1").status == "running"  # a slot is free again: it runs
    with pytest.raises(QuotaExceeded):
        c.heartbeat("acme", "c2")
    assert sum(v.status in ("pending", "running") for v in c.list_jobs("acme")) == 2


def test_two_replicas_reviving_at_once_pass_the_quota_once(pg_dsn):
    """Two coordinators over one PostgreSQL (replicas) revive two lost jobs at the same moment with
    one active slot free: exactly one runs again."""
    import threading

    from evalstop_trl.stores.postgres import PostgresStore

    clock = Clock()
    stores = [PostgresStore(pg_dsn), PostgresStore(pg_dsn)]
    a, b = (Coordinator(s, clock=clock, lease_s=300, quotas=Quotas(max_active_jobs=2)) for s in stores)
    for job in ("c1", "c2"):
        a.register_job("acme", JobRequest(job, "grpo", 100))
    clock.t += 301
    assert sorted(a.sweep()) == [("acme", "c1"), ("acme", "c2")]
    a.register_job("acme", JobRequest("c3", "grpo", 100))  # one active job of 2: one slot free
    outcomes = []
    barrier = threading.Barrier(2)

    def revive(coord, job):
        barrier.wait()
        try:
            outcomes.append(coord.heartbeat("acme", job).status)
        except QuotaExceeded:
            outcomes.append("refused")

    threads = [threading.Thread(target=revive, args=(coord, job)) for coord, job in ((a, "c1"), (b, "c2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused", "running"]
    assert stores[0].count_active("acme") == 2
    for s in stores:
        s.close()


def test_frequent_heartbeats_write_once_per_eighth_of_a_lease_and_answer_the_jobs_status(make):
    """A trainer beats every few seconds to learn a stop between evals (issue 27): a heartbeat within
    lease / 8 of the job's last sign of life writes nothing, and the lease still holds. The first heartbeat
    of a job registered before its first report makes it running (``evalstop status`` showed a training
    job as pending until its first eval)."""
    clock = Clock()
    c = make(clock, lease_s=80)  # fresh for 10 s
    c.register_job("acme", JobRequest("j", "grpo", 100))
    clock.t += 1
    assert c.heartbeat("acme", "j").status == "running"  # the first beat: the job's process runs (one write)
    version = c.state("acme", "j").version
    for _ in range(8):  # every second for 8 s more: nothing written
        clock.t += 1
        assert c.heartbeat("acme", "j").status == "running"
    assert c.state("acme", "j").version == version
    clock.t += 3  # 11 s since the first beat: one write
    c.heartbeat("acme", "j")
    assert c.state("acme", "j").version == version + 1 and c.status("acme", "j").last_seen == clock.t
    clock.t += 9
    c.heartbeat("acme", "j")  # not written: the job was seen 9 s ago
    clock.t += 79  # 88 s after the last write, 79 s after the last heartbeat: within the lease
    assert c.sweep() == [] and c.status("acme", "j").status == "running"
    c.stop("acme", "j", ReasonRequest("by hand"))
    assert c.heartbeat("acme", "j").status == "stopped"  # the answer says so at once

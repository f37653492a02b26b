"""Two coordinators (replicas) over one real PostgreSQL: a new report reads no version first.

The report's write names the version it replaces; when the other replica wrote the job since, the
store refuses it, the job is reloaded and the report decided again on what the store holds: every
report stored once, in order, and the decision the one a single process would give.
"""

from __future__ import annotations

import pytest

from evalstop_trl import Coordinator
from evalstop_trl.core.detectors import Action
from evalstop_trl.core.requests import JobRequest, ReasonRequest, ReportRequest

pytestmark = pytest.mark.slow

NEVER = {"detector": "never"}


@pytest.fixture
def pair(pg_dsn):
    from evalstop_trl.stores.postgres import PostgresStore

    stores = PostgresStore(pg_dsn), PostgresStore(pg_dsn)
    reads = []
    for name, store in zip("ab", stores, strict=True):
        real = store.job_versions

        def counted(tenant, job_ids, real=real, name=name):
            reads.append(name)
            return real(tenant, job_ids)

        store.job_versions = counted
    yield (*(Coordinator(s) for s in stores), reads)
    for s in stores:
        s.close()


def test_a_new_report_reads_no_version_and_a_stale_one_is_decided_again(pair):
    a, b, reads = pair
    a.register_job("t", JobRequest("j", "grpo", planned_steps=100, policy=NEVER))
    a.report("t", "j", ReportRequest(0, eval_score=0.1))
    a.report("t", "j", ReportRequest(1, eval_score=0.2))
    assert reads == []  # new steps on a job in memory: no version read
    b.report("t", "j", ReportRequest(2, eval_score=0.3))  # b loads the job (a store read), then writes: a's copy is stale
    reads.clear()
    reloads = []
    real = a.jobs.reload
    a.jobs.reload = lambda slot: (reloads.append(slot.head.last.step), real(slot))
    assert a.report("t", "j", ReportRequest(3, eval_score=0.4)).action is Action.CONTINUE  # refused once, reloaded, decided again
    assert reads == [] and reloads == [3]  # the refused write (step 3) reloaded a's copy, once
    assert [r.step for r in a.store.reports("t", "j")] == [0, 1, 2, 3]
    assert a.status("t", "j").n_reports == 4 and a.status("t", "j").last_step == 3
    reads.clear()
    version = a.store.job("t", "j").version
    a.report("t", "j", ReportRequest(3, eval_score=0.4))  # an identical retry: the version is read first, nothing written
    assert reads == ["a"] and a.store.job("t", "j").version == version


def test_a_report_on_a_job_stopped_through_the_other_replica(pair):
    a, b, _ = pair
    a.register_job("t", JobRequest("j", "grpo", planned_steps=100, policy=NEVER))
    a.report("t", "j", ReportRequest(0, eval_score=0.1))
    b.stop("t", "j", ReasonRequest("enough"))
    decision = a.report("t", "j", ReportRequest(1, eval_score=0.2))  # a still had the job running: refused, reloaded
    assert decision.action is Action.STOP and "manual stop" in decision.reason
    assert a.status("t", "j").status == "stopped"
    assert [r.step for r in b.store.reports("t", "j")] == [0, 1]


def test_a_report_on_a_job_deleted_through_the_other_replica(pair):
    from evalstop_trl.core.errors import NotFound

    a, b, _ = pair
    a.register_job("t", JobRequest("j", "grpo", planned_steps=100, policy=NEVER))
    a.report("t", "j", ReportRequest(0, eval_score=0.1))
    b.stop("t", "j", ReasonRequest("done"))
    b.delete_job("t", "j")
    with pytest.raises(NotFound):
        a.report("t", "j", ReportRequest(1, eval_score=0.2))
    assert a.store.reports("t", "j") == []

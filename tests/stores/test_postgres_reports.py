"""A replicated report on a real PostgreSQL: one versioned statement, a batch of them in one pipeline.

A stale report (another replica wrote the job since) is refused and inserts nothing; a batch of
reports is sent in one pipeline and every report of it is stored, its stale ones refused alone; a
report that fails (not refused: an error) fails alone, the batch applied again a write per savepoint.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest

from evalstop_trl.core.records import AuditKind, AuditRecord, JobRecord, JobType, Policy, Report
from evalstop_trl.core.store import StaleState, StoreError, wait_durable

pytestmark = pytest.mark.slow


@pytest.fixture
def store(pg_dsn):
    from evalstop_trl.stores.postgres import PostgresStore

    s = PostgresStore(pg_dsn)
    yield s
    s.close()


def _job(job_id: str) -> JobRecord:
    return JobRecord("a", job_id, JobType.GRPO, 100, Policy(), created_at=1.0, updated_at=1.0)


def _report(step: int) -> Report:
    return Report(step=step, eval_score=0.1 * step, train_loss=1.0 / (step + 1), checkpoint=f"ckpt-{step}",
                  received_at=float(step), planned_steps=100, eval_n=64, eval_noise=0.01)


@contextmanager
def one_batch(store):
    """Writes submitted inside the block reach the writer as one batch (it is held until the end),
    and ``pipelines`` counts the pipelines the store opened."""
    started, release = threading.Event(), threading.Event()

    def hold(db) -> None:
        started.set()
        release.wait(30)

    held = store._writes.submit(hold)
    started.wait(30)  # the writer holds a batch of its own: what follows queues behind it
    pipelines = []
    real = store._db.pipeline

    def counted():
        pipelines.append(1)
        return real()

    store._db.pipeline = counted
    try:
        yield pipelines
    finally:
        release.set()
        wait_durable(held)


def test_a_stale_versioned_report_is_refused_and_inserts_nothing(store):
    wait_durable(store.commit(_job("j"), expect=0))
    wait_durable(store.add_report("a", "j", _report(0), expect=1))
    with pytest.raises(StaleState, match="changed by another coordinator"):
        wait_durable(store.add_report("a", "j", _report(1), expect=1))  # another replica took version 1->2
    assert store.report("a", "j", 1) is None and store.job("a", "j").version == 2
    with pytest.raises(StaleState):  # a job that is not there (deleted through another replica)
        wait_durable(store.add_report("a", "gone", _report(0), expect=1))
    assert store.reports("a", "gone") == []
    wait_durable(store.add_report("a", "j", _report(1), expect=2))
    assert store.report("a", "j", 1) == _report(1) and store.job("a", "j").version == 3  # every field kept


def test_a_pipelined_batch_writes_everything(store):
    jobs = [f"j{i}" for i in range(20)]
    for job_id in jobs:
        wait_durable(store.commit(_job(job_id), expect=0))
    with one_batch(store) as pipelines:
        tickets = [store.add_report("a", job_id, _report(0), expect=1) for job_id in jobs]
        stale = store.add_report("a", "j0", _report(1), expect=1)  # j0 is at version 2 once the first lands
        audit = AuditRecord("a", "j1", 2.0, AuditKind.ACK, "x", "between")
        between = store.commit(_job("j1"), None, (audit,), expect=2)  # not a report: in a savepoint
        after = store.add_report("a", "j1", _report(1), expect=3)
    for ticket in [*tickets, between, after]:
        wait_durable(ticket)
    with pytest.raises(StaleState):
        wait_durable(stale)
    assert pipelines == [1, 1]  # the run of reports before the commit, and the report after it
    for job_id in jobs:
        assert store.reports("a", job_id) == ([_report(0), _report(1)] if job_id == "j1" else [_report(0)])
    assert store.job("a", "j0").version == 2 and store.job("a", "j1").version == 4
    assert [a.reason for a in store.audit("a", "j1")] == ["between"]


def test_a_failing_report_fails_alone(store):
    for job_id in ("x", "y"):
        wait_durable(store.commit(_job(job_id), expect=0))
    wait_durable(store.add_report("a", "x", _report(0), expect=1))
    with one_batch(store):
        before = store.add_report("a", "y", _report(0), expect=1)
        duplicate = store.add_report("a", "x", _report(0), expect=2)  # the step is stored: an error, not a refusal
        after = store.add_report("a", "y", _report(1), expect=2)
    wait_durable(before)
    wait_durable(after)
    with pytest.raises(StoreError, match="duplicate key") as refused:
        wait_durable(duplicate)
    assert not isinstance(refused.value, StaleState)
    assert store.job("a", "x").version == 2 and store.reports("a", "x") == [_report(0)]  # the update undone too
    assert store.job("a", "y").version == 3 and store.reports("a", "y") == [_report(0), _report(1)]
    wait_durable(store.add_report("a", "x", _report(1), expect=2))  # the writer's connection still works
    assert store.job("a", "x").version == 3

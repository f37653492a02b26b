"""The repository's common paths (evalstop_trl/core/repository.py): a registration of a new job on a
store of one process is one call of :meth:`JobCache.register`, with no retry set up, and answers,
writes and refuses exactly as the general path of a shared store does."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from evalstop_trl.core.coordinator import Coordinator
from evalstop_trl.core.errors import EvalStopError, QuotaExceeded
from evalstop_trl.core.memory_store import MemoryStore
from evalstop_trl.core.records import Quotas
from evalstop_trl.core.repository import JobCache, ReplicatedJobs
from evalstop_trl.core.requests import JobRequest, ReportRequest
from evalstop_trl.core.store import StoreError
from evalstop_trl.stores.sqlite import SQLiteStore


class Clock:
    """A clock the test moves (a shared store reads it more often, for its counts' time to live)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


QUOTAS = Quotas(max_jobs=4, max_active_jobs=3)

# (job_id, request fields) in order: new jobs, an identical retry, an amendment, a policy once
# reports were decided (a Conflict), bad input, then the quotas (active jobs, then all jobs)
SCRIPT = [
    ("a", {"job_type": "grpo", "planned_steps": 40}),
    ("b", {"job_type": "ppo", "policy": {"detector": "decline", "k": 2}, "tags": {"team": "x"}}),
    ("a", {"job_type": "grpo", "planned_steps": 40}),  # an identical retry: attached, nothing written
    ("a", {"planned_steps": 80, "hparams": {"lr": 0.1}}),  # an amendment: its audit line
    ("c", {}),
    ("d", {}),  # a fourth active job: max_active_jobs
    ("bad id!", {}),
    ("e", {"planned_steps": -1}),
]


def _outcomes(coord: Coordinator) -> list:
    """Every answer and error of :data:`SCRIPT`, with reports between, then what the store holds."""
    got = []

    def call(f, *args):
        coord.clock.t += 1.0  # every call at its own time
        try:
            got.append(f(*args))
        except EvalStopError as exc:
            got.append((type(exc).__name__, str(exc)))

    for job_id, fields in SCRIPT:
        call(coord.register_job, "t", JobRequest(job_id, **fields))
        if job_id == "b":
            for step, score in [(10, 0.5), (20, 0.4)]:
                call(coord.report, "t", "b", ReportRequest(step, eval_score=score))
            call(coord.register_job, "t", JobRequest("b", policy={"detector": "decline", "k": 3}))
    call(coord.stop, "t", "c")  # frees an active job: "d" registers, then a fifth job is over max_jobs
    call(coord.add_job, "t", JobRequest("d"))
    call(coord.add_job, "t", JobRequest("f"))
    for step, score in [(10, 0.2), (20, 0.5), (30, 0.45), (40, 0.4)]:
        call(coord.report, "t", "a", ReportRequest(step, eval_score=score))
    got.append([(j.tenant, j.job_id, j.job_type, j.planned_steps, j.policy, j.status, j.created_at, j.tags, j.hparams)
                for j in sorted(coord.store.jobs(), key=lambda j: j.job_id)])
    got.append([(a.job_id, a.kind, a.actor, a.reason, dict(a.evidence), a.at) for a in coord.audit("t")])
    return got


def test_a_new_job_on_a_store_of_one_process_is_one_repository_call(monkeypatch):
    coord = Coordinator(MemoryStore(), clock=Clock())
    assert type(coord.jobs) is JobCache
    calls = []
    register = coord.jobs.register
    monkeypatch.setattr(coord.jobs, "register", lambda *a: calls.append(a[1].job_id) or register(*a))

    def general(*args):
        raise AssertionError("a new job of a store of one process took the general path")

    monkeypatch.setattr(coord, "_register_once", general)
    monkeypatch.setattr(coord, "_retrying", general)  # no retry is set up where the store cannot conflict
    view, created = coord.register_job("t", JobRequest("j1", "grpo", planned_steps=10))
    assert created and view.status == "pending" and view.planned_steps == 10
    assert coord.add_job("t", JobRequest("j2")) is True
    assert calls == ["j1", "j2"]
    assert [j.job_id for j in coord.store.jobs()] == ["j1", "j2"]
    with pytest.raises(AssertionError, match="general path"):  # a job already there: the general path
        coord.register_job("t", JobRequest("j1"))


def test_a_shared_store_registers_through_the_general_path(tmp_path, monkeypatch):
    coord = Coordinator(SQLiteStore(tmp_path / "s.db", shared=True), clock=Clock())
    assert type(coord.jobs) is ReplicatedJobs
    retried = []
    retrying = coord._retrying
    monkeypatch.setattr(coord, "_retrying", lambda attempt: retried.append(1) or retrying(attempt))
    assert coord.register_job("t", JobRequest("j"))[1]
    assert retried == [1]
    coord.close()


@pytest.mark.parametrize("common", ["memory", "sqlite"])
def test_the_common_path_answers_writes_and_refuses_as_the_general_path(common, tmp_path):
    """The same registrations (new, retried, amended, conflicting, invalid, over each quota) give the
    same answers, errors and messages, decisions, stored jobs and audit lines on a store of one
    process (the common path) as on a shared store (the general path, with its retry)."""
    store = MemoryStore() if common == "memory" else SQLiteStore(tmp_path / "one.db")
    one = Coordinator(store, clock=Clock(), quotas=QUOTAS)
    shared = Coordinator(SQLiteStore(tmp_path / "shared.db", shared=True), clock=Clock(), quotas=QUOTAS)
    assert not one.jobs.shared and shared.jobs.shared
    got, want = _outcomes(one), _outcomes(shared)
    assert got == want
    errors = [g for g in got if isinstance(g, tuple) and len(g) == 2 and isinstance(g[0], str)]
    assert [e[0] for e in errors] == ["Conflict", "QuotaExceeded", "InvalidInput", "InvalidInput", "QuotaExceeded"]
    assert "max_active_jobs=3" in errors[1][1] and "max_jobs=4" in errors[4][1]
    one.close()
    shared.close()


def test_quota_errors_on_the_common_path_write_nothing():
    coord = Coordinator(MemoryStore(), clock=Clock(), quotas=Quotas(max_jobs=2, max_active_jobs=1))
    coord.register_job("t", JobRequest("a"))
    with pytest.raises(QuotaExceeded, match=r"tenant 't' has 1 active jobs, the most allowed \(max_active_jobs=1\)"):
        coord.register_job("t", JobRequest("b"))
    coord.finish("t", "a")
    coord.add_job("t", JobRequest("b"))
    coord.finish("t", "b")
    with pytest.raises(QuotaExceeded, match=r"tenant 't' has 2 jobs, the most allowed \(max_jobs=2,"):
        coord.add_job("t", JobRequest("c"))
    assert [j.job_id for j in coord.store.jobs()] == ["a", "b"]
    assert coord.jobs.total("t") == 2 and coord.jobs.active("t") == 0


def test_a_failed_insert_on_the_common_path_forgets_the_job():
    class Failing(MemoryStore):
        fail = True

        def register(self, job, limits):
            if self.fail:
                ticket = Future()
                ticket.set_exception(StoreError("disk full"))
                return ticket
            return super().register(job, limits)

    coord = Coordinator(Failing(), clock=Clock())
    with pytest.raises(StoreError, match="disk full"):
        coord.register_job("t", JobRequest("j"))
    assert coord.jobs.find("t", "j") is None and coord.jobs.active("t") == 0 and coord.list_jobs("t") == []
    coord.store.fail = False
    assert coord.register_job("t", JobRequest("j"))[1]  # registered anew, not attached to a lost insert

"""Memory equals disk: whatever commands come and whichever writes fail, the coordinator's answers
equal those of a coordinator rebuilt from the store (a restart), on every store.

Random command sequences (registrations that attach and amend, plans amended after reports included, reports in and out of order,
retries, stop, ack, finish, fail, launcher events, heartbeats, lease sweeps) run against a coordinator whose store refuses some writes (at once or a moment
later, as a full disk or a lost database connection would); after each command every job's view,
reports and audit must equal what a fresh coordinator over the same (unfailing) store answers.
The red-team repro (a policy whose detector cannot replay its history) leaves the store loadable.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import Future

import pytest

from evalstop_trl.core.coordinator import Coordinator
from evalstop_trl.core.errors import EvalStopError
from evalstop_trl.core.records import AuditKind, JobRecord, JobStatus, Policy, Registration, Report
from evalstop_trl.core.requests import AckRequest, JobRequest, ReasonRequest, ReportRequest
from evalstop_trl.core.store import StoreError
from tests.store_helpers import STORE_KINDS, open_store

JOBS = ("a", "b", "c")
POLICIES = ({"detector": "decline", "k": 2}, {"detector": "trend", "window": 3}, {"detector": "patience", "k": 2},
            {"detector": "cusum"}, {"detector": "decline", "k": 1, "mode": "shadow"},
            {"detector": "patience", "k": 2, "mode": "shadow"},
            {"detector": "stop_at", "fraction": 0.5})  # reads progress: a plan amended after reports (issue 25.6)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FlakyStore:
    """A store that refuses a share of its writes without applying them (at once, or a moment later)."""

    def __init__(self, inner, rng: random.Random, p_fail: float) -> None:
        self.inner, self.rng, self.p_fail = inner, rng, p_fail
        self.failures = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _maybe(self, write):
        if self.rng.random() >= self.p_fail:
            return write()
        self.failures += 1
        ticket: Future = Future()
        fail = lambda: ticket.set_exception(StoreError("injected: disk full"))  # noqa: E731
        if self.rng.random() < 0.5:
            fail()
        else:
            threading.Timer(0.001, fail).start()
        return ticket

    def commit(self, *args, **kwargs):
        return self._maybe(lambda: self.inner.commit(*args, **kwargs))

    def add_report(self, *args, **kwargs):
        return self._maybe(lambda: self.inner.add_report(*args, **kwargs))

    def revive(self, *args, **kwargs):  # a lost job running again: a write like any other
        return self._maybe(lambda: self.inner.revive(*args, **kwargs))

    def close(self):
        pass


def _random_command(coord: Coordinator, rng: random.Random, steps: dict[str, int]) -> None:
    job = rng.choice(JOBS)
    kind = rng.choices(["register", "report", "retry", "old", "stop", "ack", "finish", "fail", "event", "heartbeat",
                        "sweep"], [2, 12, 2, 1, 1, 1, 1, 1, 1, 1, 1])[0]
    coord.clock.t += rng.choice((1.0, 1.0, 50.0))  # sometimes past the lease
    if kind == "register":
        coord.register_job("acme", JobRequest(job, rng.choice((None, "grpo")), rng.choice((None, 100, 200, 400, 800)), rng.choice((None, *POLICIES))))
    elif kind == "heartbeat":
        coord.heartbeat("acme", job)
    elif kind == "sweep":
        coord.sweep()
    elif kind == "report":
        steps[job] = steps.get(job, 0) + rng.randint(1, 20)
        score = None if rng.random() < 0.15 else round(rng.gauss(0.5, 0.2), 3)
        coord.report("acme", job, ReportRequest(steps[job], eval_score=score, train_loss=round(rng.random(), 3), checkpoint=f"ckpt-{steps[job]}"))
    elif kind in ("retry", "old"):
        last = coord.state("acme", job).last
        if last is not None:
            step = last.step if kind == "retry" else max(0, last.step - rng.randint(1, 30))
            coord.report("acme", job, ReportRequest(step, last.eval_score, last.train_loss, last.proxy_reward, last.checkpoint))
    elif kind == "stop":
        coord.stop("acme", job, ReasonRequest("by hand"))
    elif kind == "ack":
        coord.ack("acme", job, AckRequest(f"best-{job}", steps.get(job)))
    elif kind == "finish":
        coord.finish("acme", job)
    elif kind == "fail":
        coord.fail("acme", job, ReasonRequest("crashed"))
    else:
        coord.append_event("acme", job, AuditKind.LAUNCHER_EXIT, "child exited", {"exit_code": 1}, "launcher")


def _snapshot(coord: Coordinator) -> dict:
    out = {}
    for view in coord.list_jobs("acme"):
        out[view.job_id] = (view, coord.reports("acme", view.job_id),
                            [(a.kind, a.reason) for a in coord.audit("acme", view.job_id)])
    return out


def _run(kind: str, tmp_path, request, seed: int, n_commands: int, check_every: int) -> int:
    rng = random.Random(seed)
    inner = open_store(kind, tmp_path / f"s{seed}.db", request)
    flaky = FlakyStore(inner, rng, p_fail=0.2)
    clock = Clock()
    coord = Coordinator(flaky, clock=clock, lease_s=40)
    steps: dict[str, int] = {}
    for i in range(n_commands):
        try:
            _random_command(coord, rng, steps)
        except (EvalStopError, StoreError):
            pass
        if (i + 1) % check_every == 0 or i == n_commands - 1:
            restarted = Coordinator(open_store(kind, tmp_path / f"s{seed}.db", request) if kind != "memory" else inner,
                                    clock=clock)
            assert _snapshot(coord) == _snapshot(restarted), f"seed {seed}, after command {i}"
            if kind != "memory":
                restarted.close()
    return flaky.failures


@pytest.mark.parametrize("seed", range(25))
def test_memory_equals_disk_in_memory(tmp_path, request, seed):
    assert _run("memory", tmp_path, request, seed, n_commands=60, check_every=1) > 0


@pytest.mark.parametrize("kind", [k for k in STORE_KINDS if k != "memory"])
@pytest.mark.parametrize("seed", range(3))
def test_memory_equals_disk_on_durable_stores(tmp_path, request, kind, seed):
    if kind == "postgres":
        request.getfixturevalue("pg_dsn")  # a fresh database per test
    assert _run(kind, tmp_path, request, 100 + seed, n_commands=60, check_every=10) > 0


def _plant_unreplayable(store) -> None:
    """What the red team left behind: a job whose policy today's bounds refuse (stored by an older
    evalstop) with the reports that made its detector divide by zero, beside a healthy job."""
    bad = Policy.from_dict({"detector": "trend", "window": 2, "noise_prior": 5e-324}, stored=True)
    for job_id, policy in (("evil", bad), ("fine", Policy())):
        record = JobRecord.new("mallory" if job_id == "evil" else "alice", Registration.parse(job_id), 1.0)
        record = record.evolve(policy=policy, status=JobStatus.RUNNING)
        store.commit(record, expect=0).result()
        for i, score in enumerate((0.0, 0.0, 0.0, 1.0, 2.0)):
            store.add_report(record.tenant, job_id, Report(i + 1, eval_score=score, received_at=1.0)).result()


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_a_job_that_cannot_be_replayed_is_marked_failed_and_the_rest_loads(tmp_path, request, kind):
    store = open_store(kind, tmp_path / "red.db", request)
    _plant_unreplayable(store)
    coord = Coordinator(store)
    view = coord.status("mallory", "evil")
    assert view.status == "failed" and view.n_reports == 5
    reasons = [a.reason for a in coord.audit("mallory", "evil") if a.kind is AuditKind.FAILED]
    assert len(reasons) == 1 and "cannot be replayed" in reasons[0] and "noise_prior" in reasons[0]
    assert coord.status("alice", "fine").status == "running"
    assert coord.report("alice", "fine", ReportRequest(6, eval_score=3.0)).action.value == "continue"
    if kind != "memory":  # a second start loads the same (and writes no second failure)
        coord.close()
        again = Coordinator(open_store(kind, tmp_path / "red.db", request))
        assert again.status("mallory", "evil").status == "failed"
        assert len([a for a in again.audit("mallory", "evil") if a.kind is AuditKind.FAILED]) == 1
        again.close()


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_a_plan_amended_after_reports_decides_the_same_after_a_restart(tmp_path, request, kind):
    """Issue 25 item 6: ``stop_at`` 0.5 over 1000 planned steps, reports at 10..60, then the plan
    amended to 100: a restart decided "stop: progress 0.50 at step 50" where the live job had continued.
    Each report keeps the plan it was decided under; the amendment changes the reports after it."""
    if kind == "postgres":
        request.getfixturevalue("pg_dsn")
    path = tmp_path / "plan.db"
    coord = Coordinator(open_store(kind, path, request), clock=Clock())
    coord.register_job("acme", JobRequest("p", "grpo", 1000, {"detector": "stop_at", "fraction": 0.5}))
    live = [coord.report("acme", "p", ReportRequest(s, eval_score=0.5)) for s in range(10, 70, 10)]
    coord.register_job("acme", JobRequest("p", "grpo", 100))  # the plan amended after its reports
    assert not any(d.stop for d in live)
    before = _snapshot(coord)
    restarted = Coordinator(open_store(kind, path, request) if kind != "memory" else coord.store, clock=Clock())
    assert _snapshot(restarted) == before and not restarted.status("acme", "p").decision.stop
    assert [r.planned_steps for r in restarted.reports("acme", "p")] == [1000] * 6
    if kind != "memory":
        restarted.close()
    # the next report is decided under the new plan (progress 0.7), and a restart says the same
    assert coord.report("acme", "p", ReportRequest(70, eval_score=0.5)).stop
    again = Coordinator(open_store(kind, path, request) if kind != "memory" else coord.store, clock=Clock())
    assert _snapshot(again) == _snapshot(coord) and again.reports("acme", "p")[-1].planned_steps == 100

"""Coordinator: tenancy, state machine, idempotency, conflicts, rebuild, thread safety."""

from __future__ import annotations

import threading

import pytest

from evalstop_trl import Action, Conflict, Coordinator, InvalidInput, MemoryStore, NotFound, Policy, SQLiteStore
from evalstop_trl.core.records import AuditKind, JobStatus
from evalstop_trl.core.requests import (
    AckRequest,
    ClaimRequest,
    EvalResult,
    EventRequest,
    HeartbeatRequest,
    JobRequest,
    ReasonRequest,
    ReportRequest,
    SnapshotRequest,
)
from tests.store_helpers import STORE_KINDS, open_store


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.fixture(params=STORE_KINDS)
def make(request, tmp_path):
    """Coordinators over each store; calling it again reopens the same database."""
    opened = []

    def factory():
        store = open_store(request.param, tmp_path / "c.db", request)
        opened.append(store)
        return Coordinator(store, clock=FakeClock())

    yield factory
    for store in opened:
        store.close()


# a rise, a small fall, then a decisive one: the default rule's run of k=2 declines is beyond the run's
# own eval-to-eval noise at step 40
HACKED = [(10, 0.2), (20, 0.5), (30, 0.45), (40, 0.2), (50, 0.3)]


def test_stop_after_two_declines_with_audit(make):
    c = make()
    c.register_job("a", JobRequest("j1", "grpo", planned_steps=50))
    actions = [c.report("a", "j1", ReportRequest(s, eval_score=v)).action for s, v in HACKED[:4]]
    assert actions == [Action.CONTINUE, Action.CONTINUE, Action.CONTINUE, Action.STOP]
    view = c.status("a", "j1")
    assert view.status == "stopped" and view.best_step == 20 and view.best_score == 0.5
    (rec,) = c.audit("a")
    assert rec.kind is AuditKind.STOP and rec.actor == "detector:decline"
    assert rec.reason.startswith("2 consecutive declines: 0.5 → 0.45 → 0.2 at step 40: falls of ")
    assert rec.evidence["best_step"] == 20 and rec.evidence["noise_units"] > rec.evidence["noise_z"] == 2.0


def test_reports_after_stop_are_recorded_but_never_unstop(make):
    c = make()
    c.register_job("a", JobRequest("j", "grpo"))
    for s, v in HACKED[:4]:
        c.report("a", "j", ReportRequest(s, eval_score=v))
    d = c.report("a", "j", ReportRequest(50, eval_score=0.99))
    assert d.action is Action.STOP
    assert c.status("a", "j").status == "stopped"
    assert [r.step for r in c.reports("a", "j")] == [10, 20, 30, 40, 50]
    assert c.finish("a", "j").status == "stopped"


def test_idempotent_reports_and_conflicts(make):
    c = make()
    c.register_job("a", JobRequest("j", "rlhf"))
    c.report("a", "j", ReportRequest(10, eval_score=0.5, train_loss=1.0))
    c.report("a", "j", ReportRequest(10, eval_score=0.5, train_loss=1.0))  # identical repeat: accepted once
    assert c.status("a", "j").n_reports == 1
    with pytest.raises(Conflict, match="step 10 of job 'j' already has a different report"):
        c.report("a", "j", ReportRequest(10, eval_score=0.6))
    c.report("a", "j", ReportRequest(20, eval_score=0.6))
    with pytest.raises(Conflict, match="step order"):
        c.report("a", "j", ReportRequest(15, eval_score=0.6))


@pytest.mark.parametrize("register", ["register_job", "add_job"])
def test_registration_idempotent_and_conflicting(make, register):
    c = make()
    created = lambda out: out[1] if isinstance(out, tuple) else out  # noqa: E731 - add_job returns created only
    reg = getattr(c, register)
    assert created(reg("a", JobRequest("j", "grpo", planned_steps=10, policy={"detector": "decline", "k": 2})))
    # same policy once defaults are filled in
    assert not created(reg("a", JobRequest("j", "grpo", planned_steps=10, policy={"detector": "decline"})))
    assert [a.kind for a in c.audit("a", "j")] == []  # attaching changes nothing
    with pytest.raises(Conflict, match="is a grpo job, not dpo"):
        reg("a", JobRequest("j", "dpo"))
    with pytest.raises(InvalidInput, match="planned_steps must be a positive integer"):
        reg("a", JobRequest("k", "grpo", planned_steps=0))
    view = c.status("a", "j")  # either way the job is the same registered job
    assert (view.status, view.planned_steps, view.policy["k"]) == ("pending", 10, 2)


@pytest.mark.parametrize(("first", "then", "expected", "audited"), [
    # the launcher registers what it knows; the callback fills in the rest
    ({}, {"job_type": "grpo", "planned_steps": 100}, ("grpo", 100, 2), "job_type rlhf -> grpo; planned_steps None -> 100"),
    # a rerun with another max_steps: an extended plan, audited
    ({"job_type": "grpo", "planned_steps": 100}, {"job_type": "grpo", "planned_steps": 300}, ("grpo", 300, 2),
     "planned_steps 100 -> 300"),
    # what a registration does not say, it keeps
    ({"job_type": "dpo", "planned_steps": 50, "policy": {"detector": "decline", "k": 3}}, {}, ("dpo", 50, 3), None),
    # a policy may change while no report was decided under the old one
    ({"policy": {"detector": "decline", "k": 3}}, {"policy": {"detector": "decline", "k": 4}}, ("rlhf", None, 4),
     "policy"),
])
def test_a_later_registration_attaches_and_amends(make, first, then, expected, audited):
    c = make()
    c.register_job("a", JobRequest("j", **first))
    view, created = c.register_job("a", JobRequest("j", **then))
    assert not created and (view.job_type, view.planned_steps, view.policy["k"]) == expected
    assert c.status("a", "j") == view
    amended = [a.reason for a in c.audit("a", "j") if a.kind is AuditKind.AMENDED]
    assert amended == ([] if audited is None else [amended[0]]) and (audited is None or audited in amended[0])


def test_a_policy_change_after_decided_reports_is_another_job(make):
    c = make()
    c.register_job("a", JobRequest("j", "grpo", policy={"detector": "decline", "k": 2}))
    c.report("a", "j", ReportRequest(10, eval_score=0.5))
    with pytest.raises(Conflict, match="1 reports decided under policy"):
        c.register_job("a", JobRequest("j", "grpo", policy={"detector": "decline", "k": 3}))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"job_type": "pretraining"}, "Unknown job_type 'pretraining'; valid job types are"),
        ({"planned_steps": 0}, "planned_steps must be a positive integer"),
        ({"policy": {"detector": "nope"}}, "valid detectors are"),
        ({"policy": {"detector": "decline", "k": 0}}, "k must be an integer in [1, 1000]"),
        ({"policy": {"detector": "decline", "grace_s": 5}}, "Unknown parameter(s) grace_s for detector 'decline'"),
        ({"policy": {"detector": "decline", "enforce": True}}, "Unknown parameter(s) enforce"),
        ({"policy": {"detector": "decline", "k": 10**6}}, "k must be an integer in [1, 1000]"),
        ({"policy": {"detector": "decline", "min_delta": 10**400}}, "min_delta must be a finite number"),
        ({"webhook": "ftp://x"}, "webhook must be an http(s) URL"),
        ({"webhook": "http://user:secret@example.com/hook"}, "must not carry credentials"),
    ],
)
def test_bad_registrations(make, kwargs, message):
    c = make()
    with pytest.raises(InvalidInput) as exc:
        c.register_job("a", JobRequest("j", **{"job_type": "rlhf", **kwargs}))
    assert message in str(exc.value)


@pytest.mark.parametrize("job_id", ["", "a b", "x" * 200, "../etc", None])
def test_bad_job_ids(make, job_id):
    with pytest.raises(InvalidInput, match="job_id must be"):
        make().register_job("a", JobRequest(job_id, "rlhf"))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_reports_rejected_and_not_stored(make, value):
    c = make()
    c.register_job("a", JobRequest("j", "rlhf"))
    with pytest.raises(InvalidInput, match="must be finite"):
        c.report("a", "j", ReportRequest(1, eval_score=value))
    assert c.status("a", "j").n_reports == 0


def test_tenants_are_isolated(make):
    c = make()
    c.register_job("alice", JobRequest("j", "grpo"))
    c.report("alice", "j", ReportRequest(1, eval_score=0.5))
    for op in (
        lambda: c.status("bob", "j"),
        lambda: c.report("bob", "j", ReportRequest(2, eval_score=0.1)),
        lambda: c.stop("bob", "j", ReasonRequest("mine now")),
        lambda: c.ack("bob", "j"),
        lambda: c.finish("bob", "j"),
        lambda: c.reports("bob", "j"),
    ):
        with pytest.raises(NotFound):
            op()
    assert c.list_jobs("bob") == [] and c.audit("bob") == []
    # bob may use the same job id for his own job
    c.register_job("bob", JobRequest("j", "dpo"))
    assert c.status("bob", "j").job_type == "dpo" and c.status("alice", "j").job_type == "grpo"


def test_state_machine_manual_stop_ack_finish(make):
    c = make()
    c.register_job("a", JobRequest("j", "grpo"))
    assert c.status("a", "j").status == "pending"
    with pytest.raises(Conflict, match="no stop to acknowledge"):
        c.ack("a", "j")
    c.report("a", "j", ReportRequest(1, eval_score=0.3))
    assert c.status("a", "j").status == "running"
    v = c.stop("a", "j", ReasonRequest("budget cut"))
    assert v.status == "stopped" and "manual stop by tenant:a: budget cut" in v.decision.reason
    assert c.stop("a", "j", ReasonRequest("again")).status == "stopped"  # idempotent
    assert c.ack("a", "j", AckRequest(checkpoint="/ckpt/best")).best_checkpoint == "/ckpt/best"
    assert [a.kind for a in c.audit("a")] == [AuditKind.MANUAL_STOP, AuditKind.ACK]
    c.register_job("a", JobRequest("k", "grpo"))
    assert c.finish("a", "k").status == "finished"
    with pytest.raises(Conflict, match="cannot become stopped"):
        c.stop("a", "k")
    assert JobStatus.FINISHED.terminal


def test_best_checkpoint_from_reports(make):
    c = make()
    c.register_job("a", JobRequest("j", "grpo"))
    c.report("a", "j", ReportRequest(10, eval_score=0.1, checkpoint="/c/10"))
    c.report("a", "j", ReportRequest(20, eval_score=0.9, checkpoint="/c/20"))
    c.report("a", "j", ReportRequest(30, eval_score=0.5, checkpoint="/c/30"))
    assert c.status("a", "j").best_checkpoint == "/c/20"


def test_reopen_gives_identical_statuses_and_decisions(tmp_path):
    path = tmp_path / "c.db"
    c1 = Coordinator(SQLiteStore(path), clock=FakeClock())
    c1.register_job("a", JobRequest("hacked", "grpo", planned_steps=50))
    c1.register_job("a", JobRequest("healthy", "grpo", planned_steps=50, policy=Policy("patience", {"k": 3})))
    c1.register_job("b", JobRequest("manual", "dpo"))
    for s, v in HACKED[:3]:
        c1.report("a", "hacked", ReportRequest(s, eval_score=v))
        c1.report("a", "healthy", ReportRequest(s, eval_score=v + s / 100))
    c1.report("b", "manual", ReportRequest(5, train_loss=1.0))
    c1.stop("b", "manual", ReasonRequest("by hand"))
    before = {(t, j.job_id): j for t in ("a", "b") for j in c1.list_jobs(t)}
    c1.close()

    c2 = Coordinator(SQLiteStore(path), clock=FakeClock())
    after = {(t, j.job_id): j for t in ("a", "b") for j in c2.list_jobs(t)}
    assert before == after
    # ... and the next report is decided exactly as an uninterrupted coordinator would
    reference = Coordinator(MemoryStore(), clock=FakeClock())
    reference.register_job("a", JobRequest("hacked", "grpo", planned_steps=50))
    for s, v in HACKED[:4]:
        expected = reference.report("a", "hacked", ReportRequest(s, eval_score=v))
    got = c2.report("a", "hacked", ReportRequest(*HACKED[3]))
    assert got.action is expected.action is Action.STOP
    assert (got.reason, got.best_step, got.best_score) == (expected.reason, expected.best_step, expected.best_score)


def test_thread_safety_many_writers(tmp_path):
    c = Coordinator(SQLiteStore(tmp_path / "c.db"))
    n_jobs, n_steps = 8, 25
    for j in range(n_jobs):
        c.register_job("a", JobRequest(f"j{j}", "grpo", policy={"detector": "never"}))
    errors = []

    def worker(j):
        try:
            for s in range(n_steps):
                c.report("a", f"j{j}", ReportRequest(s, eval_score=float(s)))
                c.report("a", f"j{j}", ReportRequest(s, eval_score=float(s)))  # duplicates interleaved
        except Exception as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(j,)) for j in range(n_jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for j in range(n_jobs):
        assert [r.step for r in c.store.reports("a", f"j{j}")] == list(range(n_steps))


def test_memory_per_job_is_bounded_reports_live_in_the_store():
    import tracemalloc

    from evalstop_trl.core.store import DONE

    class Forgetful(MemoryStore):  # keeps no reports, so only the coordinator's memory is measured
        def add_report(self, tenant, job_id, report, expect=None, created=None):
            return DONE

    c = Coordinator(Forgetful(), clock=FakeClock())
    c.register_job("a", JobRequest("j", "grpo"))
    for step in range(200):
        c.report("a", "j", ReportRequest(step, eval_score=0.5 + 0.001 * step))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for step in range(200, 20_200):
        c.report("a", "j", ReportRequest(step, eval_score=0.5 + 0.001 * (step % 7), train_loss=0.1, proxy_reward=1.0))
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 64 * 1024, f"the coordinator grew {grown} bytes over 20,000 reports of one job"
    assert c.status("a", "j").n_reports == 20_200


def test_external_evals_are_fed_in_step_order(make):
    c = make()
    c.register_job("a", JobRequest("x", "grpo", policy={"detector": "decline", "k": 2}))
    for step in (10, 20, 30, 40):
        c.publish_snapshot("a", "x", SnapshotRequest(step, f"/snap/{step}", train_loss=1.0 / step))
    c.publish_snapshot("a", "x", SnapshotRequest(10, "/snap/10"))  # the same snapshot again: a no-op
    with pytest.raises(Conflict, match="already has a snapshot"):
        c.publish_snapshot("a", "x", SnapshotRequest(10, "/elsewhere"))
    claimed = [c.claim_eval("a", ClaimRequest("w1", 60)), c.claim_eval("a", ClaimRequest("w2", 60))]
    assert [t.step for t in claimed] == [10, 20]
    # scores come back out of order: nothing is decided until the prefix is complete
    assert c.post_eval("a", "x", 20, EvalResult(0.7)).reason == "no eval yet" and c.status("a", "x").n_reports == 0
    assert c.post_eval("a", "x", 40, EvalResult(0.5)).action is Action.CONTINUE and c.status("a", "x").n_reports == 0
    c.post_eval("a", "x", 10, EvalResult(0.5))
    assert [r.step for r in c.reports("a", "x")] == [10, 20]  # 10 and 20 fed, 30 still out
    decision = c.post_eval("a", "x", 30, EvalResult(0.6, error=None))
    assert decision.stop and decision.best_step == 20  # 0.7 -> 0.6 -> 0.5: two declines, in step order
    assert [(r.step, r.checkpoint) for r in c.reports("a", "x")] == [(s, f"/snap/{s}") for s in (10, 20, 30, 40)]
    assert c.status("a", "x").best_checkpoint == "/snap/20"
    c.ack("a", "x", AckRequest("/snap/20", step=47))
    (ack,) = [e for e in c.audit("a", "x") if e.kind is AuditKind.ACK]
    assert ack.evidence["stop_lag"] == 7  # trained 7 steps after the eval that decided the stop


def test_an_expired_lease_goes_back_to_the_queue_and_a_gap_becomes_missing():
    clock = FakeClock()
    c = Coordinator(MemoryStore(), clock=clock, eval_gap_timeout_s=100)
    c.register_job("a", JobRequest("x", "grpo"))
    c.publish_snapshot("a", "x", SnapshotRequest(1, "/s/1"))
    c.publish_snapshot("a", "x", SnapshotRequest(2, "/s/2"))
    assert c.claim_eval("a", ClaimRequest("dies", 5)).step == 1
    assert c.claim_eval("a", ClaimRequest("other", 5)).step == 2  # 1 is leased
    clock.t += 10
    assert c.claim_eval("a", ClaimRequest("other", 5)).step == 1  # the first worker's lease ran out
    assert c.claim_eval("b", ClaimRequest("w", 5)) is None  # another tenant's queue is its own
    c.post_eval("a", "x", 2, EvalResult(0.5))
    assert c.status("a", "x").n_reports == 0  # waiting for step 1
    clock.t += 200  # step 1 never comes back: a missing eval
    c.post_eval("a", "x", 2, EvalResult(0.5))  # (an identical result again: idempotent, and the feed moves on)
    assert [(r.step, r.eval_score) for r in c.reports("a", "x")] == [(1, None), (2, 0.5)]


@pytest.mark.parametrize(("call", "field"), [
    (lambda c: c.stop("a", "j", ReasonRequest("a\x00b")), "reason"),
    (lambda c: c.fail("a", "j", ReasonRequest("bad\x00")), "reason"),
    (lambda c: c.heartbeat("a", "j", HeartbeatRequest("w\x00")), "actor"),
    (lambda c: c.claim_eval("a", ClaimRequest("w\x00", 60)), "worker"),
    (lambda c: c.post_eval("a", "j", 10, EvalResult(None, "w", "boom\x00")), "error"),
    (lambda c: c.report("a", "j", ReportRequest(10, eval_score=0.5, checkpoint="/ck\x00pt")), "checkpoint"),
])
def test_text_with_a_nul_is_refused_in_process_as_over_http(make, call, field):
    """PostgreSQL cannot store a NUL: the core refuses it for every client (422 over HTTP)."""
    c = make()
    c.register_job("a", JobRequest("j", "grpo"))
    with pytest.raises(InvalidInput, match=f"{field} must not contain control characters"):
        call(c)


def test_the_audit_budget_refuses_a_tenants_lines_never_the_coordinators_own():
    """Past ``audit_burst`` a failure, a stop, an ack, an event or a deletion is refused (429, nothing
    written, the job unchanged); a detector's stop still lands and is recorded; another tenant has
    its own budget; a line refused by another quota gives its tokens back."""
    from evalstop_trl.core.errors import QuotaExceeded
    from evalstop_trl.core.records import Quotas

    c = Coordinator(quotas=Quotas(audit_burst=3, audit_rate=0.001, max_events_per_job=1))
    for job in ("a", "b", "c", "d"):
        c.register_job("t", JobRequest(job))
    c.fail("t", "a", ReasonRequest("crashed"))
    c.record_event("t", "b", EventRequest("launcher_exit", "exit", 1))
    with pytest.raises(QuotaExceeded, match="max_events_per_job=1"):  # refused by the job's quota...
        c.record_event("t", "b", EventRequest("launcher_exit", "again", 1))
    c.stop("t", "c", ReasonRequest("by hand"))  # ...which gave its audit token back: this is the third line
    with pytest.raises(QuotaExceeded, match=r"audit_rate=0.001 lines/s, audit_burst=3") as refused:
        c.fail("t", "d", ReasonRequest("crashed"))
    assert refused.value.retry_after > 0 and c.status("t", "d").status == "pending"
    with pytest.raises(QuotaExceeded, match="audit_rate"):
        c.delete_job("t", "a", ReasonRequest("clean-up"))
    for step, score in [(10, 0.2), (20, 0.5), (30, 0.4), (40, 0.1)]:  # the detector's stop: always written
        decision = c.report("t", "d", ReportRequest(step, eval_score=score))
    assert decision.action is Action.STOP and c.status("t", "d").status == "stopped"
    assert [a.kind for a in c.audit("t")] == [AuditKind.FAILED, AuditKind.LAUNCHER_EXIT, AuditKind.MANUAL_STOP,
                                             AuditKind.STOP]
    c.register_job("u", JobRequest("e"))
    c.fail("u", "e", ReasonRequest("another tenant's budget"))


def test_a_tenants_stored_audit_bytes_are_capped_until_retention_reclaims_them(make):
    """``max_audit_bytes``: past it a line the tenant asks for is refused (the job unchanged), the
    coordinator's own still lands; another tenant is not refused; retention makes room again."""
    from evalstop_trl.core.errors import QuotaExceeded

    c = make()
    c.tenants.add("t")
    c.tenants.set_quotas("t", {"max_audit_bytes": 8192})
    reason = "x" * 2000
    for job in ("a", "b", "c", "d", "f"):
        c.register_job("t", JobRequest(job))
    for job in ("a", "b", "c"):  # about 2.1 kB each
        c.fail("t", job, ReasonRequest(reason))
    with pytest.raises(QuotaExceeded, match="max_audit_bytes=8192") as refused:
        c.fail("t", "d", ReasonRequest(reason))
    assert refused.value.retry_after is None and c.status("t", "d").status == "pending"
    for step, score in HACKED:  # the detector's stop: the coordinator's own line, always written
        c.report("t", "d", ReportRequest(step, eval_score=score))
    assert c.status("t", "d").status == "stopped" and c.audit("t")[-1].kind is AuditKind.STOP
    c.register_job("u", JobRequest("e"))
    c.fail("u", "e", ReasonRequest(reason))  # a cap per tenant
    assert c.store.count_audit_bytes("t") == sum(a.nbytes for a in c.audit("t")) > 8192 - 2500
    assert c.store.prune(1e18, "t", audit_before=1e18).audit == 4
    again = Coordinator(c.store, clock=FakeClock())  # a restart after the operator's retention
    again.fail("t", "f", ReasonRequest(reason))


def test_a_stop_says_how_the_proxy_moved_since_the_best_eval(make):
    """Issue 44: the proxy/world divergence as evidence. A job reporting its proxy reward gets, on a
    detector's stop, how the proxy moved since the best eval (rising while world feedback falls: the
    mark of a hack), in the reason, the evidence and the audit line; a job without one, nothing."""
    c = make()
    c.register_job("a", JobRequest("hacked", "grpo"))
    for step, (world, proxy) in enumerate([(0.5, 0.1), (0.7, 0.2), (0.6, 0.45), (0.5, 0.5)], start=1):
        decision = c.report("a", "hacked", ReportRequest(10 * step, world, proxy_reward=proxy))
    assert decision.stop and decision.evidence["proxy_since_best"] == pytest.approx(0.3)
    assert decision.reason.endswith("; proxy +0.3 since the best eval")
    (stop,) = [a for a in c.audit("a", "hacked") if a.kind is AuditKind.STOP]
    assert stop.evidence["proxy_since_best"] == pytest.approx(0.3) and stop.reason == decision.reason
    c.register_job("a", JobRequest("plain", "grpo"))
    for step, world in enumerate([0.5, 0.7, 0.6, 0.5], start=1):
        decision = c.report("a", "plain", ReportRequest(10 * step, world))
    assert decision.stop and "proxy_since_best" not in decision.evidence and "proxy" not in decision.reason

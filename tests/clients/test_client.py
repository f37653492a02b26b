"""EvalStopClient logic with httpx.MockTransport: fail-open, durable outbox, replay order, 4xx errors,
requests built from the route table, paging, typed results."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from evalstop_trl import Action, Coordinator, MemoryStore
from evalstop_trl.clients.api import EvalStopAPI
from evalstop_trl.clients.embedded import EmbeddedClient
from evalstop_trl.clients.http import ClientError, EvalStopClient
from evalstop_trl.core.codec import to_wire
from evalstop_trl.core.errors import InvalidInput
from evalstop_trl.core.records import AuditKind, AuditRecord, EvalState, EvalTask, JobView

JOB = to_wire(JobView("j", "grpo", "pending", {}, None, None, None, None, 0, None, None, False))


class FakeServer:
    """A MockTransport handler that can be switched off (connection refused) or answer 5xx."""

    def __init__(self) -> None:
        self.up = True
        self.fail_5xx = 0
        self.received: list[tuple[str, str, dict | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("refused", request=request)
        if self.fail_5xx:
            self.fail_5xx -= 1
            return httpx.Response(503, json={"detail": "busy"})
        body = json.loads(request.content) if request.content else None
        self.received.append((request.method, request.url.path, body))
        if request.headers["authorization"] != "Bearer good":
            return httpx.Response(401, json={"detail": "unknown token"})
        if request.url.path.endswith("/reports") and request.method == "POST":
            if body["step"] < 0:
                return httpx.Response(422, json={"detail": "step: must be >= 0"})
            return httpx.Response(200, json={"decision": {"action": "continue", "reason": "ok", "best_step": 1,
                                                          "best_score": 0.5}})
        return httpx.Response(201, json=JOB)


def make(fake, tmp_path=None, **kw):
    return EvalStopClient("http://coord.invalid", "good", outbox=tmp_path / "outbox.jsonl" if tmp_path else None,
                          transport=httpx.MockTransport(fake), backoff_s=0.001, probe_interval_s=0.05, **kw)


def test_reports_flow_and_decisions():
    fake = FakeServer()
    c = make(fake)
    assert c.register_job("j", "grpo", planned_steps=10).status == "pending"
    d = c.report("j", 1, eval_score=0.5)
    assert d.action is Action.CONTINUE and d.best_step == 1
    assert fake.received[-1] == ("POST", "/v1/jobs/j/reports", {"step": 1, "eval_score": 0.5})


def test_retries_5xx_then_succeeds():
    fake = FakeServer()
    fake.fail_5xx = 2
    c = make(fake, retries=2)
    assert c.report("j", 1, eval_score=0.5).reason == "ok"
    assert c.pending == 0 and not c.unreachable


def test_outage_is_fail_open_durable_and_replayed_in_order(tmp_path, caplog):
    fake = FakeServer()
    c = make(fake, tmp_path)
    c.register_job("j", "grpo")
    fake.up = False
    t0 = time.monotonic()
    for step in range(1, 6):
        d = c.report("j", step, eval_score=step / 10)
        assert d.action is Action.CONTINUE and "unreachable" in d.reason
    assert time.monotonic() - t0 < 1.0  # the loop is not blocked
    assert c.pending == 5 and c.unreachable
    lines = (tmp_path / "outbox.jsonl").read_text().splitlines()
    assert [json.loads(x)["body"]["step"] for x in lines] == [1, 2, 3, 4, 5]  # durable before returning
    assert sum("unreachable" in r.message for r in caplog.records) == 1  # told once
    # a new process picks the outbox up after a crash
    c2 = make(fake, tmp_path)
    assert c2.pending == 5
    fake.up = True
    time.sleep(0.06)
    c2.report("j", 6, eval_score=0.6)
    steps = [b["step"] for m, p, b in fake.received if p.endswith("/reports")]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert c2.pending == 0 and not (tmp_path / "outbox.jsonl").exists()


def test_contract_errors_raise_with_method_url_status_detail():
    fake = FakeServer()
    c = make(fake)
    with pytest.raises(ClientError) as exc:
        c.report("j", -1)
    msg = str(exc.value)
    assert "POST http://coord.invalid/v1/jobs/j/reports -> 422: step: must be >= 0" == msg
    bad = EvalStopClient("http://coord.invalid", "bad", transport=httpx.MockTransport(fake))
    with pytest.raises(ClientError, match="401: unknown token"):
        bad.register_job("j")


class QuotaServer(FakeServer):
    """Answers 429 (with ``Retry-After``) to registrations and reports while ``full``."""

    def __init__(self) -> None:
        super().__init__()
        self.full = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.full and self.up and request.method == "POST":
            self.received.append((request.method, request.url.path, None))
            return httpx.Response(429, json={"detail": "tenant 'acme' has 2 jobs, the most allowed (max_jobs=2)"},
                                  headers={"Retry-After": "3"})
        return super().__call__(request)


@pytest.mark.parametrize("call", [lambda c: c.register_job("j2", "grpo"), lambda c: c.report("j", 1, eval_score=0.5),
                                  lambda c: c.stop("j"), lambda c: c.record_event("j", "launcher_exit")],
                         ids=["register_job", "report", "stop", "record_event"])
def test_a_429_is_quota_exceeded_at_once_never_an_outage_and_never_queued(tmp_path, call, caplog):
    """The same refusal as the embedded client's: QuotaExceeded (retry_after from Retry-After), one
    request (no retry, no other replica), nothing in the outbox, no 'unreachable' in the log."""
    from evalstop_trl.core.errors import QuotaExceeded

    fake = QuotaServer()
    c = make(fake, tmp_path, retries=3)
    fake.full = True
    with pytest.raises(QuotaExceeded) as exc:
        call(c)
    assert exc.value.retry_after == 3.0 and exc.value.status_code == 429 and "max_jobs=2" in str(exc.value)
    assert len(fake.received) == 1 and c.pending == 0 and not c.unreachable
    assert not (tmp_path / "outbox.jsonl").exists()
    assert not any("unreachable" in r.message for r in caplog.records)


def test_a_429_during_replay_keeps_the_outbox_in_order(tmp_path):
    fake = QuotaServer()
    c = make(fake, tmp_path)
    fake.up = False
    for step in (1, 2):
        c.report("j", step, eval_score=0.5)
    assert c.pending == 2
    fake.up, fake.full = True, True
    time.sleep(0.06)
    from evalstop_trl.core.errors import QuotaExceeded

    with pytest.raises(QuotaExceeded):
        c.report("j", 3, eval_score=0.5)
    assert c.pending == 2  # not dropped: a quota can free up (a 4xx that cannot is dropped, logged)
    fake.full = False
    c.report("j", 3, eval_score=0.5)
    assert [b["step"] for m, p, b in fake.received if b and p.endswith("/reports")] == [1, 2, 3] and c.pending == 0


@pytest.mark.parametrize("url, token, message", [("coord:8765", "t", "url must start with http"),
                                                  ("http://x", "", "token is empty")])
def test_constructor_checks(url, token, message):
    with pytest.raises(ValueError, match=message):
        EvalStopClient(url, token)


def test_embedded_client_has_the_same_interface():
    emb = EmbeddedClient(Coordinator(MemoryStore()), tenant="me")
    assert isinstance(emb, EvalStopAPI)  # the signatures: tests/clients/test_contract.py
    emb.register_job("j", "grpo", planned_steps=40)
    for step, score in [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.5)]:
        d = emb.report("j", step, eval_score=score)
    assert d.stop and emb.status("j").status == "stopped"
    assert emb.ack("j", "/ckpt").acked and [a.kind for a in emb.audit()] == [AuditKind.STOP, AuditKind.ACK]


@pytest.mark.parametrize("field", ["eval_score", "train_loss", "proxy_reward"])
def test_a_non_finite_number_is_refused_before_it_reaches_the_outbox(tmp_path, field):
    fake = FakeServer()
    c = make(fake, tmp_path)
    with pytest.raises(InvalidInput, match=f"{field} must be a finite number"):
        c.report("j", 1, **{field: float("nan")})
    assert c.pending == 0 and fake.received == []  # neither sent nor queued: it would block the outbox
    assert c.report("j", 2, eval_score=0.5).reason == "ok"


def test_a_poisoned_outbox_line_is_dropped_not_retried_forever(tmp_path):
    (tmp_path / "outbox.jsonl").write_text(
        json.dumps({"op": "report", "job_id": "j", "path": "/v1/jobs/j/reports", "body": {"step": 1, "eval_score": float("nan")}})
        + "\n")
    fake = FakeServer()
    c = make(fake, tmp_path)
    assert c.pending == 0  # not strict JSON: quarantined when the outbox is opened, never sent
    assert c.report("j", 2, eval_score=0.5).reason == "ok" and c.pending == 0
    assert [b["step"] for _, p, b in fake.received if p.endswith("/reports")] == [2]
    [kept] = [json.loads(line) for line in (tmp_path / "outbox.jsonl.quarantine").read_text().splitlines()]
    assert kept["reason"] == "NaN is not strict JSON" and '"eval_score": NaN' in kept["line"]


def _answering(routes):
    """A MockTransport answering ``routes[(method, path)]`` (a callable of the request, or JSON)."""
    seen = []

    def handler(request):
        seen.append((request.method, request.url.path, dict(request.url.params),
                     json.loads(request.content) if request.content else None))
        answer = routes[(request.method, request.url.path)]
        answer = answer(request) if callable(answer) else answer
        return answer if isinstance(answer, httpx.Response) else httpx.Response(200, json=answer)

    return seen, EvalStopClient("http://coord.invalid", "good", transport=httpx.MockTransport(handler), retries=0)


def test_typed_results_of_the_eval_calls():
    task = EvalTask("me", "j", 10, "/snap/10", 1.0, state=EvalState.LEASED, lease_until=61.0, worker="w")
    audit = AuditRecord("me", "j", 2.0, AuditKind.LAUNCHER_EXIT, "launcher", "exited", {"exit_code": -15})
    seen, c = _answering({("POST", "/v1/evals/claim"): to_wire(task),
                          ("GET", "/v1/jobs/j/evals"): [to_wire(task)],
                          ("POST", "/v1/jobs/j/events"): httpx.Response(201, json={"status": "recorded"}),
                          ("GET", "/v1/audit"): [to_wire(audit)]})
    assert c.claim_eval("w", 60) == task and c.evals("j") == [task] and c.audit("j") == [audit]
    assert c.record_event("j", "launcher_exit", "exited", exit_code=-15) is None
    assert seen[0][3] == {"worker": "w", "lease_s": 60}
    assert seen[2][2] == {"job_id": "j", "limit": "1000", "offset": "0"}
    assert seen[3][3] == {"kind": "launcher_exit", "reason": "exited", "exit_code": -15}
    _, c = _answering({("POST", "/v1/evals/claim"): httpx.Response(204)})
    assert c.claim_eval("w") is None  # nothing to evaluate now


def test_listings_page_through_the_service_limit():
    def audit_page(request):
        offset = int(request.url.params["offset"])
        return [to_wire(AuditRecord("me", "j", float(i), AuditKind.ACK, "a", str(i)))
                for i in range(offset, min(offset + 1000, 1500))]

    def reports_page(request):
        after = int(request.url.params.get("after_step", -1))
        limit = int(request.url.params["limit"])
        return [{"step": s} for s in range(after + 1, min(after + 1 + limit, 2500))]

    seen, c = _answering({("GET", "/v1/audit"): audit_page, ("GET", "/v1/jobs/j/reports"): reports_page})
    assert [a.reason for a in c.audit()] == [str(i) for i in range(1500)]
    assert [s[2]["offset"] for s in seen] == ["0", "1000"]
    assert [r.step for r in c.reports("j")] == list(range(2500))
    assert [r.step for r in c.reports("j", after_step=9, limit=1200)] == list(range(10, 1210))
    assert seen[-1][2] == {"after_step": "1009", "limit": "200"}


def test_path_arguments_are_quoted():
    seen, c = _answering({("GET", "/v1/jobs/a:b@c/evals"): []})
    c.evals("a:b@c")
    assert seen[0][1] == "/v1/jobs/a:b@c/evals"  # sent as %3A / %40, read back by the server

"""EvalStopClient logic with httpx.MockTransport: fail-open, durable outbox, replay order, 4xx errors."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from evalstop_trl import Action, Coordinator, MemoryStore
from evalstop_trl.clients.embedded import EmbeddedClient
from evalstop_trl.clients.http import ClientError, EvalStopClient


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
        return httpx.Response(201, json={"job_id": "j", "job_type": "grpo", "status": "pending", "policy": {},
                                         "decision": None, "best_step": None, "best_score": None,
                                         "best_checkpoint": None, "n_reports": 0})


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


@pytest.mark.parametrize("url, token, message", [("coord:8765", "t", "url must start with http"),
                                                  ("http://x", "", "token is empty")])
def test_constructor_checks(url, token, message):
    with pytest.raises(ValueError, match=message):
        EvalStopClient(url, token)


def test_embedded_client_has_the_same_interface():
    emb = EmbeddedClient(Coordinator(MemoryStore()), tenant="me")
    public = {n for n in dir(EvalStopClient) if not n.startswith("_")} - {"outbox_path"}
    assert public <= set(dir(emb)) | {"pending", "unreachable"}
    emb.register_job("j", "grpo", planned_steps=40)
    for step, score in [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.5)]:
        d = emb.report("j", step, eval_score=score)
    assert d.stop and emb.status("j").status == "stopped"
    assert emb.ack("j", "/ckpt").acked and [a["kind"] for a in emb.audit()] == ["stop", "ack"]

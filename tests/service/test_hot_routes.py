"""Hot routes (``service/routes.py``: HotRoutes): the report and heartbeat rows answered before
FastAPI's router give exactly the answers the router gives, and a request they would refuse goes on
to the app, body and all."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from evalstop_trl import Coordinator, SQLiteStore
from evalstop_trl.core.records import Quotas
from evalstop_trl.core.requests import JobRequest
from evalstop_trl.service.app import ServiceSettings, create_app
from evalstop_trl.service.metrics import Metrics
from evalstop_trl.service.routes import HOT_ROUTES, QUERIES, Handlers, HotRoutes
from evalstop_trl.stores.memory import MemoryStore


def _client(tmp_path, name: str, hot: tuple[str, ...]):
    coord = Coordinator(SQLiteStore(tmp_path / f"{name}.db"), quotas=Quotas(max_reports_per_job=5))
    token = coord.tenants.add("alice")
    client = TestClient(create_app(coord, ServiceSettings(hot_routes=hot, run_webhooks=False)))
    client.h = {"Authorization": f"Bearer {token}"}
    return client


#: (method, path, raw body or None, content type or None): valid requests, and every kind of refusal
_SEQUENCE = [
    ("POST", "/v1/jobs", json.dumps({"job_id": "j", "job_type": "grpo", "planned_steps": 100}), "application/json"),
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": 10, "eval_score": 0.5, "train_loss": 1.0}), "application/json"),
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": 10, "eval_score": 0.5, "train_loss": 1.0}), "application/json"),
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": 10, "eval_score": 0.9}), "application/json"),  # 409
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": 5, "eval_score": 0.9}), "application/json"),  # 409
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": 20, "eval_score": 0.7}), "application/json; charset=utf-8"),
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": 30, "eval_score": 0.6}), None),
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": 31, "eval_score": 0.6}), "text/plain"),
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": "40"}), "application/json"),
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": 40, "extra": 1}), "application/json"),
    ("POST", "/v1/jobs/j/reports", json.dumps([1, 2]), "application/json"),
    ("POST", "/v1/jobs/j/reports", "null", "application/json"),
    ("POST", "/v1/jobs/j/reports", "{not json", "application/json"),
    ("POST", "/v1/jobs/j/reports", "", "application/json"),
    ("POST", "/v1/jobs/j/reports", "[" * 1000 + "]" * 1000, "application/json"),  # past the parser's depth: 400
    ("POST", "/v1/jobs/j/heartbeat", "[" * 1000 + "]" * 1000, "application/json"),
    ("POST", "/v1/jobs/j/reports", '{"step": 40, "eval_score": NaN}', "application/json"),
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": -1}), "application/json"),
    ("POST", "/v1/jobs/nobody/reports", json.dumps({"step": 1, "eval_score": 0.5}), "application/json"),  # 404
    ("POST", "/v1/jobs/j/heartbeat", json.dumps({}), "application/json"),
    ("POST", "/v1/jobs/j/heartbeat", json.dumps({"actor": 5}), "application/json"),
    ("POST", "/v1/jobs/nobody/heartbeat", json.dumps({}), "application/json"),
    ("POST", "/v1/jobs/j/heartbeat", None, None),
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": 40, "eval_score": 0.5}), "application/json"),  # stops
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": 50, "eval_score": 0.4}), "application/json"),
    ("POST", "/v1/jobs/j/reports", json.dumps({"step": 60, "eval_score": 0.4}), "application/json"),  # quota: 429
    ("POST", "/v1/jobs/j/reports/", json.dumps({"step": 70}), "application/json"),  # not the route's path
    ("PUT", "/v1/jobs/j/reports", json.dumps({"step": 70}), "application/json"),  # not the route's method
    ("GET", "/v1/jobs/j/reports", None, None),
]

_VOLATILE = ("created_at", "last_seen", "updated_at", "ended_at", "received_at")


def _comparable(value):
    """An answer's JSON without the wall-clock times two servers cannot share."""
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def test_hot_routes_answer_exactly_as_the_router(tmp_path):
    answers = {}
    for name, hot in (("hot", HOT_ROUTES), ("router", ())):
        with _client(tmp_path, name, hot) as client:
            rows = []
            for method, path, body, content_type in _SEQUENCE:
                headers = dict(client.h)
                if content_type is not None:
                    headers["Content-Type"] = content_type
                r = client.request(method, path, content=body, headers=headers)
                keep = {k: r.headers.get(k) for k in ("retry-after", "www-authenticate", "content-type")}
                rows.append((method, path, r.status_code, keep, _comparable(r.json()) if r.content else None))
            r = client.post("/v1/jobs/j/reports", json={"step": 70}, headers={"Authorization": "Bearer es_wrong"})
            rows.append(("bad token", r.status_code, r.json()))
            answers[name] = rows
    assert answers["hot"] == answers["router"]
    statuses = [row[2] for row in answers["hot"][:-1]]
    # the sequence meets every outcome it is meant to: answers, conflicts, refusals, not found, a quota
    assert {200, 201, 400, 404, 405, 409, 422, 429} <= set(statuses), statuses
    assert answers["hot"][-1][1] == 401


class _Downstream:
    """The app behind the hot routes: records what reaches it (and the body it got)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    async def __call__(self, scope, receive, send):
        message = await receive()
        self.calls.append((scope["path"], message.get("body", b"")))
        await send({"type": "http.response.start", "status": 599, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def _call(app, path: str, body: bytes, content_type: bytes | None = b"application/json", tenant: str | None = "t"):
    sent: list[dict] = []
    headers = [] if content_type is None else [(b"content-type", content_type)]
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers,
             "state": {} if tenant is None else {"tenant": tenant}}

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_a_well_formed_report_is_answered_here_anything_else_goes_on_with_its_body():
    coord = Coordinator(MemoryStore())
    coord.add_job("t", JobRequest("j"))
    down = _Downstream()
    app = HotRoutes(down, Handlers(coord, Metrics()))
    status, body = _call(app, "/v1/jobs/j/reports", b'{"step": 1, "eval_score": 0.5}')
    assert status == 200 and json.loads(body)["decision"]["action"] == "continue"
    assert down.calls == [] and coord.status("t", "j").n_reports == 1
    status, _ = _call(app, "/v1/jobs/j/heartbeat", b"{}")
    assert status == 200 and down.calls == []
    for body, content_type, tenant in ((b"{not json", b"application/json", "t"),
                                       (b"[" * 1000 + b"]" * 1000, b"application/json", "t"),
                                       (b'{"step": "1"}', b"application/json", "t"),
                                       (b'{"step": 2}', b"text/plain", "t"),
                                       (b'{"step": 2}', None, "t"),
                                       (b'{"step": 2}', b"application/json", None)):
        down.calls.clear()
        assert _call(app, "/v1/jobs/j/reports", body, content_type, tenant)[0] == 599
        assert down.calls == [("/v1/jobs/j/reports", body)]  # the app gets the request whole
    down.calls.clear()
    assert _call(app, "/v1/jobs/j/stop", b"{}")[0] == 599 and down.calls  # not a hot route
    assert coord.status("t", "j").n_reports == 1


def test_only_rows_with_a_body_and_no_query_can_be_hot():
    coord = Coordinator(MemoryStore())
    for name in HOT_ROUTES:
        assert name not in QUERIES
    with pytest.raises(ValueError, match="'list_jobs' cannot be hot"):
        HotRoutes(_Downstream(), Handlers(coord, Metrics()), names=("list_jobs",))
    with pytest.raises(KeyError):
        HotRoutes(_Downstream(), Handlers(coord, Metrics()), names=("no_such_route",))

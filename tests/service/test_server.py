"""HTTP API with the in-process TestClient: status codes, validation, tenancy, limits, metrics."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from evalstop_trl import Coordinator, SQLiteStore
from evalstop_trl.service.app import create_app


@pytest.fixture
def api(tmp_path):
    coord = Coordinator(SQLiteStore(tmp_path / "api.db"))
    tokens = {name: coord.tenants.add(name) for name in ("alice", "bob")}
    with TestClient(create_app(coord)) as tc:
        tc.tokens = tokens
        tc.h = {name: {"Authorization": f"Bearer {tok}"} for name, tok in tokens.items()}
        yield tc


def test_healthz_needs_no_auth(api):
    assert api.get("/healthz").json() == {"status": "ok"}


def test_register_report_stop_ack_finish(api):
    h = api.h["alice"]
    r = api.post("/v1/jobs", json={"job_id": "run-1", "job_type": "grpo", "planned_steps": 100}, headers=h)
    assert r.status_code == 201 and r.json()["status"] == "pending"
    assert api.post("/v1/jobs", json={"job_id": "run-1", "job_type": "grpo", "planned_steps": 100}, headers=h).status_code == 200
    assert api.post("/v1/jobs", json={"job_id": "run-1", "job_type": "dpo", "planned_steps": 99}, headers=h).status_code == 409
    actions = []
    for step, score in [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.5)]:
        r = api.post("/v1/jobs/run-1/reports", json={"step": step, "eval_score": score, "train_loss": 1.0}, headers=h)
        assert r.status_code == 200
        d = r.json()["decision"]
        assert set(d) == {"action", "reason", "best_step", "best_score", "evidence"}
        actions.append(d["action"])
        evidence = d["evidence"]
    assert actions == ["continue", "continue", "continue", "stop"]
    assert evidence["declines"] == 2 and evidence["steps"] == [20, 30, 40]  # the numbers the detector used
    job = api.get("/v1/jobs/run-1", headers=h).json()
    assert {"job_id", "job_type", "status", "policy", "decision", "best_step", "best_score", "best_checkpoint",
            "n_reports"} <= set(job)
    assert job["status"] == "stopped" and job["best_step"] == 20 and job["n_reports"] == 4
    assert [r["step"] for r in api.get("/v1/jobs/run-1/reports", headers=h).json()] == [10, 20, 30, 40]
    assert api.post("/v1/jobs/run-1/ack", json={"checkpoint": "/ckpt/20"}, headers=h).json()["best_checkpoint"] == "/ckpt/20"
    assert api.post("/v1/jobs/run-1/finish", headers=h).json()["status"] == "stopped"
    kinds = [a["kind"] for a in api.get("/v1/audit", headers=h).json()]
    assert kinds == ["stop", "ack"]
    # manual stop of a second job
    api.post("/v1/jobs", json={"job_id": "run-2"}, headers=h)
    r = api.post("/v1/jobs/run-2/stop", json={"reason": "budget"}, headers=h)
    assert r.json()["status"] == "stopped" and "budget" in r.json()["decision"]["reason"]
    assert [j["job_id"] for j in api.get("/v1/jobs", headers=h).json()] == ["run-1", "run-2"]


def test_idempotent_reports_and_conflict(api):
    h = api.h["alice"]
    api.post("/v1/jobs", json={"job_id": "j"}, headers=h)
    body = {"step": 5, "eval_score": 0.5}
    assert api.post("/v1/jobs/j/reports", json=body, headers=h).status_code == 200
    assert api.post("/v1/jobs/j/reports", json=body, headers=h).status_code == 200
    r = api.post("/v1/jobs/j/reports", json={"step": 5, "eval_score": 0.9}, headers=h)
    assert r.status_code == 409 and "already has a different report" in r.json()["detail"]
    assert api.get("/v1/jobs/j", headers=h).json()["n_reports"] == 1


@pytest.mark.parametrize(
    "path, body, raw, status, detail",
    [
        ("/v1/jobs/j/reports", {"step": -1}, None, 422, "step must be a non-negative integer"),
        ("/v1/jobs/j/reports", {"step": 1.5}, None, 422, "step: Input should be a valid integer"),
        ("/v1/jobs/j/reports", {"step": "3"}, None, 422, "step: Input should be a valid integer"),
        ("/v1/jobs/j/reports", {"step": 1, "eval_score": "high"}, None, 422, "eval_score: Input should be a valid number"),
        ("/v1/jobs/j/reports", None, '{"step": 1, "eval_score": NaN}', 422, "eval_score must be finite"),
        ("/v1/jobs/j/reports", None, '{"step": 1, "train_loss": Infinity}', 422, "train_loss must be finite"),
        ("/v1/jobs/j/reports", {"step": 1, "extra": 1}, None, 422, "extra: Extra inputs are not permitted"),
        ("/v1/jobs/j/reports", None, "{not json", 422, "body is not valid JSON"),
        ("/v1/jobs/j/reports", {}, None, 422, "step: Field required"),
        ("/v1/jobs", {"job_id": "x", "policy": {"detector": "nope"}}, None, 422, "valid detectors are"),
        ("/v1/jobs", {"job_id": "x", "policy": {"detector": "decline", "k": 0}}, None, 422, "k must be an integer in [1, 1000]"),
        ("/v1/jobs", {"job_id": "x", "policy": {"detector": "decline", "kk": 2}}, None, 422, "Unknown parameter(s) kk"),
        ("/v1/jobs", {"job_id": "x", "job_type": "pretrain"}, None, 422, "Unknown job_type"),
        ("/v1/jobs", {"job_id": "a b"}, None, 422, "job_id"),
        ("/v1/jobs", {"job_id": "x", "planned_steps": 0}, None, 422, "planned_steps"),
        ("/v1/jobs/nope/reports", {"step": 1}, None, 404, "no job 'nope'"),
    ],
)
def test_bad_input_is_4xx_with_detail(api, path, body, raw, status, detail):
    h = api.h["alice"]
    api.post("/v1/jobs", json={"job_id": "j"}, headers=h)
    if raw is not None:
        r = api.post(path, content=raw, headers={**h, "content-type": "application/json"})
    else:
        r = api.post(path, json=body, headers=h)
    assert r.status_code == status
    assert detail in r.json()["detail"]


def test_body_limit_413(api):
    h = {**api.h["alice"], "content-type": "application/json"}
    api.post("/v1/jobs", json={"job_id": "j"}, headers=api.h["alice"])
    big = b'{"step": 1, "checkpoint": "' + b"x" * (1024 * 1024) + b'"}'
    r = api.post("/v1/jobs/j/reports", content=big, headers=h)
    assert r.status_code == 413 and "1 MiB" in r.json()["detail"]

    def chunks():  # no content-length: streamed
        for _ in range(20):
            yield b"x" * 100_000

    assert api.post("/v1/jobs/j/reports", content=chunks(), headers=h).status_code == 413


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer nope", "Basic abc", "bearer x"])
def test_auth_401(api, header):
    headers = {"Authorization": header} if header else {}
    r = api.get("/v1/jobs", headers=headers)
    assert r.status_code == 401 and r.json()["detail"]


ENDPOINTS = [
    ("GET", "/v1/jobs/secret", None),
    ("POST", "/v1/jobs/secret/reports", {"step": 99, "eval_score": 0.0}),
    ("GET", "/v1/jobs/secret/reports", None),
    ("POST", "/v1/jobs/secret/stop", {"reason": "mine"}),
    ("POST", "/v1/jobs/secret/ack", {}),
    ("POST", "/v1/jobs/secret/finish", None),
]


@pytest.mark.parametrize("method, path, body", ENDPOINTS)
def test_cross_tenant_access_is_404_for_every_endpoint(api, method, path, body):
    api.post("/v1/jobs", json={"job_id": "secret"}, headers=api.h["alice"])
    api.post("/v1/jobs/secret/reports", json={"step": 1, "eval_score": 0.5}, headers=api.h["alice"])
    if path.endswith("ack"):  # a stopped job, so that an ack by its owner would be legal
        api.post("/v1/jobs/secret/stop", json={"reason": "x"}, headers=api.h["alice"])
    r = api.request(method, path, json=body, headers=api.h["bob"])
    assert r.status_code == 404 and "no job 'secret' for tenant 'bob'" in r.json()["detail"]
    assert api.get("/v1/jobs", headers=api.h["bob"]).json() == []
    assert api.get("/v1/audit", headers=api.h["bob"]).json() == []
    alice = api.get("/v1/jobs/secret", headers=api.h["alice"]).json()
    assert alice["n_reports"] == 1 and not alice["acked"]  # untouched by bob
    assert alice["status"] == ("stopped" if path.endswith("ack") else "running")


def test_revoked_token(api, tmp_path):
    api.app.state.coordinator.tenants.revoke("bob")
    r = api.get("/v1/jobs", headers=api.h["bob"])
    assert r.status_code == 401 and "revoked" in r.json()["detail"]


def test_metrics(api):
    h = api.h["alice"]
    api.post("/v1/jobs", json={"job_id": "j", "planned_steps": 100}, headers=h)
    for step, score in [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.5)]:
        api.post("/v1/jobs/j/reports", json={"step": step, "eval_score": score}, headers=h)
    api.post("/v1/jobs/j/ack", json={}, headers=h)
    text = api.get("/metrics").text
    assert "evalstop_reports_total 4.0" in text
    assert 'evalstop_stops_total{kind="detector:decline"} 1.0' in text
    assert "evalstop_acks_total 1.0" in text
    assert "evalstop_report_latency_seconds_count 4.0" in text
    assert "evalstop_gpu_seconds_reclaimed_total" in text


def test_openapi_is_served(api):
    spec = api.get("/openapi.json").json()
    assert "/v1/jobs/{job_id}/reports" in spec["paths"]


def test_readyz_is_503_when_the_store_cannot_write_or_a_worker_died(tmp_path):
    from evalstop_trl.core.store import StoreError

    coord = Coordinator(SQLiteStore(tmp_path / "r.db"))
    with TestClient(create_app(coord)) as tc:
        assert tc.get("/readyz").status_code == 200
        for worker in tc.app.state.workers:
            worker.close()  # a background worker that died
        r = tc.get("/readyz")
        assert r.status_code == 503 and "WebhookSender is not running" in r.json()["problems"][0]

    class Broken(SQLiteStore):
        def probe(self):
            raise StoreError("disk full")

    with TestClient(create_app(Coordinator(Broken(tmp_path / "b.db")))) as tc:
        r = tc.get("/readyz")
        assert r.status_code == 503 and "the store does not take writes" in r.json()["problems"][0]
        assert tc.get("/healthz").status_code == 200  # alive, but not ready

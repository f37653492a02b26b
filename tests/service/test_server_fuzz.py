"""Property-based fuzzing of the HTTP API from its own OpenAPI schema: no input gives a 5xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from evalstop_trl import Coordinator, MemoryStore
from evalstop_trl.core.requests import JobRequest
from evalstop_trl.service.app import ServiceSettings, create_app

coordinator = Coordinator(MemoryStore())
TOKEN = coordinator.tenants.add("fuzz")
coordinator.register_job("fuzz", JobRequest("a", "grpo", planned_steps=100))
app = create_app(coordinator, ServiceSettings(run_webhooks=False))
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.parametrize("auth", [True, False])
def test_no_5xx_for_any_generated_request(case, auth):
    headers = {"Authorization": f"Bearer {TOKEN}"} if auth else {}
    if case.query and "wait" in case.query:
        case.query["wait"] = 0  # the long poll is bounded (<= 60 s); fuzzing it must not sleep
    response = case.call(headers=headers)
    assert response.status_code < 500, (case.method, case.formatted_path, response.text)
    if response.status_code >= 400:
        assert isinstance(response.json().get("detail"), str) and response.json()["detail"]

"""The coordinator service: a FastAPI app over one :class:`Coordinator`.

Handlers are a few lines that call the core; one exception handler maps the
:mod:`evalstop_trl.core.errors` hierarchy to ``{"detail": ...}`` with its status code. Request
bodies are limited to 1 MiB (413). Every ``/v1`` route needs ``Authorization: Bearer <token>``.
Background workers (enforcement, webhooks) start in the app's lifespan and stop with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from ..core.coordinator import Coordinator
from ..core.detectors import Decision
from ..core.errors import EvalStopError, Unauthorized
from ..core.records import JobRecord
from ..core.store import StoreError
from .metrics import Metrics, reclaimed_seconds
from .middleware import BodyLimit
from .schemas import AckIn, FailIn, JobIn, ReportIn, ReportOut, StopIn, decision_dict, job_dict
from .workers import Enforcer, WebhookSender, Worker

__all__ = ["create_app", "MAX_BODY_BYTES"]

log = logging.getLogger("evalstop")
MAX_BODY_BYTES = 1024 * 1024


async def _tenant(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    # async on purpose: a token check is one indexed read, cheaper than a hop to the thread pool
    if not authorization or not authorization.startswith("Bearer "):
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    return request.app.state.coordinator.tenants.authenticate(authorization[len("Bearer "):].strip())


Tenant = Annotated[str, Depends(_tenant)]


def _workers(coordinator: Coordinator, metrics: Metrics, enforce: bool, webhooks: bool) -> list[Worker]:
    workers: list[Worker] = []
    if enforce:
        workers.append(Enforcer(coordinator, on_signal=lambda s: metrics.signals.labels(s).inc()))
    if webhooks:
        workers.append(WebhookSender(coordinator))
    return workers


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(EvalStopError)
    async def _evalstop_error(request: Request, exc: EvalStopError):
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError):
        log.error("store error: %s", exc)
        return JSONResponse({"detail": f"the coordinator could not store this: {exc}; retry later"}, status_code=503)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        parts = []
        for e in exc.errors():
            if e.get("type") == "json_invalid":
                parts.append(f"body is not valid JSON ({e.get('ctx', {}).get('error', 'decode error')})")
                continue
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
            msg = e.get("msg", "invalid").removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}")
        return JSONResponse({"detail": "; ".join(parts)}, status_code=422)


def create_app(coordinator: Coordinator, *, enforce: bool = True, webhooks: bool = True) -> FastAPI:
    """Build the service around ``coordinator``. Nothing starts until the app's lifespan begins
    (uvicorn, or ``with TestClient(app)``); the coordinator is closed when it ends."""
    metrics = Metrics()

    def on_stop(job: JobRecord, decision: Decision) -> None:
        kind = "manual" if decision.evidence.get("manual") else f"detector:{job.policy.detector}"
        metrics.stops.labels(kind).inc()
        metrics.reclaimed.inc(reclaimed_seconds(coordinator, job))
        log.info("STOP %s/%s (%s): %s", job.tenant, job.job_id, kind, decision.reason)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = 256  # many jobs report at once
        coordinator.add_stop_listener(on_stop)
        workers = app.state.workers = _workers(coordinator, metrics, enforce, webhooks)
        for w in workers:
            w.start()
        try:
            yield
        finally:
            for w in workers:
                w.close()
            coordinator.remove_stop_listener(on_stop)
            coordinator.close()

    app = FastAPI(title="EvalStop coordinator", version="1", lifespan=lifespan,
                  description="Stops reward-hacked RLHF jobs after consecutive declines of their world-feedback eval.")
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.state.coordinator = coordinator
    app.state.metrics = metrics
    app.state.workers = []
    _install_error_handlers(app)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/jobs", status_code=201)
    def register(body: JobIn, t: Tenant, response: Response) -> dict[str, Any]:
        view, created = coordinator.register_job(t, body.job_id, body.job_type, body.planned_steps, body.policy,
                                                 body.pid, body.pid_start_time, body.webhook)
        if not created:
            response.status_code = 200
        return job_dict(view)

    @app.get("/v1/jobs")
    def list_jobs(t: Tenant) -> list[dict[str, Any]]:
        return [job_dict(v) for v in coordinator.list_jobs(t)]

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str, t: Tenant) -> dict[str, Any]:
        return job_dict(coordinator.status(t, job_id))

    @app.post("/v1/jobs/{job_id}/reports", response_model=ReportOut)
    async def report(job_id: str, body: ReportIn, t: Tenant) -> JSONResponse:
        # The decision is in-memory work (microseconds); only durability waits, and it is awaited
        # rather than blocking a thread, so one group commit serves many concurrent reports.
        t0 = time.perf_counter()
        pending = coordinator.submit_report(t, job_id, body.step, body.eval_score, body.train_loss,
                                            body.proxy_reward, body.checkpoint)
        if not pending.ticket.done():
            try:
                await asyncio.wrap_future(pending.ticket)
            except StoreError:
                pass  # complete() reloads the job from the store (the source of truth) and re-raises
        coordinator.complete(pending)  # returns at once; re-raises a store error, runs stop listeners
        metrics.reports.inc()
        metrics.latency.observe(time.perf_counter() - t0)
        return JSONResponse({"decision": decision_dict(pending.decision)})  # skips re-validating our own output

    @app.get("/v1/jobs/{job_id}/reports")
    def list_reports(job_id: str, t: Tenant) -> list[dict[str, Any]]:
        return [r.to_dict() for r in coordinator.reports(t, job_id)]

    @app.post("/v1/jobs/{job_id}/stop")
    def stop(job_id: str, t: Tenant, body: StopIn | None = None) -> dict[str, Any]:
        return job_dict(coordinator.stop(t, job_id, (body or StopIn()).reason))

    @app.post("/v1/jobs/{job_id}/ack")
    def ack(job_id: str, t: Tenant, body: AckIn | None = None) -> dict[str, Any]:
        view = coordinator.ack(t, job_id, (body or AckIn()).checkpoint)
        metrics.acks.inc()
        return job_dict(view)

    @app.post("/v1/jobs/{job_id}/finish")
    def finish(job_id: str, t: Tenant) -> dict[str, Any]:
        return job_dict(coordinator.finish(t, job_id))

    @app.post("/v1/jobs/{job_id}/fail")
    def fail(job_id: str, t: Tenant, body: FailIn | None = None) -> dict[str, Any]:
        return job_dict(coordinator.fail(t, job_id, (body or FailIn()).reason))

    @app.get("/v1/audit")
    def audit(t: Tenant) -> list[dict[str, Any]]:
        return [a.to_dict() for a in coordinator.audit(t)]

    return app

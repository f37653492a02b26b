"""The coordinator service: a FastAPI app over one :class:`Coordinator`.

Handlers are a few lines that call the core; one exception handler maps the
:mod:`evalstop_trl.errors` hierarchy to ``{"detail": ...}`` with its status code. Request bodies
are limited to 1 MiB (413). Every ``/v1`` route needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from .actions import Enforcer, WebhookSender
from .coordinator import Coordinator, JobView
from .detectors import Decision
from .errors import EvalStopError, Unauthorized
from .models import JobRecord
from .store import StoreError

__all__ = ["create_app", "MAX_BODY_BYTES"]

log = logging.getLogger("evalstop")
MAX_BODY_BYTES = 1024 * 1024
_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$"


def _number(v: Any) -> Any:
    if v is None:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"must be a number, got {type(v).__name__}")
    if not math.isfinite(v):
        raise ValueError("must be finite (NaN and infinity are not allowed; send null for a missing value)")
    return v


def _integer(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"must be an integer, got {v!r}")
    return v


Num = Annotated[float | None, BeforeValidator(_number)]
Int = Annotated[int, BeforeValidator(_integer)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobIn(_In):
    job_id: str = Field(pattern=_ID_PATTERN, description="unique per tenant; letters, digits and _ . : @ -")
    job_type: str = Field("rlhf", max_length=32)
    planned_steps: Annotated[int | None, BeforeValidator(lambda v: v if v is None else _integer(v))] = Field(
        None, gt=0, le=2**53)
    policy: dict[str, Any] | None = Field(None, description='e.g. {"detector": "decline", "k": 2, "enforce": true, "grace_s": 30}')
    pid: Annotated[int | None, BeforeValidator(lambda v: v if v is None else _integer(v))] = Field(None, gt=1, le=2**31)
    pid_start_time: Num = None
    webhook: str | None = Field(None, max_length=2048)


class ReportIn(_In):
    step: Int = Field(ge=0, le=2**53)
    eval_score: Num = None
    train_loss: Num = None
    proxy_reward: Num = None
    checkpoint: str | None = Field(None, max_length=4096)


class DecisionOut(BaseModel):
    action: str = Field(description='"continue" or "stop"')
    reason: str
    best_step: int | None
    best_score: float | None


class ReportOut(BaseModel):
    decision: DecisionOut


class StopIn(_In):
    reason: str = Field("", max_length=2000)


class AckIn(_In):
    checkpoint: str | None = Field(None, max_length=4096)


def _decision(d: Decision | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {"action": d.action.value, "reason": d.reason, "best_step": d.best_step, "best_score": d.best_score}


def _job(v: JobView) -> dict[str, Any]:
    out = v.to_dict()
    out["decision"] = _decision(v.decision)
    return out


class _BodyLimit:
    """Pure ASGI middleware: 413 for bodies over ``limit`` bytes (declared or streamed)."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                return await self._reject(send)
        chunks, size, more = [], 0, True
        while more:  # buffer the body (at most `limit` bytes), then hand it on
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await self._reject(send)
            chunks.append(chunk)
            more = message.get("more_body", False)
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send):
        body = b'{"detail":"request body over the 1 MiB limit"}'
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.reports = Counter("evalstop_reports", "Reports accepted", registry=self.registry)
        self.stops = Counter("evalstop_stops", "Stops by kind", ["kind"], registry=self.registry)
        self.acks = Counter("evalstop_acks", "Stop acknowledgements", registry=self.registry)
        self.signals = Counter("evalstop_enforcement_signals", "Signals sent", ["signal"], registry=self.registry)
        self.latency = Histogram("evalstop_report_latency_seconds", "Report handling time (incl. fsync)",
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                                 registry=self.registry)
        self.reclaimed = Counter("evalstop_gpu_seconds_reclaimed",
                                 "Estimated job-seconds reclaimed by stops: remaining planned steps x observed "
                                 "seconds per step (per GPU)", registry=self.registry)


def _reclaimed_seconds(coord: Coordinator, job: JobRecord) -> float:
    if not job.planned_steps:
        return 0.0
    reps = coord.reports(job.tenant, job.job_id)
    if len(reps) < 2 or reps[-1].step <= reps[0].step:
        return 0.0
    per_step = (reps[-1].received_at - reps[0].received_at) / (reps[-1].step - reps[0].step)
    return max(0, job.planned_steps - reps[-1].step) * max(per_step, 0.0)


async def _tenant(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    # async on purpose: a token check is one indexed read, cheaper than a hop to the thread pool
    if not authorization or not authorization.startswith("Bearer "):
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    return request.app.state.coordinator.authenticate(authorization[len("Bearer "):].strip())


Tenant = Annotated[str, Depends(_tenant)]


def create_app(coordinator: Coordinator, *, enforce: bool = True, webhooks: bool = True) -> FastAPI:
    """Build the service around ``coordinator`` (closed when the app shuts down)."""
    metrics = _Metrics()

    def on_stop(job: JobRecord, decision: Decision) -> None:
        kind = "manual" if decision.evidence.get("manual") else f"detector:{job.policy.detector}"
        metrics.stops.labels(kind).inc()
        metrics.reclaimed.inc(_reclaimed_seconds(coordinator, job))
        log.info("STOP %s/%s (%s): %s", job.tenant, job.job_id, kind, decision.reason)

    coordinator.add_stop_listener(on_stop)
    enforcer = Enforcer(coordinator, on_signal=lambda s: metrics.signals.labels(s).inc()) if enforce else None
    if webhooks:
        WebhookSender(coordinator)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = 256  # many jobs report at once
        yield
        if enforcer:
            enforcer.close()
        coordinator.close()

    app = FastAPI(title="EvalStop coordinator", version="1", lifespan=lifespan,
                  description="Stops reward-hacked RLHF jobs after consecutive declines of their world-feedback eval.")
    app.add_middleware(_BodyLimit, limit=MAX_BODY_BYTES)
    app.state.coordinator = coordinator
    app.state.metrics = metrics

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
        return _job(view)

    @app.get("/v1/jobs")
    def list_jobs(t: Tenant) -> list[dict[str, Any]]:
        return [_job(v) for v in coordinator.list_jobs(t)]

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str, t: Tenant) -> dict[str, Any]:
        return _job(coordinator.status(t, job_id))

    @app.post("/v1/jobs/{job_id}/reports", response_model=ReportOut)
    async def report(job_id: str, body: ReportIn, t: Tenant) -> JSONResponse:
        # The decision is in-memory work (microseconds); only durability waits, and it is awaited
        # rather than blocking a thread, so one group commit serves many concurrent reports.
        t0 = time.perf_counter()
        pending = coordinator.submit_report(t, job_id, body.step, body.eval_score, body.train_loss,
                                            body.proxy_reward, body.checkpoint)
        if not pending.ticket.done:
            loop = asyncio.get_running_loop()
            durable = loop.create_future()
            pending.ticket.add_done_callback(lambda _: loop.call_soon_threadsafe(
                lambda: durable.done() or durable.set_result(None)))
            await durable
        coordinator.complete(pending)  # returns at once; re-raises a store error
        metrics.reports.inc()
        metrics.latency.observe(time.perf_counter() - t0)
        return JSONResponse({"decision": _decision(pending.decision)})  # skips re-validating our own output

    @app.get("/v1/jobs/{job_id}/reports")
    def list_reports(job_id: str, t: Tenant) -> list[dict[str, Any]]:
        return [r.to_dict() for r in coordinator.reports(t, job_id)]

    @app.post("/v1/jobs/{job_id}/stop")
    def stop(job_id: str, t: Tenant, body: StopIn | None = None) -> dict[str, Any]:
        return _job(coordinator.stop(t, job_id, (body or StopIn()).reason))

    @app.post("/v1/jobs/{job_id}/ack")
    def ack(job_id: str, t: Tenant, body: AckIn | None = None) -> dict[str, Any]:
        view = coordinator.ack(t, job_id, (body or AckIn()).checkpoint)
        metrics.acks.inc()
        return _job(view)

    @app.post("/v1/jobs/{job_id}/finish")
    def finish(job_id: str, t: Tenant) -> dict[str, Any]:
        return _job(coordinator.finish(t, job_id))

    @app.get("/v1/audit")
    def audit(t: Tenant) -> list[dict[str, Any]]:
        return [a.to_dict() for a in coordinator.audit(t)]

    return app

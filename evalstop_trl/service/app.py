"""The coordinator service: a FastAPI app over one :class:`Coordinator`.

Handlers are a few lines that call the core; one exception handler maps the
:mod:`evalstop_trl.core.errors` hierarchy to ``{"detail": ...}`` with its status code. Every
``/v1`` route needs ``Authorization: Bearer <token>``, checked by :class:`~.middleware.Guard` before
the body is read (which also limits bodies, their arrival time and each tenant's report rate).
Background workers (webhook deliveries) start in the app's lifespan and stop with it. The service
never signals a process: jobs whose loop ignores the stop flag run under ``evalstop run``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ..core.coordinator import Coordinator
from ..core.detectors import Decision
from ..core.errors import EvalStopError, InvalidInput, QuotaExceeded, Unauthorized
from ..core.records import AuditKind, JobRecord
from ..core.store import StoreError
from .dashboard import mount_dashboard
from .metrics import Metrics, reclaimed_seconds
from .middleware import Guard
from .schemas import (
    AckIn,
    ClaimIn,
    EvalResultIn,
    EventIn,
    FailIn,
    JobIn,
    ReportIn,
    ReportOut,
    SnapshotIn,
    StopIn,
    decision_dict,
    job_dict,
)
from .webhooks import WebhookPolicy, WebhookSender

__all__ = ["MAX_BODY_BYTES", "ServiceSettings", "create_app"]

log = logging.getLogger("evalstop")
MAX_BODY_BYTES = 1024 * 1024
MAX_PAGE = 1000
MAX_WAIT_S = 60.0


@dataclass(frozen=True)
class ServiceSettings:
    """What the operator sets for one ``evalstop serve`` (flags / ``EVALSTOP_*`` variables)."""

    webhooks: WebhookPolicy = WebhookPolicy()
    metrics_token: str | None = None  # if set, /metrics needs "Authorization: Bearer <it>"
    max_body_bytes: int = MAX_BODY_BYTES
    body_timeout_s: float = 10.0
    run_webhooks: bool = True


def _log_safe(text: str) -> str:
    """A tenant's text in a log line: control characters escaped, so no line can be forged."""
    return text.encode("unicode_escape", "backslashreplace").decode("ascii")[:500]


async def _tenant(request: Request) -> str:
    tenant = request.scope.get("state", {}).get("tenant")  # authenticated by the Guard, before the body
    if tenant is None:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    return tenant


Tenant = Annotated[str, Depends(_tenant)]


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(EvalStopError)
    async def _evalstop_error(request: Request, exc: EvalStopError):
        headers = None
        if isinstance(exc, Unauthorized):
            headers = {"WWW-Authenticate": "Bearer"}
        elif isinstance(exc, QuotaExceeded) and exc.retry_after is not None:
            headers = {"Retry-After": str(max(1, int(exc.retry_after + 0.999)))}
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError):
        log.error("store error: %s", exc)
        return JSONResponse({"detail": "the coordinator could not store this; retry later"}, status_code=503)

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


_LAUNCHER_KINDS = {k.value: k for k in AuditKind if k.from_launcher}


def create_app(coordinator: Coordinator, settings: ServiceSettings | None = None) -> FastAPI:
    """Build the service around ``coordinator``. Nothing starts until the app's lifespan begins
    (uvicorn, or ``with TestClient(app)``); the coordinator is closed when it ends."""
    settings = settings or ServiceSettings()
    metrics = Metrics()

    def on_stop(job: JobRecord, decision: Decision) -> None:
        kind = "manual" if decision.evidence.get("manual") else f"detector:{job.policy.detector}"
        metrics.stops.labels(kind).inc()
        metrics.reclaimed.inc(reclaimed_seconds(coordinator, job))
        log.info("STOP %s/%s (%s): %s", job.tenant, job.job_id, kind, _log_safe(decision.reason))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = 256  # many jobs report at once
        coordinator.add_stop_listener(on_stop)
        workers = app.state.workers = [WebhookSender(coordinator, settings.webhooks)] if settings.run_webhooks else []
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
    app.add_middleware(Guard, tenants=lambda: coordinator.tenants, limit=settings.max_body_bytes,
                       body_timeout_s=settings.body_timeout_s)
    app.state.coordinator = coordinator
    app.state.metrics = metrics
    app.state.workers = []
    _install_error_handlers(app)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """Alive (the process answers)."""
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        """Ready: the store takes writes and every background worker is alive (503 otherwise)."""
        problems = [f"worker {type(w).__name__} is not running" for w in app.state.workers if not w.alive]
        try:
            coordinator.store.probe()
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            problems.append(f"the store does not take writes ({type(exc).__name__})")
        if problems:
            return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    def prometheus(authorization: Annotated[str | None, Header()] = None) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if settings.metrics_token is not None:
            given = (authorization or "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), settings.metrics_token.encode()):
                raise Unauthorized("/metrics needs the operator's metrics token: 'Authorization: Bearer <token>'")
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/jobs", status_code=201)
    def register(body: JobIn, t: Tenant, response: Response) -> dict[str, Any]:
        view, created = coordinator.register_job(t, body.job_id, body.job_type, body.planned_steps, body.policy,
                                                 body.webhook)
        if not created:
            response.status_code = 200
        return job_dict(view)

    @app.get("/v1/jobs", response_model=list[dict[str, Any]])
    def list_jobs(t: Tenant, status: str | None = None, limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
                  offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> Response:
        """The caller's jobs in registration order, paged (``X-Total-Count`` has the total)."""
        views, total = coordinator.page_jobs(t, status, limit, offset)
        # serialised here, in the worker thread: FastAPI's encoder would run on the event loop
        return _json([job_dict(v) for v in views], {"X-Total-Count": str(total)})

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str, t: Tenant) -> dict[str, Any]:
        return job_dict(coordinator.status(t, job_id))

    @app.get("/v1/jobs/{job_id}/decision")
    async def wait_decision(job_id: str, t: Tenant, wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
                            stopped: bool = False) -> dict[str, Any]:
        """The job's status and decision. With ``wait``, a long poll: answers as soon as the job is no
        longer running (or, with ``stopped=true``, once it is stopped), or after ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            view = await run_in_threadpool(coordinator.status, t, job_id)
            if view.settled(stopped) or time.monotonic() >= deadline:
                return job_dict(view)
            await asyncio.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    @app.post("/v1/jobs/{job_id}/reports", response_model=ReportOut)
    async def report(job_id: str, body: ReportIn, t: Tenant) -> JSONResponse:
        # The decision is in-memory work (microseconds); only durability waits, and it is awaited
        # rather than blocking a thread, so one group commit serves many concurrent reports.
        t0 = time.perf_counter()
        args = (t, job_id, body.step, body.eval_score, body.train_loss, body.proxy_reward, body.checkpoint)
        if coordinator.store.shared:  # a shared store is read (the job's version) before deciding: not on the loop
            pending = await run_in_threadpool(coordinator.submit_report, *args)
        else:
            pending = coordinator.submit_report(*args)
        if not pending.ticket.done():
            try:
                await asyncio.wrap_future(pending.ticket)
            except StoreError:
                pass  # complete() reloads the job from the store (the source of truth) and re-raises
        coordinator.complete(pending)  # returns at once; re-raises a store error, runs stop listeners
        metrics.reports.inc()
        metrics.latency.observe(time.perf_counter() - t0)
        return JSONResponse({"decision": decision_dict(pending.decision)})  # skips re-validating our own output

    @app.get("/v1/jobs/{job_id}/reports", response_model=list[dict[str, Any]])
    def list_reports(job_id: str, t: Tenant, after_step: Annotated[int | None, Query(ge=-1, le=2**53)] = None,
                     limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE) -> Response:
        """Stored reports in step order, paged: those after ``after_step``, at most ``limit``."""
        return _json([r.to_dict() for r in coordinator.reports(t, job_id, after_step, limit)])

    @app.post("/v1/jobs/{job_id}/stop")
    def stop(job_id: str, t: Tenant, body: StopIn | None = None) -> dict[str, Any]:
        return job_dict(coordinator.stop(t, job_id, (body or StopIn()).reason))

    @app.post("/v1/jobs/{job_id}/ack")
    def ack(job_id: str, t: Tenant, body: AckIn | None = None) -> dict[str, Any]:
        body = body or AckIn()
        view = coordinator.ack(t, job_id, body.checkpoint, body.step)
        metrics.acks.inc()
        return job_dict(view)

    @app.post("/v1/jobs/{job_id}/finish")
    def finish(job_id: str, t: Tenant) -> dict[str, Any]:
        return job_dict(coordinator.finish(t, job_id))

    @app.post("/v1/jobs/{job_id}/fail")
    def fail(job_id: str, t: Tenant, body: FailIn | None = None) -> dict[str, Any]:
        return job_dict(coordinator.fail(t, job_id, (body or FailIn()).reason))

    @app.post("/v1/jobs/{job_id}/snapshots", status_code=201)
    def snapshot(job_id: str, body: SnapshotIn, t: Tenant) -> dict[str, Any]:
        """A snapshot for an external evaluator (``external_eval``): the path is only stored and handed
        to the tenant's own evaluators; the service never reads it."""
        task = coordinator.publish_snapshot(t, job_id, body.step, body.path, body.train_loss, body.proxy_reward)
        return _eval_dict(task)

    @app.get("/v1/jobs/{job_id}/evals", response_model=list[dict[str, Any]])
    def list_evals(job_id: str, t: Tenant) -> Response:
        return _json([_eval_dict(e) for e in coordinator.evals(t, job_id)])

    @app.post("/v1/evals/claim", responses={204: {"description": "nothing to evaluate now"}})
    def claim(body: ClaimIn, t: Tenant) -> Response:
        """Lease the caller's oldest snapshot waiting for an eval (204 if none)."""
        task = coordinator.claim_eval(t, body.worker, body.lease_s)
        return Response(status_code=204) if task is None else _json(_eval_dict(task))

    @app.post("/v1/jobs/{job_id}/evals/{step}")
    def post_eval(job_id: str, step: int, body: EvalResultIn, t: Tenant) -> dict[str, Any]:
        """An evaluator's score for a snapshot (or ``score: null`` with ``error``): fed in step order."""
        if step < 0 or step > 2**53:
            raise InvalidInput(f"step must be in [0, 2**53], but got {step}.")
        decision = coordinator.post_eval(t, job_id, step, body.score, body.worker, body.error)
        return {"decision": decision_dict(decision)}

    @app.post("/v1/jobs/{job_id}/events", status_code=201)
    def event(job_id: str, body: EventIn, t: Tenant) -> dict[str, str]:
        """Record what the job's launcher (``evalstop run``) did: an escalation or the child's exit."""
        kind = _LAUNCHER_KINDS.get(body.kind)
        if kind is None:
            raise InvalidInput(f"kind must be one of {', '.join(_LAUNCHER_KINDS)}, but got {body.kind!r}.")
        evidence = {} if body.exit_code is None else {"exit_code": body.exit_code}
        coordinator.record_event(t, job_id, kind, body.reason or kind.value, evidence, actor="launcher")
        if kind is not AuditKind.LAUNCHER_EXIT:
            metrics.signals.labels(kind.value.removeprefix("launcher_").upper()).inc()
        return {"status": "recorded"}

    @app.get("/v1/audit", response_model=list[dict[str, Any]])
    def audit(t: Tenant, job_id: str | None = None, limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
              offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> Response:
        """The caller's audit records, oldest first (of one job with ``job_id``), paged."""
        return _json([a.to_dict() for a in coordinator.audit(t, job_id, limit, offset)])

    mount_dashboard(app)
    return app


def _eval_dict(task) -> dict[str, Any]:
    return {"job_id": task.job_id, "step": task.step, "path": task.path, "state": task.state.value,
            "lease_until": task.lease_until, "worker": task.worker, "score": task.score, "fed": task.fed,
            "created_at": task.created_at}


def _json(data: Any, headers: dict[str, str] | None = None) -> Response:
    """JSON built in the handler's worker thread (FastAPI's encoder would run it on the event loop)."""
    return Response(json.dumps(data), media_type="application/json", headers=headers)



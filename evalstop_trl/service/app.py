"""The coordinator service: a FastAPI app over one :class:`Coordinator`.

The API's endpoints are mounted from the route table (:mod:`.routes`, one short handler per row of
:data:`~evalstop_trl.core.api.ROUTES`); one exception handler maps the
:mod:`evalstop_trl.core.errors` hierarchy to ``{"detail": ...}`` with its status code. Every
``/v1`` route needs ``Authorization: Bearer <token>``, checked by :class:`~.middleware.Guard` before
the body is read (which also limits bodies, their arrival time, each tenant's report rate and each
client address's unauthenticated requests). Background workers (webhook deliveries) start in the
app's lifespan and stop with it. The service never signals a process: jobs whose loop ignores the stop
flag run under ``evalstop run``.

Public routes: ``/healthz``, ``/readyz`` (the store's probe at most once per :data:`READY_PROBE_S`,
whatever the number of callers), ``/openapi.json`` and the dashboard. There is no ``/docs`` page (it
would load swagger-ui from a CDN on the dashboard's origin). ``/metrics`` needs the operator's metrics
token unless ``metrics_public``.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import FastAPI, Header
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ..core.coordinator import Coordinator
from ..core.detectors import Decision
from ..core.errors import EvalStopError, Unauthorized
from ..core.records import JobRecord
from ..core.store import StoreError
from .dashboard import mount_dashboard
from .liveness import LeaseSweeper
from .metrics import Metrics, reclaimed_seconds
from .middleware import Guard, PerAddress
from .routes import HOT_ROUTES, Handlers, HotRoutes, error_response, mount_routes, validation_response
from .webhooks import WebhookPolicy, WebhookSender

__all__ = ["MAX_BODY_BYTES", "READY_PROBE_S", "ServiceSettings", "StoreProbe", "create_app"]

log = logging.getLogger("evalstop")
MAX_BODY_BYTES = 1024 * 1024
READY_PROBE_S = 5.0


@dataclass(frozen=True)
class ServiceSettings:
    """What the operator sets for one ``evalstop serve`` (flags / ``EVALSTOP_*`` variables)."""

    webhooks: WebhookPolicy = WebhookPolicy()
    metrics_token: str | None = None  # if set, /metrics needs "Authorization: Bearer <it>"
    #: without a token, is /metrics readable by anyone? True for an app built in-process (tests,
    #: embedding); ``evalstop serve`` passes False unless the operator gives ``--metrics-public``
    metrics_public: bool = True
    max_body_bytes: int = MAX_BODY_BYTES
    body_timeout_s: float = 10.0  # for a whole request body, from its head
    per_address: PerAddress = PerAddress()  # unauthenticated requests per client address
    run_webhooks: bool = True
    #: routes answered before FastAPI's router (``routes.HotRoutes``); () sends every route through it
    hot_routes: tuple[str, ...] = HOT_ROUTES


class StoreProbe:
    """The store's readiness for ``/readyz``: ``store.probe()`` runs at most once every ``every_s``
    and never twice at once, whatever the number of callers (an unauthenticated flood of ``/readyz``
    costs the store nothing); callers in between get the last answer.

    Args:
        probe: raises if the store cannot take writes; every_s: how long an answer is reused.
    """

    def __init__(self, probe, every_s: float = READY_PROBE_S, clock=time.monotonic) -> None:
        self.probe, self.every_s, self.clock = probe, every_s, clock
        self._lock = threading.Lock()
        self._at: float | None = None  # when the last probe ended
        self._started: float | None = None  # when the probe in flight began
        self._problem: str | None = None

    def problem(self) -> str | None:
        """None when ready, else why not."""
        now = self.clock()
        with self._lock:
            if self._started is not None:  # another caller is probing: its last answer, or that it hangs
                if now - self._started > self.every_s:
                    return f"the store has not answered a probe for {now - self._started:.0f} s"
                return self._problem
            if self._at is not None and now - self._at < self.every_s:
                return self._problem
            self._started = now
        try:
            self.probe()
            problem = None
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            problem = f"the store does not take writes ({type(exc).__name__})"
        with self._lock:
            self._at, self._started, self._problem = self.clock(), None, problem
        return problem


def _log_safe(text: str) -> str:
    """A tenant's text in a log line: control characters escaped, so no line can be forged."""
    return text.encode("unicode_escape", "backslashreplace").decode("ascii")[:500]


def _install_error_handlers(app: FastAPI) -> None:
    async def _error(request, exc):  # a coroutine: Starlette runs a plain handler in the thread pool
        return error_response(exc)

    async def _validation_error(request, exc):
        return validation_response(exc)

    app.add_exception_handler(EvalStopError, _error)
    app.add_exception_handler(StoreError, _error)
    app.add_exception_handler(RequestValidationError, _validation_error)


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
        if coordinator.lease_s is not None:
            workers.append(LeaseSweeper(coordinator))
        for w in workers:
            w.start()
        try:
            yield
        finally:
            def shut_down() -> None:  # joins threads and flushes the store: not on the event loop
                for w in workers:
                    w.close()
                coordinator.remove_stop_listener(on_stop)
                coordinator.close()

            await run_in_threadpool(shut_down)

    app = FastAPI(title="EvalStop coordinator", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Stops reward-hacked RLHF jobs after consecutive declines of their world-feedback eval.")
    handlers = Handlers(coordinator, metrics)
    if settings.hot_routes:  # inside the Guard (added first): it answers authenticated requests only
        app.add_middleware(HotRoutes, handlers=handlers, names=settings.hot_routes)
    app.add_middleware(Guard, tenants=lambda: coordinator.tenants, limit=settings.max_body_bytes,
                       body_timeout_s=settings.body_timeout_s, per_address=settings.per_address)
    store_probe = StoreProbe(lambda: coordinator.store.probe())
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
        """Ready: the store takes writes (probed at most every few seconds) and every background worker
        is alive (503 otherwise)."""
        problems = [f"worker {type(w).__name__} is not running" for w in app.state.workers if not w.alive]
        store_problem = store_probe.problem()
        if store_problem is not None:
            problems.append(store_problem)
        if problems:
            return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    def prometheus(authorization: Annotated[str | None, Header()] = None) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if settings.metrics_token is not None:
            given = (authorization or "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), settings.metrics_token.encode()):
                raise Unauthorized("/metrics needs the operator's metrics token (evalstop serve --metrics-token): "
                                   "'Authorization: Bearer <token>'")
        elif not settings.metrics_public:
            raise Unauthorized("/metrics is not public: start evalstop serve with --metrics-token TOKEN and send "
                               "'Authorization: Bearer <token>' (or --metrics-public to publish it)")
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    mount_routes(app, handlers)
    mount_dashboard(app)
    return app

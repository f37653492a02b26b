"""The service's side of the route table: one short handler per API route, mounted from the table.

:data:`~evalstop_trl.core.api.ROUTES` says, per method of the API, the HTTP method, the path, which
arguments travel where and the result's codec; the HTTP client is derived from it. Here each route
gets its request schema (:data:`SCHEMAS`) and its handler (the :class:`Handlers` method of the same
name, a few lines calling the :class:`~evalstop_trl.core.coordinator.Coordinator`), and
:func:`mount_routes` registers them all on the FastAPI app.

Hot routes: :data:`HOT_ROUTES` (what a training loop sends every few seconds) are answered by
:class:`HotRoutes` before FastAPI's router, from the same row, body model and handler: FastAPI's
routing, dependency solving and body parsing were half of a report's server CPU
(``scripts/load_test.py``). A request the body model refuses goes the ordinary way, so its error is
FastAPI's, word for word.

Nothing that touches the store runs on the event loop: a plain handler runs in the thread pool
(its answer is encoded there too); the two coroutine handlers (``report``, whose durable write is
awaited, and the ``wait_decision`` long poll) hand every coordinator call to the thread pool.

Fair sharing: the expensive reads (listing jobs, reports, evals, the audit log) take one of
:data:`READS_PER_TENANT` slots of their tenant, and claims and posted evals one of
:data:`EVAL_CALLS_PER_TENANT`; beyond them a request gets 429 at once (``Retry-After: 1``), so one
tenant's flood holds at most that many threads and store connections. Launcher events, snapshots
and registration amendments are rate limited per tenant by the coordinator (the
``event_rate``/``event_burst`` quota), for either client alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import threading
import time
import typing
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any, NamedTuple

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, create_model
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse
from starlette.routing import compile_path
from starlette.types import Receive, Scope, Send

from ..core.api import EVALS_PAGE, ROUTES, Route
from ..core.coordinator import Coordinator, WouldBlock
from ..core.detectors import Decision
from ..core.errors import EvalStopError, QuotaExceeded, Unauthorized
from ..core.export import export_format
from ..core.records import MAX_STEP, AuditKind, JobView
from ..core.requests import (
    AckRequest,
    ClaimRequest,
    EvalResult,
    EventRequest,
    JobRequest,
    ReportRequest,
    SnapshotRequest,
)
from ..core.store import StoreError
from .metrics import Metrics
from .runs import ExportQuery, RunsExportQuery, RunsQuery, Stream, StreamAnswer, job_query
from .schemas import AuditQuery, JobsQuery, ReportsQuery, WaitQuery

__all__ = ["EVAL_CALLS_PER_TENANT", "HOT_ROUTES", "QUERIES", "READS_PER_TENANT", "Answer", "Handlers", "HotRoutes",
           "TenantGate", "body_model", "error_response", "validation_response",
           "mount_routes"]

READS_PER_TENANT = 2  # expensive reads of one tenant served at once
EVAL_CALLS_PER_TENANT = 4  # claims and posted evals of one tenant served at once


class EvalsQuery(BaseModel):
    after_step: int | None = Field(None, ge=-1, le=MAX_STEP, description="only snapshots after this step")
    limit: int = Field(EVALS_PAGE, ge=1, le=EVALS_PAGE, description="at most this many: a page (the next one: "
                       "after_step = the last step of this one)")


class AuditPageQuery(AuditQuery):
    after: int | None = Field(None, ge=0, le=2**62, description="keyset paging: the X-Next-After of the previous "
                              "page (cheaper than offset)")


class TenantGate:
    """At most ``n`` concurrent calls per tenant; beyond them :class:`QuotaExceeded` (429) at once."""

    def __init__(self, n: int, what: str) -> None:
        self.n, self.what = n, what
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, tenant: str) -> Iterator[None]:
        with self._lock:
            held = self._held.get(tenant, 0)
            if held >= self.n:
                raise QuotaExceeded(f"tenant {tenant!r} already has {held} {self.what} in progress, the most "
                                    "served at once; retry when one is done", retry_after=1.0)
            self._held[tenant] = held + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._held[tenant] - 1
                if left:
                    self._held[tenant] = left
                else:
                    del self._held[tenant]


class Answer(NamedTuple):
    """A handler's result with a status or headers of its own (else: the route's status), and the
    tenant's read slot it holds until it is sent (``close`` releases it)."""

    value: Any
    status: int | None = None
    headers: Mapping[str, str] | None = None
    close: Callable[[], None] | None = None


#: the query-string model of each route that reads one (its fields include the route's ``query``)
QUERIES: Mapping[str, type[BaseModel]] = {
    "list_jobs": JobsQuery,
    "wait_decision": WaitQuery,
    "reports": ReportsQuery,
    "evals": EvalsQuery,
    "audit": AuditPageQuery,
    "browse_jobs": RunsQuery,
    "export_jobs": RunsExportQuery,
    "export_reports": ExportQuery,
}
_PATH_TYPES = {"step": int}  # a path argument that is not text (its bounds: the coordinator's)


@functools.cache
def body_model(record: type) -> type[BaseModel]:
    """The pydantic model of a request record's JSON body: its fields with their types and defaults,
    no other key. Pydantic parses the types only (strictly: no "1" for 1, no true for 1); the values
    are the coordinator's to check, one validation for every client."""
    hints = typing.get_type_hints(record)
    defs: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        default = ... if f.default is dataclasses.MISSING else f.default
        defs[f.name] = (hints[f.name], Field(default, description=f.metadata.get("doc")))
    return create_model(record.__name__.removesuffix("Request") + "Body",
                        __config__=ConfigDict(extra="forbid", strict=True), **defs)


def _optional(record: type) -> bool:
    """A body may be left out when every field has a default."""
    return all(f.default is not dataclasses.MISSING for f in dataclasses.fields(record))


_POLL_S = 0.25


class Handlers:
    """The server side of each route: ``handler(tenant, **args)`` calls the coordinator for the
    authenticated tenant (args: the route's path and query values by wire name, and its body as the
    route's ``request`` record, handed on as it is). A route with nothing to add (a read slot, a
    budget, a status) has no method here: :meth:`handler` calls the coordinator's method of its name."""

    def __init__(self, coordinator: Coordinator, metrics: Metrics) -> None:
        self.coordinator, self.metrics = coordinator, metrics
        self.reads = TenantGate(READS_PER_TENANT, "expensive reads (listing jobs, reports, evals, audit)")
        self.eval_calls = TenantGate(EVAL_CALLS_PER_TENANT, "claims or posted evals")

    def handler(self, name: str) -> Callable[..., Any]:
        """The handler of route ``name``: the method of that name, or the coordinator's by keyword."""
        own = getattr(self, name, None)
        if own is not None:
            return own
        method = getattr(self.coordinator, name)

        def direct(t: str, request: Any = None, **args: Any) -> Any:
            return method(t, **args) if request is None else method(t, **args, request=request)

        direct.__doc__ = method.__doc__
        return direct

    def register_job(self, t: str, request: JobRequest) -> Answer:
        view, created = self.coordinator.register_job(t, request)
        return Answer(view, None if created else 200)

    def list_jobs(self, t: str, status: str | None, limit: int, offset: int) -> Answer:
        """The caller's jobs in registration order, paged (``X-Total-Count`` has the total)."""
        with self._reading(t) as slot:
            views, total = self.coordinator.page_jobs(t, status, limit, offset)
            return Answer(views, headers={"X-Total-Count": str(total)}, close=slot.pop_all().close)

    async def wait_decision(self, t: str, job_id: str, wait: float, stopped: bool) -> JobView:
        """The job's status and decision. With ``wait``, a long poll: answers as soon as the job is no
        longer running (or, with ``stopped=true``, once it is stopped), or after ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            view = await run_in_threadpool(self.coordinator.status, t, job_id)
            if view.settled(stopped) or time.monotonic() >= deadline:
                return view
            await asyncio.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    async def report(self, t: str, job_id: str, request: ReportRequest) -> Decision:
        """Decide on the loop when the job is in memory (else in the thread pool), then await
        durability without holding a thread, so one group commit serves many reports."""
        t0 = time.perf_counter()
        coordinator = self.coordinator
        try:  # a job in memory: microseconds on the loop, only its write queued (Store.QUEUED_WRITES)
            pending = coordinator.submit_report(t, job_id, request, nonblocking=True)
        except WouldBlock:  # it needs a store read first: in the thread pool
            pending = await run_in_threadpool(coordinator.submit_report, t, job_id, request)
        ticket, decision = pending.ticket, pending.decision
        if not ticket.done():
            try:
                await asyncio.wrap_future(ticket)
            except StoreError:
                pass  # complete() reloads the job from the store (the source of truth) and re-raises
        if pending.stopped is not None or ticket.exception() is not None:
            # runs the stop listeners; decides again after a version conflict; re-raises a store error
            decision = await run_in_threadpool(coordinator.complete, pending)
        self.metrics.reports.inc()
        self.metrics.latency.observe(time.perf_counter() - t0)
        return decision

    def reports(self, t: str, job_id: str, after_step: int | None, limit: int) -> list:
        """Stored reports in step order, paged: those after ``after_step``, at most ``limit``."""
        with self._reading(t) as slot:
            return Answer(self.coordinator.reports(t, job_id, after_step, limit), close=slot.pop_all().close)

    def ack(self, t: str, job_id: str, request: AckRequest) -> JobView:
        view = self.coordinator.ack(t, job_id, request)
        self.metrics.acks.inc()
        return view

    def publish_snapshot(self, t: str, job_id: str, request: SnapshotRequest) -> Any:
        """A snapshot for an external evaluator (``external_eval``): the path is only stored and handed
        to the tenant's own evaluators; the service never reads it."""
        return self.coordinator.publish_snapshot(t, job_id, request)

    def evals(self, t: str, job_id: str, after_step: int | None, limit: int) -> list:
        """The job's snapshots in step order, paged: those after ``after_step``, at most ``limit``."""
        with self._reading(t) as slot:
            return Answer(self.coordinator.evals(t, job_id, after_step, limit), close=slot.pop_all().close)

    def claim_eval(self, t: str, request: ClaimRequest) -> Any:
        """Lease the caller's oldest snapshot waiting for an eval (204 if none)."""
        with self.eval_calls(t):
            return self.coordinator.claim_eval(t, request)

    def post_eval(self, t: str, job_id: str, step: int, request: EvalResult) -> Decision:
        """An evaluator's score for a snapshot (or ``score: null`` with ``error``): fed in step order."""
        with self.eval_calls(t):
            return self.coordinator.post_eval(t, job_id, step, request)

    def record_event(self, t: str, job_id: str, request: EventRequest) -> None:
        """Record what the job's launcher (``evalstop run``) did: an escalation or the child's exit."""
        self.coordinator.record_event(t, job_id, request)
        if request.kind != AuditKind.LAUNCHER_EXIT.value:
            self.metrics.signals.labels(request.kind.removeprefix("launcher_").upper()).inc()

    def audit(self, t: str, job_id: str | None, limit: int, offset: int, after: int | None) -> Answer:
        """The caller's audit records, oldest first (of one job with ``job_id``), paged by ``offset`` or,
        cheaper, by keyset: ``after`` = the ``X-Next-After`` header of the previous page."""
        with self._reading(t) as slot:
            records, last = self.coordinator.audit_page(t, job_id, limit, offset, after)
            return Answer(records, headers=None if last is None else {"X-Next-After": str(last)},
                          close=slot.pop_all().close)


    def browse_jobs(self, t: str, **query: Any) -> Any:
        """One page of the caller's runs: search, filters, sort, keyset paging (``next``)."""
        with self._reading(t) as slot:
            return Answer(self.coordinator.browse(t, job_query(**query)), close=slot.pop_all().close)

    def summary(self, t: str) -> Any:
        """The caller's jobs by outcome and what its detectors' stops saved."""
        with self._reading(t) as slot:
            return Answer(self.coordinator.summary(t), close=slot.pop_all().close)

    @contextlib.contextmanager
    def _reading(self, t: str) -> Iterator[contextlib.ExitStack]:
        """One of the tenant's read slots, released on leaving unless the handler keeps it for its
        answer (``Answer(..., close=slot.pop_all().close)``: held until the answer is sent)."""
        with contextlib.ExitStack() as slot:
            slot.enter_context(self.reads(t))
            yield slot

    def _stream(self, t: str, make: Callable[[], Any], media_type: str, filename: str) -> Stream:
        """An export that holds one of the tenant's read slots until its last chunk is sent."""
        slot = contextlib.ExitStack()
        slot.enter_context(self.reads(t))
        try:
            chunks = make()
        except BaseException:
            slot.close()
            raise
        return Stream(chunks, media_type, filename, slot.close)

    def export_reports(self, t: str, job_id: str, format: str) -> Stream:  # noqa: A002 - the wire name
        """The job's reports as CSV or JSON, streamed a page at a time."""
        fmt = export_format(format)
        return self._stream(t, lambda: self.coordinator.export_reports(t, job_id, fmt.name), fmt.media_type,
                            f"{job_id}-reports.{fmt.suffix}")

    def export_jobs(self, t: str, format: str, **query: Any) -> Stream:  # noqa: A002 - the wire name
        """The caller's runs that the filters match, in their order, as CSV or JSON, streamed."""
        fmt, q = export_format(format), job_query(**query)
        return self._stream(t, lambda: self.coordinator.export_jobs(t, q, fmt.name), fmt.media_type,
                            f"runs.{fmt.suffix}")


def _tenant(request: Request) -> str:
    tenant = request.scope.get("state", {}).get("tenant")  # authenticated by the Guard, before the body
    if tenant is None:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    return tenant


_SLICE = 64 * 1024  # bytes of a large answer sent at once (uvicorn's write buffer high-water mark)


class SlicedAnswer(StreamingResponse):
    """A large JSON answer sent a slice at a time that releases ``close`` (the tenant's read slot)
    once it is sent or the client is gone. The next slice waits until the last is taken, so a
    client that stops reading keeps its tenant's slot busy: the answers a tenant's stalled clients
    leave in the server's memory are at most its read slots, not one per connection."""

    def __init__(self, body: bytes, status_code: int, headers: Mapping[str, str] | None,
                 close: Callable[[], None]) -> None:
        async def slices():
            for i in range(0, len(body), _SLICE):
                yield body[i:i + _SLICE]

        super().__init__(slices(), status_code=status_code, headers=headers, media_type="application/json")
        self._close = close
        weakref.finalize(self, close)  # an answer dropped before it is sent (the client went away)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._close()


def _respond(route: Route, result: Any) -> Response:
    """The HTTP answer of a handler's result, encoded by the route's codec (strict JSON)."""
    value, status, headers, close = result if isinstance(result, Answer) else (result, None, None, None)
    if isinstance(value, Stream):
        return StreamAnswer(value)
    try:
        data = route.result.encode(value)
        body = None if data is None else json.dumps(data, allow_nan=False).encode()
    except BaseException:
        if close is not None:
            close()
        raise
    if close is not None and body is not None and len(body) > _SLICE:
        return SlicedAnswer(body, status or route.status, headers, close)
    if close is not None:
        close()
    if body is None:
        return Response(status_code=204, headers=headers)
    return Response(body, status_code=status or route.status, headers=headers, media_type="application/json")


def _run(route: Route, handler: Callable[..., Any], tenant: str, args: dict[str, Any]) -> Response:
    return _respond(route, handler(tenant, **args))


async def _answer(route: Route, handler: Callable[..., Any], is_async: bool, tenant: str,
                  args: dict[str, Any]) -> Response:
    """Run a route's handler (a plain one in the thread pool, where its answer is encoded too)."""
    if is_async:
        return _respond(route, await handler(tenant, **args))
    return await run_in_threadpool(_run, route, handler, tenant, args)


def _endpoint(route: Route, handler: Callable[..., Any]) -> Callable[..., Any]:
    """A FastAPI endpoint for ``route``: its signature declares the path arguments, the query model
    and the body model derived from the request record (so FastAPI parses them and documents them
    in OpenAPI); the body runs ``handler`` with the request record built from the body."""
    query, record, is_async = QUERIES.get(route.name), route.request, inspect.iscoroutinefunction(handler)
    body = None if record is None else body_model(record)
    optional = record is not None and _optional(record)

    async def endpoint(request: Request, **given: Any) -> Response:
        tenant = _tenant(request)
        query_values = given.pop("query", None)
        args = {**given, **dict(query_values or {})}
        if record is not None:
            given = args.pop("body", None)
            args["request"] = record(**(dict(given) if given is not None else {}))
        return await _answer(route, handler, is_async, tenant, args)

    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("request", kw, annotation=Request)]
    params += [inspect.Parameter(name, kw, annotation=_PATH_TYPES.get(name, str)) for name in route.path_args]
    if query is not None:
        params.append(inspect.Parameter("query", kw, annotation=Annotated[query, Query()]))
    if body is not None:
        params.append(inspect.Parameter("body", kw, annotation=body | None if optional else body,
                                        default=None if optional else inspect.Parameter.empty))
    endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    endpoint.__name__ = route.name
    endpoint.__doc__ = handler.__doc__
    return endpoint


def mount_routes(app: FastAPI, handlers: Handlers) -> None:
    """Register one endpoint per row of :data:`~evalstop_trl.core.api.ROUTES` on ``app``."""
    for route in ROUTES.values():
        responses = {204: {"description": "nothing now"}} if route.result.name.endswith("| None") else None
        app.add_api_route(route.path, _endpoint(route, handlers.handler(route.name)), methods=[route.method],
                          status_code=route.status, name=route.name, responses=responses,
                          response_class=Response)


# ----------------------------------------------------------------------------- errors
log = logging.getLogger("evalstop")


def error_response(exc: EvalStopError | StoreError) -> JSONResponse:
    """The answer to a core or store error, on every route: the error's status and its sentence
    (``WWW-Authenticate`` with a 401, ``Retry-After`` with a quota that says when); a store error is
    a 503 that names nothing of the store (it is logged)."""
    if isinstance(exc, StoreError):
        log.error("store error: %s", exc)
        return JSONResponse({"detail": "the coordinator could not store this; retry later"}, status_code=503)
    headers = None
    if isinstance(exc, Unauthorized):
        headers = {"WWW-Authenticate": "Bearer"}
    elif isinstance(exc, QuotaExceeded) and exc.retry_after is not None:
        headers = {"Retry-After": str(max(1, int(exc.retry_after + 0.999)))}
    return JSONResponse({"detail": str(exc)}, status_code=exc.status_code, headers=headers)


def validation_response(exc: RequestValidationError) -> JSONResponse:
    """A 422 naming each refused field in one line (``step: Input should be a valid integer``)."""
    parts = []
    for e in exc.errors():
        if e.get("type") == "json_invalid":
            parts.append(f"body is not valid JSON ({e.get('ctx', {}).get('error', 'decode error')})")
            continue
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        msg = e.get("msg", "invalid").removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
    return JSONResponse({"detail": "; ".join(parts)}, status_code=422)


# ----------------------------------------------------------------------------- hot routes
#: The routes :class:`HotRoutes` answers before FastAPI's router: what every training loop sends.
HOT_ROUTES = ("report", "heartbeat")


class _Hot(NamedTuple):
    route: Route
    pattern: Any  # the path's compiled pattern (Starlette's, as its router compiles it)
    convertors: Mapping[str, Any]
    body: type[BaseModel]
    handler: Callable[..., Any]
    is_async: bool


class HotRoutes:
    """ASGI middleware, inside the :class:`~.middleware.Guard`: answers the rows of ``names`` (each
    with a body record and no query) from the route table, without FastAPI's router.

    Only a request the Guard authenticated, with a JSON body (``Content-Type: application/json``)
    that the row's body model takes, is answered here: the path is matched as Starlette matches it,
    the body parsed as FastAPI parses it (``json.loads``, then the model, strictly), the handler and
    the answer's encoding are :func:`mount_routes`' own, and core or store errors are answered by
    :func:`error_response`. Anything else goes on to the app, which answers as for any route."""

    def __init__(self, app, handlers: Handlers, names: tuple[str, ...] = HOT_ROUTES) -> None:
        self.app = app
        self._hot: dict[str, list[_Hot]] = {}
        for name in names:
            route = ROUTES[name]
            if route.request is None or name in QUERIES or route.text:
                raise ValueError(f"route {name!r} cannot be hot: a hot route takes a body record and no query")
            pattern, _, convertors = compile_path(route.path)
            handler = handlers.handler(name)
            self._hot.setdefault(route.method, []).append(
                _Hot(route, pattern, convertors, body_model(route.request), handler,
                     inspect.iscoroutinefunction(handler)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for hot in self._hot.get(scope["method"], ()):
                match = hot.pattern.match(scope["path"])
                if match is not None:
                    return await self._serve(hot, match.groupdict(), scope, receive, send)
        await self.app(scope, receive, send)

    async def _serve(self, hot: _Hot, path_args: dict[str, str], scope: Scope, receive: Receive, send: Send) -> None:
        tenant = scope.get("state", {}).get("tenant")
        content_type = next((v for k, v in scope["headers"] if k == b"content-type"), None)  # the first, as Starlette
        if tenant is None or content_type != b"application/json":
            return await self.app(scope, receive, send)
        message = await receive()  # the Guard hands the whole body over in one message
        given = False

        async def again() -> Any:  # the same body once more, for the app
            nonlocal given
            if not given:
                given = True
                return message
            return await receive()

        try:
            fields = hot.body.model_validate(json.loads(message.get("body", b"")))
        except (ValueError, RecursionError):  # not JSON (or nested past the parser), refused: the app's own answer
            return await self.app(scope, again, send)
        args: dict[str, Any] = {k: hot.convertors[k].convert(v) for k, v in path_args.items()}
        args["request"] = hot.route.request(**dict(fields))
        try:
            response = await _answer(hot.route, hot.handler, hot.is_async, tenant, args)
        except (EvalStopError, StoreError) as exc:
            response = error_response(exc)
        await response(scope, again, send)

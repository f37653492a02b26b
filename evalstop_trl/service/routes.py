"""The service's side of the route table: one short handler per API route, mounted from the table.

:data:`~evalstop_trl.core.api.ROUTES` says, per method of the API, the HTTP method, the path, which
arguments travel where and the result's codec; the HTTP client is derived from it. Here each route
gets its request schema (:data:`SCHEMAS`) and its handler (the :class:`Handlers` method of the same
name, a few lines calling the :class:`~evalstop_trl.core.coordinator.Coordinator`), and
:func:`mount_routes` registers them all on the FastAPI app.

Nothing that touches the store runs on the event loop: a plain handler runs in the thread pool
(its answer is encoded there too); the two coroutine handlers (``report``, whose durable write is
awaited, and the ``wait_decision`` long poll) hand every coordinator call to the thread pool.

Fair sharing: the expensive reads (listing jobs, reports, evals, the audit log) take one of
:data:`READS_PER_TENANT` slots of their tenant, and claims and posted evals one of
:data:`EVAL_CALLS_PER_TENANT`; beyond them a request gets 429 at once (``Retry-After: 1``), so one
tenant's flood holds at most that many threads and store connections. Launcher events and
snapshots are rate limited per tenant (the ``event_rate``/``event_burst`` quota).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple

from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..core.api import EVALS_PAGE, ROUTES, Route, launcher_event
from ..core.coordinator import Coordinator, WouldBlock
from ..core.detectors import Decision
from ..core.errors import QuotaExceeded, Unauthorized
from ..core.export import export_format
from ..core.records import MAX_STEP, AuditKind, JobView
from ..core.store import StoreError
from .metrics import Metrics
from .middleware import TokenBuckets
from .runs import ExportQuery, RunsExportQuery, RunsQuery, Stream, StreamAnswer, job_query
from .schemas import (
    AckIn,
    AuditQuery,
    ClaimIn,
    EvalResultIn,
    EventIn,
    FailIn,
    HeartbeatIn,
    JobIn,
    JobsQuery,
    ReportIn,
    ReportsQuery,
    SnapshotIn,
    StopIn,
    WaitQuery,
)

__all__ = ["EVAL_CALLS_PER_TENANT", "READS_PER_TENANT", "SCHEMAS", "Answer", "Handlers", "Schema", "TenantGate",
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


@dataclass(frozen=True, slots=True)
class Schema:
    """What a route reads besides its path: a body or a query-string model (``optional``: may be absent)."""

    model: type[BaseModel] | None = None
    where: str = "body"  # or "query"
    optional: bool = False
    path: Mapping[str, Any] = field(default_factory=dict)  # path argument -> annotation (default: str)


SCHEMAS: Mapping[str, Schema] = {
    "register_job": Schema(JobIn),
    "list_jobs": Schema(JobsQuery, "query"),
    "status": Schema(),
    "wait_decision": Schema(WaitQuery, "query"),
    "report": Schema(ReportIn),
    "reports": Schema(ReportsQuery, "query"),
    "stop": Schema(StopIn, optional=True),
    "ack": Schema(AckIn, optional=True),
    "finish": Schema(),
    "fail": Schema(FailIn, optional=True),
    "heartbeat": Schema(HeartbeatIn, optional=True),
    "publish_snapshot": Schema(SnapshotIn),
    "evals": Schema(EvalsQuery, "query"),
    "claim_eval": Schema(ClaimIn),
    "post_eval": Schema(EvalResultIn, path={"step": Annotated[int, Path(ge=0, le=MAX_STEP)]}),
    "record_event": Schema(EventIn),
    "audit": Schema(AuditPageQuery, "query"),
    "browse_jobs": Schema(RunsQuery, "query"),
    "export_jobs": Schema(RunsExportQuery, "query"),
    "export_reports": Schema(ExportQuery, "query"),
    "summary": Schema(),
    "delete_job": Schema(StopIn, optional=True),
}

_POLL_S = 0.25


class Handlers:
    """The server side of each route: ``handler(tenant, **args)`` calls the coordinator for the
    authenticated tenant (args are the route's path, query and body values, by wire name)."""

    def __init__(self, coordinator: Coordinator, metrics: Metrics) -> None:
        self.coordinator, self.metrics = coordinator, metrics
        self.reads = TenantGate(READS_PER_TENANT, "expensive reads (listing jobs, reports, evals, audit)")
        self.eval_calls = TenantGate(EVAL_CALLS_PER_TENANT, "claims or posted evals")
        self.buckets = TokenBuckets()

    def _event_budget(self, t: str) -> None:
        """One token of the tenant's event budget (launcher events and snapshots), or 429."""
        q = self.coordinator.tenants.quotas(t)
        wait = self.buckets.take(t, q.event_rate, q.event_burst)
        if wait:
            raise QuotaExceeded(f"tenant {t!r} sends launcher events and snapshots faster than its quota "
                                f"(event_rate={q.event_rate:g}/s, event_burst={q.event_burst})", retry_after=wait)

    def register_job(self, t: str, job_id: str, job_type: str, planned_steps: int | None, policy: dict | None,
                     webhook: str | None, tags: dict | None, hparams: dict | None) -> Answer:
        view, created = self.coordinator.register_job(t, job_id, job_type, planned_steps, policy, webhook, tags,
                                                      hparams)
        return Answer(view, None if created else 200)

    def list_jobs(self, t: str, status: str | None, limit: int, offset: int) -> Answer:
        """The caller's jobs in registration order, paged (``X-Total-Count`` has the total)."""
        with self._reading(t) as slot:
            views, total = self.coordinator.page_jobs(t, status, limit, offset)
            return Answer(views, headers={"X-Total-Count": str(total)}, close=slot.pop_all().close)

    def status(self, t: str, job_id: str) -> JobView:
        return self.coordinator.status(t, job_id)

    async def wait_decision(self, t: str, job_id: str, wait: float, stopped: bool) -> JobView:
        """The job's status and decision. With ``wait``, a long poll: answers as soon as the job is no
        longer running (or, with ``stopped=true``, once it is stopped), or after ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            view = await run_in_threadpool(self.coordinator.status, t, job_id)
            if view.settled(stopped) or time.monotonic() >= deadline:
                return view
            await asyncio.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    async def report(self, t: str, job_id: str, step: int, eval_score: float | None, train_loss: float | None,
                     proxy_reward: float | None, checkpoint: str | None) -> Decision:
        """Decide on the loop when the job is in memory (else in the thread pool), then await
        durability without holding a thread, so one group commit serves many reports."""
        t0 = time.perf_counter()
        coordinator = self.coordinator
        try:  # a job in memory: microseconds on the loop, only its write queued (Store.QUEUED_WRITES)
            pending = coordinator.submit_report(t, job_id, step, eval_score, train_loss, proxy_reward, checkpoint,
                                                nonblocking=True)
        except WouldBlock:  # it needs a store read first: in the thread pool
            pending = await run_in_threadpool(coordinator.submit_report, t, job_id, step, eval_score, train_loss,
                                              proxy_reward, checkpoint)
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

    def stop(self, t: str, job_id: str, reason: str) -> JobView:
        return self.coordinator.stop(t, job_id, reason)

    def ack(self, t: str, job_id: str, checkpoint: str | None, step: int | None) -> JobView:
        view = self.coordinator.ack(t, job_id, checkpoint, step)
        self.metrics.acks.inc()
        return view

    def finish(self, t: str, job_id: str) -> JobView:
        return self.coordinator.finish(t, job_id)

    def fail(self, t: str, job_id: str, reason: str) -> JobView:
        return self.coordinator.fail(t, job_id, reason)

    def heartbeat(self, t: str, job_id: str, actor: str) -> JobView:
        """The job is alive: renews its lease (a lost job runs again)."""
        return self.coordinator.heartbeat(t, job_id, actor)

    def publish_snapshot(self, t: str, job_id: str, step: int, path: str, train_loss: float | None,
                         proxy_reward: float | None) -> Any:
        """A snapshot for an external evaluator (``external_eval``): the path is only stored and handed
        to the tenant's own evaluators; the service never reads it."""
        self._event_budget(t)
        return self.coordinator.publish_snapshot(t, job_id, step, path, train_loss, proxy_reward)

    def evals(self, t: str, job_id: str, after_step: int | None, limit: int) -> list:
        """The job's snapshots in step order, paged: those after ``after_step``, at most ``limit``."""
        with self._reading(t) as slot:
            return Answer(self.coordinator.evals(t, job_id, after_step, limit), close=slot.pop_all().close)

    def claim_eval(self, t: str, worker: str, lease_s: float) -> Any:
        """Lease the caller's oldest snapshot waiting for an eval (204 if none)."""
        with self.eval_calls(t):
            return self.coordinator.claim_eval(t, worker, lease_s)

    def post_eval(self, t: str, job_id: str, step: int, score: float | None, worker: str, error: str | None) -> Decision:
        """An evaluator's score for a snapshot (or ``score: null`` with ``error``): fed in step order."""
        with self.eval_calls(t):
            return self.coordinator.post_eval(t, job_id, step, score, worker, error)

    def record_event(self, t: str, job_id: str, kind: str, reason: str, exit_code: int | None) -> None:
        """Record what the job's launcher (``evalstop run``) did: an escalation or the child's exit."""
        event, reason, evidence = launcher_event(kind, reason, exit_code)
        self._event_budget(t)
        self.coordinator.record_event(t, job_id, event, reason, evidence, actor="launcher")
        if event is not AuditKind.LAUNCHER_EXIT:
            self.metrics.signals.labels(event.value.removeprefix("launcher_").upper()).inc()

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

    def delete_job(self, t: str, job_id: str, reason: str) -> JobView:
        """Delete the caller's ended job with its reports (409 while it runs); its audit line stays."""
        return self.coordinator.delete_job(t, job_id, reason)

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


def _endpoint(route: Route, handler: Callable[..., Any], schema: Schema) -> Callable[..., Any]:
    """A FastAPI endpoint for ``route``: its signature declares the path arguments and the schema
    (so FastAPI validates them and documents them in OpenAPI); the body runs ``handler``."""
    model, optional, is_async = schema.model, schema.optional, inspect.iscoroutinefunction(handler)

    async def endpoint(request: Request, **values: Any) -> Response:
        tenant = _tenant(request)
        params = values.pop("params", None)
        if params is None and model is not None:
            params = model()  # an optional body left out: its defaults
        args = {**values, **(dict(params) if params is not None else {})}
        if is_async:
            return _respond(route, await handler(tenant, **args))
        return await run_in_threadpool(_run, route, handler, tenant, args)

    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("request", kw, annotation=Request)]
    params += [inspect.Parameter(name, kw, annotation=schema.path.get(name, str)) for name in route.path_args]
    if model is not None:
        annotation = Annotated[model, Query()] if schema.where == "query" else (model | None if optional else model)
        default = None if optional else inspect.Parameter.empty
        params.append(inspect.Parameter("params", kw, annotation=annotation, default=default))
    endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    endpoint.__name__ = route.name
    endpoint.__doc__ = handler.__doc__
    return endpoint


def mount_routes(app: FastAPI, handlers: Handlers) -> None:
    """Register one endpoint per row of :data:`~evalstop_trl.core.api.ROUTES` on ``app``."""
    for route in ROUTES.values():
        handler = getattr(handlers, route.name)
        responses = {204: {"description": "nothing now"}} if route.result.name.endswith("| None") else None
        app.add_api_route(route.path, _endpoint(route, handler, SCHEMAS[route.name]), methods=[route.method],
                          status_code=route.status, name=route.name, responses=responses,
                          response_class=Response)

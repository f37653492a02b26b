"""Clients: :class:`EvalStopClient` (HTTP, fail-open) and :class:`EmbeddedClient` (in process).

Both implement :class:`~evalstop_trl.core.api.EvalStopAPI` and return the same records. Every call
here is derived from the route table (:data:`~evalstop_trl.core.api.ROUTES`): :meth:`EvalStopClient.call`
builds the request from a route's row and decodes the answer with the route's codec
(:mod:`evalstop_trl.core.codec`), so each method is one line. This module needs nothing of the
coordinator but the API's records.

The HTTP client never raises into a training loop because the coordinator is unreachable:

* each call retries connection errors, timeouts and 500/502/503/504 answers with exponential backoff
  (the next replica first, when there are several);
* when the coordinator is still unreachable, fail-open operations (the routes marked ``fail_open``:
  register, report, ack, finish, fail, publish_snapshot) are appended to a durable outbox (a JSONL
  file, fsync'd) and the caller gets a CONTINUE decision (None from the others); the outage is
  logged once, not at every step;
* during an outage the client probes at most every ``probe_interval_s`` seconds, so a training
  step never waits on timeouts again and again;
* when the coordinator answers again, the outbox is replayed in order (registrations first, then
  each job's reports in step order) before the new call, then cleared;
* every answer is checked against its route's codec: a 2xx that is not what the route returns
  (``{}``, HTML from a proxy, a list, an unknown action) counts as an outage, never as an exception
  into training (a fail-open call stays in the outbox and ``report`` returns CONTINUE; any other
  call raises :class:`~evalstop_trl.core.errors.EvalStopError` saying so).

Refusals (4xx) raise a :class:`ClientError` naming the method, URL, status and the server's
detail, never retried and never kept in the outbox. Its subclass for the status is also the core's
error class, so one ``except`` serves both clients: 401 -> :class:`Unauthorized`, 404 ->
:class:`NotFound`, 409 -> :class:`Conflict`, 422 -> :class:`InvalidInput`, 429 ->
:class:`QuotaExceeded` (``retry_after`` from the answer's ``Retry-After``).

Example::

    client = EvalStopClient("http://127.0.0.1:8765", token, outbox="runs/a/evalstop-outbox.jsonl")
    client.register_job("run-a", "grpo", planned_steps=500)
    decision = client.report("run-a", step=50, eval_score=0.71)
    if decision.stop: ...
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from typing import Any

from ..core.api import MAX_WAIT_S, ROUTES, Route
from ..core.browse import JobPage
from ..core.detectors import Action, Decision
from ..core.errors import EvalStopError, InvalidInput, QuotaExceeded
from ..core.records import AuditRecord, EvalTask, JobView, Report
from ..core.summary import TenantSummary
from .outbox import Operation, Outbox
from .transport import ClientError, Transport, Unreachable

__all__ = ["ClientError", "EvalStopClient"]

log = logging.getLogger("evalstop.client")

#: the outbox's name of a fail-open route (kept: outboxes written by earlier versions replay as before)
_OUTBOX_OP = {"register_job": "register", "publish_snapshot": "snapshot"}
_ROUTE_OF_OP = {_OUTBOX_OP.get(r.name, r.name): r for r in ROUTES.values() if r.fail_open}
_EXPORT_TIMEOUT_S = 120.0  # an export streams up to a tenant's whole history
_KEPT = Decision(Action.CONTINUE, "coordinator unreachable: report kept in the outbox (fail-open)")


def _body_checked(body: dict[str, Any] | None) -> dict[str, Any] | None:
    """``body`` if strict JSON can carry it; InvalidInput (as the coordinator would say) otherwise,
    before anything is sent or queued: a NaN must never sit in the outbox."""
    if body is None:
        return None
    for key, value in body.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInput(f"{key} must be a finite number, but got {value!r}; send None for a missing value.")
    try:
        json.dumps(body, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"the request body is not strict JSON ({exc}).") from None
    return body


class EvalStopClient:
    """HTTP client of ``evalstop serve`` (an :class:`~evalstop_trl.core.api.EvalStopAPI`).

    Args:
        url: the coordinator, e.g. ``http://127.0.0.1:8765``, or its replicas separated by commas
            (a replica that does not answer is skipped).
        token: the tenant's bearer token.
        outbox: JSONL file for reports sent while the coordinator is unreachable (default: in memory
            only; pass a path next to the run's output to survive a crash of the training process).
        timeout_s: per-request timeout; connect_timeout_s: connection timeout.
        retries: retries per call on connection errors and 5xx; backoff_s: first backoff (doubles).
        probe_interval_s: during an outage, contact the coordinator at most this often.
    """

    def __init__(self, url: str, token: str, outbox: str | os.PathLike | None = None, *, timeout_s: float = 5.0,
                 connect_timeout_s: float = 1.0, retries: int = 2, backoff_s: float = 0.1,
                 probe_interval_s: float = 2.0, transport: Any = None) -> None:
        self.outbox = Outbox(outbox)
        self.outbox_path = self.outbox.path
        self.transport = Transport(url, token, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,
                                   retries=retries, backoff_s=backoff_s, probe_interval_s=probe_interval_s,
                                   transport=transport, on_outage=str(self.outbox_path or "memory"))
        self.url = self.transport.url
        self._lock = threading.RLock()

    @property
    def unreachable(self) -> bool:
        """True during an outage (after a failed call, until one succeeds)."""
        return self.transport.unreachable

    @property
    def pending(self) -> int:
        """Operations waiting in the outbox."""
        return len(self.outbox)

    def _replay(self) -> Any:
        """Send the outbox in order; returns the last answer to a replayed report (or None)."""
        outbox = self.outbox
        outbox.in_replay_order()
        last = None
        sent = 0
        try:
            while outbox:
                e = outbox.peek()
                try:  # a malformed answer raises Unreachable: the operation stays queued
                    answer = self.transport.call("POST", e.path, e.body, decode=_ROUTE_OF_OP[e.op].result.decode)
                    if e.op == "report":
                        last = answer
                except QuotaExceeded:
                    raise  # may succeed later (a rate, a quota freed): it stays queued, in order
                except ClientError as exc:  # cannot succeed later either: drop it, say so
                    log.error("dropping queued %s for job %s: %s", e.op, e.job_id, exc)
                outbox.pop()
                sent += 1
        finally:
            if sent:
                outbox.save()
                log.warning("replayed %d queued operation(s) to %s", sent, self.url)
        return last

    def _fail_open(self, route: Route, op: Operation) -> Any:
        """Send now (the decoded answer), or keep in the outbox (None). Only a refusal (4xx: a contract
        error) raises; nothing else that can go wrong here (network, a malformed answer, outbox I/O, a
        bug) escapes into the training loop. The coordinator accepts the same operation twice once, so
        one whose answer was lost or garbled is safe to send again."""
        with self._lock:
            try:
                if self.outbox:
                    self._replay()
                return self.transport.call("POST", op.path, op.body, decode=route.result.decode)
            except ClientError:
                raise
            except Unreachable:
                self._queue(op)
                return None
            except Exception:  # noqa: BLE001 - fail open, loudly
                log.exception("EvalStop client: unexpected error on %s %s; kept in the outbox (fail-open)", op.op,
                              op.path)
                self._queue(op)
                return None

    def _queue(self, op: Operation) -> None:
        """Keep ``op`` for the replay; InvalidInput (what the coordinator would answer) for one that the
        outbox could not load again (a step that is not an integer, say): it would block the replay."""
        try:
            op.checked()
        except ValueError as exc:
            raise InvalidInput(f"{op.op} for job {op.job_id}: {exc}.") from None
        self.outbox.append(op)

    def flush(self) -> bool:
        """Try to send the outbox now; True if it is empty afterwards."""
        with self._lock:
            if self.outbox:
                try:
                    self._replay()
                except Unreachable:
                    pass
            return not self.outbox

    # ------------------------------------------------------------------ one call, derived from its route
    def call(self, name: str, /, *, timeout: float | None = None, **args: Any) -> Any:
        """Call the API method ``name`` (a key of :data:`~evalstop_trl.core.api.ROUTES`) with ``args``
        (its wire names); returns the decoded result. A fail-open route returns None when the call
        was kept in the outbox; a paged route returns every page (up to ``limit`` items, if given)."""
        route = ROUTES[name]
        if route.page is not None:
            return self._pages(route, args)
        return self._send(route, args, timeout)

    def _send(self, route: Route, args: dict[str, Any], timeout: float | None = None) -> Any:
        path, body = route.target(args), _body_checked(route.payload(args))
        if route.fail_open:
            return self._fail_open(route, Operation(_OUTBOX_OP.get(route.name, route.name), args["job_id"], path, body))
        try:
            answer = self.transport.send(route.method, path, body, timeout=timeout, text=route.text)
        except Unreachable as exc:
            raise EvalStopError(f"{route.method} {self.url}{path}: coordinator unreachable ({exc})") from None
        try:
            return route.result.decode(answer)
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise EvalStopError(f"{route.method} {self.url}{path}: coordinator unreachable (a malformed answer: "
                                f"{exc})") from None

    def _pages(self, route: Route, args: dict[str, Any]) -> list[Any]:
        limit = args.pop("limit", None)
        out: list[Any] = []
        while True:
            size = route.page_size
            want = size if limit is None else max(0, min(limit - len(out), size))
            if want == 0:
                return out
            page = self._send(route, {**args, "limit": want, **({"offset": len(out)} if route.page == "offset" else {})})
            out.extend(page)
            if len(page) < want:
                return out
            if route.page == "after_step":
                args["after_step"] = page[-1].step

    # ------------------------------------------------------------------ the API (EvalStopAPI)
    def register_job(self, job_id: str, job_type: str | None = None, planned_steps: int | None = None,
                     policy: dict[str, Any] | None = None, webhook: str | None = None,
                     tags: dict[str, Any] | None = None, hparams: dict[str, Any] | None = None) -> JobView | None:
        return self.call("register_job", job_id=job_id, job_type=job_type, planned_steps=planned_steps, policy=policy,
                         webhook=webhook, tags=tags, hparams=hparams)

    def report(self, job_id: str, step: int, eval_score: float | None = None, train_loss: float | None = None,
               proxy_reward: float | None = None, checkpoint: str | None = None) -> Decision:
        return self.call("report", job_id=job_id, step=step, eval_score=eval_score, train_loss=train_loss,
                         proxy_reward=proxy_reward, checkpoint=checkpoint) or _KEPT

    def ack(self, job_id: str, checkpoint: str | None = None, step: int | None = None) -> JobView | None:
        return self.call("ack", job_id=job_id, checkpoint=checkpoint, step=step)

    def finish(self, job_id: str) -> JobView | None:
        return self.call("finish", job_id=job_id)

    def fail(self, job_id: str, reason: str = "") -> JobView | None:
        """Mark the job failed (its trainer crashed); fail-open like a report."""
        return self.call("fail", job_id=job_id, reason=reason)

    def stop(self, job_id: str, reason: str = "") -> JobView:
        return self.call("stop", job_id=job_id, reason=reason)

    def heartbeat(self, job_id: str, actor: str = "job") -> JobView:
        """Renew the job's lease (not kept in the outbox: a heartbeat is only worth sending now)."""
        return self.call("heartbeat", job_id=job_id, actor=actor)

    def status(self, job_id: str) -> JobView:
        return self.call("status", job_id=job_id)

    def list_jobs(self, status: str | None = None) -> list[JobView]:
        """Every job of the tenant (paging through the service's limit)."""
        return self.call("list_jobs", status=status)

    def reports(self, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[Report]:
        """Stored reports in step order; pages through the service's limit unless ``limit`` is given."""
        return self.call("reports", job_id=job_id, after_step=after_step, limit=limit)

    def publish_snapshot(self, job_id: str, step: int, path: str, train_loss: float | None = None,
                         proxy_reward: float | None = None) -> EvalTask | None:
        """Queue a snapshot for external evaluators (fail-open: kept in the outbox during an outage)."""
        return self.call("publish_snapshot", job_id=job_id, step=step, path=path, train_loss=train_loss,
                         proxy_reward=proxy_reward)

    def claim_eval(self, worker: str, lease_s: float = 300.0) -> EvalTask | None:
        """Lease the oldest snapshot waiting for an eval (None if there is none)."""
        return self.call("claim_eval", worker=worker, lease_s=lease_s)

    def post_eval(self, job_id: str, step: int, score: float | None, worker: str = "",
                  error: str | None = None) -> Decision:
        return self.call("post_eval", job_id=job_id, step=step, score=score, worker=worker,
                         error=error[:2000] if error else None)

    def evals(self, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[EvalTask]:
        """The job's snapshots in step order; pages through the service's limit unless ``limit`` is given."""
        return self.call("evals", job_id=job_id, after_step=after_step, limit=limit)

    def wait_decision(self, job_id: str, wait_s: float = 30.0, stopped: bool = False) -> JobView:
        """Long poll: the job once it is no longer running (or stopped, with ``stopped``), or after ``wait_s``."""
        wait_s = min(max(wait_s, 0.0), MAX_WAIT_S)
        return self.call("wait_decision", job_id=job_id, wait=f"{wait_s:g}", stopped=stopped, timeout=wait_s + 10)

    def record_event(self, job_id: str, kind: str, reason: str = "", exit_code: int | None = None) -> None:
        """Append a launcher event (``launcher_sigterm``, ``launcher_sigkill``, ``launcher_exit``) to the audit log."""
        return self.call("record_event", job_id=job_id, kind=kind, reason=reason, exit_code=exit_code)

    def audit(self, job_id: str | None = None) -> list[AuditRecord]:
        """The tenant's audit records (of one job with ``job_id``), oldest first, every page."""
        return self.call("audit", job_id=job_id)

    def browse_jobs(self, q: str | None = None, status: str | None = None, job_type: str | None = None,
                    detector: str | None = None, tag: str | None = None, sort: str | None = None,
                    order: str | None = None, limit: int | None = None, after: str | None = None) -> JobPage:
        """One page of the tenant's runs (search, filters, sort); the next: ``after=page.next``."""
        return self.call("browse_jobs", q=q, status=status, job_type=job_type, detector=detector, tag=tag, sort=sort,
                         order=order, limit=limit, after=after)

    def delete_job(self, job_id: str, reason: str = "") -> JobView:
        """Delete an ended job (stopped, finished, failed, lost) with its reports; audited."""
        return self.call("delete_job", job_id=job_id, reason=reason)

    def summary(self) -> TenantSummary:
        """The tenant's jobs by outcome and what its detectors' stops saved (steps, job-hours)."""
        return self.call("summary")

    def export_reports(self, job_id: str, format: str = "csv") -> str:  # noqa: A002 - the wire name
        """The job's reports as CSV or JSON text."""
        return self.call("export_reports", job_id=job_id, format=format, timeout=_EXPORT_TIMEOUT_S)

    def export_jobs(self, format: str = "csv", q: str | None = None, status: str | None = None,  # noqa: A002
                    job_type: str | None = None, detector: str | None = None, tag: str | None = None,
                    sort: str | None = None, order: str | None = None) -> str:
        """The tenant's runs that the filters match, in their order, as CSV or JSON text."""
        return self.call("export_jobs", format=format, q=q, status=status, job_type=job_type, detector=detector,
                         tag=tag, sort=sort, order=order, timeout=_EXPORT_TIMEOUT_S)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> EvalStopClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

"""The HTTP transport of the client API: :class:`EvalStopClient` (fail-open, with a durable outbox).

Its methods are :class:`~evalstop_trl.clients.api.EvalStopAPI`'s; every call is derived from the
route table (:data:`~evalstop_trl.core.api.ROUTES`): the path and query from the route's row, the
body from the route's request record, the answer decoded with the route's codec
(:mod:`evalstop_trl.core.codec`). This module needs nothing of the coordinator but the API's records.

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

from ..core.api import ROUTES, Route
from ..core.errors import EvalStopError, InvalidInput, QuotaExceeded
from .api import EvalStopAPI
from .outbox import Operation, Outbox
from .transport import ClientError, Transport, Unreachable

__all__ = ["ClientError", "EvalStopClient"]

log = logging.getLogger("evalstop.client")

#: the outbox's name of a fail-open route (kept: outboxes written by earlier versions replay as before)
_OUTBOX_OP = {"register_job": "register", "publish_snapshot": "snapshot"}
_ROUTE_OF_OP = {_OUTBOX_OP.get(r.name, r.name): r for r in ROUTES.values() if r.fail_open}


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


class EvalStopClient(EvalStopAPI):
    """HTTP client of ``evalstop serve`` (an :class:`~evalstop_trl.clients.api.EvalStopAPI`).

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
    def _send(self, route: Route, args: dict[str, Any], request: Any, timeout: float | None) -> Any:
        """The call of ``route``: a fail-open route returns None when the call was kept in the outbox;
        a paged route returns every page (up to ``limit`` items, if given)."""
        if route.page is not None:
            return self._pages(route, args)
        return self._request(route, args, route.payload(request), timeout)

    def _request(self, route: Route, args: dict[str, Any], body: dict[str, Any] | None,
                 timeout: float | None = None) -> Any:
        path, body = route.target(args), _body_checked(body)
        if route.fail_open:
            job_id = args["job_id"] if "job_id" in args else body["job_id"]  # a registration's is in its body
            return self._fail_open(route, Operation(_OUTBOX_OP.get(route.name, route.name), job_id, path, body))
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
            page = self._request(route, {**args, "limit": want, **({"offset": len(out)} if route.page == "offset"
                                                                   else {})}, None)
            out.extend(page)
            if len(page) < want:
                return out
            if route.page == "after_step":
                args["after_step"] = page[-1].step

    def close(self) -> None:
        self.transport.close()

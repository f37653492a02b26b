"""The one API of a tenant's client, and the one table of its HTTP routes.

:class:`EvalStopAPI` is what a training job, a launcher or an evaluator talks to: the HTTP client
(:class:`~evalstop_trl.clients.http.EvalStopClient`) and the in-process one
(:class:`~evalstop_trl.clients.embedded.EmbeddedClient`) both implement it, with typed records in and
out (:class:`~.detectors.Decision`, :class:`~.records.JobView`, :class:`~.records.Report`,
:class:`~.records.EvalTask`, :class:`~.records.AuditRecord`; never dicts).

:data:`ROUTES` maps each remote method to its endpoint: HTTP method, path template, which arguments
travel in the path, the query or the body, and the :class:`~.codec.Codec` of its result. The
service registers one handler per route and the HTTP client derives its calls from the same rows,
so a new endpoint is one row here, one handler in ``service/routes.py`` and a one-line client
method. ``flush``, ``close`` and ``wait_decision``'s client-side clamping stay local.

Example::

    >>> ROUTES["report"].method, ROUTES["report"].path
    ('POST', '/v1/jobs/{job_id}/reports')
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote, urlencode

from . import codec
from .browse import JobPage
from .codec import Codec
from .detectors import Decision
from .errors import InvalidInput
from .records import AuditKind, AuditRecord, EvalTask, JobView, Report
from .summary import TenantSummary

__all__ = ["EVALS_PAGE", "LOCAL_METHODS", "MAX_PAGE", "MAX_WAIT_S", "PAGE", "ROUTES", "TEXT", "EvalStopAPI", "Route",
           "launcher_event"]

MAX_PAGE = 1000  # items per page of a listing
EVALS_PAGE = 250  # snapshots per page of /evals (each is a path and its state: the costliest page to encode)
MAX_WAIT_S = 60.0  # longest long poll


@runtime_checkable
class EvalStopAPI(Protocol):
    """A tenant's client of the coordinator (every job id is the tenant's own).

    Fail-open methods (``register_job``, ``report``, ``ack``, ``finish``, ``fail``,
    ``publish_snapshot``) of the HTTP client keep the call in its outbox while the coordinator is
    unreachable: they then return None (``report``: a CONTINUE decision saying so). A refusal raises
    the core's error for it (:class:`~.errors.NotFound`, :class:`~.errors.Conflict`,
    :class:`~.errors.InvalidInput`, ...) from either client.
    """

    unreachable: bool  # the HTTP client is in an outage (always False in process)
    pending: int  # operations waiting in the outbox

    def register_job(self, job_id: str, job_type: str | None = None, planned_steps: int | None = None,
                     policy: dict[str, Any] | None = None, webhook: str | None = None,
                     tags: dict[str, Any] | None = None, hparams: dict[str, Any] | None = None) -> JobView | None: ...

    def report(self, job_id: str, step: int, eval_score: float | None = None, train_loss: float | None = None,
               proxy_reward: float | None = None, checkpoint: str | None = None) -> Decision: ...

    def ack(self, job_id: str, checkpoint: str | None = None, step: int | None = None) -> JobView | None: ...

    def finish(self, job_id: str) -> JobView | None: ...

    def fail(self, job_id: str, reason: str = "") -> JobView | None: ...

    def stop(self, job_id: str, reason: str = "") -> JobView: ...

    def heartbeat(self, job_id: str, actor: str = "job") -> JobView: ...

    def status(self, job_id: str) -> JobView: ...

    def list_jobs(self, status: str | None = None) -> list[JobView]: ...

    def reports(self, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[Report]: ...

    def publish_snapshot(self, job_id: str, step: int, path: str, train_loss: float | None = None,
                         proxy_reward: float | None = None) -> EvalTask | None: ...

    def claim_eval(self, worker: str, lease_s: float = 300.0) -> EvalTask | None: ...

    def post_eval(self, job_id: str, step: int, score: float | None, worker: str = "",
                  error: str | None = None) -> Decision: ...

    def evals(self, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[EvalTask]: ...

    def record_event(self, job_id: str, kind: str, reason: str = "", exit_code: int | None = None) -> None: ...

    def audit(self, job_id: str | None = None) -> list[AuditRecord]: ...

    def wait_decision(self, job_id: str, wait_s: float = 30.0, stopped: bool = False) -> JobView: ...

    def browse_jobs(self, q: str | None = None, status: str | None = None, job_type: str | None = None,
                    detector: str | None = None, tag: str | None = None, sort: str | None = None,
                    order: str | None = None, limit: int | None = None, after: str | None = None) -> JobPage: ...

    def export_reports(self, job_id: str, format: str = "csv") -> str: ...

    def summary(self) -> TenantSummary: ...

    def delete_job(self, job_id: str, reason: str = "") -> JobView: ...

    def export_jobs(self, format: str = "csv", q: str | None = None, status: str | None = None,
                    job_type: str | None = None, detector: str | None = None, tag: str | None = None,
                    sort: str | None = None, order: str | None = None) -> str: ...

    def flush(self) -> bool: ...

    def close(self) -> None: ...


#: Protocol methods that never cross the wire (the outbox, the client's own resources)
LOCAL_METHODS = frozenset({"flush", "close"})


@dataclass(frozen=True, slots=True)
class Route:
    """One endpoint: the API method it serves and how its arguments and result travel.

    Args:
        name: the :class:`EvalStopAPI` method.
        method, path: HTTP method and path template (``{job_id}`` etc. are path arguments).
        result: the codec of the answer.
        query, body: the arguments sent in the query string / the JSON body (wire names).
        status: the success status (the service may answer 200 for an existing resource).
        fail_open: the HTTP client keeps the call in its outbox while the coordinator is away.
        page: ``"offset"`` (``limit``/``offset``) or ``"after_step"`` (keyset on the last step):
            the client pages through :data:`MAX_PAGE` items at a time.
    """

    name: str
    method: str
    path: str
    result: Codec
    query: tuple[str, ...] = ()
    body: tuple[str, ...] = ()
    status: int = 200
    fail_open: bool = False
    page: str | None = None
    page_size: int = MAX_PAGE
    text: bool = False  # the answer is text (an export, streamed), not JSON

    @property
    def path_args(self) -> tuple[str, ...]:
        return tuple(name for _, name, _, _ in string.Formatter().parse(self.path) if name)

    def target(self, args: Mapping[str, Any]) -> str:
        """The request's path and query string for ``args`` (None values are left out)."""
        path = self.path.format(**{a: quote(str(args[a]), safe="") for a in self.path_args})
        query = {k: _query_value(args[k]) for k in self.query if args.get(k) is not None}
        return f"{path}?{urlencode(query)}" if query else path

    def payload(self, args: Mapping[str, Any]) -> dict[str, Any] | None:
        """The request's JSON body for ``args`` (None values are left out; None without body args)."""
        if not self.body:
            return None
        return {k: args[k] for k in self.body if args.get(k) is not None}


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _page_decode(data: Any) -> JobPage:
    if not isinstance(data, Mapping) or not isinstance(data.get("jobs"), list) or type(data.get("total")) is not int:
        raise ValueError(f"a page of runs on the wire is an object with jobs and total, but got {data!r:.100}")
    nxt = data.get("next")
    if nxt is not None and not isinstance(nxt, str):
        raise ValueError(f"next must be a string or null, but got {nxt!r:.40}")
    return JobPage(tuple(codec.JOB.decode(j) for j in data["jobs"]), data["total"], nxt)


#: a page of runs: ``{"jobs": [job, ...], "total": n, "next": cursor | null}``
PAGE = Codec("JobPage", lambda p: {"jobs": [codec.JOB.encode(v) for v in p.jobs], "total": p.total, "next": p.next},
             _page_decode)
def _summary_decode(data: Any) -> TenantSummary:
    if not isinstance(data, Mapping):
        raise ValueError(f"a summary on the wire is an object, but got {type(data).__name__}")
    names = TenantSummary().to_dict()
    return TenantSummary(**{k: (float(data[k]) if isinstance(names[k], float) else int(data[k]))
                            for k in names if k in data})


#: a tenant's summary: ``{"jobs": n, "stopped": n, ..., "steps_saved": n, "hours_saved": h}``
SUMMARY = Codec("TenantSummary", lambda s: s.to_dict(), _summary_decode)
#: an export's text (the service streams it; the clients return it whole)
TEXT = Codec("text", lambda chunks: chunks, lambda data: data if isinstance(data, str) else str(data))

_FILTERS = ("q", "status", "job_type", "detector", "tag", "sort", "order")
_JOB_BODY = ("job_id", "job_type", "planned_steps", "policy", "webhook", "tags", "hparams")
_REPORT_BODY = ("step", "eval_score", "train_loss", "proxy_reward", "checkpoint")

ROUTES: Mapping[str, Route] = {r.name: r for r in (
    Route("register_job", "POST", "/v1/jobs", codec.JOB, body=_JOB_BODY, status=201, fail_open=True),
    Route("list_jobs", "GET", "/v1/jobs", codec.many(codec.JOB), query=("status", "limit", "offset"), page="offset"),
    Route("status", "GET", "/v1/jobs/{job_id}", codec.JOB),
    Route("wait_decision", "GET", "/v1/jobs/{job_id}/decision", codec.JOB, query=("wait", "stopped")),
    Route("report", "POST", "/v1/jobs/{job_id}/reports", codec.under("decision", codec.DECISION), body=_REPORT_BODY,
          fail_open=True),
    Route("reports", "GET", "/v1/jobs/{job_id}/reports", codec.many(codec.REPORT), query=("after_step", "limit"),
          page="after_step"),
    Route("stop", "POST", "/v1/jobs/{job_id}/stop", codec.JOB, body=("reason",)),
    Route("ack", "POST", "/v1/jobs/{job_id}/ack", codec.JOB, body=("checkpoint", "step"), fail_open=True),
    Route("finish", "POST", "/v1/jobs/{job_id}/finish", codec.JOB, fail_open=True),
    Route("heartbeat", "POST", "/v1/jobs/{job_id}/heartbeat", codec.JOB, body=("actor",)),
    Route("fail", "POST", "/v1/jobs/{job_id}/fail", codec.JOB, body=("reason",), fail_open=True),
    Route("publish_snapshot", "POST", "/v1/jobs/{job_id}/snapshots", codec.EVAL_TASK,
          body=("step", "path", "train_loss", "proxy_reward"), status=201, fail_open=True),
    Route("evals", "GET", "/v1/jobs/{job_id}/evals", codec.many(codec.EVAL_TASK), query=("after_step", "limit"),
          page="after_step", page_size=EVALS_PAGE),
    Route("claim_eval", "POST", "/v1/evals/claim", codec.optional(codec.EVAL_TASK), body=("worker", "lease_s")),
    Route("post_eval", "POST", "/v1/jobs/{job_id}/evals/{step}", codec.under("decision", codec.DECISION),
          body=("score", "worker", "error")),
    Route("record_event", "POST", "/v1/jobs/{job_id}/events", codec.nothing("recorded"),
          body=("kind", "reason", "exit_code"), status=201),
    Route("audit", "GET", "/v1/audit", codec.many(codec.AUDIT), query=("job_id", "limit", "offset"), page="offset"),
    Route("browse_jobs", "GET", "/v1/runs", PAGE, query=(*_FILTERS, "limit", "after")),
    Route("export_jobs", "GET", "/v1/runs/export", TEXT, query=("format", *_FILTERS), text=True),
    Route("export_reports", "GET", "/v1/jobs/{job_id}/export", TEXT, query=("format",), text=True),
    Route("summary", "GET", "/v1/summary", SUMMARY),
    Route("delete_job", "POST", "/v1/jobs/{job_id}/delete", codec.JOB, body=("reason",)),
)}


_LAUNCHER_KINDS = {k.value: k for k in AuditKind if k.from_launcher}


def launcher_event(kind: str, reason: str = "", exit_code: int | None = None) -> tuple[AuditKind, str, dict[str, Any]]:
    """What :meth:`EvalStopAPI.record_event` appends: ``(kind, reason, evidence)``; InvalidInput for
    a kind that is not a launcher's (a tenant may not forge a stop or an ack)."""
    event = _LAUNCHER_KINDS.get(kind) if isinstance(kind, str) else None
    if event is None:
        raise InvalidInput(f"kind must be one of {', '.join(_LAUNCHER_KINDS)}, but got {kind!r}.")
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)
                                  or not -255 <= exit_code <= 255):
        raise InvalidInput(f"exit_code must be an integer in [-255, 255], but got {exit_code!r}.")
    return event, reason or event.value, {} if exit_code is None else {"exit_code": exit_code}

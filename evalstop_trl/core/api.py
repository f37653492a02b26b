"""The one table of the API's routes.

:data:`ROUTES` maps each method of the client API (:class:`~evalstop_trl.clients.api.EvalStopAPI`)
to its endpoint: HTTP method, path template, the arguments that travel in the path and the query, the
request record whose fields are the JSON body (:mod:`.requests`), and the :class:`~.codec.Codec` of
its result. The service mounts one endpoint per row (its body model derived from the record), the
HTTP client derives its calls from the same rows, and the in-process client calls the coordinator's
method of the route's name with the record. A new endpoint: its row here, its record, the coordinator's method and
the client's one-line method (``docs/architecture.md``).

Example::

    >>> ROUTES["report"].method, ROUTES["report"].path
    ('POST', '/v1/jobs/{job_id}/reports')
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from . import codec
from .browse import JobPage
from .codec import Codec
from .requests import (
    AckRequest,
    ClaimRequest,
    EvalResult,
    EventRequest,
    HeartbeatRequest,
    JobRequest,
    ReasonRequest,
    ReportRequest,
    SnapshotRequest,
    field_names,
)
from .summary import TenantSummary

__all__ = ["EVALS_PAGE", "MAX_PAGE", "MAX_WAIT_S", "PAGE", "REQUESTS", "ROUTES", "TEXT", "Route"]

MAX_PAGE = 1000  # items per page of a listing
EVALS_PAGE = 250  # snapshots per page of /evals (each is a path and its state: the costliest page to encode)
MAX_WAIT_S = 60.0  # longest long poll


@dataclass(frozen=True, slots=True)
class Route:
    """One endpoint: the API method it serves and how its arguments and result travel.

    Args:
        name: the method of the client API and of the coordinator.
        method, path: HTTP method and path template (``{job_id}`` etc. are path arguments).
        result: the codec of the answer.
        request: the record whose fields are the JSON body (None: no body).
        query: the arguments sent in the query string (wire names).
        status: the success status (the service may answer 200 for an existing resource).
        fail_open: the HTTP client keeps the call in its outbox while the coordinator is away.
        page: ``"offset"`` (``limit``/``offset``) or ``"after_step"`` (keyset on the last step):
            the client pages through :data:`MAX_PAGE` items at a time.
    """

    name: str
    method: str
    path: str
    result: Codec
    request: type | None = None
    query: tuple[str, ...] = ()
    status: int = 200
    fail_open: bool = False
    page: str | None = None
    page_size: int = MAX_PAGE
    text: bool = False  # the answer is text (an export, streamed), not JSON

    @property
    def body(self) -> tuple[str, ...]:
        """The JSON body's keys: the request record's fields."""
        return () if self.request is None else field_names(self.request)

    @property
    def path_args(self) -> tuple[str, ...]:
        return tuple(name for _, name, _, _ in string.Formatter().parse(self.path) if name)

    def target(self, args: Mapping[str, Any]) -> str:
        """The request's path and query string for ``args`` (None values are left out)."""
        path = self.path.format(**{a: quote(str(args[a]), safe="") for a in self.path_args})
        query = {k: _query_value(args[k]) for k in self.query if args.get(k) is not None}
        return f"{path}?{urlencode(query)}" if query else path

    def payload(self, request: Any) -> dict[str, Any] | None:
        """The JSON body of a ``request`` record (None values are left out; None without a record)."""
        if request is None:
            return None
        return {k: v for k in self.body if (v := getattr(request, k)) is not None}


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
    return TenantSummary(**{k: type(names[k])(data[k]) for k in names if k in data})


#: a tenant's summary: ``{"tenant": name, "jobs": n, "stopped": n, ..., "steps_saved": n, "hours_saved": h}``
SUMMARY = Codec("TenantSummary", lambda s: s.to_dict(), _summary_decode)
#: an export's text (the service streams it; the clients return it whole)
TEXT = Codec("text", lambda chunks: chunks, lambda data: data if isinstance(data, str) else str(data))

_FILTERS = ("q", "status", "job_type", "detector", "tag", "sort", "order")

ROUTES: Mapping[str, Route] = {r.name: r for r in (
    Route("register_job", "POST", "/v1/jobs", codec.JOB, JobRequest, status=201, fail_open=True),
    Route("list_jobs", "GET", "/v1/jobs", codec.many(codec.JOB), query=("status", "limit", "offset"), page="offset"),
    Route("status", "GET", "/v1/jobs/{job_id}", codec.JOB),
    Route("wait_decision", "GET", "/v1/jobs/{job_id}/decision", codec.JOB, query=("wait", "stopped")),
    Route("report", "POST", "/v1/jobs/{job_id}/reports", codec.under("decision", codec.DECISION), ReportRequest,
          fail_open=True),
    Route("reports", "GET", "/v1/jobs/{job_id}/reports", codec.many(codec.REPORT), query=("after_step", "limit"),
          page="after_step"),
    Route("stop", "POST", "/v1/jobs/{job_id}/stop", codec.JOB, ReasonRequest),
    Route("ack", "POST", "/v1/jobs/{job_id}/ack", codec.JOB, AckRequest, fail_open=True),
    Route("finish", "POST", "/v1/jobs/{job_id}/finish", codec.JOB, fail_open=True),
    Route("heartbeat", "POST", "/v1/jobs/{job_id}/heartbeat", codec.JOB, HeartbeatRequest),
    Route("fail", "POST", "/v1/jobs/{job_id}/fail", codec.JOB, ReasonRequest, fail_open=True),
    Route("publish_snapshot", "POST", "/v1/jobs/{job_id}/snapshots", codec.EVAL_TASK, SnapshotRequest,
          status=201, fail_open=True),
    Route("evals", "GET", "/v1/jobs/{job_id}/evals", codec.many(codec.EVAL_TASK), query=("after_step", "limit"),
          page="after_step", page_size=EVALS_PAGE),
    Route("claim_eval", "POST", "/v1/evals/claim", codec.optional(codec.EVAL_TASK), ClaimRequest),
    Route("post_eval", "POST", "/v1/jobs/{job_id}/evals/{step}", codec.under("decision", codec.DECISION),
          EvalResult),
    Route("record_event", "POST", "/v1/jobs/{job_id}/events", codec.nothing("recorded"),
          EventRequest, status=201),
    Route("audit", "GET", "/v1/audit", codec.many(codec.AUDIT), query=("job_id", "limit", "offset"), page="offset"),
    Route("browse_jobs", "GET", "/v1/runs", PAGE, query=(*_FILTERS, "limit", "after")),
    Route("export_jobs", "GET", "/v1/runs/export", TEXT, query=("format", *_FILTERS), text=True),
    Route("export_reports", "GET", "/v1/jobs/{job_id}/export", TEXT, query=("format",), text=True),
    Route("summary", "GET", "/v1/summary", SUMMARY),
    Route("delete_job", "POST", "/v1/jobs/{job_id}/delete", codec.JOB, ReasonRequest),
)}

#: every request record, as the routes name them (the codec test checks each one crosses the wire)
REQUESTS: tuple[type, ...] = tuple(dict.fromkeys(r.request for r in ROUTES.values() if r.request is not None))

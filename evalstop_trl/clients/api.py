"""The one client API: :class:`EvalStopAPI`, its typed methods declared once, over two transports.

A training job, a launcher or an evaluator talks to the coordinator through these methods, with
typed records in and out (:class:`~evalstop_trl.core.detectors.Decision`,
:class:`~evalstop_trl.core.records.JobView`, :class:`~evalstop_trl.core.records.Report`,
:class:`~evalstop_trl.core.records.EvalTask`, :class:`~evalstop_trl.core.records.AuditRecord`; never
dicts). Each method is one line: it names its route of :data:`~evalstop_trl.core.api.ROUTES`, and
:meth:`EvalStopAPI._call` builds the route's request record (:mod:`evalstop_trl.core.requests`) from
the arguments and hands both to the transport:

* :class:`~evalstop_trl.clients.http.EvalStopClient`: HTTP, derived from the route's row (fail-open,
  with the durable outbox);
* :class:`~evalstop_trl.clients.embedded.EmbeddedClient`: the in-process coordinator's method of the
  route's name, by keyword.

So a refusal raises the same core error from either (:class:`~evalstop_trl.core.errors.NotFound`,
:class:`~evalstop_trl.core.errors.Conflict`, :class:`~evalstop_trl.core.errors.InvalidInput`,
:class:`~evalstop_trl.core.errors.QuotaExceeded`, ...). Fail-open methods (``register_job``,
``report``, ``ack``, ``finish``, ``fail``, ``publish_snapshot``) of the HTTP client keep the call in
its outbox while the coordinator is unreachable: they then return None (``report``: a CONTINUE
decision saying so).
"""

from __future__ import annotations

import abc
from typing import Any

from ..core.api import MAX_WAIT_S, ROUTES, Route
from ..core.browse import JobPage
from ..core.detectors import Action, Decision
from ..core.records import AuditRecord, EvalTask, JobView, Report
from ..core.summary import TenantSummary

__all__ = ["EXPORT_TIMEOUT_S", "LOCAL_METHODS", "EvalStopAPI"]

EXPORT_TIMEOUT_S = 120.0  # an export streams up to a tenant's whole history
#: methods that never cross the wire (the outbox, the client's own resources)
LOCAL_METHODS = frozenset({"flush", "close"})
_KEPT = Decision(Action.CONTINUE, "coordinator unreachable: report kept in the outbox (fail-open)")


def _args(frame_locals: dict[str, Any]) -> dict[str, Any]:
    """A method's arguments by name (its ``locals()`` before anything else is bound)."""
    return {k: v for k, v in frame_locals.items() if k != "self"}


class EvalStopAPI(abc.ABC):
    """A tenant's client of the coordinator (every job id is the tenant's own)."""

    unreachable: bool = False  # the HTTP client is in an outage (always False in process)

    @property
    def pending(self) -> int:
        """Operations waiting in the outbox (0 in process)."""
        return 0

    @abc.abstractmethod
    def _send(self, route: Route, args: dict[str, Any], request: Any, timeout: float | None) -> Any:
        """The transport: call ``route`` with its path and query ``args`` and its ``request`` record."""

    def _call(self, name: str, args: dict[str, Any], timeout: float | None = None) -> Any:
        route = ROUTES[name]
        request = None
        if route.request is not None:  # keyword construction: the record's fields are the body
            request = route.request(**{k: args.pop(k) for k in route.body})
        return self._send(route, args, request, timeout)

    # ------------------------------------------------------------------ jobs
    def register_job(self, job_id: str, job_type: str | None = None, planned_steps: int | None = None,
                     policy: dict[str, Any] | None = None, webhook: str | None = None,
                     tags: dict[str, Any] | None = None, hparams: dict[str, Any] | None = None) -> JobView | None:
        """Register a job, or attach to it (a later registration fills in or changes what it says)."""
        return self._call("register_job", _args(locals()))

    def report(self, job_id: str, step: int, eval_score: float | None = None, train_loss: float | None = None,
               proxy_reward: float | None = None, checkpoint: str | None = None, eval_n: int | None = None,
               eval_noise: float | None = None, kl: float | None = None, length: float | None = None) -> Decision:
        """Record one eval and return the job's decision (CONTINUE while the coordinator is away).
        ``eval_n``, ``eval_noise``: the eval's per-example evidence (:mod:`evalstop_trl.core.examples`);
        ``kl``: the policy's KL to its reference model at this step (a KL-clock gate reads it);
        ``length``: the mean completion length (tokens) of the latest rollouts (a stop says how it
        moved since the best eval, :data:`evalstop_trl.core.logged.LENGTH_KEYS`)."""
        return self._call("report", _args(locals())) or _KEPT

    def ack(self, job_id: str, checkpoint: str | None = None, step: int | None = None) -> JobView | None:
        """Confirm a stop: the best checkpoint is safe and the job is stopping (at ``step``)."""
        return self._call("ack", _args(locals()))

    def finish(self, job_id: str) -> JobView | None:
        """Mark the job finished (it ran to its end)."""
        return self._call("finish", _args(locals()))

    def fail(self, job_id: str, reason: str = "") -> JobView | None:
        """Mark the job failed (its trainer crashed); fail-open like a report."""
        return self._call("fail", _args(locals()))

    def stop(self, job_id: str, reason: str = "") -> JobView:
        """Stop the job by hand (idempotent for a job already stopped)."""
        return self._call("stop", _args(locals()))

    def heartbeat(self, job_id: str, actor: str = "job") -> JobView:
        """Renew the job's lease (not kept in the outbox: a heartbeat is only worth sending now)."""
        return self._call("heartbeat", _args(locals()))

    def delete_job(self, job_id: str, reason: str = "") -> JobView:
        """Delete an ended job (stopped, finished, failed, lost) with its reports; audited."""
        return self._call("delete_job", _args(locals()))

    def record_event(self, job_id: str, kind: str, reason: str = "", exit_code: int | None = None) -> None:
        """Append a launcher event (``launcher_sigterm``, ``launcher_sigkill``, ``launcher_exit``) to the audit log."""
        return self._call("record_event", _args(locals()))

    # ------------------------------------------------------------------ reads
    def status(self, job_id: str) -> JobView:
        return self._call("status", _args(locals()))

    def wait_decision(self, job_id: str, wait_s: float = 30.0, stopped: bool = False) -> JobView:
        """Long poll: the job once it is no longer running (or stopped, with ``stopped``), or after ``wait_s``."""
        wait = min(max(wait_s, 0.0), MAX_WAIT_S)
        return self._call("wait_decision", {"job_id": job_id, "wait": wait, "stopped": stopped}, timeout=wait + 10)

    def list_jobs(self, status: str | None = None) -> list[JobView]:
        """Every job of the tenant (paging through the service's limit)."""
        return self._call("list_jobs", _args(locals()))

    def reports(self, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[Report]:
        """Stored reports in step order; every page unless ``limit`` is given."""
        return self._call("reports", _args(locals()))

    def audit(self, job_id: str | None = None) -> list[AuditRecord]:
        """The tenant's audit records (of one job with ``job_id``), oldest first, every page."""
        return self._call("audit", _args(locals()))

    def browse_jobs(self, q: str | None = None, status: str | None = None, job_type: str | None = None,
                    detector: str | None = None, tag: str | None = None, sort: str | None = None,
                    order: str | None = None, limit: int | None = None, after: str | None = None) -> JobPage:
        """One page of the tenant's runs (search, filters, sort); the next: ``after=page.next``."""
        return self._call("browse_jobs", _args(locals()))

    def summary(self) -> TenantSummary:
        """The tenant's name, its jobs by outcome and what its detectors' stops saved (steps, job-hours)."""
        return self._call("summary", {})

    def export_reports(self, job_id: str, format: str = "csv") -> str:  # noqa: A002 - the wire name
        """The job's reports as CSV or JSON text."""
        return self._call("export_reports", _args(locals()), timeout=EXPORT_TIMEOUT_S)

    def export_jobs(self, format: str = "csv", q: str | None = None, status: str | None = None,  # noqa: A002
                    job_type: str | None = None, detector: str | None = None, tag: str | None = None,
                    sort: str | None = None, order: str | None = None) -> str:
        """The tenant's runs that the filters match, in their order, as CSV or JSON text."""
        return self._call("export_jobs", _args(locals()), timeout=EXPORT_TIMEOUT_S)

    # ------------------------------------------------------------------ external evals
    def publish_snapshot(self, job_id: str, step: int, path: str, train_loss: float | None = None,
                         proxy_reward: float | None = None) -> EvalTask | None:
        """Queue a snapshot for external evaluators (fail-open: kept in the outbox during an outage)."""
        return self._call("publish_snapshot", _args(locals()))

    def claim_eval(self, worker: str, lease_s: float = 300.0) -> EvalTask | None:
        """Lease the oldest snapshot waiting for an eval (None if there is none)."""
        return self._call("claim_eval", _args(locals()))

    def post_eval(self, job_id: str, step: int, score: float | None, worker: str = "",
                  error: str | None = None, eval_n: int | None = None, eval_noise: float | None = None) -> Decision:
        """An evaluator's score for a snapshot (or ``score=None`` with ``error``, cut to 2,000 characters);
        ``eval_n``, ``eval_noise``: the score's per-example evidence."""
        return self._call("post_eval", {**_args(locals()), "error": error[:2000] if error else None})

    def evals(self, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[EvalTask]:
        """The job's snapshots in step order; every page unless ``limit`` is given."""
        return self._call("evals", _args(locals()))

    # ------------------------------------------------------------------ the client's own
    def flush(self) -> bool:
        """Try to send the outbox now; True if it is empty afterwards (always, in process)."""
        return True

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> EvalStopAPI:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

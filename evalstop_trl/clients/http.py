"""Clients: :class:`EvalStopClient` (HTTP, fail-open) and :class:`EmbeddedClient` (in process).

Both have the same methods and return the same types (:class:`~evalstop_trl.core.detectors.Decision`,
:class:`~evalstop_trl.core.records.JobView`). This module needs nothing of the coordinator but the
API's records.

The HTTP client never raises into a training loop because the coordinator is unreachable:

* each call retries connection errors and 5xx answers with exponential backoff;
* when the coordinator is still unreachable, fail-open operations (register, report, ack, finish)
  are appended to a durable outbox (a JSONL file, fsync'd) and the caller gets a CONTINUE decision;
  the outage is logged once, not at every step;
* during an outage the client probes at most every ``probe_interval_s`` seconds, so a training
  step never waits on timeouts again and again;
* when the coordinator answers again, the outbox is replayed in order (registrations first, then
  each job's reports in step order) before the new call, then cleared.

Contract errors (4xx) raise a :class:`ClientError` naming the method, URL, status and the server's
detail. Its subclass for the status is also the core's error class, so one ``except`` serves both
clients: 401 -> :class:`Unauthorized`, 404 -> :class:`NotFound`, 409 -> :class:`Conflict`,
422 -> :class:`InvalidInput`.

Example::

    client = EvalStopClient("http://127.0.0.1:8765", token, outbox="runs/a/evalstop-outbox.jsonl")
    client.register_job("run-a", "grpo", planned_steps=500)
    decision = client.report("run-a", step=50, eval_score=0.71)
    if decision.stop: ...
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ..core.detectors import Action, Decision
from ..core.errors import EvalStopError
from ..core.records import JobView, Report
from .outbox import Operation, Outbox
from .transport import ClientError, Transport, Unreachable

__all__ = ["ClientError", "EvalStopClient"]

log = logging.getLogger("evalstop.client")


class EvalStopClient:
    """HTTP client of ``evalstop serve``.

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
                try:
                    answer = self.transport.call("POST", e.path, e.body)
                    if e.op == "report":
                        last = answer
                except ClientError as exc:  # cannot succeed later either: drop it, say so
                    log.error("dropping queued %s for job %s: %s", e.op, e.job_id, exc)
                outbox.pop()
                sent += 1
        finally:
            if sent:
                outbox.save()
                log.warning("replayed %d queued operation(s) to %s", sent, self.url)
        return last

    def _fail_open(self, op: str, job_id: str, path: str, body: dict[str, Any] | None) -> Any:
        """Send now, or keep in the outbox. Only a refusal (4xx: a contract error) raises; nothing else
        that can go wrong here (network, outbox I/O, a bug) escapes into the training loop."""
        with self._lock:
            try:
                if self.outbox:
                    self._replay()
                return self.transport.call("POST", path, body)
            except ClientError:
                raise
            except Unreachable:
                self.outbox.append(Operation(op, job_id, path, body))
                return None
            except Exception:  # noqa: BLE001 - fail open, loudly
                log.exception("EvalStop client: unexpected error on %s %s; kept in the outbox (fail-open)", op, path)
                self.outbox.append(Operation(op, job_id, path, body))
                return None

    def flush(self) -> bool:
        """Try to send the outbox now; True if it is empty afterwards."""
        with self._lock:
            if self.outbox:
                try:
                    self._replay()
                except Unreachable:
                    pass
            return not self.outbox

    # ------------------------------------------------------------------ API
    def register_job(self, job_id: str, job_type: str = "rlhf", planned_steps: int | None = None,
                     policy: dict[str, Any] | None = None, webhook: str | None = None) -> JobView | None:
        body = {k: v for k, v in {"job_id": job_id, "job_type": job_type, "planned_steps": planned_steps,
                                  "policy": policy, "webhook": webhook}.items() if v is not None}
        answer = self._fail_open("register", job_id, "/v1/jobs", body)
        return JobView.from_dict(answer) if answer else None

    def report(self, job_id: str, step: int, eval_score: float | None = None, train_loss: float | None = None,
               proxy_reward: float | None = None, checkpoint: str | None = None) -> Decision:
        body = {k: v for k, v in {"step": step, "eval_score": eval_score, "train_loss": train_loss,
                                  "proxy_reward": proxy_reward, "checkpoint": checkpoint}.items() if v is not None}
        answer = self._fail_open("report", job_id, f"/v1/jobs/{job_id}/reports", body)
        if answer is None:
            return Decision(Action.CONTINUE, "coordinator unreachable: report kept in the outbox (fail-open)")
        d = answer["decision"]
        return Decision(Action(d["action"]), d["reason"], d.get("best_step"), d.get("best_score"))

    def ack(self, job_id: str, checkpoint: str | None = None, step: int | None = None) -> JobView | None:
        body = {k: v for k, v in {"checkpoint": checkpoint, "step": step}.items() if v is not None}
        answer = self._fail_open("ack", job_id, f"/v1/jobs/{job_id}/ack", body)
        return JobView.from_dict(answer) if answer else None

    def finish(self, job_id: str) -> JobView | None:
        answer = self._fail_open("finish", job_id, f"/v1/jobs/{job_id}/finish", None)
        return JobView.from_dict(answer) if answer else None

    def fail(self, job_id: str, reason: str = "") -> JobView | None:
        """Mark the job failed (its trainer crashed); fail-open like a report."""
        answer = self._fail_open("fail", job_id, f"/v1/jobs/{job_id}/fail", {"reason": reason})
        return JobView.from_dict(answer) if answer else None

    def _get(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            return self.transport.send(method, path, body)
        except Unreachable as exc:
            raise EvalStopError(f"{method} {self.url}{path}: coordinator unreachable ({exc})") from None

    def status(self, job_id: str) -> JobView:
        return JobView.from_dict(self._get("GET", f"/v1/jobs/{job_id}"))

    def list_jobs(self, status: str | None = None) -> list[JobView]:
        """Every job of the tenant (paging through the service's limit)."""
        out: list[JobView] = []
        while True:
            q = f"/v1/jobs?limit=1000&offset={len(out)}" + (f"&status={status}" if status else "")
            page = [JobView.from_dict(d) for d in self._get("GET", q)]
            out.extend(page)
            if len(page) < 1000:
                return out

    def stop(self, job_id: str, reason: str = "") -> JobView:
        return JobView.from_dict(self._get("POST", f"/v1/jobs/{job_id}/stop", {"reason": reason}))

    def publish_snapshot(self, job_id: str, step: int, path: str, train_loss: float | None = None,
                         proxy_reward: float | None = None) -> None:
        """Queue a snapshot for external evaluators (fail-open: kept in the outbox during an outage)."""
        body = {k: v for k, v in {"step": step, "path": path, "train_loss": train_loss,
                                  "proxy_reward": proxy_reward}.items() if v is not None}
        self._fail_open("snapshot", job_id, f"/v1/jobs/{job_id}/snapshots", body)

    def claim_eval(self, worker: str, lease_s: float = 300.0) -> dict[str, Any] | None:
        """Lease the oldest snapshot waiting for an eval (None if there is none)."""
        return self._get("POST", "/v1/evals/claim", {"worker": worker, "lease_s": lease_s}) or None

    def post_eval(self, job_id: str, step: int, score: float | None, worker: str = "",
                  error: str | None = None) -> Decision:
        body = {"score": score, "worker": worker, **({"error": error[:2000]} if error else {})}
        d = self._get("POST", f"/v1/jobs/{job_id}/evals/{step}", body)["decision"]
        return Decision(Action(d["action"]), d["reason"], d.get("best_step"), d.get("best_score"))

    def evals(self, job_id: str) -> list[dict[str, Any]]:
        return self._get("GET", f"/v1/jobs/{job_id}/evals")

    def wait_decision(self, job_id: str, wait_s: float = 30.0, stopped: bool = False) -> JobView:
        """Long poll: the job once it is no longer running (or stopped, with ``stopped``), or after ``wait_s``."""
        wait_s = min(max(wait_s, 0.0), 60.0)
        return JobView.from_dict(self.transport.send(
            "GET", f"/v1/jobs/{job_id}/decision?wait={wait_s:g}&stopped={'true' if stopped else 'false'}",
            timeout=wait_s + 10))

    def record_event(self, job_id: str, kind: str, reason: str = "", exit_code: int | None = None) -> None:
        """Append a launcher event (``launcher_sigterm``, ``launcher_sigkill``, ``launcher_exit``) to the audit log."""
        body = {"kind": kind, "reason": reason}
        if exit_code is not None:
            body["exit_code"] = exit_code
        self._get("POST", f"/v1/jobs/{job_id}/events", body)

    def reports(self, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[Report]:
        """Stored reports in step order; pages through the service's limit unless ``limit`` is given."""
        out: list[Report] = []
        while True:
            q = [f"limit={min(limit - len(out), 1000) if limit else 1000}"]
            if after_step is not None:
                q.append(f"after_step={after_step}")
            page = [Report(**r) for r in self._get("GET", f"/v1/jobs/{job_id}/reports?{'&'.join(q)}")]
            out.extend(page)
            if len(page) < 1000 or (limit is not None and len(out) >= limit):
                return out
            after_step = page[-1].step

    def audit(self, job_id: str | None = None) -> list[dict[str, Any]]:
        return self._get("GET", "/v1/audit" + (f"?job_id={job_id}" if job_id else ""))

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> EvalStopClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

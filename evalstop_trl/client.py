"""Clients: :class:`EvalStopClient` (HTTP, fail-open) and :class:`EmbeddedClient` (in process).

Both have the same methods and return the same types (:class:`~evalstop_trl.detectors.Decision`,
:class:`~evalstop_trl.coordinator.JobView`).

The HTTP client never raises into a training loop because the coordinator is unreachable:

* each call retries connection errors and 5xx answers with exponential backoff;
* when the coordinator is still unreachable, fail-open operations (register, report, ack, finish)
  are appended to a durable outbox (a JSONL file, fsync'd) and the caller gets a CONTINUE decision;
  the outage is logged once, not at every step;
* during an outage the client probes at most every ``probe_interval_s`` seconds, so a training
  step never waits on timeouts again and again;
* when the coordinator answers again, the outbox is replayed in order (registrations first, then
  each job's reports in step order) before the new call, then cleared.

Contract errors (4xx: bad token, bad input, conflicts) raise :class:`ClientError`, naming the
method, URL, status and the server's detail.

Example::

    client = EvalStopClient("http://127.0.0.1:8765", token, outbox="runs/a/evalstop-outbox.jsonl")
    client.register_job("run-a", "grpo", planned_steps=500)
    decision = client.report("run-a", step=50, eval_score=0.71)
    if decision.stop: ...
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from .coordinator import Coordinator, JobView
from .detectors import Action, Decision
from .errors import EvalStopError
from .models import Report

__all__ = ["ClientError", "EmbeddedClient", "EvalStopClient", "free_loopback_port", "wait_until_healthy"]

log = logging.getLogger("evalstop.client")

_FAIL_OPEN = {"register": 0, "report": 1, "ack": 2, "finish": 3}


class ClientError(EvalStopError):
    """The coordinator refused a request (4xx)."""

    def __init__(self, method: str, url: str, status: int, detail: str) -> None:
        super().__init__(f"{method} {url} -> {status}: {detail}")
        self.method, self.url, self.status_code, self.detail = method, url, status, detail


class _Unreachable(Exception):
    pass


class EvalStopClient:
    """HTTP client of ``evalstop serve``.

    Args:
        url: the coordinator, e.g. ``http://127.0.0.1:8765``.
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
        import httpx

        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, but got {url!r}.")
        if not token:
            raise ValueError("token is empty; create one with 'evalstop tenants add NAME'.")
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s), transport=transport,
        )
        self._httpx = httpx
        self.retries, self.backoff_s, self.probe_interval_s = retries, backoff_s, probe_interval_s
        self.outbox_path = Path(outbox) if outbox else None
        self._outbox: list[dict[str, Any]] = self._load_outbox()
        self._lock = threading.RLock()
        self.unreachable = False
        self._next_probe = 0.0

    # ------------------------------------------------------------------ outbox
    def _load_outbox(self) -> list[dict[str, Any]]:
        if not self.outbox_path or not self.outbox_path.exists():
            return []
        entries = []
        for line in self.outbox_path.read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("skipping a torn line in outbox %s", self.outbox_path)  # a crash mid-write
        return entries

    def _append_outbox(self, entry: dict[str, Any]) -> None:
        self._outbox.append(entry)
        if self.outbox_path:
            self.outbox_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.outbox_path, "a") as fh:
                fh.write(json.dumps(entry) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def _rewrite_outbox(self) -> None:
        if not self.outbox_path:
            return
        if not self._outbox:
            self.outbox_path.unlink(missing_ok=True)
            return
        tmp = self.outbox_path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write("".join(json.dumps(e) + "\n" for e in self._outbox))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.outbox_path)

    @property
    def pending(self) -> int:
        """Operations waiting in the outbox."""
        return len(self._outbox)

    # ------------------------------------------------------------------ transport
    def _send(self, method: str, path: str, body: dict[str, Any] | None = None, retries: int | None = None) -> Any:
        httpx = self._httpx
        attempts = 1 + (self.retries if retries is None else retries)
        last = ""
        for attempt in range(attempts):
            try:
                r = self._http.request(method, path, json=body)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if r.status_code < 400:
                    return r.json()
                if r.status_code < 500:
                    try:
                        detail = r.json().get("detail", r.text)
                    except ValueError:
                        detail = r.text
                    raise ClientError(method, f"{self.url}{path}", r.status_code, str(detail))
                last = f"HTTP {r.status_code}"
            if attempt + 1 < attempts:
                time.sleep(self.backoff_s * 2**attempt)
        raise _Unreachable(last)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request, honouring the outage back-off; raises _Unreachable."""
        now = time.monotonic()
        if self.unreachable and now < self._next_probe:
            raise _Unreachable("in back-off")
        try:
            result = self._send(method, path, body, retries=0 if self.unreachable else None)
        except _Unreachable as exc:
            if not self.unreachable:
                log.warning(
                    "EvalStop coordinator at %s is unreachable (%s); training continues (fail-open), reports are "
                    "kept in %s and replayed when it returns", self.url, exc,
                    self.outbox_path or "memory")
            self.unreachable = True
            self._next_probe = time.monotonic() + self.probe_interval_s
            raise
        if self.unreachable:
            self.unreachable = False
            log.warning("EvalStop coordinator at %s is reachable again", self.url)
        return result

    def _replay(self) -> Any:
        """Send the outbox in order; returns the last answer to a replayed report (or None)."""
        order = {}
        for e in self._outbox:
            order.setdefault(e["job_id"], len(order))
        # registrations first, then each job's operations in order: reports by step, then ack, finish
        self._outbox.sort(key=lambda e: (-1 if e["op"] == "register" else order[e["job_id"]],
                                         _FAIL_OPEN[e["op"]], (e.get("body") or {}).get("step", 0)))
        last = None
        sent = 0
        try:
            while self._outbox:
                e = self._outbox[0]
                try:
                    answer = self._call("POST", e["path"], e.get("body"))
                    if e["op"] == "report":
                        last = answer
                except ClientError as exc:  # cannot succeed later either: drop it, say so
                    log.error("dropping queued %s for job %s: %s", e["op"], e["job_id"], exc)
                self._outbox.pop(0)
                sent += 1
        finally:
            if sent:
                self._rewrite_outbox()
                log.warning("replayed %d queued operation(s) to %s", sent, self.url)
        return last

    def _fail_open(self, op: str, job_id: str, path: str, body: dict[str, Any] | None) -> Any:
        with self._lock:
            if self._outbox:
                try:
                    self._replay()
                except _Unreachable:
                    self._append_outbox({"op": op, "job_id": job_id, "path": path, "body": body})
                    return None
            try:
                return self._call("POST", path, body)
            except _Unreachable:
                self._append_outbox({"op": op, "job_id": job_id, "path": path, "body": body})
                return None

    def flush(self) -> bool:
        """Try to send the outbox now; True if it is empty afterwards."""
        with self._lock:
            if self._outbox:
                try:
                    self._replay()
                except _Unreachable:
                    pass
            return not self._outbox

    # ------------------------------------------------------------------ API
    def register_job(self, job_id: str, job_type: str = "rlhf", planned_steps: int | None = None,
                     policy: dict[str, Any] | None = None, pid: int | None = None,
                     pid_start_time: float | None = None, webhook: str | None = None) -> JobView | None:
        body = {k: v for k, v in {"job_id": job_id, "job_type": job_type, "planned_steps": planned_steps,
                                  "policy": policy, "pid": pid, "pid_start_time": pid_start_time,
                                  "webhook": webhook}.items() if v is not None}
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

    def ack(self, job_id: str, checkpoint: str | None = None) -> JobView | None:
        answer = self._fail_open("ack", job_id, f"/v1/jobs/{job_id}/ack",
                                 {"checkpoint": checkpoint} if checkpoint else {})
        return JobView.from_dict(answer) if answer else None

    def finish(self, job_id: str) -> JobView | None:
        answer = self._fail_open("finish", job_id, f"/v1/jobs/{job_id}/finish", None)
        return JobView.from_dict(answer) if answer else None

    def _get(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            return self._send(method, path, body)
        except _Unreachable as exc:
            raise EvalStopError(f"{method} {self.url}{path}: coordinator unreachable ({exc})") from None

    def status(self, job_id: str) -> JobView:
        return JobView.from_dict(self._get("GET", f"/v1/jobs/{job_id}"))

    def list_jobs(self) -> list[JobView]:
        return [JobView.from_dict(d) for d in self._get("GET", "/v1/jobs")]

    def stop(self, job_id: str, reason: str = "") -> JobView:
        return JobView.from_dict(self._get("POST", f"/v1/jobs/{job_id}/stop", {"reason": reason}))

    def reports(self, job_id: str) -> list[Report]:
        return [Report(**r) for r in self._get("GET", f"/v1/jobs/{job_id}/reports")]

    def audit(self) -> list[dict[str, Any]]:
        return self._get("GET", "/v1/audit")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EvalStopClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EmbeddedClient:
    """The same interface over an in-process :class:`Coordinator` (no HTTP)."""

    unreachable = False
    pending = 0

    def __init__(self, coordinator: Coordinator, tenant: str = "local") -> None:
        self.coordinator, self.tenant = coordinator, tenant

    def register_job(self, job_id: str, job_type: str = "rlhf", planned_steps: int | None = None,
                     policy: dict[str, Any] | None = None, pid: int | None = None,
                     pid_start_time: float | None = None, webhook: str | None = None) -> JobView:
        return self.coordinator.register_job(self.tenant, job_id, job_type, planned_steps, policy, pid,
                                             pid_start_time, webhook)[0]

    def report(self, job_id: str, step: int, eval_score: float | None = None, train_loss: float | None = None,
               proxy_reward: float | None = None, checkpoint: str | None = None) -> Decision:
        return self.coordinator.report(self.tenant, job_id, step, eval_score, train_loss, proxy_reward, checkpoint)

    def ack(self, job_id: str, checkpoint: str | None = None) -> JobView:
        return self.coordinator.ack(self.tenant, job_id, checkpoint)

    def finish(self, job_id: str) -> JobView:
        return self.coordinator.finish(self.tenant, job_id)

    def status(self, job_id: str) -> JobView:
        return self.coordinator.status(self.tenant, job_id)

    def list_jobs(self) -> list[JobView]:
        return self.coordinator.list_jobs(self.tenant)

    def stop(self, job_id: str, reason: str = "") -> JobView:
        return self.coordinator.stop(self.tenant, job_id, reason)

    def reports(self, job_id: str) -> list[Report]:
        return self.coordinator.reports(self.tenant, job_id)

    def audit(self) -> list[dict[str, Any]]:
        return [a.to_dict() for a in self.coordinator.audit(self.tenant)]

    def flush(self) -> bool:
        return True

    def close(self) -> None:
        self.coordinator.close()


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for starting a local `evalstop serve`)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_healthy(url: str, timeout_s: float = 30.0, process: Any = None) -> bool:
    """Poll ``url/healthz`` until it answers 200 (True) or ``timeout_s`` passes or ``process``, a
    ``subprocess.Popen`` of the server, exits (False)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return False
        try:
            if httpx.get(url.rstrip("/") + "/healthz", timeout=0.5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False

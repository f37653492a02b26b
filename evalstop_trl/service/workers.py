"""Background workers of the service: enforcement by signal, and webhooks.

Workers are built and started in the app's lifespan (never when the app is built) and stopped
when it shuts down; each subscribes to the coordinator's stops while it runs.

Enforcement only ever signals a process that registered itself: the job's registration carries its
pid *and* its start time (from ``/proc/<pid>/stat``), and the enforcer checks both before each
signal, so a reused pid is never signalled. SIGTERM goes out ``grace_s`` seconds after a STOP that
was not acknowledged; SIGKILL after a second ``grace_s`` if the process is still alive (the
:class:`~evalstop_trl.core.records.Escalation` lifecycle). Every signal and every webhook delivery
is written to the audit log. Linux only (``/proc``).
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..clients.local import process_start_time
from ..core.coordinator import Coordinator
from ..core.detectors import Decision
from ..core.errors import NotFound
from ..core.records import AuditKind, Escalation, JobRecord

__all__ = ["Enforcer", "WebhookSender", "Worker"]

log = logging.getLogger("evalstop")


class Worker:
    """A background worker: :meth:`start` subscribes and starts threads; :meth:`close` stops them."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self._running = False

    def start(self) -> None:
        self.coordinator.add_stop_listener(self.on_stop)
        self._running = True

    def close(self) -> None:
        self.coordinator.remove_stop_listener(self.on_stop)
        self._running = False

    @property
    def alive(self) -> bool:
        return self._running

    def on_stop(self, job: JobRecord, decision: Decision) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


_SIGNALS = {Escalation.SIGTERM: (signal.SIGTERM, AuditKind.SIGTERM), Escalation.SIGKILL: (signal.SIGKILL, AuditKind.SIGKILL)}


class Enforcer(Worker):
    """Escalates unacknowledged stops of enforced jobs: SIGTERM, then SIGKILL."""

    def __init__(self, coordinator: Coordinator, clock: Callable[[], float] = time.monotonic,
                 on_signal: Callable[[str], None] | None = None) -> None:
        super().__init__(coordinator)
        self.clock = clock
        self.on_signal = on_signal
        self._heap: list[tuple[float, int, str, str, Escalation]] = []
        self._seq = 0
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="evalstop-enforcer", daemon=True)

    def start(self) -> None:
        self._thread.start()
        super().start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def on_stop(self, job: JobRecord, decision: Decision) -> None:
        if job.policy.enforce and job.pid is not None:
            self._schedule(job.policy.grace_s, job.tenant, job.job_id, Escalation.GRACE.to(Escalation.SIGTERM))

    def _schedule(self, delay: float, tenant: str, job_id: str, stage: Escalation) -> None:
        with self._cv:
            self._seq += 1
            heapq.heappush(self._heap, (self.clock() + delay, self._seq, tenant, job_id, stage))
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (not self._heap or self._heap[0][0] > self.clock()):
                    self._cv.wait(None if not self._heap else max(0.0, self._heap[0][0] - self.clock()))
                if self._closed:
                    return
                _, _, tenant, job_id, stage = heapq.heappop(self._heap)
            try:
                self._act(tenant, job_id, stage)
            except Exception:  # noqa: BLE001 - the enforcer must outlive any one job
                log.exception("enforcement of %s/%s failed", tenant, job_id)

    def _act(self, tenant: str, job_id: str, stage: Escalation) -> None:
        try:
            job = self.coordinator.record(tenant, job_id)
        except NotFound:
            return
        if stage is Escalation.SIGTERM and job.acked_at is not None:
            return  # the job acknowledged in time: cooperative stop
        started = process_start_time(job.pid)
        if started is None:
            return  # already gone
        sig, kind = _SIGNALS[stage]
        if job.pid_start_time is None or abs(started - job.pid_start_time) > 1e-6:
            self.coordinator.record_event(
                tenant, job_id, kind, f"not sent: pid {job.pid} is not the process that registered "
                "(start time differs)", {"pid": job.pid, "sent": False})
            return
        os.kill(job.pid, sig)
        grace = job.policy.grace_s
        self.coordinator.record_event(
            tenant, job_id, kind,
            f"{sig.name} sent to pid {job.pid}: stop not acknowledged within {grace:g} s"
            if stage is Escalation.SIGTERM else f"SIGKILL sent to pid {job.pid}: still alive {grace:g} s after SIGTERM",
            {"pid": job.pid, "sent": True, "grace_s": grace})
        log.warning("%s sent to %s/%s (pid %d)", sig.name, tenant, job_id, job.pid)
        if self.on_signal:
            self.on_signal(sig.name)
        if stage is Escalation.SIGTERM:
            self._schedule(grace, tenant, job_id, stage.to(Escalation.SIGKILL))

    def close(self) -> None:
        super().close()
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class WebhookSender(Worker):
    """POSTs a JSON notice to a job's webhook on stop, with retries, from a bounded pool of threads;
    results go to the audit log."""

    def __init__(self, coordinator: Coordinator, attempts: int = 3, backoff_s: float = 0.5,
                 timeout_s: float = 5.0, max_workers: int = 8) -> None:
        super().__init__(coordinator)
        self.attempts, self.backoff_s, self.timeout_s = attempts, backoff_s, timeout_s
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="evalstop-webhook")

    def on_stop(self, job: JobRecord, decision: Decision) -> None:
        if job.webhook:
            self._pool.submit(self._send, job, decision)

    def close(self) -> None:
        super().close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _send(self, job: JobRecord, decision: Decision) -> None:
        import httpx

        body = json.dumps({"event": "stop", "tenant": job.tenant, "job_id": job.job_id,
                           "decision": decision.to_dict()})
        error = ""
        for attempt in range(1, self.attempts + 1):
            try:
                r = httpx.post(job.webhook, content=body, headers={"content-type": "application/json"},
                               timeout=self.timeout_s)
                if r.status_code < 300:
                    self.coordinator.record_event(job.tenant, job.job_id, AuditKind.WEBHOOK,
                                                  f"webhook delivered (HTTP {r.status_code})",
                                                  {"url": job.webhook, "attempt": attempt})
                    return
                error = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            time.sleep(self.backoff_s * 2 ** (attempt - 1))
        self.coordinator.record_event(job.tenant, job.job_id, AuditKind.WEBHOOK_FAILED,
                                      f"webhook failed after {self.attempts} attempts: {error}",
                                      {"url": job.webhook})

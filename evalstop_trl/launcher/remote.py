"""Stops for jobs that run elsewhere (a Ray job, a Slurm job), delivered by a watcher outside them.

The service still signals nothing. A watcher holds the tenant's token and, for one EvalStop job:

1. registers it (or attaches to it), and sends heartbeats for it while the remote job runs
   (:class:`~.watch.JobWatch`, actor ``launcher``; outages never touch the remote job);
2. follows the remote job's state (:class:`RemoteJob`: the backend's own API or commands);
3. on a stop: a job that acknowledged it (its callback is saving) gets ``grace_s`` to end on its
   own; one that did not acknowledge within :data:`ACK_WINDOW_S` (or did not end in time) is stopped
   through the backend: **first** it re-reads who owns the remote job and refuses a mismatch (logged,
   recorded in the ``launcher_exit`` line, exit status 2, nothing sent), then asks for a graceful stop
   (Ray: ``stop_job``, SIGTERM to the entrypoint's tree; Slurm: ``scancel --signal=TERM --full``),
   and ``grace_s`` later for a forced one where the backend does not escalate by itself (Slurm:
   ``scancel``; Ray sends SIGKILL itself after ``RAY_JOB_STOP_WAIT_TIME_S``, set to ``grace_s`` at
   submission). Each request is a ``launcher_sigterm`` / ``launcher_sigkill`` audit line;
4. when the remote job ends, writes ``launcher_exit`` and settles the EvalStop job: finished when it
   succeeded, failed when it failed, left to its lease when something else stopped or removed it.

Exit status: 0 (or ``stopped_exit_code``) when EvalStop stopped the job; 0 when it succeeded; 1 when it
failed or was stopped outside EvalStop; 2 when a stop was refused (not this tenant's or user's job);
3 when the backend still reported the job running after the stop requests and their grace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from ..clients.api import EvalStopAPI
from .link import JobLink
from .watch import JobWatch, log_text

__all__ = ["ACK_WINDOW_S", "RemoteJob", "RemoteRefused", "RemoteResult", "RemoteState", "RemoteStatus", "RemoteWatcher"]

log = logging.getLogger("evalstop.launcher")

#: after a stop: how long a job has to acknowledge it (its callback is then saving) before it is stopped
ACK_WINDOW_S = 5.0
_TICK_S, _STOPPING_TICK_S = 1.0, 0.25  # how often the remote job's state is read: idle, while stopping
_SETTLE_S = 10.0  # after the forced stop: how long to wait for the backend to report the end
_RETRY_S = 2.0  # a stop request that failed (the backend did not answer) is sent again after this
EXIT_REFUSED = 2
EXIT_STILL_RUNNING = 3  # the stop was asked for and the backend still reports the job running


class RemoteRefused(Exception):
    """The backend refused a stop request for good (not this user's job, say): not retried."""


class RemoteState(str, Enum):
    """A remote job's state, as the backends' states map onto it."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # cancelled or stopped (by this watcher or anyone else)
    GONE = "gone"  # the backend no longer knows the job

    @property
    def ended(self) -> bool:
        return self not in (RemoteState.PENDING, RemoteState.RUNNING)


@dataclass(frozen=True, slots=True)
class RemoteStatus:
    """One reading of a remote job: its state and the backend's own words for it."""

    state: RemoteState
    detail: str = ""


class RemoteJob(Protocol):
    """What a watcher needs of a backend (:mod:`.ray_jobs`, :mod:`.slurm`)."""

    #: how the job is named in log and audit lines: ``Ray job j1``, ``Slurm job 12``
    label: str
    #: True when the backend forces the stop by itself after its graceful one (no :meth:`kill`)
    escalates: bool

    def status(self) -> RemoteStatus:
        """Its state now (raises when the backend cannot be asked: the watcher retries)."""

    def refusal(self, job_id: str, tenant: str) -> str | None:
        """Why this watcher must not stop it for EvalStop job ``job_id`` of ``tenant`` (None: it may;
        raises when the owner cannot be read now: asked again)."""

    def terminate(self) -> str:
        """Ask for a graceful stop; what was asked (:class:`RemoteRefused` for a refusal, any other
        exception when the backend did not answer)."""

    def kill(self) -> str:
        """Ask for a forced stop (as :meth:`terminate`)."""


@dataclass(frozen=True, slots=True)
class RemoteResult:
    """How a watch ended: the exit status, whether EvalStop stopped the job, the stop requests sent
    ("sigterm", "sigkill"), the remote job's last state, and a refusal's reason."""

    exit_status: int
    stop_seen: bool
    escalations: tuple[str, ...]
    final: RemoteStatus
    refused: str = ""


class RemoteWatcher:
    """Watch one remote job for one EvalStop job (see the module docstring).

    Args:
        client: the API (the tenant's token).
        link: the job's registration (:class:`~.link.JobLink`; registered already or not).
        remote: the backend's job.
        grace_s: seconds between the graceful and the forced stop, and an acknowledged job's time to end.
        confirmed: the registration was confirmed (else the watch retries it).
        tenant: the tenant the token speaks for, where known (else asked for when a stop needs it).
        ack_window_s: after a stop, how long an unacknowledged job is left alone (:data:`ACK_WINDOW_S`).
    """

    def __init__(self, client: EvalStopAPI, link: JobLink, remote: RemoteJob, *, grace_s: float = 30.0,
                 confirmed: bool = True, tenant: str | None = None, poll_s: float = 5.0,
                 heartbeat_s: float | None = 60.0, stopped_exit_code: int = 0, ack_window_s: float = ACK_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 <= grace_s <= 86_400:
            raise ValueError(f"grace_s must be in [0, 86400] seconds, but got {grace_s!r}.")
        self.client, self.link, self.remote, self.grace_s = client, link, remote, grace_s
        self.confirmed, self.tenant, self.poll_s, self.heartbeat_s = confirmed, tenant, poll_s, heartbeat_s
        self.stopped_exit_code, self.ack_window_s, self.clock = stopped_exit_code, ack_window_s, clock
        self._sent: list[str] = []
        self._unreadable = self._troubles = 0

    def run(self) -> RemoteResult:
        """Watch until the remote job ends (or a stop is refused)."""
        watch = JobWatch(self.client, self.link.job_id, poll_s=self.poll_s, heartbeat_s=self.heartbeat_s,
                         register=None if self.confirmed else self.link.register_deferred, clock=self.clock).start()
        try:
            return self._loop(watch)
        finally:
            watch.close(timeout=0.5)

    def _loop(self, watch: JobWatch) -> RemoteResult:
        seen_at = acked_at = None
        next_at = retry_at = 0.0
        last = RemoteStatus(RemoteState.PENDING)
        while True:
            now = self.clock()
            last = self._status(last)
            if last.state.ended:
                return self._finish(last, watch.state.stopped or seen_at is not None)
            state = watch.state
            if state.stopped and seen_at is None:
                seen_at = now
                log.warning("%s: job %s stopped (%s); stopping %s", self.link.who, log_text(self.link.job_id),
                            log_text(state.reason), self.remote.label)
            if seen_at is not None and state.acked and acked_at is None and not self._sent:
                acked_at = now  # its callback is saving: it gets grace_s to end on its own
            if seen_at is not None and not self._sent:
                due = acked_at + self.grace_s if acked_at is not None else seen_at + self.ack_window_s
                if now >= max(due, retry_at):
                    refused = self._owner_check()  # nothing is sent before the owner is known to be right
                    if refused == "":
                        refused = self._request("sigterm", self.remote.terminate)
                    if refused:
                        return self._refuse(refused, last)
                    if self._sent:
                        next_at = now + self.grace_s + (_SETTLE_S if self.remote.escalates else 0.0)
                    else:
                        retry_at = now + _RETRY_S
            elif self._sent and now >= next_at:
                if self._sent[-1] == "sigterm" and not self.remote.escalates:
                    refused = self._request("sigkill", self.remote.kill)
                    if refused:
                        return self._refuse(refused, last)
                    next_at = now + (_SETTLE_S if self._sent[-1] == "sigkill" else _RETRY_S)
                else:
                    log.error("%s: %s still %s %g s after its stop was asked for; giving up on it", self.link.who,
                              self.remote.label, last.state.value, now - seen_at)
                    return self._finish(last, True, gave_up=True)
            time.sleep(_STOPPING_TICK_S if seen_at is not None else _TICK_S)

    def _status(self, last: RemoteStatus) -> RemoteStatus:
        try:
            status = self.remote.status()
        except Exception as exc:  # noqa: BLE001 - the backend is down or slow: keep watching
            if self._unreadable == 0:
                log.warning("%s: cannot read %s's state (%s: %s); retrying", self.link.who, self.remote.label,
                            type(exc).__name__, log_text(exc, 300))
            self._unreadable += 1
            return RemoteStatus(last.state if not last.state.ended else RemoteState.RUNNING, last.detail)
        self._unreadable = 0
        return status

    def _owner_check(self) -> str | None:
        """"" when the remote job may be stopped for this job and tenant, a refusal's reason, or None
        when that cannot be told now (the token's tenant or the job's owner could not be read: logged,
        asked again after ``_RETRY_S``)."""
        try:
            if not self.tenant:
                self.tenant = self.client.summary().tenant or None
                if self.tenant is None:
                    raise LookupError("the coordinator names no tenant for this token")
            refused = self.remote.refusal(self.link.job_id, self.tenant) or ""
        except Exception as exc:  # noqa: BLE001 - asked again: an owner not read is never taken as ours
            self._trouble("cannot check who owns", exc)
            return None
        self._troubles = 0
        return refused

    def _trouble(self, what: str, exc: BaseException) -> None:
        """A failed call to the coordinator or the backend while stopping: logged once per outage."""
        if self._troubles == 0:
            log.warning("%s: %s %s (%s: %s); asking again every %g s", self.link.who, what, self.remote.label,
                        type(exc).__name__, log_text(exc, 300), _RETRY_S)
        self._troubles += 1

    def _refuse(self, why: str, last: RemoteStatus) -> RemoteResult:
        reason = f"stop not delivered to {self.remote.label}: {why}"
        log.error("%s: %s", self.link.who, log_text(reason, 2000))
        self.link.event("launcher_exit", reason, EXIT_REFUSED, tries=3)
        return RemoteResult(EXIT_REFUSED, True, tuple(self._sent), last, why)

    def _request(self, stage: str, ask: Callable[[], str]) -> str | None:
        """Send one stop request; a definite refusal's reason (:class:`RemoteRefused`), else None (sent,
        or a transient failure that is logged and retried)."""
        try:
            asked = ask()
        except RemoteRefused as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - the backend is down: said, and retried
            self._trouble("could not stop", exc)
            return None
        self._troubles = 0
        self._sent.append(stage)
        log.warning("%s: %s", self.link.who, log_text(asked, 2000))
        self.link.event(f"launcher_{stage}", asked)
        return None

    def _finish(self, final: RemoteStatus, stopped: bool, gave_up: bool = False) -> RemoteResult:
        reason = f"{self.remote.label} ended: {final.state.value}" + (f" ({final.detail})" if final.detail else "")
        view = self.link.status() if not stopped else None
        stopped = stopped or (view is not None and view.status == "stopped")
        if gave_up:
            status = EXIT_STILL_RUNNING
            reason = (f"{self.remote.label} still {final.state.value} after its stop was asked for "
                      f"({', '.join(self._sent)}): the watcher gave up on it")
        elif stopped:
            status = self.stopped_exit_code
        elif final.state is RemoteState.SUCCEEDED:
            status = 0
        else:
            status = 1
            if final.state in (RemoteState.STOPPED, RemoteState.GONE):
                reason += "; stopped outside EvalStop: left to its lease"
        self.link.event("launcher_exit", reason, status, tries=3)
        if not stopped and final.state in (RemoteState.SUCCEEDED, RemoteState.FAILED) and (
                view is None or view.status in ("pending", "running", "lost")):
            self.link.settle(0 if final.state is RemoteState.SUCCEEDED else 1, reason)
        return RemoteResult(status, stopped, tuple(self._sent), final)

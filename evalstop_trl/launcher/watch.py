"""The launcher's view of its job: a thread that long-polls the decision and sends heartbeats.

Everything the coordinator says is checked before it is believed, and nothing it does (no answer, an
error, a malformed answer: ``{}``, HTML, an unknown action, a list) stops the thread or the child:
the thread backs off (0.5 s doubling to 30 s), keeps the last good state, logs the outage once, and
tries again (fail-open). A stop once seen stays seen.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..clients.api import EvalStopAPI
from ..core.errors import EvalStopError
from ..core.records import JobStatus, JobView

__all__ = ["JobWatch", "WatchState", "checked_view", "log_text"]

log = logging.getLogger("evalstop.launcher")

_STATUSES = frozenset(s.value for s in JobStatus)
_BACKOFF_S, _BACKOFF_MAX_S = 0.5, 30.0
_ACK_POLL_S = 0.25  # after a stop: how often to look for the child's acknowledgement
_FAILED = object()


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\\\\]")  # what could forge a line (and the escape)


def log_text(text: object, limit: int = 500) -> str:
    """Tenant text (a reason, a job id) fit for one log line: control characters, line separators and
    backslashes escaped, so it cannot forge lines; printable text stays as it is ("0.7 → 0.6")."""
    s = str(text)
    s = s if len(s) <= limit else s[:limit] + "..."
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), s)


def checked_view(answer: object) -> JobView | None:
    """``answer`` if it is a well-formed job view, else None (and the caller keeps what it knew)."""
    if not isinstance(answer, JobView) or not isinstance(answer.status, str) or answer.status not in _STATUSES:
        return None
    if not isinstance(answer.acked, bool):
        return None
    decision = answer.decision
    if decision is not None and not isinstance(getattr(decision, "reason", None), str):
        return None
    return answer


@dataclass(frozen=True, slots=True)
class WatchState:
    """What the launcher knows of its job (the last good answer)."""

    stopped: bool = False
    reason: str = ""
    acked: bool = False
    reachable: bool = True


class JobWatch:
    """Watch one job from a daemon thread (see the module docstring).

    Args:
        client: the API.
        job_id: the job.
        register: a registration the coordinator has not confirmed yet (it was kept in the client's
            outbox, or the answer was malformed): called again with backoff until it answers a job view
            or refuses (the job then exists in some form); the view's job is the one watched from then
            on (an ended job's next run).
        poll_s: longest long poll.
        heartbeat_s: seconds between heartbeats (None: none).
        clock: monotonic seconds.
    """

    def __init__(self, client: EvalStopAPI, job_id: str, *, poll_s: float = 5.0, heartbeat_s: float | None = 60.0,
                 register: Callable[[], object] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.job_id, self.poll_s, self.heartbeat_s, self.clock = client, job_id, poll_s, heartbeat_s, clock
        self._register = register
        self._state = WatchState()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._failures = 0
        self._thread = threading.Thread(target=self._loop, name=f"evalstop-watch-{job_id}", daemon=True)

    @property
    def state(self) -> WatchState:
        with self._lock:
            return self._state

    def start(self) -> JobWatch:
        self._thread.start()
        return self

    def close(self, timeout: float = 1.0) -> None:
        """Stop watching (a long poll in flight is abandoned after ``timeout``; the thread is a daemon)."""
        self._done.set()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        next_beat = self.clock()
        while not self._done.is_set():
            try:
                if self._register is not None:
                    if not self._registered():
                        self._done.wait(self._backoff())
                        continue
                if self.heartbeat_s is not None and self.clock() >= next_beat:
                    beat = self._call("heartbeat", lambda: self.client.heartbeat(self.job_id, actor="launcher"))
                    next_beat = self.clock() + (self.heartbeat_s if beat is not _FAILED
                                                else min(self.heartbeat_s, self._backoff()))
                self._poll(next_beat)
            except Exception:  # noqa: BLE001 - a bug here must not end the watch
                log.exception("evalstop run: unexpected error while watching job %s; still watching",
                              log_text(self.job_id))
                self._done.wait(self._backoff())

    def _registered(self) -> bool:
        register = self._register
        try:
            view = checked_view(register())
        except EvalStopError as exc:
            log.warning("evalstop run: the coordinator refused to register job %s again: %s", log_text(self.job_id),
                        log_text(exc, 300))
            view = exc
        except Exception:  # noqa: BLE001 - a malformed answer: not registered yet
            view = None
        if view is None:
            self._failures += 1
            return False
        if isinstance(view, JobView) and view.job_id != self.job_id:
            self.job_id = view.job_id  # the job had ended: this launch is its next run (JobLink.register_deferred)
        self._register = None
        return True

    def _until(self, next_beat: float, cap: float) -> float:
        return cap if self.heartbeat_s is None else min(cap, max(0.0, next_beat - self.clock()))

    def _poll(self, next_beat: float) -> None:
        state = self.state
        if state.stopped and state.acked:  # nothing more to learn: only heartbeats are left to send
            self._done.wait(self._until(next_beat, self.poll_s))
            return
        wait_s = 0.0 if state.stopped else self._until(next_beat, self.poll_s)
        view = self._call("wait_decision", lambda: self._view(wait_s))
        if view is _FAILED:
            self._done.wait(self._backoff())
            return
        self._update(view)
        if state.stopped:
            self._done.wait(_ACK_POLL_S)

    def _view(self, wait_s: float) -> JobView:
        answer = self.client.wait_decision(self.job_id, wait_s, stopped=True)
        view = checked_view(answer)
        if view is None:
            raise ValueError(f"malformed answer {log_text(repr(answer), 200)}")
        return view

    def _update(self, view: JobView) -> None:
        with self._lock:
            s = self._state
            if view.status == JobStatus.STOPPED.value and not s.stopped:
                reason = view.decision.reason if view.decision is not None else "stopped"
                self._state = WatchState(True, reason, view.acked, True)
            elif s.stopped:
                self._state = WatchState(True, s.reason, s.acked or view.acked, True)

    def _call(self, what: str, fn: Callable[[], object]) -> object:
        """Run one API call: its answer, or ``_FAILED``. Logs the first failure of an outage and the
        recovery, nothing in between."""
        try:
            answer = fn()
        except Exception as exc:  # noqa: BLE001 - fail-open: no answer, a refusal or garbage alike
            if self._done.is_set():
                return _FAILED
            if self._failures == 0:
                log.warning("evalstop run: no usable answer from the coordinator to %s for job %s (%s: %s); "
                            "the job keeps running, retrying with backoff", what, log_text(self.job_id),
                            type(exc).__name__, log_text(exc, 300))
            self._failures += 1
            self._set_reachable(False)
            return _FAILED
        if self._failures:
            log.warning("evalstop run: the coordinator answers again (after %d failed call(s))", self._failures)
            self._failures = 0
            self._set_reachable(True)
        return answer

    def _set_reachable(self, reachable: bool) -> None:
        with self._lock:
            s = self._state
            self._state = WatchState(s.stopped, s.reason, s.acked, reachable)

    def _backoff(self) -> float:
        return min(_BACKOFF_MAX_S, _BACKOFF_S * 2 ** max(0, min(self._failures - 1, 16)))

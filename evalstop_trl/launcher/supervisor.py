"""The launcher: start a command as a child in a new process group, watch its job's decision, and
escalate a stop the child does not honour.

1. The job is registered (or, if it exists with the same registration, attached to).
2. The command starts in a new session (its own process group) with ``EVALSTOP_URL``,
   ``EVALSTOP_TOKEN`` and ``EVALSTOP_JOB_ID`` in its environment, so an ``EvalStopCallback`` in it
   reports to the same job.
3. The launcher long-polls the job's decision. After a STOP, the child has ``grace_s`` seconds to
   acknowledge it (and ``grace_s`` more to exit after its acknowledgement); then the launcher sends
   SIGTERM to the child's process group and, ``grace_s`` later, SIGKILL (the
   :class:`~evalstop_trl.core.records.Escalation` lifecycle). Each escalation and the child's exit are
   written to the job's audit log through the API.
4. SIGINT and SIGTERM sent to the launcher are forwarded to the child's process group.
5. When the child exits, a job that is still running is marked finished (exit status 0) or failed
   (any other status); the launcher exits with the child's status (128 + N for a signal N).

A coordinator that cannot be reached never stops the child: the launcher keeps polling.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.api import EvalStopAPI
from ..core.errors import EvalStopError
from ..core.records import Escalation

__all__ = ["LaunchResult", "Launcher", "child_exit_status"]

log = logging.getLogger("evalstop.launcher")

_ESCALATION_SIGNALS = {Escalation.SIGTERM: signal.SIGTERM, Escalation.SIGKILL: signal.SIGKILL}


def child_exit_status(returncode: int) -> int:
    """A shell's exit status for a child's ``returncode`` (a signal N gives 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class LaunchResult:
    exit_status: int
    stop_seen: bool
    escalations: tuple[str, ...]  # "sigterm", "sigkill" as sent


class Launcher:
    """Run one command for one job (see the module docstring).

    Args:
        client: an :class:`~evalstop_trl.core.api.EvalStopAPI` (it calls ``register_job``,
            ``wait_decision``, ``record_event``, ``status``, ``finish``, ``fail``).
        job_id, job_type, planned_steps, policy: the job's registration.
        grace_s: seconds a stopped child has to acknowledge (and then to exit) before SIGTERM, and
            between SIGTERM and SIGKILL.
        url, token: exported to the child.
    """

    def __init__(self, client: EvalStopAPI, job_id: str, *, url: str, token: str, grace_s: float = 30.0,
                 job_type: str = "rlhf", planned_steps: int | None = None, policy: Mapping[str, Any] | None = None,
                 poll_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 <= grace_s <= 86_400:
            raise ValueError(f"grace_s must be in [0, 86400] seconds, but got {grace_s!r}.")
        self.client, self.job_id, self.url, self.token = client, job_id, url, token
        self.grace_s, self.job_type, self.planned_steps = grace_s, job_type, planned_steps
        self.policy = dict(policy) if policy else None
        self.poll_s, self.clock = poll_s, clock
        self._child: subprocess.Popen | None = None

    # ------------------------------------------------------------------ the child
    def _start(self, argv: Sequence[str], env: Mapping[str, str] | None) -> subprocess.Popen:
        child_env = dict(os.environ if env is None else env)
        child_env.update({"EVALSTOP_URL": self.url, "EVALSTOP_TOKEN": self.token, "EVALSTOP_JOB_ID": self.job_id})
        return subprocess.Popen(list(argv), env=child_env, start_new_session=True)

    def _signal_group(self, sig: int) -> None:
        child = self._child
        if child is None or child.poll() is not None:
            return
        try:
            os.killpg(child.pid, sig)  # the child leads its own session, so its pgid is its pid
        except ProcessLookupError:
            pass

    def _forward(self, signum: int, frame: Any) -> None:
        log.warning("evalstop run: forwarding %s to the job's process group", signal.Signals(signum).name)
        self._signal_group(signum)

    # ------------------------------------------------------------------ the API (fail-open)
    def _event(self, kind: str, reason: str, exit_code: int | None = None) -> None:
        try:
            self.client.record_event(self.job_id, kind, reason, exit_code)
        except EvalStopError as exc:
            log.warning("evalstop run: could not record %s: %s", kind, exc)

    def _view(self, wait_s: float):
        try:
            return self.client.wait_decision(self.job_id, wait_s, stopped=True)
        except EvalStopError as exc:
            log.debug("evalstop run: no decision (%s)", exc)
            return None

    # ------------------------------------------------------------------ run
    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> LaunchResult:
        """Register, start ``argv``, supervise it to its end; returns the child's exit status."""
        if not argv:
            raise ValueError("evalstop run needs a command after '--'.")
        self.client.register_job(self.job_id, self.job_type, planned_steps=self.planned_steps, policy=self.policy)
        self._child = child = self._start(argv, env)
        old = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)}
        stage, deadline, acked = Escalation.GRACE, None, False
        stop_seen, sent = False, []
        try:
            while child.poll() is None:
                if deadline is None:  # no stop yet: long-poll the decision
                    view = self._view(min(self.poll_s, 30.0))
                    if view is not None and view.status == "stopped":
                        stop_seen, deadline = True, self.clock() + self.grace_s
                        log.warning("evalstop run: job %s stopped (%s); the child has %g s to stop",
                                    self.job_id, view.decision.reason if view.decision else "", self.grace_s)
                    elif view is None:
                        time.sleep(min(self.poll_s, 1.0))
                    continue
                if not acked and stage is Escalation.GRACE:
                    view = self._view(0.0)
                    if view is not None and view.acked:  # acknowledged: it gets grace_s more to exit
                        acked, deadline = True, self.clock() + self.grace_s
                if self.clock() >= deadline and stage is not Escalation.SIGKILL:
                    stage = stage.to(Escalation.SIGTERM if stage is Escalation.GRACE else Escalation.SIGKILL)
                    self._signal_group(_ESCALATION_SIGNALS[stage])
                    sent.append(stage.value)
                    why = ("stop acknowledged but the child did not exit" if acked else "stop not acknowledged")
                    self._event(f"launcher_{stage.value}",
                                f"{stage.value.upper()} sent to the job's process group: {why} within "
                                f"{self.grace_s:g} s" if stage is Escalation.SIGTERM else
                                f"SIGKILL sent to the job's process group: still running {self.grace_s:g} s after SIGTERM")
                    deadline = self.clock() + self.grace_s
                try:
                    child.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
        status = child_exit_status(child.returncode)
        self._event("launcher_exit", f"the job's command exited with status {status}", status)
        self._settle(status)
        return LaunchResult(status, stop_seen, tuple(sent))

    def _settle(self, status: int) -> None:
        """Mark a job that is still running finished (status 0) or failed (any other status)."""
        try:
            view = self.client.status(self.job_id)
            if view.status in ("pending", "running"):
                if status == 0:
                    self.client.finish(self.job_id)
                else:
                    self.client.fail(self.job_id, f"the job's command exited with status {status}")
        except EvalStopError as exc:
            log.warning("evalstop run: could not settle the job's status: %s", exc)

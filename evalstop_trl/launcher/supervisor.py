"""The launcher: run a command as a child, watch its job's decision, deliver a stop it does not honour
to every process it started, and never let go of it.

1. The job is registered (or attached to: a later registration by the callback fills in what it
   knows). A refusal (409, 422, 401, ...) is an error before anything starts; no answer, or a
   malformed one, is not: the command runs anyway (fail-open).
2. The launcher makes itself a child subreaper (Linux) and starts the command in a session of its
   own with ``EVALSTOP_URL``, ``EVALSTOP_TOKEN`` and ``EVALSTOP_JOB_ID`` in its environment.
   With ``metric_from`` (``--metric-from``) a second thread reports the evals the command logs
   (:mod:`.metrics`: verl's JSONL file logger, plain JSONL, TensorBoard event files).
3. A thread (:class:`~.watch.JobWatch`) long-polls the decision and sends a heartbeat every
   ``heartbeat_s``. Outages and malformed answers never reach the child: it keeps running, the
   launcher keeps the last decision it believed and retries with backoff.
4. After a STOP the child has ``grace_s`` seconds to acknowledge (``grace_s`` more to exit after
   its acknowledgement); then SIGTERM goes to its process group and to every process outside it,
   ``grace_s`` later SIGKILL to whatever still runs, descendants that left the group or outlived the
   child included (:class:`~.enforce.Enforcer`). Processes the command leaves running when it exits
   are terminated the same way. Each escalation names the processes it reached in the audit log.
5. SIGHUP, SIGINT, SIGTERM, SIGQUIT, SIGUSR1 and SIGUSR2 sent to the launcher are forwarded to the
   child's process group. The launcher returns only once its child and every descendant are gone.
6. The child's exit is written to the audit log (``launcher_exit``, with its status). A job that
   was not stopped is marked finished (status 0) or failed (any other status, with the reason).

Exit status of ``evalstop run``:

====================  =======================================================================
0 (or ``--stopped-    EvalStop stopped the job (its decision or a manual stop) before the
exit-code N``)        command ended, however the command then ended: a scheduler that retries
                      failed jobs does not rerun a stopped one
the command's status  otherwise: its own exit code, or 128 + N if a signal N ended it
2                     bad input to ``evalstop run``, a refused registration, or a command that
                      cannot be started
====================  =======================================================================
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

from ..clients.api import EvalStopAPI
from ..core.records import Escalation, JobStatus
from .enforce import Enforcer, describe
from .link import JobLink
from .metrics import MetricFrom, MetricReporter
from .procs import ProcessTree, set_child_subreaper
from .watch import JobWatch, log_text

__all__ = ["FORWARDED_SIGNALS", "LaunchResult", "Launcher", "child_exit_status", "heartbeat_interval"]

log = logging.getLogger("evalstop.launcher")

FORWARDED_SIGNALS = tuple(getattr(signal, n) for n in ("SIGHUP", "SIGINT", "SIGTERM", "SIGQUIT", "SIGUSR1",
                                                        "SIGUSR2") if hasattr(signal, n))
_TICK_S = 0.1
#: ``evalstop run``'s exit status when the command succeeded but ``--metric`` never appeared in its logs
METRIC_NEVER_SEEN_EXIT = 3
_SCAN_IDLE_S = 2.0  # while the child runs and no stop is being delivered: how often to walk /proc
_KILL_SETTLE_S = 10.0  # after SIGKILL: how long to wait for the job's processes to vanish


def child_exit_status(returncode: int) -> int:
    """A shell's exit status for a child's ``returncode`` (a signal N gives 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def heartbeat_interval(lease_s: float) -> float | None:
    """Seconds between the launcher's heartbeats for a coordinator lease of ``lease_s`` seconds: a
    quarter of it, at most 60 s (None for no lease)."""
    return None if lease_s <= 0 else min(lease_s / 4.0, 60.0)


def _how(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (exit status {child_exit_status(returncode)})"
    return f"exited with status {returncode}"


@dataclass(frozen=True)
class LaunchResult:
    """How a launch ended.

    ``exit_status``: the launcher's (see the module docstring); ``child_status``: the command's (128
    + N for a signal N); ``stop_seen``: EvalStop stopped the job; ``escalations``: "sigterm",
    "sigkill" as sent; ``left_behind``: processes still running when the command exited;
    ``survivors``: processes still running when the launcher gave up on them."""

    exit_status: int
    stop_seen: bool
    escalations: tuple[str, ...]
    child_status: int = 0
    left_behind: tuple[str, ...] = ()
    survivors: tuple[str, ...] = ()


class Launcher:
    """Run one command for one job (see the module docstring).

    Args:
        client: an :class:`~evalstop_trl.clients.api.EvalStopAPI`.
        job_id, job_type, planned_steps, policy: the job's registration (None: unspecified).
        url, token: exported to the child.
        grace_s: seconds a stopped child has to acknowledge (and then to exit), and between SIGTERM
            and SIGKILL.
        poll_s: longest long poll of the decision.
        heartbeat_s: seconds between heartbeats (None: none); see :func:`heartbeat_interval`.
        stopped_exit_code: the launcher's exit status when EvalStop stopped the job.
        metric_from: report the job's evals from the logs the command writes (:mod:`.metrics`).
    """

    def __init__(self, client: EvalStopAPI, job_id: str, *, url: str, token: str, grace_s: float = 30.0,
                 job_type: str | None = None, planned_steps: int | None = None,
                 policy: Mapping[str, Any] | None = None, poll_s: float = 5.0, heartbeat_s: float | None = 60.0,
                 stopped_exit_code: int = 0, metric_from: MetricFrom | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 <= grace_s <= 86_400:
            raise ValueError(f"grace_s must be in [0, 86400] seconds, but got {grace_s!r}.")
        if not 0 <= stopped_exit_code <= 255:
            raise ValueError(f"stopped_exit_code must be in [0, 255], but got {stopped_exit_code!r}.")
        if heartbeat_s is not None and not 0 < heartbeat_s <= 3600:
            raise ValueError(f"heartbeat_s must be in (0, 3600] seconds or None, but got {heartbeat_s!r}.")
        self.client, self.url, self.token, self.grace_s = client, url, token, grace_s
        self.link = JobLink(client, job_id, job_type=job_type, planned_steps=planned_steps, policy=policy)
        self.poll_s, self.heartbeat_s, self.stopped_exit_code, self.clock = poll_s, heartbeat_s, stopped_exit_code, clock
        self.metric_from = metric_from
        self._metric_never: str | None = None  # why --metric was never read, once the command ended
        self._enforcer: Enforcer | None = None
        self._pending: list[int] = []  # signals received before the child started
        self._sent: list[str] = []

    @property
    def job_id(self) -> str:
        """The job (after attaching to an ended one, the next run's: ``NAME-2``, ...)."""
        return self.link.job_id

    # ------------------------------------------------------------------ run
    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> LaunchResult:
        """Register, start ``argv``, supervise it and its descendants to their end.

        Raises:
            ValueError: no command.
            EvalStopError: the coordinator refused the registration.
            OSError: the command cannot be started.
        """
        if not argv:
            raise ValueError("evalstop run needs a command after '--'.")
        confirmed = self.link.register()
        tree = ProcessTree()
        was_subreaper = set_child_subreaper(True)
        old = {s: signal.signal(s, self._forward) for s in FORWARDED_SIGNALS}
        watch = reporter = None
        try:
            child = self._start(argv, env)
            if self.metric_from is not None:
                reporter = MetricReporter(self.metric_from, self.client, self.job_id).start()
            self._enforcer = enforcer = Enforcer(child, tree)
            for sig in self._pending:
                enforcer.forward(sig)
            watch = JobWatch(self.client, self.job_id, poll_s=self.poll_s, heartbeat_s=self.heartbeat_s,
                             register=None if confirmed else self.link.register_deferred, clock=self.clock).start()
            try:
                stop_seen, left, survivors = self._supervise(enforcer, watch)
            except Exception:  # noqa: BLE001 - whatever breaks here, the launcher outlives its child
                log.exception("evalstop run: unexpected error while supervising job %s; waiting for its command",
                              log_text(self.job_id))
                child.wait()
                stop_seen, left, survivors = watch.state.stopped, [], []
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
            if reporter is not None:
                reporter.close()
                self._metric_never = reporter.never_reported
            if watch is not None:
                watch.close(timeout=0.5)
            if was_subreaper is False:
                set_child_subreaper(False)
        return self._finish(child.returncode, stop_seen, left, survivors)

    def _start(self, argv: Sequence[str], env: Mapping[str, str] | None) -> subprocess.Popen:
        child_env = dict(os.environ if env is None else env)
        child_env.update({"EVALSTOP_URL": self.url, "EVALSTOP_TOKEN": self.token, "EVALSTOP_JOB_ID": self.job_id})
        return subprocess.Popen(list(argv), env=child_env, start_new_session=True)

    def _forward(self, signum: int, frame: Any) -> None:
        log.warning("evalstop run: forwarding %s to the job's process group", signal.Signals(signum).name)
        if self._enforcer is None:
            self._pending.append(signum)
        else:
            self._enforcer.forward(signum)

    # ------------------------------------------------------------------ the loop
    def _supervise(self, enforcer: Enforcer, watch: JobWatch) -> tuple[bool, list[str], list[str]]:
        """Until nothing of the job runs: returns (stop seen, processes left behind, survivors)."""
        stop_seen, acked, deadline, killed_at = False, False, None, None
        left: list[str] = []
        child_pid = enforcer.child.pid
        scanned = float("-inf")
        while True:
            now = self.clock()
            scan = enforcer.stage is not Escalation.GRACE or now - scanned >= _SCAN_IDLE_S
            scanned = now if scan else scanned
            if not enforcer.look(scan):
                break
            state = watch.state
            if state.stopped and not stop_seen and not enforcer.child_done:
                stop_seen, deadline = True, now + self.grace_s
                log.warning("evalstop run: job %s stopped (%s); the command has %g s to stop", log_text(self.job_id),
                            log_text(state.reason), self.grace_s)
            if stop_seen and state.acked and not acked and enforcer.stage is Escalation.GRACE:
                acked, deadline = True, now + self.grace_s  # acknowledged: it gets grace_s more to exit
            if enforcer.child_done and enforcer.stage is Escalation.GRACE:
                if not left:  # the command ended, processes it started did not: terminate them now
                    left = [p.describe(child_pid) for p in enforcer.others()]
                deadline = now
            if deadline is not None and now >= deadline and enforcer.stage is not Escalation.SIGKILL:
                self._escalate(enforcer, acked)
                deadline = now + self.grace_s
                if enforcer.stage is Escalation.SIGKILL:
                    killed_at = now
            elif enforcer.stage is Escalation.SIGKILL:
                if now - killed_at > max(self.grace_s, _KILL_SETTLE_S) and enforcer.child_done:
                    survivors = [p.describe(child_pid) for p in enforcer.others()]
                    log.error("evalstop run: %s still running after SIGKILL; giving up on them",
                              describe(enforcer.others(), child_pid))
                    return stop_seen, left, survivors
                enforcer.send(signal.SIGKILL)  # what started while the others died
            self._wait(enforcer)
        return stop_seen or watch.state.stopped, left, []

    @staticmethod
    def _wait(enforcer: Enforcer) -> None:
        if enforcer.child_done:
            time.sleep(_TICK_S)
            return
        try:
            enforcer.child.wait(timeout=_TICK_S)
        except subprocess.TimeoutExpired:
            pass

    def _escalate(self, enforcer: Enforcer, acked: bool) -> None:
        child_pid = enforcer.child.pid
        stage, reached = enforcer.escalate()
        self._sent.append(stage.value)
        if stage is Escalation.SIGTERM:
            if enforcer.child_done:
                why = f"the command {_how(enforcer.child.returncode)} and left {describe(reached, child_pid)} running"
                reason = f"SIGTERM sent to what the job's command left behind: {why}"
            else:
                why = "stop acknowledged but the command did not exit" if acked else "stop not acknowledged"
                target = "the job's process group" + (
                    f" and {describe([p for p in reached if p.pgid != child_pid], child_pid)} outside it"
                    if any(p.pgid != child_pid for p in reached) else "")
                reason = f"SIGTERM sent to {target}: {why} within {self.grace_s:g} s"
        else:
            still = ("the command and " if not enforcer.child_done else "") + (
                describe(reached, child_pid) if reached else "no other process")
            reason = f"SIGKILL sent: still running {self.grace_s:g} s after SIGTERM: {still}"
        log.warning("evalstop run: %s", log_text(reason, 2000))
        self.link.event(f"launcher_{stage.value}", reason)

    # ------------------------------------------------------------------ the end
    def _finish(self, returncode: int, stop_seen: bool, left: list[str], survivors: list[str]) -> LaunchResult:
        status = child_exit_status(returncode)
        view = self.link.status()
        stopped = stop_seen or (view is not None and view.status == JobStatus.STOPPED.value)
        reason = f"the job's command {_how(returncode)}"
        never = self._metric_never
        if never and not stopped:  # nothing was watched: not a finished job, and not a success
            log.error("evalstop run: %s; the job was never watched", log_text(never, 2000))
            reason += f"; {never}"
            status = status or METRIC_NEVER_SEEN_EXIT
        if left:
            reason += f"; it left {len(left)} process(es) running, terminated by the launcher: {', '.join(left[:8])}"
        if survivors:
            reason += f"; {len(survivors)} process(es) survived SIGKILL: {', '.join(survivors[:8])}"
        killed_outside = returncode < 0 and not self._sent  # preempted or OOM-killed, not by this launcher
        if killed_outside and not stopped:
            reason += "; left to its lease: lost unless a resumed attempt reports"
        self.link.event("launcher_exit", reason, status, tries=3)
        if not stopped and not killed_outside and (view is None or view.status in (
                JobStatus.PENDING.value, JobStatus.RUNNING.value, JobStatus.LOST.value)):
            self.link.settle(status, reason)
        return LaunchResult(self.stopped_exit_code if stopped else status, stopped, tuple(self._sent), status,
                            tuple(left), tuple(survivors))

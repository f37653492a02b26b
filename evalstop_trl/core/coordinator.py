"""The Coordinator: the one place where stop decisions are made.

The HTTP service, the embedded client of the TRL callback and the platform simulator all call this
same class. It is thread-safe (one lock), uses only the injected ``clock`` for time, and keeps the
store as the source of truth: on construction it rebuilds every job's detector by replaying the
stored reports, so a reopened coordinator answers exactly as an uninterrupted one.

Each operation is *decide → transition → commit*: the detector decides on a report, the job's
:class:`~evalstop_trl.core.records.JobStatus` moves by its transition table, and the new state, the
report and any audit record go to the store in one atomic write. Tenants and tokens live in
:mod:`.tenants`, validation of what callers send in :mod:`.records`.

Rules:

* Jobs are namespaced by tenant; a tenant never sees another tenant's jobs (:class:`NotFound`).
* Reports are idempotent on (tenant, job_id, step): an identical repeat is accepted once; a
  different payload for a stored step raises :class:`Conflict`; reports must come in step order.
* Reports for a stopped, finished or failed job are recorded but never change its status or decision.
* Every stop (detector or manual) is appended to the audit log with its reason and evidence.

Example::

    >>> from evalstop_trl.stores.memory import MemoryStore
    >>> coord = Coordinator(MemoryStore())
    >>> _ = coord.register_job("acme", "run-1", "grpo", planned_steps=100)
    >>> for step, score in [(10, 0.2), (20, 0.5), (30, 0.4), (40, 0.3)]:
    ...     decision = coord.report("acme", "run-1", step, eval_score=score)
    >>> decision.action.value, decision.best_step
    ('stop', 20)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .detectors import Action, Decision, Detector, Observation, all_finite_floats, check_finite
from .errors import Conflict, InvalidInput, NotFound
from .records import (
    MAX_STEP,
    AuditKind,
    AuditRecord,
    JobRecord,
    JobStatus,
    JobType,
    JobView,
    Policy,
    Registration,
    Report,
    check_checkpoint,
)
from .store import DONE, Store, StoreError, wait_durable
from .tenants import Tenants

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["Coordinator", "PendingReport"]

# Enum members bound once: looking them up on the class is slow, and this is the report hot path.
_RUNNING, _PENDING, _STOPPED, _CONTINUE = JobStatus.RUNNING, JobStatus.PENDING, JobStatus.STOPPED, Action.CONTINUE
_trusted = Observation.trusted
_report = Report.trusted
_finite_floats = all_finite_floats


def _check_report(step: Any, eval_score: Any, train_loss: Any, proxy_reward: Any) -> None:
    """Validate a report's numbers once, at the boundary (detectors then trust them). The caller
    has found that the fast check (int step in range, finite floats or None) failed."""
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidInput(f"step must be a non-negative integer, but got {step!r}.")
        raise InvalidInput(f"step must be at most {MAX_STEP}, but got {step}.")
    for name, value in (("eval_score", eval_score), ("train_loss", train_loss), ("proxy_reward", proxy_reward)):
        if value is not None and (type(value) is not float or value - value != 0.0):
            try:
                check_finite(name, value)
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None


class _Live:
    """In-memory state of one job: its record, its detector and its reports by step."""

    __slots__ = ("record", "detector", "reports", "last_step", "decision", "job_type", "planned", "ticket")

    def __init__(self, record: JobRecord, detector: Detector) -> None:
        self.record = record
        self.job_type = record.job_type.value
        self.planned = record.planned_steps
        self.detector = detector
        self.reports: dict[int, Report] = {}
        self.last_step: int | None = None
        self.decision: Decision | None = None  # the detector's latest answer
        self.ticket: Future = DONE  # the job's latest write (stores apply writes in order)

    def observe(self, rep: Report) -> Decision:
        planned = self.planned
        return self.detector.observe(_trusted(self.record.job_id, rep.step, rep.eval_score, rep.train_loss,
                                              rep.proxy_reward, self.job_type,
                                              rep.step / planned if planned else None))

    def remember(self, rep: Report, decision: Decision) -> None:
        self.reports[rep.step] = rep
        self.last_step = rep.step
        self.decision = decision


StopListener = Callable[[JobRecord, Decision], None]


class PendingReport(NamedTuple):
    """A decided report whose write may not be durable yet (see :meth:`Coordinator.submit_report`).

    Internal to the coordinator and its service (a NamedTuple: one is made per report, on the hot path)."""

    tenant: str
    job_id: str
    decision: Decision
    ticket: Future
    stopped: JobRecord | None  # the job's record if this report stopped it


class Coordinator:
    """Make and record stop decisions for many tenants' jobs.

    Args:
        store: where state lives (``SQLiteStore`` or ``MemoryStore``; a new MemoryStore if None).
        clock: a function returning the current time in seconds (virtual time in the simulator).
        default_policy: the policy of jobs registered without one (decline, k=2).
    """

    def __init__(self, store: Store | None = None, clock: Callable[[], float] = time.time,
                 default_policy: Policy | None = None) -> None:
        if store is None:
            from ..stores.memory import MemoryStore  # the default: an outer layer, imported lazily

            store = MemoryStore()
        self.store = store
        self.clock = clock
        self.default_policy = default_policy or Policy()
        self.tenants = Tenants(store, clock)
        self._lock = threading.RLock()
        self._jobs: dict[tuple[str, str], _Live] = {}
        self._stop_listeners: list[StopListener] = []
        for record in self.store.jobs():
            self._jobs[(record.tenant, record.job_id)] = self._load(record)

    # ------------------------------------------------------------------ state
    def _load(self, record: JobRecord) -> _Live:
        """Rebuild a job's live state by replaying its stored reports through a fresh detector."""
        live = _Live(record, record.policy.build())
        for rep in self.store.reports(record.tenant, record.job_id):
            live.remember(rep, live.observe(rep))
        return live

    def _settle(self, ticket: Future, tenant: str, job_id: str) -> None:
        """Wait until a write is durable. If it failed, reload the job from the store (the source of
        truth) so memory never claims what the disk does not hold, and re-raise."""
        try:
            wait_durable(ticket)
        except StoreError:
            with self._lock:
                stored = [r for r in self.store.jobs() if (r.tenant, r.job_id) == (tenant, job_id)]
                if stored:
                    self._jobs[(tenant, job_id)] = self._load(stored[0])
                else:
                    self._jobs.pop((tenant, job_id), None)
            raise

    def _get(self, tenant: str, job_id: str) -> _Live:
        live = self._jobs.get((tenant, job_id))
        if live is None:
            raise NotFound(f"no job {job_id!r} for tenant {tenant!r}")
        return live

    def add_stop_listener(self, listener: StopListener) -> None:
        """Call ``listener(job, decision)`` after every stop is durably recorded."""
        self._stop_listeners.append(listener)

    def remove_stop_listener(self, listener: StopListener) -> None:
        """Stop calling ``listener`` (no error if it was not added)."""
        try:
            self._stop_listeners.remove(listener)
        except ValueError:
            pass

    def _notify(self, record: JobRecord, decision: Decision) -> None:
        for listener in list(self._stop_listeners):
            listener(record, decision)

    def _transition(self, live: _Live, status: JobStatus, now: float, kind: AuditKind | None, actor: str,
                    reason: str, evidence: dict[str, Any], report: Report | None = None,
                    **changes: Any) -> Future:
        """Move ``live``'s job to ``status`` and commit the new record, ``report`` and an audit line."""
        record = live.record
        new = record.evolve(status=record.status.to(status), updated_at=now, **changes)
        audit = () if kind is None else (AuditRecord(record.tenant, record.job_id, now, kind, actor, reason, evidence),)
        ticket = self.store.commit(new, report, audit)
        live.record = new
        return ticket

    # ------------------------------------------------------------------ jobs
    def register_job(self, tenant: str, job_id: str, job_type: str | JobType = JobType.RLHF,
                     planned_steps: int | None = None, policy: Policy | dict | None = None, pid: int | None = None,
                     pid_start_time: float | None = None, webhook: str | None = None) -> tuple[JobView, bool]:
        """Register a job. Returns ``(view, created)``; an identical re-registration returns
        ``created=False``; a different one for an existing id raises :class:`Conflict`."""
        reg = Registration.parse(job_id, job_type, planned_steps, policy, pid, pid_start_time, webhook,
                                 default_policy=self.default_policy)
        record = JobRecord.new(tenant, reg, self.clock())
        with self._lock:
            existing = self._jobs.get((tenant, job_id))
            if existing is not None:
                if existing.record.registration() == reg:
                    return self._view(existing), False
                raise Conflict(
                    f"job {job_id!r} is already registered with a different job_type, planned_steps, "
                    f"policy, pid or webhook; use a new job_id"
                )
            ticket = self.store.commit(record)
            live = self._jobs[(tenant, job_id)] = _Live(record, reg.policy.build())
            view = self._view(live)
        self._settle(ticket, tenant, job_id)
        return view, True

    def report(self, tenant: str, job_id: str, step: int, eval_score: float | None = None,
               train_loss: float | None = None, proxy_reward: float | None = None,
               checkpoint: str | None = None) -> Decision:
        """Record one report (durably, before returning) and return the job's decision."""
        pending = self.submit_report(tenant, job_id, step, eval_score, train_loss, proxy_reward, checkpoint)
        ticket = pending.ticket
        if pending.stopped is not None or (ticket is not DONE and (not ticket.done() or ticket.exception())):
            self.complete(pending)  # waits, raises a store error, runs the stop listeners
        return pending.decision

    def complete(self, pending: PendingReport) -> None:
        """Wait until ``pending`` is durable, then run the stop listeners (re-raises a store error)."""
        self._settle(pending.ticket, pending.tenant, pending.job_id)
        if pending.stopped is not None:
            self._notify(pending.stopped, pending.decision)

    def submit_report(self, tenant: str, job_id: str, step: int, eval_score: float | None = None,
                      train_loss: float | None = None, proxy_reward: float | None = None,
                      checkpoint: str | None = None) -> PendingReport:
        """Decide on one report and queue its durable write; :meth:`complete` waits for it.

        The async service awaits ``pending.ticket`` (a Future) instead of blocking a thread."""
        if not (type(step) is int and 0 <= step <= MAX_STEP and _finite_floats(eval_score, train_loss, proxy_reward)):
            _check_report(step, eval_score, train_loss, proxy_reward)
        if checkpoint is not None:
            check_checkpoint(checkpoint)
        with self._lock:
            live = self._jobs.get((tenant, job_id)) or self._get(tenant, job_id)
            rep = _report(step, eval_score, train_loss, proxy_reward, checkpoint, self.clock())
            stored = live.reports.get(step)
            if stored is not None:
                if stored.payload() == rep.payload():
                    # an identical retry: answered once the original write is durable, never before
                    return PendingReport(tenant, job_id, self._current(live), live.ticket, None)
                raise Conflict(
                    f"step {step} of job {job_id!r} already has a different report "
                    f"(stored {_payload_str(stored)}, got {_payload_str(rep)}); a step is reported once"
                )
            if live.last_step is not None and step < live.last_step:
                raise Conflict(
                    f"reports must come in step order: step {step} is before the last reported step "
                    f"{live.last_step} of job {job_id!r}"
                )
            # decide
            planned = live.planned
            decision = live.detector.observe(_trusted(job_id, step, eval_score, train_loss, proxy_reward,
                                                      live.job_type, step / planned if planned else None))
            status = live.record.status
            if status is _RUNNING and decision.action is _CONTINUE:  # the hot path: no transition
                ticket = live.ticket = self.store.add_report(tenant, job_id, rep)
                live.reports[step] = rep
                live.last_step = step
                live.decision = decision
                return PendingReport(tenant, job_id, decision, ticket, None)
            # transition, commit
            stopped = None
            now = rep.received_at
            if status.terminal:
                ticket = self.store.add_report(tenant, job_id, rep)  # recorded, changes nothing
            elif decision.action is Action.STOP:
                actor = f"detector:{live.record.policy.detector}"
                ticket = self._transition(
                    live, _STOPPED, now, AuditKind.STOP, actor, decision.reason,
                    {**decision.evidence, "step": step, "best_step": decision.best_step,
                     "best_score": decision.best_score},
                    rep, decision=decision, stopped_by=actor, stopped_at=now)
                stopped = live.record
            elif status is _PENDING:
                ticket = self._transition(live, _RUNNING, now, None, "", "", {}, rep)
            else:
                ticket = self.store.add_report(tenant, job_id, rep)
            live.ticket = ticket
            live.remember(rep, decision)
            return PendingReport(tenant, job_id, self._current(live), ticket, stopped)

    def _current(self, live: _Live) -> Decision:
        """The decision a job's reports and status say now."""
        record = live.record
        if record.status.terminal:
            if record.decision is not None:
                return record.decision
            return Decision(Action.CONTINUE, f"job is {record.status.value}", live.detector.best_step,
                            live.detector.best_score)
        return live.decision or Decision(Action.CONTINUE, "no eval yet", live.detector.best_step,
                                         live.detector.best_score)

    def stop(self, tenant: str, job_id: str, reason: str = "", actor: str | None = None) -> JobView:
        """Stop a job by hand (idempotent for a job already stopped)."""
        if not isinstance(reason, str) or len(reason) > 2000:
            raise InvalidInput("reason must be a string of at most 2000 characters.")
        with self._lock:
            live = self._get(tenant, job_id)
            if live.record.status is _STOPPED:
                return self._view(live)
            now = self.clock()
            who = actor or f"tenant:{tenant}"
            det = live.detector
            decision = Decision(Action.STOP, f"manual stop by {who}: {reason or 'no reason given'}",
                                det.best_step, det.best_score, {"manual": True})
            ticket = self._transition(live, _STOPPED, now, AuditKind.MANUAL_STOP, who, decision.reason,
                                      {"best_step": decision.best_step, "best_score": decision.best_score},
                                      decision=decision, stopped_by=who, stopped_at=now)
            new, view = live.record, self._view(live)
        self._settle(ticket, tenant, job_id)
        self._notify(new, decision)
        return view

    def ack(self, tenant: str, job_id: str, checkpoint: str | None = None) -> JobView:
        """The job confirms it has its best checkpoint safe and is stopping."""
        check_checkpoint(checkpoint)
        with self._lock:
            live = self._get(tenant, job_id)
            record = live.record
            if record.status is not _STOPPED:
                raise Conflict(f"job {job_id!r} is {record.status.value}: there is no stop to acknowledge")
            now = self.clock()
            first = record.acked_at is None
            ticket = self._transition(
                live, _STOPPED, now, AuditKind.ACK if first else None, f"job:{job_id}", "stop acknowledged",
                {"checkpoint": checkpoint or record.checkpoint},
                acked_at=record.acked_at or now, checkpoint=checkpoint or record.checkpoint)
            view = self._view(live)
        self._settle(ticket, tenant, job_id)
        return view

    def finish(self, tenant: str, job_id: str) -> JobView:
        """Mark a job finished (it ran to its end). A stopped or failed job stays as it is."""
        with self._lock:
            live = self._get(tenant, job_id)
            if live.record.status.terminal:
                return self._view(live)
            now = self.clock()
            ticket = self._transition(live, JobStatus.FINISHED, now, None, "", "", {}, finished_at=now)
            view = self._view(live)
        self._settle(ticket, tenant, job_id)
        return view

    def fail(self, tenant: str, job_id: str, reason: str = "") -> JobView:
        """Mark a job failed (its trainer crashed), so no job stays "running" forever. A job that is
        already stopped, finished or failed stays as it is."""
        if not isinstance(reason, str) or len(reason) > 2000:
            raise InvalidInput("reason must be a string of at most 2000 characters.")
        with self._lock:
            live = self._get(tenant, job_id)
            if live.record.status.terminal:
                return self._view(live)
            now = self.clock()
            ticket = self._transition(live, JobStatus.FAILED, now, AuditKind.FAILED, f"job:{job_id}",
                                      reason or "the job reported a failure", {}, finished_at=now)
            view = self._view(live)
        self._settle(ticket, tenant, job_id)
        return view

    def record_event(self, tenant: str, job_id: str, kind: AuditKind, reason: str, evidence: dict,
                     actor: str = "coordinator") -> None:
        """Append an enforcement or webhook event to the job's audit log."""
        with self._lock:
            live = self._get(tenant, job_id)
            audit = AuditRecord(tenant, job_id, self.clock(), kind, actor, reason, evidence)
            ticket = self.store.commit(live.record, None, (audit,))
        self._settle(ticket, tenant, job_id)

    # ------------------------------------------------------------------ reads
    def _view(self, live: _Live) -> JobView:
        r = live.record
        det = live.detector
        best_ckpt = r.checkpoint
        if best_ckpt is None and det.best_step is not None:
            best_rep = live.reports.get(det.best_step)
            best_ckpt = best_rep.checkpoint if best_rep else None
        return JobView(
            job_id=r.job_id, job_type=r.job_type.value, status=r.status.value, policy=r.policy.to_dict(),
            decision=self._current(live) if live.reports or r.decision else None, best_step=det.best_step,
            best_score=det.best_score, best_checkpoint=best_ckpt, n_reports=len(live.reports),
            last_step=live.last_step, planned_steps=r.planned_steps, acked=r.acked_at is not None,
        )

    def status(self, tenant: str, job_id: str) -> JobView:
        with self._lock:
            return self._view(self._get(tenant, job_id))

    def record(self, tenant: str, job_id: str) -> JobRecord:
        with self._lock:
            return self._get(tenant, job_id).record

    def list_jobs(self, tenant: str) -> list[JobView]:
        with self._lock:
            return [self._view(v) for (t, _), v in self._jobs.items() if t == tenant]

    def reports(self, tenant: str, job_id: str) -> list[Report]:
        with self._lock:
            live = self._get(tenant, job_id)
            return [live.reports[s] for s in sorted(live.reports)]

    def audit(self, tenant: str) -> list[AuditRecord]:
        with self._lock:
            return self.store.audit(tenant)

    def close(self) -> None:
        with self._lock:
            self.store.close()


def _payload_str(rep: Report) -> str:
    return (f"eval_score={rep.eval_score}, train_loss={rep.train_loss}, proxy_reward={rep.proxy_reward}, "
            f"checkpoint={rep.checkpoint!r}")

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

import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from .detectors import Action, Decision, Detector, Observation, check_finite
from .errors import Conflict, InvalidInput, NotFound, QuotaExceeded
from .frozen import trusted_init
from .records import (
    MAX_STEP,
    AuditKind,
    AuditRecord,
    Delivery,
    EvalState,
    EvalTask,
    JobRecord,
    JobStatus,
    JobType,
    JobView,
    Policy,
    Quotas,
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
_job_view = trusted_init(JobView)
_report = Report.trusted
_isfinite = math.isfinite
_NO_EVIDENCE: Mapping[str, Any] = MappingProxyType({})


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
    """In-memory state of one job: its record and its detector, plus a few facts about its reports.

    Memory per job is bounded (the detector's state, the first and last report, counters); the
    reports themselves are in the store and read from it, paged."""

    __slots__ = ("record", "detector", "first", "last", "n_reports", "best_checkpoint", "decision", "job_type",
                 "planned", "ticket", "max_reports", "version")

    def __init__(self, record: JobRecord, detector: Detector, max_reports: int = 10**9) -> None:
        self.max_reports = max_reports  # the tenant's quota when the job was registered
        self.record = record
        self.job_type = record.job_type.value
        self.planned = record.planned_steps
        self.detector = detector
        self.first: Report | None = None
        self.last: Report | None = None
        self.n_reports = 0
        self.best_checkpoint: str | None = None  # the checkpoint reported with the best step
        self.decision: Decision | None = None  # the detector's latest answer
        self.ticket: Future = DONE  # the job's latest write (stores apply writes in order)
        self.version = record.version  # the job's writes so far, this one's included (shared stores)

    def next_version(self) -> int:
        """The version the next write replaces (and moves on by one)."""
        self.version += 1
        return self.version - 1

    def observe(self, rep: Report) -> Decision:
        planned = self.planned
        return self.detector.observe(_trusted(self.record.job_id, rep.step, rep.eval_score, rep.train_loss,
                                              rep.proxy_reward, self.job_type,
                                              rep.step / planned if planned else None))

    def remember(self, rep: Report, decision: Decision) -> None:
        if self.first is None:
            self.first = rep
        self.last = rep
        self.n_reports += 1
        self.decision = decision
        if self.detector.best_step == rep.step:
            self.best_checkpoint = rep.checkpoint

    @property
    def last_step(self) -> int | None:
        return None if self.last is None else self.last.step


StopListener = Callable[[JobRecord, Decision], None]


class PendingReport(NamedTuple):
    """A decided report whose write may not be durable yet (see :meth:`Coordinator.submit_report`).

    Internal to the coordinator and its service (a NamedTuple: one is made per report, on the hot path)."""

    tenant: str
    job_id: str
    decision: Decision
    ticket: Future
    stopped: JobRecord | None  # the job's record if this report stopped it


_pending = partial(tuple.__new__, PendingReport)  # PendingReport((...)) without NamedTuple's keyword __new__


class Coordinator:
    """Make and record stop decisions for many tenants' jobs.

    Args:
        store: where state lives (``SQLiteStore`` or ``MemoryStore``; a new MemoryStore if None).
        clock: a function returning the current time in seconds (virtual time in the simulator).
        default_policy: the policy of jobs registered without one (decline, k=2).
        quotas: per-tenant limits (active jobs, reports per job); unlimited-ish defaults.
        eval_gap_timeout_s: an external eval not back this long after its snapshot counts as missing.
    """

    def __init__(self, store: Store | None = None, clock: Callable[[], float] = time.time,
                 default_policy: Policy | None = None, quotas: Quotas | None = None,
                 eval_gap_timeout_s: float = 600.0) -> None:
        if store is None:
            from ..stores.memory import MemoryStore  # the default: an outer layer, imported lazily

            store = MemoryStore()
        self.store = store
        self.clock = clock
        self.default_policy = default_policy or Policy()
        self.eval_gap_timeout_s = eval_gap_timeout_s
        self.tenants = Tenants(store, clock, quotas)
        self._lock = threading.RLock()
        self._jobs: dict[tuple[str, str], _Live] = {}
        self._by_tenant: dict[str, dict[str, _Live]] = {}  # registration order, for listing
        self._active: dict[str, int] = {}  # tenant -> jobs not yet stopped, finished or failed
        self._stop_listeners: list[StopListener] = []
        for record in self.store.jobs():
            self._put(self._load(record))

    def _put(self, live: _Live) -> None:
        r = live.record
        old = self._jobs.get((r.tenant, r.job_id))
        if old is not None and not old.record.status.terminal:
            self._active[r.tenant] -= 1
        if not r.status.terminal:
            self._active[r.tenant] = self._active.get(r.tenant, 0) + 1
        self._jobs[(r.tenant, r.job_id)] = live
        self._by_tenant.setdefault(r.tenant, {})[r.job_id] = live

    # ------------------------------------------------------------------ state
    def _load(self, record: JobRecord) -> _Live:
        """Rebuild a job's live state by replaying its stored reports through a fresh detector."""
        live = _Live(record, record.policy.build(), self.tenants.quotas(record.tenant).max_reports_per_job)
        for rep in self.store.reports(record.tenant, record.job_id):
            live.remember(rep, live.observe(rep))
        return live

    def _settle(self, ticket: Future, tenant: str, job_id: str) -> None:
        """Wait until a write is durable. If it failed, reload the job from the store (the source of
        truth) so memory never claims what the disk does not hold, and re-raise."""
        if ticket is DONE:  # an in-memory store's writes are done when queued
            return
        try:
            wait_durable(ticket)
        except StoreError:
            with self._lock:
                try:
                    self._reload(tenant, job_id)
                except NotFound:
                    pass
            raise

    def _get(self, tenant: str, job_id: str) -> _Live:
        live = self._jobs.get((tenant, job_id))
        if live is None:
            record = self.store.job(tenant, job_id) if self.store.shared else None  # another replica's job
            if record is None:
                raise NotFound(f"no job {job_id!r} for tenant {tenant!r}")
            live = self._load(record)
            self._put(live)
        return live

    def _fresh(self, tenant: str, job_id: str) -> _Live:
        """The job's live state; with a shared store, re-read if another replica wrote it since."""
        live = self._get(tenant, job_id)
        if self.store.shared:
            stored = self.store.job_versions(tenant, [job_id]).get(job_id, 0)
            if stored > live.version:
                live = self._reload(tenant, job_id)
        return live

    def _reload(self, tenant: str, job_id: str) -> _Live:
        record = self.store.job(tenant, job_id)
        if record is None:
            old = self._jobs.pop((tenant, job_id), None)
            if old is not None and not old.record.status.terminal:
                self._active[tenant] -= 1
            self._by_tenant.get(tenant, {}).pop(job_id, None)
            raise NotFound(f"no job {job_id!r} for tenant {tenant!r}")
        live = self._load(record)
        self._put(live)
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
                    reason: str, evidence: Mapping[str, Any], report: Report | None = None,
                    **changes: Any) -> Future:
        """Move ``live``'s job to ``status`` and commit the new record, ``report``, an audit line and,
        for a stop of a job with a webhook, its delivery (durably queued with the stop itself)."""
        record = live.record
        new = record.evolve(status=record.status.to(status), updated_at=now, **changes)
        audit = () if kind is None else (AuditRecord(record.tenant, record.job_id, now, kind, actor, reason, evidence),)
        deliveries = ()
        if status is _STOPPED and record.status is not _STOPPED and record.webhook and new.decision is not None:
            deliveries = (stop_delivery(new, now),)
        ticket = self.store.commit(new, report, audit, deliveries, expect=live.next_version())
        if new.status.terminal and not record.status.terminal:
            self._active[record.tenant] -= 1
        live.record = new
        return ticket

    # ------------------------------------------------------------------ jobs
    def register_job(self, tenant: str, job_id: str, job_type: str | JobType = JobType.RLHF,
                     planned_steps: int | None = None, policy: Policy | dict | None = None,
                     webhook: str | None = None) -> tuple[JobView, bool]:
        """Register a job. Returns ``(view, created)``; an identical re-registration returns
        ``created=False``; a different one for an existing id raises :class:`Conflict`."""
        return self._register(tenant, job_id, job_type, planned_steps, policy, webhook, True)

    def add_job(self, tenant: str, job_id: str, job_type: str | JobType = JobType.RLHF,
                planned_steps: int | None = None, policy: Policy | dict | None = None,
                webhook: str | None = None) -> bool:
        """:meth:`register_job` for an in-process caller that does not read the job's view (the
        simulator registers a job per arrival): returns ``created``, with the same checks."""
        return self._register(tenant, job_id, job_type, planned_steps, policy, webhook, False)[1]

    def _register(self, tenant: str, job_id: str, job_type: str | JobType, planned_steps: int | None,
                  policy: Policy | dict | None, webhook: str | None, want_view: bool) -> tuple[JobView | None, bool]:
        reg = Registration.parse(job_id, job_type, planned_steps, policy, webhook,
                                 default_policy=self.default_policy)
        with self._lock:
            existing = self._jobs.get((tenant, job_id))
            if existing is None and self.store.shared:
                try:
                    existing = self._fresh(tenant, job_id)
                except NotFound:
                    existing = None
            if existing is not None:
                if existing.record.registration() == reg:
                    return (self._view(existing) if want_view else None), False
                raise Conflict(
                    f"job {job_id!r} is already registered with a different job_type, planned_steps, "
                    f"policy or webhook; use a new job_id"
                )
            quotas = self.tenants.quotas(tenant)
            active = self.store.count_active(tenant) if self.store.shared else self._active.get(tenant, 0)
            if active >= quotas.max_active_jobs:
                raise QuotaExceeded(
                    f"tenant {tenant!r} has {active} active jobs, the most allowed "
                    f"(max_active_jobs={quotas.max_active_jobs}); finish or stop some first")
            record = JobRecord.new(tenant, reg, self.clock())
            ticket = self.store.commit(record, expect=0)
            live = _Live(record, reg.policy.build(), quotas.max_reports_per_job)
            live.version = 1
            self._put(live)
            view = self._view(live) if want_view else None
        self._settle(ticket, tenant, job_id)
        return view, True

    def report(self, tenant: str, job_id: str, step: int, eval_score: float | None = None,
               train_loss: float | None = None, proxy_reward: float | None = None,
               checkpoint: str | None = None) -> Decision:
        """Record one report (durably, before returning) and return the job's decision."""
        pending = self.submit_report(tenant, job_id, step, eval_score, train_loss, proxy_reward, checkpoint)
        _, _, decision, ticket, stopped = pending
        if stopped is not None or (ticket is not DONE and (not ticket.done() or ticket.exception())):
            self.complete(pending)  # waits, raises a store error, runs the stop listeners
        return decision

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
        # the common case checked inline (finite floats); anything else gets the full check and its message
        if not (type(step) is int and 0 <= step <= MAX_STEP
                and (eval_score is None or type(eval_score) is float and _isfinite(eval_score))
                and (train_loss is None or type(train_loss) is float and _isfinite(train_loss))
                and (proxy_reward is None or type(proxy_reward) is float and _isfinite(proxy_reward))):
            _check_report(step, eval_score, train_loss, proxy_reward)
        if checkpoint is not None:
            check_checkpoint(checkpoint)
        with self._lock:
            live = (self._jobs.get((tenant, job_id)) if not self.store.shared else None) or self._fresh(tenant, job_id)
            rep = _report(step, eval_score, train_loss, proxy_reward, checkpoint, self.clock())
            last = live.last
            if last is not None and step <= last.step:
                stored = last if step == last.step else self._stored_report(live, step)
                if stored is None:
                    raise Conflict(
                        f"reports must come in step order: step {step} is before the last reported step "
                        f"{last.step} of job {job_id!r}"
                    )
                if stored.payload() == rep.payload():
                    # an identical retry: answered once the original write is durable, never before
                    return _pending((tenant, job_id, self._current(live), live.ticket, None))
                raise Conflict(
                    f"step {step} of job {job_id!r} already has a different report "
                    f"(stored {_payload_str(stored)}, got {_payload_str(rep)}); a step is reported once"
                )
            if live.n_reports >= live.max_reports:
                raise QuotaExceeded(
                    f"job {job_id!r} has {live.n_reports} reports, the most a job may have "
                    f"(max_reports_per_job={live.max_reports}); start a new job")
            # decide
            planned = live.planned
            decision = live.detector.observe(_trusted(job_id, step, eval_score, train_loss, proxy_reward,
                                                      live.job_type, step / planned if planned else None))
            status = live.record.status
            if status is _RUNNING and decision.action is _CONTINUE:  # the hot path: no transition
                version = live.version
                live.version = version + 1
                ticket = live.ticket = self.store.add_report(tenant, job_id, rep, version)
                live.last = rep
                live.n_reports += 1
                live.decision = decision
                if live.detector.best_step == step:
                    live.best_checkpoint = checkpoint
                return _pending((tenant, job_id, decision, ticket, None))
            # transition, commit
            stopped = None
            now = rep.received_at
            if status.terminal:
                ticket = self.store.add_report(tenant, job_id, rep, live.next_version())  # recorded, changes nothing
            elif decision.action is Action.STOP:
                actor = f"detector:{live.record.policy.detector}"
                ticket = self._transition(
                    live, _STOPPED, now, AuditKind.STOP, actor, decision.reason,
                    {**decision.evidence, "step": step, "best_step": decision.best_step,
                     "best_score": decision.best_score},
                    rep, decision=decision, stopped_by=actor, stopped_at=now)
                stopped = live.record
            elif status is _PENDING:
                ticket = self._transition(live, _RUNNING, now, None, "", "", _NO_EVIDENCE, rep)
            else:
                ticket = self.store.add_report(tenant, job_id, rep, live.next_version())
            live.ticket = ticket
            live.remember(rep, decision)
            return _pending((tenant, job_id, self._current(live), ticket, stopped))

    def _stored_report(self, live: _Live, step: int) -> Report | None:
        """The stored report of an earlier step (rare: a retry of an old step), once writes are durable."""
        if not live.ticket.done():
            wait_durable(live.ticket)
        return self.store.report(live.record.tenant, live.record.job_id, step)

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
            live = self._fresh(tenant, job_id)
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

    def ack(self, tenant: str, job_id: str, checkpoint: str | None = None, step: int | None = None) -> JobView:
        """The job confirms it has its best checkpoint safe and is stopping (at ``step``, if it says:
        the audit then records the stop lag, the steps it trained after the eval that stopped it)."""
        check_checkpoint(checkpoint)
        if step is not None:
            _check_report(step, None, None, None)
        with self._lock:
            live = self._fresh(tenant, job_id)
            record = live.record
            if record.status is not _STOPPED:
                raise Conflict(f"job {job_id!r} is {record.status.value}: there is no stop to acknowledge")
            now = self.clock()
            first = record.acked_at is None
            evidence: dict[str, Any] = {"checkpoint": checkpoint or record.checkpoint}
            decided_at = _decided_step(record, live)
            if step is not None and decided_at is not None:
                evidence.update(step=step, stop_lag=max(0, step - decided_at))
            ticket = self._transition(
                live, _STOPPED, now, AuditKind.ACK if first else None, f"job:{job_id}", "stop acknowledged",
                evidence,
                acked_at=record.acked_at or now, checkpoint=checkpoint or record.checkpoint)
            view = self._view(live)
        self._settle(ticket, tenant, job_id)
        return view

    def finish(self, tenant: str, job_id: str) -> JobView:
        """Mark a job finished (it ran to its end). A stopped or failed job stays as it is."""
        with self._lock:
            live = self._fresh(tenant, job_id)
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
            live = self._fresh(tenant, job_id)
            if live.record.status.terminal:
                return self._view(live)
            now = self.clock()
            ticket = self._transition(live, JobStatus.FAILED, now, AuditKind.FAILED, f"job:{job_id}",
                                      reason or "the job reported a failure", {}, finished_at=now)
            view = self._view(live)
        self._settle(ticket, tenant, job_id)
        return view

    # ------------------------------------------------------------------ external evals
    def publish_snapshot(self, tenant: str, job_id: str, step: int, path: str, train_loss: float | None = None,
                         proxy_reward: float | None = None) -> EvalTask:
        """A job saved a snapshot at ``step`` for an external evaluator (``evalstop evaluate``) to score.
        Publishing the same snapshot again is a no-op; its eval is fed to the detector in step order."""
        _check_report(step, None, train_loss, proxy_reward)
        if not isinstance(path, str) or not path:
            raise InvalidInput("path must be the snapshot's folder, a non-empty string.")
        check_checkpoint(path)
        with self._lock:
            live = self._fresh(tenant, job_id)
            tasks = {t.step: t for t in self.store.evals(tenant, job_id)}
            if step in tasks:
                if tasks[step].path != path:
                    raise Conflict(f"step {step} of job {job_id!r} already has a snapshot at {tasks[step].path!r}")
                return tasks[step]
            if live.last is not None and step <= live.last.step:
                raise Conflict(f"step {step} of job {job_id!r} is not after its last report (step {live.last.step})")
            task = EvalTask(tenant, job_id, step, path, self.clock(), train_loss, proxy_reward)
            ticket = self.store.put_eval(task)
        self._settle(ticket, tenant, job_id)
        return task

    def claim_eval(self, tenant: str, worker: str, lease_s: float) -> EvalTask | None:
        """Lease the tenant's oldest snapshot waiting for an eval (or one whose lease ran out: its
        worker died) to ``worker`` for ``lease_s`` seconds; None if there is none."""
        if not isinstance(worker, str) or not 0 < len(worker) <= 128:
            raise InvalidInput("worker must be a name of 1-128 characters.")
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not 1 <= lease_s <= 3600:
            raise InvalidInput(f"lease_s must be in [1, 3600] seconds, but got {lease_s!r}.")
        with self._lock:
            now = self.clock()
            for task in self.store.claimable_evals(tenant, now, 1):
                claimed = dataclasses.replace(task, state=task.state.to(EvalState.LEASED), lease_until=now + lease_s,
                                              worker=worker)
                wait_durable(self.store.put_eval(claimed))
                return claimed
        return None

    def post_eval(self, tenant: str, job_id: str, step: int, score: float | None, worker: str = "",
                  error: str | None = None) -> Decision:
        """An evaluator's result for a snapshot: its score, or None (``error``: the eval failed, a
        missing eval). Results may come in any order; the detector gets them in step order, as soon as
        every earlier snapshot has one (a gap older than ``eval_gap_timeout_s`` counts as missing)."""
        _check_report(step, score, None, None)
        with self._lock:
            self._fresh(tenant, job_id)
            task = next((t for t in self.store.evals(tenant, job_id) if t.step == step), None)
            if task is None:
                raise NotFound(f"no snapshot of step {step} for job {job_id!r}")
            if not task.state.terminal:
                state = EvalState.DONE if score is not None else EvalState.MISSING
                wait_durable(self.store.put_eval(dataclasses.replace(
                    task, state=task.state.to(state) if task.state is EvalState.LEASED else state, score=score,
                    worker=worker or task.worker)))
            return self._feed(tenant, job_id)

    def _feed(self, tenant: str, job_id: str) -> Decision:
        """Report every scored snapshot whose earlier snapshots are all scored, in step order."""
        now = self.clock()
        for task in self.store.evals(tenant, job_id):
            if task.fed:
                continue
            if not task.state.terminal:
                if now - task.created_at <= self.eval_gap_timeout_s:
                    break  # the prefix is not complete yet
                task = dataclasses.replace(task, state=EvalState.MISSING)
            done = task.state is EvalState.DONE
            try:
                self.report(tenant, job_id, task.step, task.score if done else None, task.train_loss, task.proxy_reward,
                            task.path if done else None)
            except Conflict:
                pass  # fed before a crash, or reported some other way: the stored report stands
            wait_durable(self.store.put_eval(dataclasses.replace(task, fed=True)))
        return self._current(self._fresh(tenant, job_id))

    def evals(self, tenant: str, job_id: str) -> list[EvalTask]:
        """The job's published snapshots and their evals' states, in step order."""
        self._fresh(tenant, job_id)
        return self.store.evals(tenant, job_id)

    def record_event(self, tenant: str, job_id: str, kind: AuditKind, reason: str, evidence: dict,
                     actor: str = "coordinator") -> None:
        """Append a launcher or webhook event to the job's audit log."""
        if not isinstance(reason, str) or len(reason) > 2000:
            raise InvalidInput("reason must be a string of at most 2000 characters.")
        with self._lock:
            live = self._fresh(tenant, job_id)
            audit = AuditRecord(tenant, job_id, self.clock(), kind, actor, reason, evidence)
            ticket = self.store.commit(live.record, None, (audit,), expect=live.next_version())
        self._settle(ticket, tenant, job_id)

    # ------------------------------------------------------------------ reads
    def _view(self, live: _Live) -> JobView:
        r = live.record
        det = live.detector
        return _job_view(
            r.job_id, r.job_type.value, r.status.value, MappingProxyType(r.policy.to_dict()),
            self._current(live) if live.n_reports or r.decision else None, det.best_step, det.best_score,
            r.checkpoint or live.best_checkpoint, live.n_reports, live.last_step, r.planned_steps,
            r.acked_at is not None,
        )

    def status(self, tenant: str, job_id: str) -> JobView:
        with self._lock:
            return self._view(self._fresh(tenant, job_id))

    def list_jobs(self, tenant: str, status: JobStatus | str | None = None, limit: int | None = None,
                  offset: int = 0) -> list[JobView]:
        """The tenant's jobs in registration order, optionally of one ``status``, paged."""
        return self.page_jobs(tenant, status, limit, offset)[0]

    def page_jobs(self, tenant: str, status: JobStatus | str | None = None, limit: int | None = None,
                  offset: int = 0) -> tuple[list[JobView], int]:
        """``(views, total)``: one page of the tenant's jobs (``total`` counts every match).

        Views are built without holding the coordinator's lock, so listing thousands of jobs never
        holds up another tenant's reports."""
        wanted = None if status is None else (status if isinstance(status, JobStatus) else _parse_status(status))
        if self.store.shared:  # the store knows every replica's jobs
            ids, total = self.store.job_page(tenant, None if wanted is None else wanted.value, limit, offset)
            versions = self.store.job_versions(tenant, ids)
            views = []
            for job_id in ids:
                with self._lock:
                    try:
                        live = self._get(tenant, job_id)
                        if versions.get(job_id, 0) > live.version:
                            live = self._reload(tenant, job_id)
                    except NotFound:
                        continue
                views.append(self._view(live))
            return views, total
        lives = list(self._by_tenant.get(tenant, {}).values())  # a snapshot (atomic under the GIL)
        if wanted is not None:
            lives = [v for v in lives if v.record.status is wanted]
        end = len(lives) if limit is None else offset + limit
        return [self._view(v) for v in lives[offset:end]], len(lives)

    def report_span(self, tenant: str, job_id: str) -> tuple[Report | None, Report | None]:
        """The job's first and last report (None before any)."""
        live = self._fresh(tenant, job_id)
        return live.first, live.last

    def reports(self, tenant: str, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[Report]:
        """The job's durable reports in step order: those after ``after_step``, at most ``limit``."""
        live = self._fresh(tenant, job_id)
        return self.store.reports(tenant, live.record.job_id, after_step, limit)

    def audit(self, tenant: str, job_id: str | None = None, limit: int | None = None,
              offset: int = 0) -> list[AuditRecord]:
        """The tenant's audit records (of one job if ``job_id``), oldest first, paged."""
        return self.store.audit(tenant, job_id, limit, offset)

    def close(self) -> None:
        with self._lock:
            self.store.close()


def stop_delivery(job: JobRecord, now: float) -> Delivery:
    """The webhook delivery of a job's stop: strict JSON (no NaN or infinity), one per job."""
    decision = job.decision.to_dict() if job.decision else None
    body = json.dumps({"event": "stop", "tenant": job.tenant, "job_id": job.job_id, "at": now,
                       "decision": _json_safe(decision)}, allow_nan=False, sort_keys=True)
    return Delivery(f"{job.tenant}/{job.job_id}/stop", job.tenant, job.job_id, job.webhook or "", body, now)


def _json_safe(value: Any) -> Any:
    """Non-finite floats become None, so the payload is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _decided_step(record: JobRecord, live: _Live) -> int | None:
    """The step of the eval whose report stopped the job (None for a manual stop)."""
    if record.decision is None or record.decision.evidence.get("manual"):
        return None
    steps = record.decision.evidence.get("steps")
    if isinstance(steps, (list, tuple)) and steps:
        return steps[-1]
    return live.last.step if live.last is not None else None


def _parse_status(value: str) -> JobStatus:
    try:
        return JobStatus(value)
    except ValueError:
        raise InvalidInput(f"Unknown status {value!r}; valid statuses are: {', '.join(s.value for s in JobStatus)}.") \
            from None


def _payload_str(rep: Report) -> str:
    return (f"eval_score={rep.eval_score}, train_loss={rep.train_loss}, proxy_reward={rep.proxy_reward}, "
            f"checkpoint={rep.checkpoint!r}")

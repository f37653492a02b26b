"""The Coordinator: the one place where stop decisions are made.

The HTTP service, the embedded client of the TRL callback and the platform simulator all call this
same class. It is thread-safe, uses only the injected ``clock`` for time, and keeps the store as the
source of truth: on construction it rebuilds every job's state by replaying the stored reports, so a
reopened coordinator answers exactly as an uninterrupted one.

Each operation is *compute → commit → swap*: the pure job core (:mod:`.job`) computes the job's next
state and the rows to write; the store queues them; the in-memory state readers see is replaced
only once the write is durable (:mod:`.repository`), so memory always equals what a restart
rebuilds. Locks are per job and held only while a step is computed and its write queued, never
across a disk or network wait; stop listeners run after every lock is released. One class holds
every operation (commands, reads, leases, external evals, deletion), each group under its own
heading; the external-eval queue is :mod:`.evals` (handed the functions it needs, not the
coordinator), tenants and tokens :mod:`.tenants`, validation :mod:`.records`.

Rules:

* Jobs are namespaced by tenant; a tenant never sees another tenant's jobs (:class:`NotFound`).
* Reports are idempotent on (tenant, job_id, step): an identical repeat is accepted once; a
  different payload for a stored step raises :class:`Conflict`; reports must come in step order.
* Reports for a stopped, finished or failed job are recorded but never change its status or decision.
* Every stop (detector or manual) is appended to the audit log with its reason and evidence.

Example::

    >>> from evalstop_trl.core.requests import JobRequest, ReportRequest
    >>> coord = Coordinator()  # an in-memory store
    >>> _ = coord.register_job("acme", JobRequest("run-1", "grpo", planned_steps=100))
    >>> for step, score in [(10, 0.2), (20, 0.5), (30, 0.4), (40, 0.2)]:
    ...     decision = coord.report("acme", "run-1", ReportRequest(step, eval_score=score))
    >>> decision.action.value, decision.best_step
    ('stop', 20)
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple, TypeVar

from .browse import JobPage, JobQuery, select
from .buckets import TokenBuckets
from .detectors import Decision, Detector
from .errors import Conflict, EvalStopError, InvalidInput, NotFound, QuotaExceeded
from .evals import ExternalEvals
from .export import export_format
from .job import Ack, Amend, Event, Expire, Fail, Finish, Heartbeat, JobState, Observe, Step, Stop, amendments, step
from .memory_store import MemoryStore
from .records import (
    AuditKind,
    AuditRecord,
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
    check_report,
    check_step,
    check_text,
    mode_named,
)
from .repository import JobCache, ReplicatedJobs, Slot
from .requests import (
    AckRequest,
    ClaimRequest,
    EvalResult,
    EventRequest,
    HeartbeatRequest,
    JobRequest,
    ReasonRequest,
    ReportRequest,
    SnapshotRequest,
)
from .store import (
    DONE,
    PRUNABLE,
    JobLimits,
    LimitReached,
    StaleState,
    Store,
    StoreError,
    revival_refused,
    wait_durable,
)
from .summary import TenantSummary
from .tenants import Tenants

__all__ = ["Coordinator", "PendingReport", "WouldBlock", "check_report"]


#: how often a command whose write another replica beat (a version conflict: not an outage) is decided
#: again on what that replica wrote before the caller sees it (a 503 is left for real store outages)
#: The lease of ``evalstop serve`` and of the embedded coordinator: a job silent this long becomes LOST.
DEFAULT_LEASE_S = 300.0
#: A heartbeat within this share of a lease after the job's last sign of life writes nothing.
HEARTBEAT_FRESH = 1 / 8
CONFLICT_RETRIES = 3
EXPORT_PAGE = 1000  # reports or jobs read (and held) at once by an export
_NO_LOCK = contextlib.nullcontext()
CONFLICT_PAUSE_S = 0.005  # the longest pause before the first retry (then 2x, 3x): replicas' retries spread out
T = TypeVar("T")


# the bodies a route may leave out (every field has a default)
_NO_REASON, _NO_ACK, _FROM_JOB = ReasonRequest(), AckRequest(), HeartbeatRequest()

_LAUNCHER_KINDS = {k.value: k for k in AuditKind if k.from_launcher}


def _launcher_event(kind: str, reason: str = "", exit_code: int | None = None) -> tuple[AuditKind, str, dict[str, Any]]:
    """What :meth:`Coordinator.record_event` appends: ``(kind, reason, evidence)``."""
    event = _LAUNCHER_KINDS.get(kind) if isinstance(kind, str) else None
    if event is None:
        raise InvalidInput(f"kind must be one of {', '.join(_LAUNCHER_KINDS)}, but got {kind!r}.")
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)
                                  or not -255 <= exit_code <= 255):
        raise InvalidInput(f"exit_code must be an integer in [-255, 255], but got {exit_code!r}.")
    return event, reason or event.value, {} if exit_code is None else {"exit_code": exit_code}


def _check_reason(reason: Any) -> None:
    check_text("reason", reason, 2000, multiline=True)  # no NUL (PostgreSQL cannot store one) or control codes


StopListener = Callable[[JobRecord, Decision], None]


def _nothing() -> None:
    """No tokens to put back."""


class _AuditUse:
    """A tenant's audit quotas and the bytes of its stored audit lines, as this process last read
    them (outside any lock: a command under a job's lock never reads the store)."""

    __slots__ = ("quotas", "stored", "counted_at")

    def __init__(self, quotas: Quotas, stored: int, counted_at: float) -> None:
        self.quotas, self.stored, self.counted_at = quotas, stored, counted_at


class WouldBlock(Exception):
    """:meth:`Coordinator.submit_report` with ``nonblocking=True`` would have to read the store
    (the job is not in memory, or the store is shared): call it again from a worker thread."""


class PendingReport(NamedTuple):
    """A decided report whose write may not be durable yet (see :meth:`Coordinator.submit_report`)."""

    tenant: str
    job_id: str
    request: ReportRequest  # decided again on a conflict
    decision: Decision
    ticket: Future
    stopped: JobRecord | None  # the job's record if this report stopped it


def _asked(reg: Registration, tags: Mapping | None, hparams: Mapping | None) -> tuple[Mapping | None, Mapping | None]:
    """The tags and hparams a re-registration asks for (None: it says nothing of them)."""
    return None if tags is None else reg.tags, None if hparams is None else reg.hparams


def _asked_policy(reg: Registration, policy: Any, job: JobState) -> Policy | None:
    """The policy a re-registration asks for: none, or one that attaches in the job's mode when it
    does not name a mode (the tenant's default may have changed since the job was registered)."""
    if policy is None:
        return None
    return reg.policy if mode_named(policy) else reg.policy.with_mode(job.record.policy.mode)


class Coordinator:
    """Make and record stop decisions for many tenants' jobs.

    Args:
        store: where state lives (``SQLiteStore``, ``PostgresStore`` or ``MemoryStore``; a new
            MemoryStore if None). A shared store (several replicas) gets a replicated repository.
        clock: a function returning the current time in seconds (virtual time in the simulator).
        default_policy: the policy of jobs registered without one (decline, k=2).
        quotas: per-tenant limits (see :class:`~.records.Quotas`: jobs, active jobs, reports per job and
            per tenant, launcher events and snapshots per job, their rates).
        eval_gap_timeout_s: an external eval not back this long after its snapshot counts as missing.
        lease_s: a pending or running job silent (no report, no heartbeat) for longer becomes LOST at
            the next :meth:`sweep` and frees its quota (None: no leases, e.g. the simulator).
        outage_grace: count silence only from this coordinator's start (a service: its clients could
            not reach it while it was down); False for an embedded coordinator, which dies with its job.
    """

    def __init__(self, store: Store | None = None, clock: Callable[[], float] = time.time,
                 default_policy: Policy | None = None, quotas: Quotas | None = None,
                 eval_gap_timeout_s: float = 600.0, lease_s: float | None = None,
                 outage_grace: bool = False) -> None:
        if lease_s is not None and (isinstance(lease_s, bool) or not isinstance(lease_s, (int, float))
                                    or not 1 <= lease_s <= 7 * 86400):
            raise InvalidInput(f"lease_s must be None or in [1, 604800] seconds, but got {lease_s!r}.")
        self.store = store = MemoryStore() if store is None else store
        self.lease_s = lease_s
        self.clock = clock
        self.default_policy = default_policy or Policy()
        # a detector is its parameters only (what it remembers of a job is the job's own state): the
        # jobs registered under the default policy share one, built once
        self._default_detector = self.default_policy.build()
        self.tenants = Tenants(store, clock, quotas)
        repository = ReplicatedJobs if store.shared else JobCache
        self.jobs = repository(store, lambda t: self.tenants.quotas(t).max_reports_per_job, clock)
        self.external = ExternalEvals(store, self.jobs.read, self.tenants.quotas, clock, self._feed, eval_gap_timeout_s)
        self._stop_listeners: list[StopListener] = []
        self._events = TokenBuckets()  # each tenant's event_rate: launcher events, snapshots, amendments
        self._audit_lines, self._audit_bytes = TokenBuckets(), TokenBuckets()  # each tenant's audit budget
        self._audit: dict[str, _AuditUse] = {}  # tenant -> its audit quotas and stored bytes (see _audit_count)
        self._audit_lock = threading.Lock()  # a tenant's jobs add to its count under their own locks
        self.started_at = clock() if outage_grace else float("-inf")
        if lease_s is not None:
            self.sweep()

    @property
    def eval_gap_timeout_s(self) -> float:
        return self.external.gap_timeout_s

    # ------------------------------------------------------------------ compute, commit, swap
    def _run(self, slot: Slot, command: Any, guard: Callable[[Slot], None] | None = None) -> tuple[Step, Future]:
        """Compute ``command`` on the job's head and queue its write; the swap happens when durable.

        With a shared store a job has at most one write in flight per replica: the command waits
        (holding no lock) until the previous one landed, so no write is ever computed on a write the
        store refused (whose version number another replica's write may have taken). ``guard(slot)``
        runs under the job's lock once the command is computed, just before its write is queued (a
        per-job quota), after the tenant's audit budget took the write's audit lines."""
        shared, jobs = self.jobs.shared, self.jobs
        while True:
            if shared:
                jobs.settle(slot)
            # a lost job may run again: its tenant's active jobs are counted first, under the registration
            # lock in one process (taken before the job's lock, as registrations do), in the write's
            # transaction with a shared store
            lost = slot.head.record.status is JobStatus.LOST
            quotas = self.tenants.quotas(slot.head.record.tenant) if lost else None
            with jobs.register_lock if lost else _NO_LOCK, slot.lock:
                if slot.deleted:  # deleted while this command waited for the lock
                    raise NotFound(f"no job {slot.head.record.job_id!r} for tenant {slot.head.record.tenant!r}")
                if shared and not slot.landed:
                    continue  # another command queued a write meanwhile (or it failed): wait for it
                out = step(slot.head, command)  # pure: nothing changes until the write is queued below
                if out.commit is None:
                    if guard is not None:
                        guard(slot)
                    return out, slot.ticket  # nothing to write: answered once earlier writes are durable
                r = slot.head.record
                revive = None
                if r.status is JobStatus.LOST and out.state.record.status.active:
                    if quotas is None:
                        continue  # lost meanwhile: count with the registration lock held
                    revive = JobLimits(quotas.max_jobs, quotas.max_active_jobs)
                    if not shared and jobs.active(r.tenant) >= quotas.max_active_jobs:
                        raise QuotaExceeded(revival_refused(r.tenant, r.job_id, jobs.active(r.tenant),
                                                            quotas.max_active_jobs))
                refund = self._audit_budget(r.tenant, out.commit.audit)  # before any count moves
                try:
                    if guard is not None:
                        guard(slot)
                except QuotaExceeded:
                    refund()
                    raise
                ticket = jobs.commit(out.commit, r.tenant, r.job_id, revive)
                slot.push(out.state, ticket)
            return out, ticket

    def _settle(self, ticket: Future, tenant: str, job_id: str) -> None:
        """Wait (holding no lock) until a write is durable. If it failed, memory is reloaded from the
        store (the source of truth) and the error re-raised."""
        if ticket is DONE:
            return
        try:
            wait_durable(ticket)
        except StoreError as exc:
            self.jobs.refresh(tenant, job_id)
            if isinstance(exc, LimitReached):  # a shared store counted the tenant's jobs: a quota, not an outage
                raise QuotaExceeded(str(exc)) from None
            raise

    @staticmethod
    def _retrying(attempt: Callable[[], T]) -> T:
        """``attempt()``, made again while another replica's write of the job beats it (a version
        conflict, :class:`StaleState`: the job was reloaded, so the next attempt decides on what that
        replica wrote): at most :data:`CONFLICT_RETRIES` times, each after a short random pause."""
        for retry in range(CONFLICT_RETRIES):
            try:
                return attempt()
            except StaleState:
                time.sleep(random.uniform(0.0, CONFLICT_PAUSE_S * (retry + 1)))
        return attempt()

    def _command(self, tenant: str, job_id: str, command: Any, guard: Callable[[Slot], None] | None = None) -> Step:
        def attempt() -> Step:
            out, ticket = self._run(self.jobs.get(tenant, job_id), command, guard)
            self._settle(ticket, tenant, job_id)
            return out

        out = self._retrying(attempt)
        if out.stopped:
            self._notify(out.state.record, out.decision)
        return out

    def add_stop_listener(self, listener: StopListener) -> None:
        """Call ``listener(job, decision)`` after every stop is durably recorded (no lock held)."""
        self._stop_listeners.append(listener)

    def remove_stop_listener(self, listener: StopListener) -> None:
        with contextlib.suppress(ValueError):  # not added: nothing to do
            self._stop_listeners.remove(listener)

    def _notify(self, record: JobRecord, decision: Decision) -> None:
        for listener in list(self._stop_listeners):
            listener(record, decision)

    # ------------------------------------------------------------------ jobs
    def register_job(self, tenant: str, request: JobRequest) -> tuple[JobView, bool]:
        """Register a job, or attach to it. Returns ``(view, created)``.

        Whoever registers first (a launcher, the callback, an evaluator) creates the job; a later
        registration of the same id attaches to it (``created=False``) and fills in or changes what it
        says (None keeps the job's value): a plan (``planned_steps``), a specific ``job_type`` for a
        generic one, a webhook, a policy while the job has no report — each change in the audit log.
        Another specific job type, or another policy once reports were decided, is a
        :class:`Conflict` (a different job: use a new id). ``job_type`` None means ``rlhf``.
        ``tags`` and ``hparams`` (bounded: :mod:`.labels`): a re-registration's replace the job's."""
        state, created = self._register(tenant, request)
        return state.view(), created

    def add_job(self, tenant: str, request: JobRequest) -> bool:
        """:meth:`register_job` for an in-process caller that does not read the job's view (the
        simulator registers a job per arrival): returns ``created``, with the same checks."""
        return self._register(tenant, request)[1]

    def _register(self, tenant: str, request: JobRequest) -> tuple[JobState, bool]:
        """Register or attach. A store of one process never refuses an insert as stale: a new job is
        the repository's one call (:meth:`JobCache.register`, the common path), a job already there
        the general path (:meth:`_register_once`), and no retry is set up. A shared store's
        registration is made again from the start when another replica's write beat it (it
        registered or amended the job first)."""
        if self.jobs.shared:
            return self._retrying(lambda: self._register_once(tenant, request, *self._registration(tenant, request)))
        reg, quotas = self._registration(tenant, request)
        state = self.jobs.register(tenant, reg, quotas, self._detector(reg))
        return (state, True) if state is not None else self._register_once(tenant, request, reg, quotas)

    def _registration(self, tenant: str, request: JobRequest) -> tuple[Registration, Quotas]:
        """The request checked (the one validation: :meth:`Registration.parse`) and the tenant's quotas."""
        quotas = self.tenants.quotas(tenant)
        job_type = request.job_type
        reg = Registration.parse(request.job_id, JobType.RLHF if job_type is None else job_type, request.planned_steps,
                                 request.policy, request.webhook, default_policy=self.default_policy,
                                 default_mode=quotas.default_mode, tags=request.tags, hparams=request.hparams)
        return reg, quotas

    def _detector(self, reg: Registration) -> Detector | None:
        """The new job's rule: the coordinator's shared default one, or None (built from its policy)."""
        return self._default_detector if reg.policy is self.default_policy else None

    def _register_once(self, tenant: str, request: JobRequest, reg: Registration, quotas: Quotas) -> tuple[JobState, bool]:
        """The general path: attach to the job (amending it if the request changes something), or
        register it if it is not there (the repository's call)."""
        jobs, job_id = self.jobs, reg.job_id
        while True:
            with jobs.register_lock:
                existing = jobs.find(tenant, job_id)
                if existing is not None:
                    changes = amendments(existing.head, None if request.job_type is None else reg.job_type,
                                         request.planned_steps, _asked_policy(reg, request.policy, existing.head),
                                         request.webhook, *_asked(reg, request.tags, request.hparams))
                    if not changes:
                        return existing.head, False
                    amend = Amend(changes, f"tenant:{tenant}", self.clock())
            if existing is not None:
                break
            state = jobs.register(tenant, reg, quotas, self._detector(reg))
            if state is not None:
                return state, True
            # registered meanwhile: attach
        self._event_budget(tenant, "registration amendments")
        self._audit_count(tenant)
        out, ticket = self._run(existing, amend, self._counted(tenant, job_id, existing))
        self._settle(ticket, tenant, job_id)
        return out.state, False

    def report(self, tenant: str, job_id: str, request: ReportRequest) -> Decision:
        """Record one report (durably, before returning) and return the job's decision."""
        if self.jobs.shared:  # another replica's write may beat this one's: decided again on what it wrote
            out = self._retrying(lambda: self._report_durably(tenant, job_id, request))
        else:  # a store of one coordinator never refuses a report's write as stale: no retry to set up
            out, ticket = self._report(tenant, job_id, request)
            if ticket is not DONE:
                self._settle(ticket, tenant, job_id)
        if out.stopped:
            self._notify(out.state.record, out.decision)
        return out.decision

    def _report_durably(self, tenant: str, job_id: str, request: ReportRequest) -> Step:
        out, ticket = self._report(tenant, job_id, request)
        self._settle(ticket, tenant, job_id)
        return out

    def submit_report(self, tenant: str, job_id: str, request: ReportRequest, nonblocking: bool = False) -> PendingReport:
        """Decide on one report, queue its write; :meth:`complete` (or awaiting ``pending.ticket``) waits.
        ``nonblocking``: :class:`WouldBlock` instead of a store read (the service's event-loop path)."""
        if nonblocking and (tenant not in self.jobs.report_limits or not self.jobs.in_memory(tenant, job_id,
                                                                                              request.step)):
            raise WouldBlock(job_id)
        out, ticket = self._report(tenant, job_id, request)
        return PendingReport(tenant, job_id, request, out.decision, ticket, out.state.record if out.stopped else None)

    def _report(self, tenant: str, job_id: str, request: ReportRequest) -> tuple[Step, Future]:
        """Check ``request`` and decide it: on the repository's common path in one call, else here."""
        check_report(request)
        now = self.clock()
        common = self.jobs.observe(tenant, job_id, request, now)
        if common is not None:
            return common
        slot = self.jobs.for_report(tenant, job_id, request.step)  # a replica reads no version before a new step
        # built with the job's plan as read now (the core re-stamps it if an amendment lands first)
        rep = Report.of(request, now, slot.head.record.planned_steps)
        step, last = request.step, slot.head.last
        if last is None or step > last.step:  # a new report (a retry is answered whatever the quota)
            limit = self.jobs.report_limits.get(tenant)
            if limit is None:  # the tenant's quota as of its latest registration (as max_reports_per_job)
                limit = self.jobs.report_limits[tenant] = self.tenants.quotas(tenant).max_reports_per_tenant
            if self.jobs.reports(tenant) >= limit:
                raise QuotaExceeded(f"tenant {tenant!r} has {limit} stored reports, the most allowed "
                                    f"(max_reports_per_tenant={limit}); prune finished jobs ('evalstop prune')")
        stored = None
        if last is not None and step < last.step:  # a late retry of an old step: read the store (no lock held)
            self._settle(slot.ticket, tenant, job_id)
            stored = self.store.report(tenant, job_id, step)
        return self._run(slot, Observe(rep, stored))

    def complete(self, pending: PendingReport) -> Decision:
        """Wait until ``pending`` is durable, run the stop listeners and return the decision (re-raises a
        store error). A write another replica got to first is decided again (:meth:`report`), so the
        decision returned may differ from ``pending.decision``."""
        try:
            self._settle(pending.ticket, pending.tenant, pending.job_id)
        except StaleState:
            return self.report(pending.tenant, pending.job_id, pending.request)
        if pending.stopped is not None:
            self._notify(pending.stopped, pending.decision)
        return pending.decision

    def stop(self, tenant: str, job_id: str, request: ReasonRequest = _NO_REASON, actor: str | None = None) -> JobView:
        """Stop a job by hand (idempotent for a job already stopped)."""
        reason = request.reason
        _check_reason(reason)
        self._audit_count(tenant)
        return self._command(tenant, job_id, Stop(reason, actor or f"tenant:{tenant}", self.clock())).state.view()

    def ack(self, tenant: str, job_id: str, request: AckRequest = _NO_ACK) -> JobView:
        """The job confirms it has its best checkpoint safe and is stopping (at ``step``, if it says:
        the audit then records the stop lag, the steps it trained after the eval that stopped it)."""
        checkpoint, step = request.checkpoint, request.step
        check_checkpoint(checkpoint)
        if step is not None:
            check_step(step)
        self._audit_count(tenant)
        return self._command(tenant, job_id, Ack(checkpoint, step, self.clock())).state.view()

    def finish(self, tenant: str, job_id: str) -> JobView:
        """Mark a job finished (it ran to its end). A stopped or failed job stays as it is."""
        return self._command(tenant, job_id, Finish(self.clock())).state.view()

    def fail(self, tenant: str, job_id: str, request: ReasonRequest = _NO_REASON) -> JobView:
        """Mark a job failed (its trainer crashed), so no job stays "running" forever. A job that is
        already stopped, finished or failed stays as it is."""
        reason = request.reason
        _check_reason(reason)
        self._audit_count(tenant)
        return self._command(tenant, job_id, Fail(reason, f"job:{job_id}", self.clock())).state.view()

    def record_event(self, tenant: str, job_id: str, request: EventRequest) -> None:
        """What the job's launcher did (``launcher_sigterm``, ``launcher_sigkill`` or ``launcher_exit``),
        appended to its audit log; InvalidInput for any other kind (a tenant may not forge a stop)."""
        event, reason, evidence = _launcher_event(request.kind, request.reason, request.exit_code)
        self._event_budget(tenant, "launcher events")
        self.append_event(tenant, job_id, event, reason, evidence, actor="launcher")

    def _event_budget(self, tenant: str, what: str) -> None:
        """One token of the tenant's ``event_rate`` budget (launcher events, snapshots and registration
        amendments share it), else :class:`QuotaExceeded` with the seconds to wait (429 over HTTP)."""
        q = self.tenants.quotas(tenant)
        wait = self._events.take(tenant, q.event_rate, q.event_burst)
        if wait:
            raise QuotaExceeded(f"tenant {tenant!r} sends {what} faster than its quota (event_rate={q.event_rate:g}/s, "
                                f"event_burst={q.event_burst}: launcher events, snapshots and registration "
                                f"amendments together); retry after {wait:.2f} s", retry_after=wait)

    def _audit_budget(self, tenant: str, lines: Sequence[AuditRecord]) -> Callable[[], None]:
        """Count ``lines`` against the tenant's audit budget (``audit_rate`` lines and
        ``audit_bytes_rate`` bytes per second, token buckets). A line the tenant asked for
        (:attr:`AuditKind.by_tenant`: a failure, a manual stop, an ack, a launcher event, an amendment,
        a deletion) beyond it, or past ``max_audit_bytes`` stored, is :class:`QuotaExceeded` (429 over
        HTTP; with the seconds to wait for a rate) and nothing is written; the coordinator's own lines
        are counted and always written. Returns what puts the tokens back (the write was then refused
        for another reason)."""
        if not lines:
            return _nothing
        use = self._audit.get(tenant)  # read by _audit_count before a command that writes a tenant's line
        q = use.quotas if use is not None else self.tenants.default_quotas
        n, size = len(lines), sum(a.nbytes for a in lines)

        def count(delta: int) -> None:
            if use is not None:
                with self._audit_lock:
                    use.stored += delta

        if not any(a.kind.by_tenant for a in lines):
            self._audit_lines.spend(tenant, q.audit_rate, q.audit_burst, n)
            self._audit_bytes.spend(tenant, q.audit_bytes_rate, q.audit_bytes_burst, size)
            count(size)
            return _nothing
        wait = self._audit_lines.take(tenant, q.audit_rate, q.audit_burst, n)
        if not wait:
            wait = self._audit_bytes.take(tenant, q.audit_bytes_rate, q.audit_bytes_burst, size)
            if wait:
                self._audit_lines.give(tenant, q.audit_burst, n)
        if wait:
            raise QuotaExceeded(
                f"tenant {tenant!r} writes to the audit log faster than its quota (audit_rate={q.audit_rate:g} "
                f"lines/s, audit_burst={q.audit_burst}; audit_bytes_rate={q.audit_bytes_rate:g} bytes/s, "
                f"audit_bytes_burst={q.audit_bytes_burst}: failures, stops, acks, launcher events, amendments and "
                f"deletions with their reasons); retry after {wait:.2f} s", retry_after=wait)

        def refund() -> None:
            self._audit_lines.give(tenant, q.audit_burst, n)
            self._audit_bytes.give(tenant, q.audit_bytes_burst, size)
            count(-size)

        with self._audit_lock:
            stored = None if use is None else use.stored
            full = stored is not None and stored + size > q.max_audit_bytes
            if use is not None and not full:
                use.stored += size
        if full:
            self._audit_lines.give(tenant, q.audit_burst, n)
            self._audit_bytes.give(tenant, q.audit_bytes_burst, size)
            raise QuotaExceeded(f"tenant {tenant!r} has {stored} bytes of audit lines stored, the most allowed "
                                f"(max_audit_bytes={q.max_audit_bytes}); the operator's retention reclaims old ones "
                                f"('evalstop prune --audit-older-than')")
        return refund

    #: a shared store's other replicas write audit lines too: count again this often
    AUDIT_COUNT_TTL_S = 5.0

    def _audit_count(self, tenant: str) -> None:
        """Read the tenant's quotas and its stored audit bytes (the ``max_audit_bytes`` quota) before a
        command that writes a line it asks for, holding no lock: the bytes once per process (every
        write is then added), or every :attr:`AUDIT_COUNT_TTL_S` with a shared store."""
        quotas, now = self.tenants.quotas(tenant), self.clock()
        use = self._audit.get(tenant)
        if use is None or (self.jobs.shared and now - use.counted_at > self.AUDIT_COUNT_TTL_S):
            self._audit[tenant] = _AuditUse(quotas, self.store.count_audit_bytes(tenant), now)
        else:
            use.quotas = quotas

    def append_event(self, tenant: str, job_id: str, kind: AuditKind, reason: str, evidence: dict,
                     actor: str = "coordinator") -> None:
        """Append a launcher or webhook event to the job's audit log."""
        _check_reason(reason)
        if kind.by_tenant:
            self._audit_count(tenant)
        command = Event(kind, reason, dict(evidence), actor, self.clock())
        if not kind.counted:
            self._command(tenant, job_id, command)
            return
        self._command(tenant, job_id, command, self._counted(tenant, job_id, self.jobs.get(tenant, job_id)))

    def _counted(self, tenant: str, job_id: str, slot: Slot) -> Callable[[Slot], None]:
        """A guard that counts one more launcher event or amendment of the job against
        ``max_events_per_job`` (the job's count is read from the store once, holding no lock)."""
        limit = self.tenants.quotas(tenant).max_events_per_job
        counted = slot.events
        if counted is None:
            counted = slot.events = self.store.count_events(tenant, job_id)

        def within_quota(slot: Slot) -> None:  # under the job's lock: counted and queued together
            if slot.events is None:  # reloaded meanwhile
                slot.events = counted
            if slot.events >= limit:
                raise QuotaExceeded(f"job {job_id!r} has {slot.events} launcher events and registration amendments, "
                                    f"the most a job may have (max_events_per_job={limit}); start a new job")
            slot.events += 1

        return within_quota

    # ------------------------------------------------------------------ reads: the committed state only (what a restart would rebuild), no lock held while views are built
    def browse(self, tenant: str, query: JobQuery) -> JobPage:
        """One page of the tenant's runs that ``query`` matches, in its order (see :mod:`.browse`):
        their views, how many match in all, and the cursor of the next page. Only the page's jobs
        are built into views (finished jobs replayed on first access)."""
        page = select(self.jobs.run_rows(tenant), query, self.clock())
        views = []
        for job_id in page.jobs:
            try:
                views.append(self.jobs.read(tenant, job_id).view())
            except NotFound:  # removed since the records were read
                continue
        return JobPage(tuple(views), page.total, page.next)

    def summary(self, tenant: str) -> TenantSummary:
        """The tenant's jobs by outcome and what its detectors' stops saved (:mod:`.summary`). Views
        are built only for the jobs that need one (stopped, or in shadow mode); the rest are counted
        from their records."""
        def views():
            for record in self.jobs.run_rows(tenant):
                if record.status.value == "stopped" or record.mode == "shadow":
                    try:
                        yield self.jobs.read(tenant, record.job_id).view()
                    except NotFound:
                        continue
                else:
                    yield _RecordView(record)

        return TenantSummary.of(views(), tenant)

    def export_reports(self, tenant: str, job_id: str, fmt: str = "csv") -> Iterator[str]:
        """The job's reports as ``fmt`` (``csv`` or ``json``) text chunks, read a page at a time.
        The job is looked up (NotFound) and the format checked before the first chunk."""
        writer = export_format(fmt)
        self.jobs.read(tenant, job_id)

        def pages():
            after = None
            while True:
                page = self.store.reports(tenant, job_id, after, EXPORT_PAGE)
                if page:
                    yield page
                if len(page) < EXPORT_PAGE:
                    return
                after = page[-1].step

        return writer.reports(pages())

    def export_jobs(self, tenant: str, query: JobQuery, fmt: str = "csv") -> Iterator[str]:
        """Every run ``query`` matches (its filters and order; its cursor and limit are ignored) as
        ``fmt`` text chunks, a page of :data:`EXPORT_PAGE` views at a time."""
        writer = export_format(fmt)
        first = dataclasses.replace(query, limit=EXPORT_PAGE, after=None)

        def pages():
            q = first
            while True:
                page = self.browse(tenant, q)
                if page.jobs:
                    yield page.jobs
                if page.next is None:
                    return
                cursor = JobQuery.parse(sort=q.sort, after=page.next)
                q = dataclasses.replace(first, after=cursor.after, at=cursor.at)

        return writer.jobs(pages())

    def evals(self, tenant: str, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[EvalTask]:
        """The job's published snapshots and their evals' states, in step order: those after
        ``after_step``, at most ``limit`` (a keyed read of one page)."""
        self.jobs.read(tenant, job_id)
        return self.store.evals(tenant, job_id, after_step, limit)

    def state(self, tenant: str, job_id: str) -> JobState:
        """The job's durable state (what a restart would rebuild)."""
        return self.jobs.read(tenant, job_id)

    def status(self, tenant: str, job_id: str) -> JobView:
        return self.jobs.read(tenant, job_id).view()

    def list_jobs(self, tenant: str, status: JobStatus | str | None = None, limit: int | None = None,
                  offset: int = 0) -> list[JobView]:
        """The tenant's jobs in registration order, optionally of one ``status``, paged."""
        return self.page_jobs(tenant, status, limit, offset)[0]

    def page_jobs(self, tenant: str, status: JobStatus | str | None = None, limit: int | None = None,
                  offset: int = 0) -> tuple[list[JobView], int]:
        """``(views, total)``: one page of the tenant's jobs (``total`` counts every match). No lock is
        held while views are built, so listing thousands of jobs never holds up another tenant."""
        wanted = None if status is None else (status if isinstance(status, JobStatus) else _parse_status(status))
        states, total = self.jobs.page(tenant, wanted, limit, offset)
        return [s.view() for s in states], total

    def report_span(self, tenant: str, job_id: str) -> tuple[Report | None, Report | None]:
        """The job's first and last durable report (None before any)."""
        state = self.jobs.read(tenant, job_id)
        return state.first, state.last

    def reports(self, tenant: str, job_id: str, after_step: int | None = None, limit: int | None = None) -> list[Report]:
        """The job's durable reports in step order: those after ``after_step``, at most ``limit``."""
        self.jobs.read(tenant, job_id)
        return self.store.reports(tenant, job_id, after_step, limit)

    def audit(self, tenant: str, job_id: str | None = None, limit: int | None = None,
              offset: int = 0, after: int | None = None) -> list[AuditRecord]:
        """The tenant's audit records (of one job if ``job_id``), oldest first, paged by ``offset`` or
        by keyset (``after``: the sequence number :meth:`audit_page` gave for the previous page)."""
        return self.store.audit_page(tenant, job_id, limit, offset, after)[0]

    def audit_page(self, tenant: str, job_id: str | None = None, limit: int | None = None, offset: int = 0,
                   after: int | None = None) -> tuple[list[AuditRecord], int | None]:
        """:meth:`audit` and the ``after`` of the next page (None after an empty page)."""
        return self.store.audit_page(tenant, job_id, limit, offset, after)

    # ------------------------------------------------------------------ leases: a job silent for longer than lease_s becomes LOST; a report or heartbeat revives it
    def heartbeat(self, tenant: str, job_id: str, request: HeartbeatRequest = _FROM_JOB) -> JobView:
        """The job is alive: renews its lease (a LOST job is RUNNING again). Reports renew it too.
        Returns the job's view: a trainer learns a stop between its evals from it. A job seen within
        the last eighth of a lease is not written again (:data:`HEARTBEAT_FRESH`)."""
        actor = request.actor
        check_text("actor", actor, 128, min_len=1)
        now, fresh = self.clock(), (self.lease_s or DEFAULT_LEASE_S) * HEARTBEAT_FRESH
        out = self._command(tenant, job_id, Heartbeat(actor, now, fresh))
        if out.commit is None:  # not written: the sweep of this process still counts it as a sign of life
            slot = self.jobs.get(tenant, job_id)
            slot.beat_at = max(slot.beat_at, now)
        return out.state.view()

    def sweep(self) -> list[tuple[str, str]]:
        """Mark LOST every pending or running job silent for longer than ``lease_s`` (the service runs
        this periodically; an embedded coordinator when it opens). Returns the (tenant, job_id) marked."""
        if self.lease_s is None:
            return []
        now = self.clock()
        lease = self.lease_s
        marked = []
        for slot in self.jobs.live_slots():
            state = slot.head
            # a heartbeat answered without a write (HEARTBEAT_FRESH) is a sign of life too; another replica,
            # which did not answer it, may mark the job lost up to lease * HEARTBEAT_FRESH early
            if not state.record.status.active or now - max(state.last_seen, slot.beat_at, self.started_at) <= lease:
                continue
            r = state.record
            try:
                out = self._command(r.tenant, r.job_id, Expire(lease + max(0.0, self.started_at - state.last_seen),
                                                               now))
            except (StoreError, EvalStopError):
                continue  # another replica changed it, or the store is down: the next sweep retries
            if out.commit is not None:
                marked.append((r.tenant, r.job_id))
        return marked

    # ------------------------------------------------------------------ external evals (see :mod:`.evals`)
    def _feed(self, tenant: str, job_id: str, tasks: Sequence[EvalTask]) -> None:
        """Report scored snapshots in step order: queued together, then waited for together (one
        fsync for a catch-up batch); raises a store error (then nothing of the batch is marked fed)."""
        pending = []
        for task in tasks:
            try:
                pending.append(self.submit_report(tenant, job_id, task.report()))
            except Conflict:
                pass  # fed before a crash, or reported some other way: the stored report stands
        for p in pending:
            self.complete(p)

    def publish_snapshot(self, tenant: str, job_id: str, request: SnapshotRequest) -> EvalTask:
        """A job saved a snapshot for external evaluators (see :meth:`.evals.ExternalEvals.publish`)."""
        self._event_budget(tenant, "snapshots")
        return self.external.publish(tenant, job_id, request)

    def claim_eval(self, tenant: str, request: ClaimRequest) -> EvalTask | None:
        """Lease the tenant's oldest snapshot waiting for an eval (see :meth:`.evals.ExternalEvals.claim`)."""
        return self.external.claim(tenant, request.worker, request.lease_s)

    def post_eval(self, tenant: str, job_id: str, step: int, request: EvalResult) -> Decision:
        """An evaluator's result for a snapshot (see :meth:`.evals.ExternalEvals.post`)."""
        return self.external.post(tenant, job_id, step, request)

    # ------------------------------------------------------------------ deleting one of the tenant's own ended jobs (its audit line stays)
    def delete_job(self, tenant: str, job_id: str, request: ReasonRequest = _NO_REASON,
                   actor: str | None = None) -> JobView:
        """Delete the tenant's ended job (see the module docstring); returns the job as it was.

        Raises:
            NotFound: no such job for this tenant. Conflict: the job is not over yet, or a write of it
            is still on its way to the disk (retry). InvalidInput: a reason that is not text.
        """
        reason = request.reason
        check_text("reason", reason, 2000, multiline=True)
        slot = self.jobs.get(tenant, job_id)
        self._audit_count(tenant)
        with slot.lock:
            if slot.deleted or slot.committed is None:
                raise NotFound(f"no job {job_id!r:.140} for tenant {tenant!r}")
            if slot.pending:
                raise Conflict(f"job {job_id!r} has a write in progress; retry in a moment")
            state = slot.committed
            status = state.record.status.value
            if status not in PRUNABLE:
                raise Conflict(f"job {job_id!r} is {status}: only a stopped, finished, failed or lost job can be "
                               "deleted; stop it or mark it failed first")
            view = state.view()
            audit = AuditRecord(tenant, job_id, self.clock(), AuditKind.DELETED, actor or f"tenant:{tenant}",
                                reason or "deleted", {"status": status, "n_reports": view.n_reports,
                                                      "last_step": view.last_step})
            refund = self._audit_budget(tenant, (audit,))
            if not self.store.delete_job(tenant, job_id, audit):
                refund()
                raise NotFound(f"no job {job_id!r:.140} for tenant {tenant!r}")
            self.jobs.forget(slot, view.n_reports)
        return view

    def close(self) -> None:
        self.store.close()


class _RecordView:
    """What :meth:`TenantSummary.of` reads of a job that needs no replay (its status)."""

    __slots__ = ("status",)
    would_stop_step = None

    def __init__(self, record) -> None:
        self.status = record.status.value


def _parse_status(value: str) -> JobStatus:
    try:
        return JobStatus(value)
    except ValueError:
        raise InvalidInput(f"Unknown status {value!r}; valid statuses are: {', '.join(s.value for s in JobStatus)}.") \
            from None

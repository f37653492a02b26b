"""The Coordinator: the one place where stop decisions are made.

The HTTP service, the embedded client of the TRL callback and the platform simulator all call this
same class. It is thread-safe, uses only the injected ``clock`` for time, and keeps the store as the
source of truth: on construction it rebuilds every job's state by replaying the stored reports, so a
reopened coordinator answers exactly as an uninterrupted one.

Each operation is *compute → commit → swap*: the pure job core (:mod:`.job`) computes the job's next
state and the rows to write; the store queues them; the in-memory state readers see is replaced
only once the write is durable (:mod:`.repository`), so memory always equals what a restart
rebuilds. Locks are per job and held only while a step is computed and its write queued, never
across a disk or network wait; stop listeners run after every lock is released. External evals
live in :mod:`.evals`, tenants and tokens in :mod:`.tenants`, validation in :mod:`.records`.

Rules:

* Jobs are namespaced by tenant; a tenant never sees another tenant's jobs (:class:`NotFound`).
* Reports are idempotent on (tenant, job_id, step): an identical repeat is accepted once; a
  different payload for a stored step raises :class:`Conflict`; reports must come in step order.
* Reports for a stopped, finished or failed job are recorded but never change its status or decision.
* Every stop (detector or manual) is appended to the audit log with its reason and evidence.

Example::

    >>> coord = Coordinator()  # an in-memory store
    >>> _ = coord.register_job("acme", "run-1", "grpo", planned_steps=100)
    >>> for step, score in [(10, 0.2), (20, 0.5), (30, 0.4), (40, 0.3)]:
    ...     decision = coord.report("acme", "run-1", step, eval_score=score)
    >>> decision.action.value, decision.best_step
    ('stop', 20)
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, NamedTuple, TypeVar

from .detectors import Decision
from .errors import InvalidInput, NotFound, QuotaExceeded
from .evals import ExternalEvalMethods, ExternalEvals
from .job import Ack, Amend, Event, Fail, Finish, JobState, Observe, Step, Stop, amendments, step
from .leases import JobLeases
from .memory_store import MemoryStore
from .reads import JobReads
from .records import (
    MAX_STEP,
    AuditKind,
    JobRecord,
    JobType,
    JobView,
    Policy,
    Quotas,
    Registration,
    Report,
    check_checkpoint,
    check_report,
    check_text,
    mode_named,
)
from .removal import JobRemoval
from .repository import JobCache, ReplicatedJobs, Slot
from .store import DONE, JobLimits, LimitReached, StaleState, Store, StoreError, wait_durable
from .tenants import Tenants

__all__ = ["Coordinator", "PendingReport", "WouldBlock", "check_report"]

_isfinite = math.isfinite

#: how often a command whose write another replica beat (a version conflict: not an outage) is decided
#: again on what that replica wrote before the caller sees it (a 503 is left for real store outages)
CONFLICT_RETRIES = 3
CONFLICT_PAUSE_S = 0.005  # the longest pause before the first retry (then 2x, 3x): replicas' retries spread out
T = TypeVar("T")


def _check_reason(reason: Any) -> None:
    check_text("reason", reason, 2000, multiline=True)  # no NUL (PostgreSQL cannot store one) or control codes


StopListener = Callable[[JobRecord, Decision], None]


class WouldBlock(Exception):
    """:meth:`Coordinator.submit_report` with ``nonblocking=True`` would have to read the store
    (the job is not in memory, or the store is shared): call it again from a worker thread."""


class PendingReport(NamedTuple):
    """A decided report whose write may not be durable yet (see :meth:`Coordinator.submit_report`)."""

    tenant: str
    job_id: str
    decision: Decision
    ticket: Future
    stopped: JobRecord | None  # the job's record if this report stopped it
    args: tuple  # the report's (step, eval_score, train_loss, proxy_reward, checkpoint): decided again on a conflict


def _check_job_quotas(jobs: JobCache, tenant: str, quotas: Quotas) -> None:
    """QuotaExceeded if the tenant may not register another job (under the registration lock)."""
    total = jobs.total(tenant)
    if total >= quotas.max_jobs:
        raise QuotaExceeded(f"tenant {tenant!r} has {total} jobs, the most allowed (max_jobs={quotas.max_jobs},"
                            " finished ones included); prune old ones ('evalstop prune') or ask for more")
    active = jobs.active(tenant)
    if active >= quotas.max_active_jobs:
        raise QuotaExceeded(f"tenant {tenant!r} has {active} active jobs, the most allowed "
                            f"(max_active_jobs={quotas.max_active_jobs}); finish or stop some first")


def _asked(reg: Registration, tags: Mapping | None, hparams: Mapping | None) -> tuple[Mapping | None, Mapping | None]:
    """The tags and hparams a re-registration asks for (None: it says nothing of them)."""
    return None if tags is None else reg.tags, None if hparams is None else reg.hparams


def _asked_policy(reg: Registration, policy: Any, job: JobState) -> Policy | None:
    """The policy a re-registration asks for: none, or one that attaches in the job's mode when it
    does not name a mode (the tenant's default may have changed since the job was registered)."""
    if policy is None:
        return None
    return reg.policy if mode_named(policy) else reg.policy.with_mode(job.record.policy.mode)


class Coordinator(JobReads, JobLeases, ExternalEvalMethods, JobRemoval):
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
        self.tenants = Tenants(store, clock, quotas)
        repository = ReplicatedJobs if store.shared else JobCache
        self.jobs = repository(store, lambda t: self.tenants.quotas(t).max_reports_per_job, clock)
        self.external = ExternalEvals(self, eval_gap_timeout_s)
        self._stop_listeners: list[StopListener] = []
        self._report_limits: dict[str, int] = {}  # tenant -> max_reports_per_tenant, read at registration
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
        runs under the job's lock just before the command is computed (a per-job quota)."""
        shared = self.jobs.shared
        while True:
            if shared:
                self.jobs.settle(slot)
            with slot.lock:
                if slot.deleted:  # deleted while this command waited for the lock
                    raise NotFound(f"no job {slot.head.record.job_id!r} for tenant {slot.head.record.tenant!r}")
                if shared and not slot.landed:
                    continue  # another command queued a write meanwhile (or it failed): wait for it
                if guard is not None:
                    guard(slot)
                out = step(slot.head, command)
                if out.commit is None:
                    return out, slot.ticket  # nothing to write: answered once earlier writes are durable
                r = slot.head.record
                ticket = self.jobs.commit(out.commit, r.tenant, r.job_id)
                slot.push(out.state, ticket)
            return out, ticket

    def _settle(self, ticket: Future, tenant: str, job_id: str) -> None:
        """Wait (holding no lock) until a write is durable. If it failed, memory is reloaded from the
        store (the source of truth) and the error re-raised."""
        if ticket is DONE:
            return
        try:
            wait_durable(ticket)
        except StoreError:
            self.jobs.refresh(tenant, job_id)
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
    def register_job(self, tenant: str, job_id: str, job_type: str | JobType | None = None,
                     planned_steps: int | None = None, policy: Policy | dict | None = None,
                     webhook: str | None = None, tags: Mapping | None = None,
                     hparams: Mapping | None = None) -> tuple[JobView, bool]:
        """Register a job, or attach to it. Returns ``(view, created)``.

        Whoever registers first (a launcher, the callback, an evaluator) creates the job; a later
        registration of the same id attaches to it (``created=False``) and fills in or changes what it
        says (None keeps the job's value): a plan (``planned_steps``), a specific ``job_type`` for a
        generic one, a webhook, a policy while the job has no report — each change in the audit log.
        Another specific job type, or another policy once reports were decided, is a
        :class:`Conflict` (a different job: use a new id). ``job_type`` None means ``rlhf``.
        ``tags`` and ``hparams`` (bounded: :mod:`.labels`): a re-registration's replace the job's."""
        state, created = self._register(tenant, job_id, job_type, planned_steps, policy, webhook, tags, hparams)
        return state.view(), created

    def add_job(self, tenant: str, job_id: str, job_type: str | JobType | None = None,
                planned_steps: int | None = None, policy: Policy | dict | None = None,
                webhook: str | None = None) -> bool:
        """:meth:`register_job` for an in-process caller that does not read the job's view (the
        simulator registers a job per arrival): returns ``created``, with the same checks."""
        return self._register(tenant, job_id, job_type, planned_steps, policy, webhook)[1]

    def _register(self, *args: Any) -> tuple[JobState, bool]:
        return self._retrying(lambda: self._register_once(*args))  # another replica registered it: attach

    def _register_once(self, tenant: str, job_id: str, job_type: str | JobType | None, planned_steps: int | None,
                       policy: Policy | dict | None, webhook: str | None, tags: Mapping | None = None,
                       hparams: Mapping | None = None) -> tuple[JobState, bool]:
        quotas = self.tenants.quotas(tenant)
        reg = Registration.parse(job_id, JobType.RLHF if job_type is None else job_type, planned_steps, policy,
                                 webhook, default_policy=self.default_policy, default_mode=quotas.default_mode,
                                 tags=tags, hparams=hparams)
        jobs = self.jobs
        with jobs.register_lock:
            existing = jobs.find(tenant, job_id)
            if existing is not None:
                changes = amendments(existing.head, None if job_type is None else reg.job_type, planned_steps,
                                     _asked_policy(reg, policy, existing.head), webhook, *_asked(reg, tags, hparams))
                if not changes:
                    return existing.head, False
                amend = Amend(changes, f"tenant:{tenant}", self.clock())
        if existing is not None:
            out, ticket = self._run(existing, amend)
            self._settle(ticket, tenant, job_id)
            return out.state, False
        with jobs.register_lock:
            if jobs.find(tenant, job_id) is not None:  # registered meanwhile: attach
                return self._register_once(tenant, job_id, job_type, planned_steps, policy, webhook, tags, hparams)
            self._report_limits[tenant] = quotas.max_reports_per_tenant
            _check_job_quotas(jobs, tenant, quotas)
            record = JobRecord.new(tenant, reg, self.clock())
            state = JobState(record, reg.policy.build(), max_reports=quotas.max_reports_per_job, version=1)
            # a shared store checks the quotas again inside the insert's transaction (replicas race)
            ticket = self.store.register(record, JobLimits(quotas.max_jobs, quotas.max_active_jobs))
            slot = jobs.insert(state, committed=False)
            slot.push(state, ticket)
        if ticket is not DONE:
            try:
                wait_durable(ticket)
            except StoreError as exc:
                jobs.remove(slot)
                if isinstance(exc, LimitReached):
                    raise QuotaExceeded(str(exc)) from None
                raise
        return state, True

    def report(self, tenant: str, job_id: str, step: int, eval_score: float | None = None,
               train_loss: float | None = None, proxy_reward: float | None = None,
               checkpoint: str | None = None) -> Decision:
        """Record one report (durably, before returning) and return the job's decision."""
        def attempt() -> Step:
            out, ticket = self._report(tenant, job_id, step, eval_score, train_loss, proxy_reward, checkpoint)
            if ticket is not DONE:
                self._settle(ticket, tenant, job_id)
            return out

        out = self._retrying(attempt)
        if out.stopped:
            self._notify(out.state.record, out.decision)
        return out.decision

    def submit_report(self, tenant: str, job_id: str, step: int, eval_score: float | None = None,
                      train_loss: float | None = None, proxy_reward: float | None = None,
                      checkpoint: str | None = None, nonblocking: bool = False) -> PendingReport:
        """Decide on one report, queue its write; :meth:`complete` (or awaiting ``pending.ticket``) waits.
        ``nonblocking``: :class:`WouldBlock` instead of a store read (the service's event-loop path)."""
        if nonblocking and (tenant not in self._report_limits or not self.jobs.in_memory(tenant, job_id, step)):
            raise WouldBlock(job_id)
        out, ticket = self._report(tenant, job_id, step, eval_score, train_loss, proxy_reward, checkpoint)
        return PendingReport(tenant, job_id, out.decision, ticket, out.state.record if out.stopped else None,
                             (step, eval_score, train_loss, proxy_reward, checkpoint))

    def _report(self, tenant: str, job_id: str, step: int, eval_score: float | None, train_loss: float | None,
                proxy_reward: float | None, checkpoint: str | None) -> tuple[Step, Future]:
        if not (type(step) is int and 0 <= step <= MAX_STEP
                and (eval_score is None or type(eval_score) is float and _isfinite(eval_score))
                and (train_loss is None or type(train_loss) is float and _isfinite(train_loss))
                and (proxy_reward is None or type(proxy_reward) is float and _isfinite(proxy_reward))):
            check_report(step, eval_score, train_loss, proxy_reward)
        if checkpoint is not None:
            check_checkpoint(checkpoint)
        slot = self.jobs.get(tenant, job_id)
        rep = Report(step, eval_score, train_loss, proxy_reward, checkpoint, self.clock())
        last = slot.head.last
        if last is None or step > last.step:  # a new report (a retry is answered whatever the quota)
            limit = self._report_limits.get(tenant)
            if limit is None:  # the tenant's quota as of its latest registration (as max_reports_per_job)
                limit = self._report_limits[tenant] = self.tenants.quotas(tenant).max_reports_per_tenant
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
            return self.report(pending.tenant, pending.job_id, *pending.args)
        if pending.stopped is not None:
            self._notify(pending.stopped, pending.decision)
        return pending.decision

    def stop(self, tenant: str, job_id: str, reason: str = "", actor: str | None = None) -> JobView:
        """Stop a job by hand (idempotent for a job already stopped)."""
        _check_reason(reason)
        return self._command(tenant, job_id, Stop(reason, actor or f"tenant:{tenant}", self.clock())).state.view()

    def ack(self, tenant: str, job_id: str, checkpoint: str | None = None, step: int | None = None) -> JobView:
        """The job confirms it has its best checkpoint safe and is stopping (at ``step``, if it says:
        the audit then records the stop lag, the steps it trained after the eval that stopped it)."""
        check_checkpoint(checkpoint)
        if step is not None:
            check_report(step)
        return self._command(tenant, job_id, Ack(checkpoint, step, self.clock())).state.view()

    def finish(self, tenant: str, job_id: str) -> JobView:
        """Mark a job finished (it ran to its end). A stopped or failed job stays as it is."""
        return self._command(tenant, job_id, Finish(self.clock())).state.view()

    def fail(self, tenant: str, job_id: str, reason: str = "") -> JobView:
        """Mark a job failed (its trainer crashed), so no job stays "running" forever. A job that is
        already stopped, finished or failed stays as it is."""
        _check_reason(reason)
        return self._command(tenant, job_id, Fail(reason, f"job:{job_id}", self.clock())).state.view()

    def record_event(self, tenant: str, job_id: str, kind: AuditKind, reason: str, evidence: dict,
                     actor: str = "coordinator") -> None:
        """Append a launcher or webhook event to the job's audit log."""
        _check_reason(reason)
        command = Event(kind, reason, dict(evidence), actor, self.clock())
        if not kind.from_launcher:
            self._command(tenant, job_id, command)
            return
        slot = self.jobs.get(tenant, job_id)
        limit = self.tenants.quotas(tenant).max_events_per_job
        counted = slot.events
        if counted is None:
            counted = slot.events = self.store.count_events(tenant, job_id)  # once per job (no lock held)

        def within_quota(slot: Slot) -> None:  # under the job's lock: counted and queued together
            if slot.events is None:  # reloaded meanwhile
                slot.events = counted
            if slot.events >= limit:
                raise QuotaExceeded(f"job {job_id!r} has {slot.events} launcher events, the most a job may have "
                                    f"(max_events_per_job={limit})")
            slot.events += 1

        self._command(tenant, job_id, command, within_quota)

    def close(self) -> None:
        self.store.close()

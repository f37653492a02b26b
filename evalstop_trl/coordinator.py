"""The Coordinator: the one place where stop decisions are made.

The HTTP service, the embedded client of the TRL callback and the platform simulator all call this
same class. It is thread-safe (one lock), uses only the injected ``clock`` for time, and keeps the
store as the source of truth: on construction it rebuilds every job's detector by replaying the
stored reports, so a reopened coordinator answers exactly as an uninterrupted one.

Rules:

* Jobs are namespaced by tenant; a tenant never sees another tenant's jobs (:class:`NotFound`).
* Reports are idempotent on (tenant, job_id, step): an identical repeat is accepted once; a
  different payload for a stored step raises :class:`Conflict`; reports must come in step order.
* Reports for a stopped or finished job are recorded but never change its status or decision.
* Every stop (detector or manual) is appended to the audit log with its reason and evidence.

Example::

    >>> coord = Coordinator(MemoryStore())
    >>> _ = coord.register_job("acme", "run-1", "grpo", planned_steps=100)
    >>> for step, score in [(10, 0.2), (20, 0.5), (30, 0.4), (40, 0.3)]:
    ...     decision = coord.report("acme", "run-1", step, eval_score=score)
    >>> decision.action.value, decision.best_step
    ('stop', 20)
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .detectors import Action, Decision, Detector, Observation
from .errors import Conflict, InvalidInput, NotFound, Unauthorized
from .models import AuditKind, AuditRecord, JobRecord, JobStatus, JobType, Policy, Report
from .store import DONE, MemoryStore, Store, StoreError, TenantRecord, Ticket

__all__ = ["Coordinator", "JobView", "hash_token"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")
MAX_STEP = 2**53
_TERMINAL = frozenset({JobStatus.STOPPED, JobStatus.FINISHED, JobStatus.FAILED})
# Enum members bound once: looking them up on the class is slow, and this is the report hot path.
_RUNNING, _PENDING, _CONTINUE = JobStatus.RUNNING, JobStatus.PENDING, Action.CONTINUE


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(kind: str, value: Any) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise InvalidInput(
            f"{kind} must be 1-128 characters of letters, digits and _ . : @ - (starting with a letter "
            f"or digit), but got {value!r}."
        )
    return value


@dataclass(frozen=True, slots=True)
class JobView:
    """What a tenant may read about one of its jobs."""

    job_id: str
    job_type: str
    status: str
    policy: dict[str, Any]
    decision: Decision | None
    best_step: int | None
    best_score: float | None
    best_checkpoint: str | None
    n_reports: int
    last_step: int | None
    planned_steps: int | None
    acked: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "job_type": self.job_type,
            "status": self.status,
            "policy": self.policy,
            "decision": self.decision.to_dict() if self.decision else None,
            "best_step": self.best_step,
            "best_score": self.best_score,
            "best_checkpoint": self.best_checkpoint,
            "n_reports": self.n_reports,
            "last_step": self.last_step,
            "planned_steps": self.planned_steps,
            "acked": self.acked,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobView:
        dec = d.get("decision")
        decision = None
        if dec:
            decision = Decision(Action(dec["action"]), dec["reason"], dec.get("best_step"), dec.get("best_score"),
                                dec.get("evidence") or {})
        return cls(
            job_id=d["job_id"], job_type=d["job_type"], status=d["status"], policy=d.get("policy") or {},
            decision=decision, best_step=d.get("best_step"), best_score=d.get("best_score"),
            best_checkpoint=d.get("best_checkpoint"), n_reports=d.get("n_reports", 0),
            last_step=d.get("last_step"), planned_steps=d.get("planned_steps"), acked=d.get("acked", False),
        )


class _Live:
    """In-memory state of one job: its record, its detector and its reports by step."""

    __slots__ = ("record", "detector", "reports", "last_step", "decision", "job_type")

    def __init__(self, record: JobRecord, detector: Detector) -> None:
        self.record = record
        self.job_type = record.job_type.value
        self.detector = detector
        self.reports: dict[int, Report] = {}
        self.last_step: int | None = None
        self.decision: Decision | None = None  # the detector's latest answer


StopListener = Callable[[JobRecord, Decision], None]


class PendingReport(NamedTuple):
    """A decided report whose write may not be durable yet (see :meth:`Coordinator.submit_report`)."""

    tenant: str
    job_id: str
    decision: Decision
    ticket: Ticket
    stopped: JobRecord | None  # the job's record if this report stopped it


class Coordinator:
    """Make and record stop decisions for many tenants' jobs.

    Args:
        store: where state lives (:class:`~evalstop_trl.store.SQLiteStore` or ``MemoryStore``).
        clock: a function returning the current time in seconds (virtual time in the simulator).
        default_policy: the policy of jobs registered without one (decline, k=2).
    """

    def __init__(
        self,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
        default_policy: Policy | None = None,
    ) -> None:
        self.store = store if store is not None else MemoryStore()
        self.clock = clock
        self.default_policy = default_policy or Policy()
        self._lock = threading.RLock()
        self._jobs: dict[tuple[str, str], _Live] = {}
        self._stop_listeners: list[StopListener] = []
        self._rebuild()

    # ------------------------------------------------------------------ state rebuild
    def _rebuild(self) -> None:
        for record in self.store.jobs():
            self._jobs[(record.tenant, record.job_id)] = self._load(record)

    def _load(self, record: JobRecord) -> _Live:
        live = _Live(record, record.policy.build())
        for rep in self.store.reports(record.tenant, record.job_id):
            live.decision = live.detector.observe(self._observation(live, rep))
            live.reports[rep.step] = rep
            live.last_step = rep.step
        return live

    def _settle(self, ticket: Ticket, tenant: str, job_id: str) -> None:
        """Wait until a write is durable. If it failed, reload the job from the store (the source of
        truth) so memory never claims what the disk does not hold, and re-raise."""
        try:
            ticket.wait()
        except StoreError:
            with self._lock:
                stored = [r for r in self.store.jobs() if (r.tenant, r.job_id) == (tenant, job_id)]
                if stored:
                    self._jobs[(tenant, job_id)] = self._load(stored[0])
                else:
                    self._jobs.pop((tenant, job_id), None)
            raise

    def add_stop_listener(self, listener: StopListener) -> None:
        """Call ``listener(job, decision)`` after every stop is durably recorded."""
        self._stop_listeners.append(listener)

    # ------------------------------------------------------------------ tenants
    def add_tenant(self, name: str) -> str:
        """Create a tenant and return its new token (shown once; only its hash is stored)."""
        check_name("tenant name", name)
        token = "es_" + secrets.token_urlsafe(32)
        self.store.add_tenant(TenantRecord(name, hash_token(token), self.clock()))
        return token

    def authenticate(self, token: str | None) -> str:
        """Return the tenant owning ``token`` or raise :class:`Unauthorized`."""
        if not token:
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        t = self.store.tenant_by_hash(hash_token(token))
        if t is None:
            raise Unauthorized("unknown token: create one with 'evalstop tenants add NAME'")
        if t.revoked:
            raise Unauthorized(f"the token of tenant {t.name!r} was revoked")
        return t.name

    # ------------------------------------------------------------------ jobs
    def _get(self, tenant: str, job_id: str) -> _Live:
        live = self._jobs.get((tenant, job_id))
        if live is None:
            raise NotFound(f"no job {job_id!r} for tenant {tenant!r}")
        return live

    def register_job(
        self,
        tenant: str,
        job_id: str,
        job_type: str | JobType = JobType.RLHF,
        planned_steps: int | None = None,
        policy: Policy | dict | None = None,
        pid: int | None = None,
        pid_start_time: float | None = None,
        webhook: str | None = None,
    ) -> tuple[JobView, bool]:
        """Register a job. Returns ``(view, created)``; an identical re-registration returns
        ``created=False``; a different one for an existing id raises :class:`Conflict`."""
        check_name("job_id", job_id)
        jt = job_type if isinstance(job_type, JobType) else JobType.parse(job_type)
        if planned_steps is not None and (
            isinstance(planned_steps, bool) or not isinstance(planned_steps, int) or not 0 < planned_steps <= MAX_STEP
        ):
            raise InvalidInput(f"planned_steps must be a positive integer, but got {planned_steps!r}.")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1):
            raise InvalidInput(f"pid must be an integer > 1, but got {pid!r}.")
        if webhook is not None and (not isinstance(webhook, str) or not re.match(r"^https?://", webhook)):
            raise InvalidInput(f"webhook must be an http(s) URL, but got {webhook!r}.")
        if policy is None:
            pol = self.default_policy
        elif isinstance(policy, Policy):
            pol = policy
        else:
            pol = Policy.from_dict(policy)
        now = self.clock()
        record = JobRecord(
            tenant=tenant, job_id=job_id, job_type=jt, planned_steps=planned_steps, policy=pol,
            pid=pid, pid_start_time=pid_start_time, webhook=webhook, created_at=now, updated_at=now,
        )
        with self._lock:
            existing = self._jobs.get((tenant, job_id))
            if existing is not None:
                if existing.record.registration() == record.registration():
                    return self._view(existing), False
                raise Conflict(
                    f"job {job_id!r} is already registered with a different job_type, planned_steps, "
                    f"policy, pid or webhook; use a new job_id"
                )
            ticket = self.store.commit(record)
            live = _Live(record, pol.build())
            self._jobs[(tenant, job_id)] = live
            view = self._view(live)
        self._settle(ticket, tenant, job_id)
        return view, True

    @staticmethod
    def _observation(live: _Live, rep: Report) -> Observation:
        """What the detector may see of one report (raises ValueError for non-finite numbers)."""
        planned = live.record.planned_steps
        return Observation(live.record.job_id, rep.step, rep.eval_score, rep.train_loss, rep.proxy_reward,
                           live.job_type, rep.step / planned if planned else None)

    def report(self, tenant: str, job_id: str, step: int, eval_score: float | None = None,
               train_loss: float | None = None, proxy_reward: float | None = None,
               checkpoint: str | None = None) -> Decision:
        """Record one report (durably, before returning) and return the job's decision."""
        pending = self.submit_report(tenant, job_id, step, eval_score, train_loss, proxy_reward, checkpoint)
        ticket = pending.ticket
        if pending.stopped is not None or not ticket.done or ticket.error is not None:
            self.complete(pending)  # waits, raises a store error, runs the stop listeners
        return pending.decision

    def complete(self, pending: PendingReport) -> None:
        """Wait until ``pending`` is durable, then run the stop listeners (re-raises a store error)."""
        self._settle(pending.ticket, pending.tenant, pending.job_id)
        if pending.stopped is not None:
            self._notify(pending.stopped, pending.decision)

    def submit_report(
        self,
        tenant: str,
        job_id: str,
        step: int,
        eval_score: float | None = None,
        train_loss: float | None = None,
        proxy_reward: float | None = None,
        checkpoint: str | None = None,
    ) -> PendingReport:
        """Decide on one report and queue its durable write; :meth:`complete` waits for it.

        The async service awaits ``pending.ticket`` instead of blocking a thread."""
        if checkpoint is not None and (not isinstance(checkpoint, str) or len(checkpoint) > 4096):
            raise InvalidInput("checkpoint must be a path string of at most 4096 characters.")
        with self._lock:
            live = self._get(tenant, job_id)
            record = live.record
            rep = Report(step, eval_score, train_loss, proxy_reward, checkpoint, self.clock())
            try:
                obs = self._observation(live, rep)
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None
            if step > MAX_STEP:
                raise InvalidInput(f"step must be at most {MAX_STEP}, but got {step}.")
            stored = live.reports.get(step)
            if stored is not None:
                if stored.payload() == rep.payload():
                    return PendingReport(tenant, job_id, self._current(live), DONE, None)
                raise Conflict(
                    f"step {step} of job {job_id!r} already has a different report "
                    f"(stored {_payload_str(stored)}, got {_payload_str(rep)}); a step is reported once"
                )
            if live.last_step is not None and step < live.last_step:
                raise Conflict(
                    f"reports must come in step order: step {step} is before the last reported step "
                    f"{live.last_step} of job {job_id!r}"
                )
            decision = live.detector.observe(obs)
            status = record.status
            stopped = False
            if status is _RUNNING and decision.action is _CONTINUE:  # the hot path
                ticket = self.store.add_report(tenant, job_id, rep)
                live.reports[step] = rep
                live.last_step = step
                live.decision = decision
                return PendingReport(tenant, job_id, decision, ticket, None)
            if status in _TERMINAL:
                ticket = self.store.add_report(tenant, job_id, rep)  # recorded, changes nothing
            elif decision.action is Action.STOP:
                stopped = True
                record = record.evolve(
                    status=status.to(JobStatus.STOPPED), decision=decision,
                    stopped_by=f"detector:{record.policy.detector}", stopped_at=rep.received_at,
                    updated_at=rep.received_at,
                )
                audit = AuditRecord(
                    tenant, job_id, rep.received_at, AuditKind.STOP, record.stopped_by, decision.reason,
                    {**decision.evidence, "step": step, "best_step": decision.best_step,
                     "best_score": decision.best_score},
                )
                ticket = self.store.commit(record, rep, (audit,))
            elif status is JobStatus.PENDING:
                record = record.evolve(status=JobStatus.RUNNING, updated_at=rep.received_at)
                ticket = self.store.commit(record, rep)
            else:
                ticket = self.store.add_report(tenant, job_id, rep)
            live.record = record
            live.reports[step] = rep
            live.last_step = step
            live.decision = decision
            return PendingReport(tenant, job_id, self._current(live), ticket, record if stopped else None)

    def _current(self, live: _Live) -> Decision:
        """The decision a job's reports and status say now."""
        record = live.record
        if record.status in _TERMINAL:
            if record.decision is not None:
                return record.decision
            return Decision(Action.CONTINUE, f"job is {record.status.value}", live.detector.best_step,
                            live.detector.best_score)
        return live.decision or self._pending_decision(live)

    def _pending_decision(self, live: _Live) -> Decision:
        return Decision(Action.CONTINUE, "no eval yet", live.detector.best_step, live.detector.best_score)

    def _notify(self, record: JobRecord, decision: Decision) -> None:
        for listener in list(self._stop_listeners):
            listener(record, decision)

    def stop(self, tenant: str, job_id: str, reason: str = "", actor: str | None = None) -> JobView:
        """Stop a job by hand (idempotent for a job already stopped)."""
        if not isinstance(reason, str) or len(reason) > 2000:
            raise InvalidInput("reason must be a string of at most 2000 characters.")
        with self._lock:
            live = self._get(tenant, job_id)
            record = live.record
            if record.status is JobStatus.STOPPED:
                return self._view(live)
            status = record.status.to(JobStatus.STOPPED)
            now = self.clock()
            who = actor or f"tenant:{tenant}"
            decision = Decision(
                Action.STOP, f"manual stop by {who}: {reason or 'no reason given'}",
                live.detector.best_step, live.detector.best_score, {"manual": True},
            )
            new = record.evolve(status=status, decision=decision, stopped_by=who, stopped_at=now, updated_at=now)
            ticket = self.store.commit(new, None, (AuditRecord(
                tenant, job_id, now, AuditKind.MANUAL_STOP, who, decision.reason,
                {"best_step": decision.best_step, "best_score": decision.best_score}),))
            live.record = new
            view = self._view(live)
        self._settle(ticket, tenant, job_id)
        self._notify(new, decision)
        return view

    def ack(self, tenant: str, job_id: str, checkpoint: str | None = None) -> JobView:
        """The job confirms it has its best checkpoint safe and is stopping."""
        if checkpoint is not None and (not isinstance(checkpoint, str) or len(checkpoint) > 4096):
            raise InvalidInput("checkpoint must be a path string of at most 4096 characters.")
        with self._lock:
            live = self._get(tenant, job_id)
            record = live.record
            if record.status is not JobStatus.STOPPED:
                raise Conflict(f"job {job_id!r} is {record.status.value}: there is no stop to acknowledge")
            now = self.clock()
            new = record.evolve(acked_at=record.acked_at or now, checkpoint=checkpoint or record.checkpoint,
                          updated_at=now)
            audit = ()
            if record.acked_at is None:
                audit = (AuditRecord(tenant, job_id, now, AuditKind.ACK, f"job:{job_id}", "stop acknowledged",
                                     {"checkpoint": new.checkpoint}),)
            ticket = self.store.commit(new, None, audit)
            live.record = new
            view = self._view(live)
        self._settle(ticket, tenant, job_id)
        return view

    def finish(self, tenant: str, job_id: str) -> JobView:
        """Mark a job finished (it ran to its end). A stopped job stays stopped."""
        with self._lock:
            live = self._get(tenant, job_id)
            record = live.record
            if record.status in (JobStatus.STOPPED, JobStatus.FINISHED):
                return self._view(live)
            now = self.clock()
            new = record.evolve(status=record.status.to(JobStatus.FINISHED), finished_at=now, updated_at=now)
            ticket = self.store.commit(new)
            live.record = new
            view = self._view(live)
        self._settle(ticket, tenant, job_id)
        return view

    def record_signal(self, tenant: str, job_id: str, kind: AuditKind, reason: str, evidence: dict) -> None:
        """Append an enforcement or webhook event to the audit log."""
        with self._lock:
            live = self._get(tenant, job_id)
            now = self.clock()
            ticket = self.store.commit(live.record, None, (AuditRecord(tenant, job_id, now, kind, "coordinator",
                                                                       reason, evidence),))
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
            decision=self._current(live) if live.reports or r.decision else None, best_step=det.best_step, best_score=det.best_score,
            best_checkpoint=best_ckpt, n_reports=len(live.reports), last_step=live.last_step,
            planned_steps=r.planned_steps, acked=r.acked_at is not None,
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

"""The pure job core: one job's state and the commands that change it.

``step(state, command) -> Step`` is a pure function: no lock, store, clock or I/O inside. It returns
the job's next state, the decision a caller gets, and the effects as data (:class:`Commit`: the
rows to write, the audit lines, the webhook deliveries; ``stopped``: a stop to deliver). The
:class:`~evalstop_trl.core.coordinator.Coordinator` applies a step as *compute → commit → swap*: it
computes the step on the job's state, hands the commit to the store, and replaces the in-memory
state only once the store says the commit is durable. A state is never changed in place (the
detector's memory of the job is a value too), so a failed commit leaves memory exactly as the store is,
and :func:`replay` rebuilds, from the stored reports, the state the steps had built.

Example::

    >>> from evalstop_trl.core.records import JobRecord, Registration
    >>> state = JobState.new(JobRecord.new("acme", Registration.parse("run-1", "grpo"), now=0.0))
    >>> out = step(state, Observe(Report(10, eval_score=0.5, received_at=1.0)))
    >>> out.state.record.status.value, out.commit.report.step, state.n_reports
    ('running', 10, 0)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from .codec import to_wire
from .detectors import Action, Decision, Detector, DetectorState
from .errors import Conflict, QuotaExceeded
from .logged import with_evidence
from .records import (
    AuditKind,
    AuditRecord,
    Delivery,
    JobRecord,
    JobStatus,
    JobType,
    JobView,
    Policy,
    PolicyMode,
    Report,
    check_report,
)
from .requests import values

_GENERIC_TYPES = frozenset({JobType.RLHF, JobType.OTHER})

__all__ = [
    "Ack", "Amend", "Commit", "Event", "Expire", "Fail", "Finish", "Heartbeat", "JobState", "Observe", "Step", "Stop",
    "SHADOW_REASON", "amendments", "observe", "replay", "shadowed", "step", "stop_delivery",
]

_NO_EVIDENCE: Mapping[str, Any] = MappingProxyType({})


class JobState(NamedTuple):
    """Everything the coordinator keeps in memory about one job; never changed in place.

    Memory is bounded: the detector's state, the first and last report and counters (the reports
    themselves are in the store). ``version`` counts the job's writes (shared stores check it)."""

    record: JobRecord
    detector: Detector  # the job's rule: its parameters only (shared, never changed)
    memory: DetectorState  # what the rule remembers of the job's evals (a value)
    first: Report | None = None
    last: Report | None = None
    n_reports: int = 0
    best_checkpoint: str | None = None  # the checkpoint reported with the best step
    decision: Decision | None = None  # the detector's latest answer
    max_reports: int = 10**9  # the tenant's quota when the job was loaded or registered
    version: int = 0
    would_stop: Decision | None = None  # shadow mode: the first stop the detector decided
    would_stop_step: int | None = None  # ... and the step of the eval that decided it
    best_proxy: float | None = None  # the proxy reward reported with the best step (a stop's evidence)
    best_length: float | None = None  # the completion length reported with the best step (a stop's evidence)

    @classmethod
    def new(cls, record: JobRecord, max_reports: int = 10**9, detector: Detector | None = None,
            version: int | None = None) -> JobState:
        """A job with no report yet: a stored job before its replay (at the record's ``version``), or a
        new registration (``version=1``: the insert is the job's first write)."""
        detector = detector or record.policy.build()
        return cls(record, detector, detector.start(), max_reports=max_reports,
                   version=record.version if version is None else version)

    @property
    def last_seen(self) -> float:
        """When the job last gave a sign of life: its registration, heartbeat or latest report."""
        seen = self.record.last_seen or self.record.created_at
        last = self.last
        return seen if last is None or last.received_at < seen else last.received_at

    def current(self) -> Decision:
        """The decision the job's reports and status say now."""
        record = self.record
        if record.status.terminal:
            if record.decision is not None:
                return record.decision
            return Decision(Action.CONTINUE, f"job is {record.status.value}", self.memory.best_step,
                            self.memory.best_score)
        return self.decision or Decision(Action.CONTINUE, "no eval yet", self.memory.best_step, self.memory.best_score)

    def view(self) -> JobView:
        """What the tenant reads about the job."""
        r, det = self.record, self.memory
        return JobView(
            job_id=r.job_id, job_type=r.job_type.value, status=r.status.value, policy=r.policy.to_dict(),
            decision=self.current() if self.n_reports or r.decision else None, best_step=det.best_step,
            best_score=det.best_score, best_checkpoint=r.checkpoint or self.best_checkpoint,
            n_reports=self.n_reports, last_step=None if self.last is None else self.last.step,
            planned_steps=r.planned_steps, acked=r.acked_at is not None, created_at=r.created_at,
            last_seen=self.last_seen, ended_at=r.stopped_at if r.stopped_at is not None else r.finished_at,
            would_stop=self.would_stop, would_stop_step=self.would_stop_step, tags=r.tags, hparams=r.hparams,
        )


class Commit(NamedTuple):
    """The rows one step writes, atomically: the job's new record (None: unchanged), a report, audit
    lines and webhook deliveries. ``expect``: the job's version this write replaces, and ``created``
    its ``created_at`` (with the version, the job's identity: a job deleted and registered again
    under its id starts its versions again)."""

    job: JobRecord | None
    report: Report | None
    audit: tuple[AuditRecord, ...]
    deliveries: tuple[Delivery, ...]
    expect: int
    created: float | None = None


class Step(NamedTuple):
    """The result of one command: the next state, the caller's answer and the effects.

    ``commit`` is None when nothing changes (an identical retry, finishing a finished job); the
    caller then answers once the job's earlier writes are durable. ``stopped``: this step stopped the
    job, so the stop is delivered (listeners, webhook) once the commit is durable."""

    state: JobState
    decision: Decision
    commit: Commit | None = None
    stopped: bool = False


# ---------------------------------------------------------------------------------------- commands
class Observe(NamedTuple):
    """A report. ``stored``: the store's report of the same step, when it is before the last one (a
    late retry: the caller reads it, since the core reads nothing)."""

    report: Report
    stored: Report | None = None


class Stop(NamedTuple):
    """A stop by hand."""

    reason: str
    actor: str
    now: float


class Ack(NamedTuple):
    """The job has its best checkpoint safe and is stopping (at ``step``, if it says)."""

    checkpoint: str | None
    step: int | None
    now: float


class Finish(NamedTuple):
    """The job ran to its end."""

    now: float


class Fail(NamedTuple):
    """The job failed: its trainer crashed, or its stored history cannot be replayed."""

    reason: str
    actor: str
    now: float


class Event(NamedTuple):
    """A launcher or webhook event for the audit log (changes nothing else)."""

    kind: AuditKind
    reason: str
    evidence: Mapping[str, Any]
    actor: str
    now: float


class Heartbeat(NamedTuple):
    """The job is alive (its callback or launcher says so between reports). A job seen less than
    ``fresh_s`` ago changes nothing (no write): frequent heartbeats, which carry the job's decision
    back to its trainer, cost the store one write per ``fresh_s`` at most."""

    actor: str
    now: float
    fresh_s: float = 0.0


class Expire(NamedTuple):
    """The lease check: a pending or running job silent for more than ``lease_s`` becomes LOST."""

    lease_s: float
    now: float


class Amend(NamedTuple):
    """A re-registration that fills in or changes the job's plan, type, policy or webhook (see
    :func:`amendments`): ``changes`` maps field names to new values."""

    changes: Mapping[str, Any]
    actor: str
    now: float


def step(state: JobState, command: Any) -> Step:
    """Apply ``command`` to ``state`` (pure). Raises :class:`Conflict` or :class:`QuotaExceeded` for
    a command the job refuses; ``state`` is never changed."""
    handler = _HANDLERS.get(type(command))
    if handler is None:
        raise TypeError(f"step() takes one of {', '.join(c.__name__ for c in _HANDLERS)}, "
                        f"but got {type(command).__name__}.")
    return handler(state, command)


def _payload_str(rep: Report) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values(rep.request()).items() if k != "step" and v is not None)


def _observe(state: JobState, cmd: Observe) -> Step:
    return observe(state, cmd.report, cmd.stored)


def observe(state: JobState, rep: Report, stored: Report | None = None) -> Step:
    """The job after one report (pure): the common case (a new step, decided by the job's rule) first.
    ``stored``: the store's report of the same step when it is before the last one (a late retry: the
    caller reads it, since the core reads nothing)."""
    record, last = state.record, state.last
    job_id = record.job_id
    if last is not None and rep.step <= last.step:
        stored = last if rep.step == last.step else stored
        if stored is None:
            raise Conflict(f"reports must come in step order: step {rep.step} is before the last reported step "
                           f"{last.step} of job {job_id!r}")
        if stored.request() == rep.request():
            return Step(state, state.current())  # an identical retry
        raise Conflict(f"step {rep.step} of job {job_id!r} already has a different report "
                       f"(stored {_payload_str(stored)}, got {_payload_str(rep)}); a step is reported once")
    if state.n_reports >= state.max_reports:
        raise QuotaExceeded(f"job {job_id!r} has {state.n_reports} reports, the most a job may have "
                            f"(max_reports_per_job={state.max_reports}); start a new job")
    detector = state.detector
    if rep.planned_steps != record.planned_steps:  # stored with the plan it is decided under (see replay)
        rep = rep._replace(planned_steps=record.planned_steps)
    memory, decision = detector.decide(state.memory, rep)  # the report is the observation (checked on arrival)
    best = memory.best_step == rep.step
    best_proxy = rep.proxy_reward if best else state.best_proxy
    best_length = rep.length if best else state.best_length
    status = record.status
    new_record, audit, deliveries, stopped = record, (), (), False
    would_stop, would_stop_step = state.would_stop, state.would_stop_step
    if decision.action is Action.STOP and record.policy.mode is PolicyMode.SHADOW:
        memory = detector.resume(memory)  # the job trains on: its best keeps following its evals
        decision = with_evidence(decision, best_proxy, best_length, rep.proxy_reward, rep.length)  # as a stop's
        if would_stop is None:
            would_stop, would_stop_step = decision, rep.step
            audit = (AuditRecord(record.tenant, job_id, rep.received_at, AuditKind.WOULD_STOP,
                                 f"detector:{record.policy.detector}", decision.reason,
                                 {**decision.evidence, "step": rep.step, "best_step": decision.best_step,
                                  "best_score": decision.best_score}),)
        decision = shadowed(decision, would_stop_step)
    if status.terminal:
        pass  # recorded; changes nothing
    elif decision.action is Action.STOP:
        decision = with_evidence(decision, best_proxy, best_length, rep.proxy_reward, rep.length)
        actor = f"detector:{record.policy.detector}"
        now = rep.received_at
        new_record = record.evolve(status=status.to(JobStatus.STOPPED), updated_at=now, decision=decision,
                                         stopped_by=actor, stopped_at=now)
        audit = (AuditRecord(record.tenant, job_id, now, AuditKind.STOP, actor, decision.reason,
                             {**decision.evidence, "step": rep.step, "best_step": decision.best_step,
                              "best_score": decision.best_score}),)
        deliveries = _deliveries(record, new_record, now)
        stopped = True
    elif status is JobStatus.PENDING:
        new_record = record.evolve(status=JobStatus.RUNNING, updated_at=rep.received_at)
    elif status is JobStatus.LOST:
        new_record = record.evolve(status=JobStatus.RUNNING, updated_at=rep.received_at)
        audit = (*audit, _seen_again(state, rep.received_at, f"report of step {rep.step}"))
    new = JobState(new_record, detector, memory, state.first or rep, rep, state.n_reports + 1,
                   rep.checkpoint if best else state.best_checkpoint, decision,
                   state.max_reports, state.version + 1, would_stop, would_stop_step, best_proxy, best_length)
    # job None: only the report is written (the fast path), so a step with audit lines writes the record too
    commit = Commit(None if new_record is record and not audit else new_record, rep, audit, deliveries, state.version,
                    state.record.created_at)
    return Step(new, new.current() if new_record.status.terminal else decision, commit, stopped)


#: how a shadow-mode job's answer to a decided stop begins (then the detector's reason)
SHADOW_REASON = "shadow mode, not stopped: would stop: "


def shadowed(decision: Decision, would_stop_step: int | None) -> Decision:
    """A shadow-mode job's answer to a stop its detector decided: CONTINUE, saying what would have
    happened (evidence ``would_stop``: the step of the first would-stop eval)."""
    return Decision(Action.CONTINUE, SHADOW_REASON + decision.reason, decision.best_step,
                    decision.best_score, {**decision.evidence, "would_stop": would_stop_step})


def _transition(state: JobState, status: JobStatus, now: float, audit: AuditRecord | None,
                **changes: Any) -> tuple[JobState, Commit]:
    """``state`` moved to ``status`` (by the status's transition table), and the commit that writes it."""
    record = state.record
    new_record = record.evolve(status=record.status.to(status), updated_at=now, **changes)
    deliveries = _deliveries(record, new_record, now) if status is JobStatus.STOPPED else ()
    new = state._replace(record=new_record, version=state.version + 1)
    return new, Commit(new_record, None, () if audit is None else (audit,), deliveries, state.version,
                       state.record.created_at)


def _stop(state: JobState, cmd: Stop) -> Step:
    record, det = state.record, state.memory
    if record.status is JobStatus.STOPPED:
        return Step(state, state.current())
    decision = Decision(Action.STOP, f"manual stop by {cmd.actor}: {cmd.reason or 'no reason given'}",
                        det.best_step, det.best_score, {"manual": True})
    audit = AuditRecord(record.tenant, record.job_id, cmd.now, AuditKind.MANUAL_STOP, cmd.actor, decision.reason,
                        {"best_step": decision.best_step, "best_score": decision.best_score})
    new, commit = _transition(state, JobStatus.STOPPED, cmd.now, audit, decision=decision, stopped_by=cmd.actor,
                              stopped_at=cmd.now)
    return Step(new, decision, commit, stopped=True)


def _ack(state: JobState, cmd: Ack) -> Step:
    record = state.record
    if record.status is not JobStatus.STOPPED:
        raise Conflict(f"job {record.job_id!r} is {record.status.value}: there is no stop to acknowledge")
    first = record.acked_at is None
    checkpoint = cmd.checkpoint or record.checkpoint
    audit = None
    if first:
        evidence: dict[str, Any] = {"checkpoint": checkpoint}
        decided_at = decided_step(state)
        if cmd.step is not None and decided_at is not None:
            evidence.update(step=cmd.step, stop_lag=max(0, cmd.step - decided_at))
        audit = AuditRecord(record.tenant, record.job_id, cmd.now, AuditKind.ACK, f"job:{record.job_id}",
                            "stop acknowledged", evidence)
    elif checkpoint == record.checkpoint:
        return Step(state, state.current())  # a repeated ack changes nothing
    new, commit = _transition(state, JobStatus.STOPPED, cmd.now, audit, acked_at=record.acked_at or cmd.now,
                              checkpoint=checkpoint)
    return Step(new, new.current(), commit)


def _finish(state: JobState, cmd: Finish) -> Step:
    if state.record.status.terminal:
        return Step(state, state.current())
    new, commit = _transition(state, JobStatus.FINISHED, cmd.now, None, finished_at=cmd.now)
    return Step(new, new.current(), commit)


def _fail(state: JobState, cmd: Fail) -> Step:
    record = state.record
    if record.status.terminal:
        return Step(state, state.current())
    audit = AuditRecord(record.tenant, record.job_id, cmd.now, AuditKind.FAILED, cmd.actor,
                        cmd.reason or "the job reported a failure", {})
    new, commit = _transition(state, JobStatus.FAILED, cmd.now, audit, finished_at=cmd.now)
    return Step(new, new.current(), commit)


def _event(state: JobState, cmd: Event) -> Step:
    record = state.record
    audit = AuditRecord(record.tenant, record.job_id, cmd.now, cmd.kind, cmd.actor, cmd.reason, cmd.evidence)
    new = state._replace(version=state.version + 1)
    return Step(new, new.current(), Commit(record, None, (audit,), (), state.version, state.record.created_at))


def _seen_again(state: JobState, now: float, how: str) -> AuditRecord:
    r = state.record
    return AuditRecord(r.tenant, r.job_id, now, AuditKind.SEEN_AGAIN, f"job:{r.job_id}",
                       f"seen again ({how}) after {now - state.last_seen:.0f} s of silence", {})


def _heartbeat(state: JobState, cmd: Heartbeat) -> Step:
    record = state.record
    # a heartbeat says the job's process runs: a pending job (no report yet) is running from its first one
    waking = record.status in (JobStatus.LOST, JobStatus.PENDING)
    if record.status.terminal or (not waking and cmd.now - state.last_seen < cmd.fresh_s):
        return Step(state, state.current())
    audit = _seen_again(state, cmd.now, f"heartbeat from {cmd.actor}") if record.status is JobStatus.LOST else None
    new_record = record.evolve(status=JobStatus.RUNNING if waking else record.status, last_seen=cmd.now)
    new = state._replace(record=new_record, version=state.version + 1)
    return Step(new, new.current(), Commit(new_record, None, () if audit is None else (audit,), (), state.version,
                                           state.record.created_at))


def _expire(state: JobState, cmd: Expire) -> Step:
    record = state.record
    silent = cmd.now - state.last_seen
    if not record.status.active or silent <= cmd.lease_s:
        return Step(state, state.current())
    reason = f"no report or heartbeat for {silent:.0f} s (lease {cmd.lease_s:g} s): marked lost"
    audit = AuditRecord(record.tenant, record.job_id, cmd.now, AuditKind.LOST, "coordinator", reason,
                        {"last_seen": state.last_seen, "lease_s": cmd.lease_s})
    new, commit = _transition(state, JobStatus.LOST, cmd.now, audit)
    return Step(new, new.current(), commit)


#: An amendment's audit line names at most this many changed labels (tags, hparams), each value cut
#: to ``_SHOWN_CHARS``: the line stays about a kilobyte whatever a re-registration sends.
_SHOWN_LABELS, _SHOWN_CHARS = 8, 64


def _amend(state: JobState, cmd: Amend) -> Step:
    record = state.record
    evidence = {k: _diff(getattr(record, k), v) for k, v in cmd.changes.items()}
    said = "; ".join(f"{k} {_said(evidence[k])}" for k in cmd.changes)
    audit = AuditRecord(record.tenant, record.job_id, cmd.now, AuditKind.AMENDED, cmd.actor,
                        f"registration amended: {said}", evidence)
    new_record = record.evolve(updated_at=cmd.now, **cmd.changes)
    if "policy" in cmd.changes:
        detector = new_record.policy.build()
        new = state._replace(record=new_record, detector=detector, memory=detector.start(), version=state.version + 1)
    else:
        new = state._replace(record=new_record, version=state.version + 1)
    return Step(new, new.current(), Commit(new_record, None, (audit,), (), state.version, state.record.created_at))


def _shown(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return getattr(value, "value", value)


def _cut(value: Any) -> Any:
    text = value if isinstance(value, str) else None
    return value if text is None or len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _diff(old: Any, new: Any) -> dict[str, Any]:
    """An amended field's audit evidence: ``{"from": old, "to": new}``, or for labels (tags, hparams)
    only what changed: ``set`` (new or changed keys), ``removed`` and ``more`` (changes not listed)."""
    if not isinstance(new, Mapping):
        return {"from": _shown(old), "to": _shown(new)}
    old = old if isinstance(old, Mapping) else {}
    changed = [k for k in sorted(new) if k not in old or old[k] != new[k]]
    removed = [k for k in sorted(old) if k not in new]
    shown = (changed + removed)[:_SHOWN_LABELS]
    return {"set": {_cut(k): _cut(new[k]) for k in changed if k in shown},
            "removed": [_cut(k) for k in removed if k in shown], "more": len(changed) + len(removed) - len(shown)}


def _said(diff: Mapping[str, Any]) -> str:
    if "to" in diff:
        return f"{diff['from']} -> {diff['to']}"
    parts = [f"{k}={v}" for k, v in diff["set"].items()] + [f"-{k}" for k in diff["removed"]]
    return "{" + ", ".join(parts) + (f", and {diff['more']} more" if diff["more"] else "") + "}"


def amendments(state: JobState, job_type: JobType | None, planned_steps: int | None, policy: Policy | None,
               webhook: str | None, tags: Mapping[str, Any] | None = None,
               hparams: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a re-registration changes (only what it says: None keeps the job's value). Raises
    :class:`Conflict` for a change that would make it another job: another specific job type, or
    another policy once the job has reports (its history was decided under the old one)."""
    record = state.record
    changes: dict[str, Any] = {}
    if job_type is not None and job_type is not record.job_type:
        if record.job_type not in _GENERIC_TYPES and job_type not in _GENERIC_TYPES:
            raise Conflict(f"job {record.job_id!r} is a {record.job_type.value} job, not {job_type.value}; "
                           f"use a new job_id for another job")
        if record.job_type in _GENERIC_TYPES:
            changes["job_type"] = job_type
    if planned_steps is not None and planned_steps != record.planned_steps:
        changes["planned_steps"] = planned_steps  # filled in, or an extended/shortened plan (audited)
    if policy is not None and policy != record.policy:
        if state.n_reports:
            raise Conflict(f"job {record.job_id!r} has {state.n_reports} reports decided under policy "
                           f"{record.policy.to_dict()}; a new policy needs a new job_id")
        changes["policy"] = policy
    if webhook is not None and webhook != record.webhook:
        changes["webhook"] = webhook
    if tags is not None and dict(tags) != dict(record.tags):
        changes["tags"] = tags  # a re-registration's tags replace the job's (audited)
    if hparams is not None and dict(hparams) != dict(record.hparams):
        changes["hparams"] = hparams
    return changes


_HANDLERS: dict[type, Callable[[JobState, Any], Step]] = {
    Observe: _observe, Stop: _stop, Ack: _ack, Finish: _finish, Fail: _fail, Event: _event,
    Heartbeat: _heartbeat, Expire: _expire, Amend: _amend,
}


def replay(record: JobRecord, reports: Iterable[Report], max_reports: int = 10**9) -> JobState:
    """The state a stored job's reports rebuild (the store's record is the truth for its status).

    The same fold as :func:`step`'s reports, each with the plan it was decided under (a plan amended
    later changes the reports after it, never the decisions before). Raises what the detector raises
    on a history it cannot take (the coordinator then marks the job failed)."""
    detector = record.policy.build()
    memory = detector.start()
    first = last = None
    n = 0
    best_checkpoint = decision = would_stop = would_stop_step = best_proxy = best_length = None
    planned = record.planned_steps
    shadow = record.policy.mode is PolicyMode.SHADOW
    for rep in reports:
        # what a file holds is checked as on arrival (a bad row: InvalidInput, a ValueError)
        check_report(rep)
        if rep.planned_steps is None:  # stored before plans were kept: decided under the job's plan
            rep = rep._replace(planned_steps=planned)
        memory, decision = detector.decide(memory, rep)
        if shadow and decision.action is Action.STOP:
            memory = detector.resume(memory)
            if would_stop is None:
                would_stop, would_stop_step = decision, rep.step
            decision = shadowed(decision, would_stop_step)
        first = first or rep
        last = rep
        n += 1
        if memory.best_step == rep.step:
            best_checkpoint, best_proxy, best_length = rep.checkpoint, rep.proxy_reward, rep.length
    return JobState(record, detector, memory, first, last, n, best_checkpoint, decision, max_reports, record.version,
                    would_stop, would_stop_step, best_proxy, best_length)


def counted(record: JobRecord, reports: Iterable[Report], max_reports: int = 10**9) -> JobState:
    """A stored job whose history cannot be replayed: its counts, a fresh detector, no decision."""
    first = last = None
    n = 0
    for rep in reports:
        first = first or rep
        last = rep
        n += 1
    detector = _fresh_or_never(record)
    return JobState(record, detector, detector.start(), first, last, n, None, None, max_reports, record.version)


def _fresh_or_never(record: JobRecord) -> Detector:
    try:
        return record.policy.build()
    except (ValueError, TypeError, ArithmeticError):
        from .detectors import create_detector

        return create_detector("never")


def decided_step(state: JobState) -> int | None:
    """The step of the eval whose report stopped the job (None for a manual stop)."""
    record = state.record
    if record.decision is None or record.decision.evidence.get("manual"):
        return None
    steps = record.decision.evidence.get("steps")
    if isinstance(steps, (list, tuple)) and steps:
        return steps[-1]
    return state.last.step if state.last is not None else None


def _deliveries(old: JobRecord, new: JobRecord, now: float) -> tuple[Delivery, ...]:
    if old.status is JobStatus.STOPPED or not old.webhook or new.decision is None:
        return ()
    return (stop_delivery(new, now),)


def stop_delivery(job: JobRecord, now: float) -> Delivery:
    """The webhook delivery of a job's stop: strict JSON (no NaN or infinity), one per job."""
    decision = to_wire(job.decision) if job.decision else None
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

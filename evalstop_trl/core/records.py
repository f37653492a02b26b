"""Typed records that cross the coordinator's boundaries (store, service, clients).

Everything here is a frozen, slotted dataclass or an Enum, with read-only mappings inside. The HTTP
client needs nothing but this module, :mod:`.detectors` (Decision) and :mod:`.errors`.

* :class:`JobType`, :class:`JobStatus` (a lifecycle with a transition table), :class:`AuditKind`;
* :class:`Policy` (a detector and its parameters), :class:`Registration` (what a job registers,
  validated once here for every entry point), :class:`Report`, :class:`AuditRecord`,
  :class:`JobRecord` (what the store keeps) and :class:`JobView` (what a tenant reads);
* :func:`check_name`: the one rule for tenant names and job ids.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from types import MappingProxyType
from typing import Any, NamedTuple

from .detectors import DEFAULT_DETECTOR, DETECTORS, GATES, Decision, check_evidence, check_finite
from .detectors import MAX_STEP as _MAX_STEP
from .errors import InvalidInput
from .labels import EMPTY as _NO_LABELS
from .labels import check_hparams, check_tags
from .lifecycle import Lifecycle, transitions
from .requests import ReportRequest, field_names

__all__ = [
    "AuditKind", "AuditRecord", "Escalation", "EvalState", "EvalTask", "JobRecord", "JobStatus", "JobType", "JobView", "MAX_STEP", "NAME_PATTERN",
    "Delivery", "Policy", "PolicyMode", "Quotas", "Registration", "Report", "TenantRecord", "check_name", "check_checkpoint", "check_report",
    "check_step", "check_text",
]

#: tenant names and job ids: 1-128 characters of letters, digits and ``_ . : @ -``, starting with a
#: letter or digit. The pattern is for ``re.fullmatch`` (a trailing newline does not match).
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}"
_NAME_RE = re.compile(NAME_PATTERN)
MAX_STEP = _MAX_STEP  # one bound for steps everywhere (the detectors define it)
MAX_PATH = 4096


def check_name(kind: str, value: Any) -> str:
    """Return ``value`` if it is a valid tenant name or job id, else raise :class:`InvalidInput`."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise InvalidInput(
            f"{kind} must be 1-128 characters of letters, digits and _ . : @ - (starting with a letter "
            f"or digit), but got {value!r}."
        )
    return value


def check_webhook_url(url: Any) -> str:
    """A webhook URL's form: http(s), a host, no credentials, at most 2048 characters. (Where it may
    point is the operator's allowlist, checked at connect time by the service.)"""
    from urllib.parse import urlsplit

    if not isinstance(url, str) or len(url) > 2048 or not re.match(r"^https?://", url):
        raise InvalidInput(f"webhook must be an http(s) URL of at most 2048 characters, but got {url!r}.")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise InvalidInput(f"webhook is not a valid URL ({exc}).") from None
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise InvalidInput("webhook must not carry credentials (user:password@); the service signs each payload "
                           "with the tenant's webhook secret instead.")
    if not parts.hostname:
        raise InvalidInput(f"webhook needs a host name, but got {url!r}.")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise InvalidInput("webhook must not contain spaces or control characters.")
    return url


def check_step(step: Any) -> int:
    """``step`` if it is an integer in [0, :data:`MAX_STEP`], else :class:`InvalidInput`."""
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidInput(f"step must be a non-negative integer, but got {step!r}.")
        raise InvalidInput(f"step must be at most {MAX_STEP}, but got {step}.")
    return step


def check_report(report: Any) -> None:
    """Validate a report's values once, at the boundary (detectors then trust them): a
    :class:`~.requests.ReportRequest`, or a stored :class:`Report` read back from a file. Every field
    of the request record is checked here, by name: a new field gets its check in this function."""
    step, score, eval_n, noise = report.step, report.eval_score, report.eval_n, report.eval_noise
    if eval_n is not None or noise is not None:
        try:
            check_evidence(score, eval_n, noise)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    check_step(step)
    for name, value in (("eval_score", score), ("train_loss", report.train_loss), ("proxy_reward", report.proxy_reward)):
        if value is not None and (type(value) is not float or not math.isfinite(value)):
            try:
                check_finite(name, value)
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None
    if report.checkpoint is not None:
        check_checkpoint(report.checkpoint)
    kl = report.kl  # any finite number: TRL's estimator of the KL is slightly negative at times
    if kl is not None and (type(kl) is not float or not math.isfinite(kl)):
        try:
            check_finite("kl", kl)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    length = report.length  # tokens: a mean over the latest step's completions
    if length is not None and (type(length) is not float or not 0.0 <= length < math.inf):
        try:
            check_finite("length", length)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        if length < 0:
            raise InvalidInput(f"length must be >= 0 (a mean completion length in tokens), but got {length!r}.")


# no control character (nor line separator) in a path or a name; free text may hold tabs and line breaks;
# neither a lone surrogate (JSON can carry one, UTF-8 cannot: PostgreSQL would refuse it for ever)
_LINE_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_TEXT_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def check_text(kind: str, value: Any, max_len: int = 2000, *, multiline: bool = False, min_len: int = 0) -> str:
    """Return ``value`` if it is a string of ``min_len`` to ``max_len`` characters with no NUL or other
    control character (``multiline``: tabs and line breaks allowed), else raise :class:`InvalidInput`.
    A NUL in particular is refused here: PostgreSQL cannot store one."""
    if not isinstance(value, str) or not min_len <= len(value) <= max_len:
        size = f"at most {max_len}" if not min_len else f"{min_len}-{max_len}"
        raise InvalidInput(f"{kind} must be a string of {size} characters, but got {value!r:.80}.")
    bad = (_TEXT_CONTROL if multiline else _LINE_CONTROL).search(value)
    if bad:
        raise InvalidInput(f"{kind} must not contain control characters, but got {bad.group()!r} at position "
                           f"{bad.start()}.")
    return value


def check_checkpoint(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or len(value) > MAX_PATH):
        raise InvalidInput(f"checkpoint must be a path string of at most {MAX_PATH} characters.")
    return value if value is None else check_text("checkpoint", value, MAX_PATH)


class JobType(str, Enum):
    """Kinds of training job. RLHF kinds are the ones reward hacking applies to."""

    RLHF = "rlhf"
    PPO = "ppo"
    GRPO = "grpo"
    RLOO = "rloo"
    ONLINE_DPO = "online_dpo"
    DPO = "dpo"
    SFT = "sft"
    LORA_SFT = "lora_sft"
    OTHER = "other"

    @property
    def is_rlhf(self) -> bool:
        return self in _RLHF_TYPES

    @classmethod
    def parse(cls, value: Any) -> JobType:
        if isinstance(value, JobType):
            return value
        try:
            return cls(value)
        except ValueError:
            raise InvalidInput(
                f"Unknown job_type {value!r}; valid job types are: {', '.join(t.value for t in cls)}."
            ) from None


_RLHF_TYPES = frozenset({JobType.RLHF, JobType.PPO, JobType.GRPO, JobType.RLOO, JobType.ONLINE_DPO})


@transitions({
    "PENDING": {"RUNNING", "STOPPED", "FINISHED", "FAILED", "LOST"},
    "RUNNING": {"STOPPED", "FINISHED", "FAILED", "LOST"},
    "LOST": {"RUNNING", "STOPPED", "FINISHED", "FAILED"},
    "STOPPED": set(),
    "FINISHED": set(),
    "FAILED": set(),
})
class JobStatus(Lifecycle, str, Enum):
    """A job's life: PENDING -> RUNNING -> STOPPED | FINISHED | FAILED (the last three are terminal).

    PENDING until its first report; STOPPED by a detector or by hand; FINISHED when it ran to its end;
    FAILED when its trainer reported a crash. LOST when it was silent (no report, no heartbeat) past
    its lease: it no longer counts against the tenant's active jobs, and a report or heartbeat brings
    it back to RUNNING. An illegal move raises ``IllegalTransition`` (409)."""

    PENDING = "pending"
    RUNNING = "running"
    LOST = "lost"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def active(self) -> bool:
        """Counted against the tenant's ``max_active_jobs`` (pending or running)."""
        return self is JobStatus.PENDING or self is JobStatus.RUNNING




@transitions({
    "GRACE": {"SIGTERM", "DONE"},
    "SIGTERM": {"SIGKILL", "DONE"},
    "SIGKILL": {"DONE"},
    "DONE": set(),
})
class Escalation(Lifecycle, str, Enum):
    """Delivery of an enforced stop: a grace period, then SIGTERM, then SIGKILL; DONE once the job
    acknowledged, exited or was killed."""

    GRACE = "grace"
    SIGTERM = "sigterm"
    SIGKILL = "sigkill"
    DONE = "done"


# keys of policies stored by evalstop 0.1, when the service signalled processes itself; ignored now


class PolicyMode(str, Enum):
    """What a job's stop decisions do. ``enforce`` (the default) stops the job; ``shadow`` decides
    exactly as ``enforce`` would, records the first "would stop" (the job's ``would_stop``, an audit
    line) and never stops: the job trains to its end. Shadow mode is how a platform earns trust
    before enforcing (``evalstop shadow-report`` compares would-stop steps with how runs ended)."""

    ENFORCE = "enforce"
    SHADOW = "shadow"

    @classmethod
    def parse(cls, value: Any) -> PolicyMode:
        try:
            return cls(value)
        except ValueError:
            raise InvalidInput(f"policy mode must be one of {', '.join(m.value for m in cls)}, but got {value!r:.60}.")\
                from None


class StopKind(str, Enum):
    """Why a policy may stop a job. ``hacked`` (always): its detector says the eval is falling.
    ``converged`` (opt-in, ``stop_on: [hacked, converged]``): the eval has not improved beyond its
    noise for :data:`CONVERGED_SHARE` of the planned training (a plateau; its own reason, never counted
    as a caught hack)."""

    HACKED = "hacked"
    CONVERGED = "converged"


_HACKED_ONLY = (StopKind.HACKED,)


def _stop_on(value: Any) -> tuple[StopKind, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not 1 <= len(value) <= len(StopKind):
        raise InvalidInput(f"policy stop_on must be a list of {', '.join(k.value for k in StopKind)}, but got "
                           f"{value!r:.60}.")
    try:
        kinds = tuple(dict.fromkeys(StopKind(v) for v in value))
    except ValueError:
        raise InvalidInput(f"policy stop_on must be a list of {', '.join(k.value for k in StopKind)}, but got "
                           f"{value!r:.60}.") from None
    if StopKind.HACKED not in kinds:
        raise InvalidInput("policy stop_on must include hacked (a policy always stops a falling eval); add "
                           "converged to also stop plateaus.")
    return tuple(sorted(kinds, key=list(StopKind).index))


@dataclass(frozen=True, slots=True)
class Policy:
    """How a job is watched: a detector with its parameters, its :class:`PolicyMode`, and what it
    stops (:class:`StopKind`).

    ``params`` is filled with the detector's defaults (so equal policies compare equal) and is
    read-only. Every parameter is bounded (see each detector's docstring): no work or memory grows
    with a number a caller sends. In a dict (:meth:`to_dict`, the API) the mode is the key ``mode``,
    present only for ``shadow``, ``stop_on`` is present only when it adds ``converged``, and ``gate``
    only when set (:data:`~.detectors.GATES`: ``kl_past_peak``, a stop stands only once the run's KL is
    past the KL clock's forecast peak, :mod:`.detectors.klgate`; ``proxy_diverges``, only while the
    proxy reward is above its value at the best eval, :mod:`.detectors.proxygate`; a run that reports
    neither is judged by its rule alone)."""

    detector: str = DEFAULT_DETECTOR
    params: Mapping[str, Any] = field(default_factory=dict)
    mode: PolicyMode = PolicyMode.ENFORCE
    stop_on: tuple[StopKind, ...] = _HACKED_ONLY
    gate: str | None = None  # a name in detectors.GATES: a stop stands only when the run's evidence agrees

    def __post_init__(self) -> None:
        if self.gate is not None and self.gate not in GATES:
            raise InvalidInput(f"gate must be one of {', '.join(GATES)} (or left out), but got {self.gate!r}.")
        if type(self.mode) is not PolicyMode:
            object.__setattr__(self, "mode", PolicyMode.parse(self.mode))
        if self.stop_on is not _HACKED_ONLY:
            object.__setattr__(self, "stop_on", _stop_on(list(self.stop_on)))
        try:
            DETECTORS.create(self.detector, **dict(self.params))
        except (ValueError, TypeError, OverflowError) as exc:
            raise InvalidInput(str(exc)) from None
        full = DETECTORS.params(self.detector)
        full.update(self.params)
        object.__setattr__(self, "params", MappingProxyType(full))

    def __reduce__(self):  # picklable (params are a read-only view)
        return (Policy, (self.detector, dict(self.params), self.mode, self.stop_on, self.gate))

    @property
    def shadow(self) -> bool:
        """Decide, record "would stop", never stop (:class:`PolicyMode`)."""
        return self.mode is PolicyMode.SHADOW

    def build(self):
        """A fresh detector for this policy (its parameters were checked when the policy was made);
        with ``converged`` in :attr:`stop_on`, it also stops plateaus (:class:`~.detectors.converged.ConvergedOr`)."""
        detector = DETECTORS.get(self.detector)(**self.params)
        if self.gate is not None:
            detector = GATES[self.gate](detector)
        if StopKind.CONVERGED in self.stop_on:
            from .detectors.converged import ConvergedOr

            return ConvergedOr(detector)
        return detector

    def to_dict(self) -> dict[str, Any]:
        out = {"detector": self.detector, **self.params}
        if self.mode is PolicyMode.SHADOW:
            out["mode"] = self.mode.value
        if self.stop_on != _HACKED_ONLY:
            out["stop_on"] = [k.value for k in self.stop_on]
        if self.gate is not None:
            out["gate"] = self.gate
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, *, stored: bool = False) -> Policy:
        """``{"detector": "decline", "k": 2}`` (``"mode": "shadow"`` optional); missing keys take
        defaults. ``stored=True`` reads a stored policy: one that today's bounds refuse is kept as it was
        (building its detector raises, and the coordinator marks the job failed with the reason)."""
        if data is None:
            return cls()
        if isinstance(data, Policy):
            return data
        if not isinstance(data, Mapping):
            raise InvalidInput(f"policy must be an object, but got {data!r}.")
        params = {k: v for k, v in data.items() if k not in ("detector", "mode", "stop_on", "gate")}
        gate = data.get("gate")
        detector = data.get("detector", DEFAULT_DETECTOR)
        mode = PolicyMode.parse(data.get("mode", PolicyMode.ENFORCE))
        stop_on = _stop_on(data["stop_on"]) if "stop_on" in data else _HACKED_ONLY
        if not stored:
            return cls(detector=detector, params=params, mode=mode, stop_on=stop_on, gate=gate)
        if detector == "decline" and "noise_z" in params and "noise" not in params:
            # stored before issue 44 (every parameter is written, and "noise" was not one): that default
            # counted each fall beyond the eval's paired noise, else every fall. A job keeps deciding so:
            # the paper's rule on plain scores exactly, the paired noise when its evals carry it
            params["noise"] = "paired"
        try:
            return cls(detector=detector, params=params, mode=mode, stop_on=stop_on, gate=gate)
        except InvalidInput:
            # A stored policy that today's bounds refuse (stored by an older evalstop): kept as it was,
            # so the store still loads; building its detector raises, and the coordinator marks the job
            # failed with the reason instead of refusing to start.
            policy = object.__new__(cls)
            object.__setattr__(policy, "detector", str(detector))
            object.__setattr__(policy, "params", MappingProxyType(params))
            object.__setattr__(policy, "mode", mode)
            object.__setattr__(policy, "stop_on", stop_on)
            object.__setattr__(policy, "gate", gate)
            return policy

    def with_mode(self, mode: PolicyMode) -> Policy:
        """This policy in another mode."""
        if mode is self.mode:
            return self
        return dataclasses.replace(self, mode=mode)


def mode_named(policy: Any) -> bool:
    """Whether a registration's raw ``policy`` says its mode (else the tenant's default applies)."""
    return isinstance(policy, Policy) or (isinstance(policy, Mapping) and "mode" in policy)


def _optional_int(value: Any, low: int, high: int, message: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
        raise InvalidInput(f"{message}, but got {value!r}.")
    return value


@dataclass(frozen=True, slots=True)
class Registration:
    """What a job registers; built through :meth:`parse`, the one validation for every entry point."""

    job_id: str
    job_type: JobType = JobType.RLHF
    planned_steps: int | None = None
    policy: Policy = field(default_factory=Policy)
    webhook: str | None = None
    tags: Mapping[str, str] = field(default_factory=lambda: _NO_LABELS)  # user tags (:mod:`.labels`)
    hparams: Mapping[str, Any] = field(default_factory=lambda: _NO_LABELS)  # hyperparameters (:mod:`.labels`)

    @classmethod
    def parse(cls, job_id: Any, job_type: Any = JobType.RLHF, planned_steps: Any = None, policy: Any = None,
              webhook: Any = None, default_policy: Policy | None = None,
              default_mode: PolicyMode | None = None, tags: Any = None, hparams: Any = None) -> Registration:
        """Validate raw values (raises :class:`InvalidInput` naming the field). ``default_mode``
        (the tenant's) applies to a policy that does not name its mode; ``tags`` and ``hparams`` are
        bounded (:mod:`.labels`)."""
        check_name("job_id", job_id)
        _optional_int(planned_steps, 1, MAX_STEP, f"planned_steps must be a positive integer (at most {MAX_STEP})")
        if webhook is not None:
            check_webhook_url(webhook)
        pol = (default_policy or Policy()) if policy is None else Policy.from_dict(policy)
        if default_mode is not None and not mode_named(policy):
            pol = pol.with_mode(default_mode)
        return cls(job_id=job_id, job_type=JobType.parse(job_type), planned_steps=planned_steps, policy=pol,
                   webhook=webhook, tags=check_tags(tags), hparams=check_hparams(hparams))


class Report(NamedTuple):
    """One stored report of a job (one step): the :class:`~.requests.ReportRequest`'s fields, by
    name, and what the coordinator adds (``received_at``, ``planned_steps``). Built by :meth:`of`.

    It is also what the job's detector observes (a :class:`~evalstop_trl.core.detectors.Observed`):
    its values were checked once on arrival (:func:`check_report`), so no second record is built.
    (``tests/core/test_records.py`` ties its fields to the request's.)"""

    step: int
    eval_score: float | None = None
    train_loss: float | None = None
    proxy_reward: float | None = None
    checkpoint: str | None = None
    eval_n: int | None = None  # per-example evidence: the eval's number of examples
    eval_noise: float | None = None  # and its paired noise level (core/examples.py)
    kl: float | None = None  # the policy's KL to its reference model (a KL-clock gate reads it)
    length: float | None = None  # the mean completion length of the latest rollouts (a stop's evidence)
    # what the coordinator adds
    received_at: float = 0.0
    planned_steps: int | None = None  # the job's plan when it was decided (a later amendment changes not it)

    @classmethod
    def of(cls, request: ReportRequest, received_at: float, planned_steps: int | None) -> Report:
        """The stored report of ``request``, received at ``received_at`` by a job planning ``planned_steps``."""
        return cls._make((*_request_fields(request), received_at, planned_steps))

    @property
    def progress(self) -> float | None:
        """step / planned steps (None when the plan is unknown): what a detector reads of the plan."""
        planned = self.planned_steps
        return self.step / planned if planned else None

    def request(self) -> ReportRequest:
        """What the job sent: idempotency compares this, not the arrival time or the plan."""
        return ReportRequest(*_request_fields(self))

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


#: a request's fields by name, in the order of both records (the Report's first fields are the request's)
_request_fields = operator.attrgetter(*field_names(ReportRequest))


class AuditKind(str, Enum):
    STOP = "stop"
    MANUAL_STOP = "manual_stop"
    ACK = "ack"
    FAILED = "failed"
    LAUNCHER_SIGTERM = "launcher_sigterm"  # `evalstop run` escalated: SIGTERM to its child's process group
    LAUNCHER_SIGKILL = "launcher_sigkill"
    LAUNCHER_EXIT = "launcher_exit"  # the launcher's child exited (with its status)
    WEBHOOK = "webhook"
    WEBHOOK_FAILED = "webhook_failed"
    LOST = "lost"  # silent past its lease
    SEEN_AGAIN = "seen_again"  # a lost job reported or sent a heartbeat again
    AMENDED = "amended"  # a re-registration filled in or changed the job's plan, policy or webhook
    DELETED = "deleted"  # the tenant deleted the ended job with its reports (the audit line stays)
    WOULD_STOP = "would_stop"  # shadow mode: the detector decided a stop that was not carried out

    @property
    def from_launcher(self) -> bool:
        return self in (AuditKind.LAUNCHER_SIGTERM, AuditKind.LAUNCHER_SIGKILL, AuditKind.LAUNCHER_EXIT)

    @property
    def by_tenant(self) -> bool:
        """Lines written when a tenant asks, with its text: refused beyond the tenant's audit budget
        (``audit_rate``, ``audit_bytes_rate``, ``max_audit_bytes``). The others (a detector's stop, a would-stop, lost, seen
        again, webhooks) are the coordinator's own: counted against the budget, never refused."""
        return self.counted or self in (AuditKind.MANUAL_STOP, AuditKind.ACK, AuditKind.FAILED, AuditKind.DELETED)

    @property
    def counted(self) -> bool:
        """Lines a tenant writes at will, counted against ``max_events_per_job``: launcher events and
        registration amendments."""
        return self.from_launcher or self is AuditKind.AMENDED


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One line of the append-only audit log: who or what did what to a job, when and why."""

    tenant: str
    job_id: str
    at: float
    kind: AuditKind
    actor: str
    reason: str
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if type(self.evidence) is not MappingProxyType:
            object.__setattr__(self, "evidence", MappingProxyType(dict(self.evidence)))

    def __reduce__(self):
        return (AuditRecord, (self.tenant, self.job_id, self.at, self.kind, self.actor, self.reason, dict(self.evidence)))

    @property
    def nbytes(self) -> int:
        """About what the line takes in a store: its text, its evidence as the store writes it
        (JSON), and 48 bytes for its tenant, time, kind and sequence number (what the audit budget
        counts; :meth:`~evalstop_trl.core.store.Store.count_audit_bytes` sums it over the store)."""
        evidence = json.dumps(dict(self.evidence), default=str)
        return 48 + sum(len(x.encode()) for x in (self.job_id, self.actor, self.reason, evidence))

    def to_dict(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "job_id": self.job_id,
            "at": self.at,
            "kind": self.kind.value,
            "actor": self.actor,
            "reason": self.reason,
            "evidence": dict(self.evidence),
        }


class JobRecord(NamedTuple):
    """A job as the store keeps it. A NamedTuple: :meth:`evolve` (``_replace``) makes the copy a
    status change needs in about a microsecond, without re-validating checked values."""

    tenant: str
    job_id: str
    job_type: JobType
    planned_steps: int | None
    policy: Policy
    webhook: str | None = None
    status: JobStatus = JobStatus.PENDING
    created_at: float = 0.0
    updated_at: float = 0.0
    decision: Decision | None = None
    stopped_by: str | None = None
    stopped_at: float | None = None
    acked_at: float | None = None
    checkpoint: str | None = None
    finished_at: float | None = None
    version: int = 0  # writes to the job so far, as a shared store counts them (0 elsewhere)
    last_seen: float | None = None  # its last heartbeat (its reports count too: see JobState.last_seen)
    tags: Mapping[str, str] = _NO_LABELS  # user tags, checked by :func:`.labels.check_tags`
    hparams: Mapping[str, Any] = _NO_LABELS  # hyperparameters, checked by :func:`.labels.check_hparams`

    @classmethod
    def new(cls, tenant: str, reg: Registration, now: float) -> JobRecord:
        """A new PENDING job from a validated registration."""
        return cls(tenant=tenant, job_id=reg.job_id, job_type=reg.job_type, planned_steps=reg.planned_steps,
                   policy=reg.policy, webhook=reg.webhook, status=JobStatus.PENDING, created_at=now, updated_at=now,
                   tags=reg.tags, hparams=reg.hparams)

    def evolve(self, **changes: Any) -> JobRecord:
        """A copy with ``changes`` (field names checked: an unknown one is a ValueError)."""
        return self._replace(**changes)

    def __reduce__(self):  # picklable (tags and hparams are read-only views)
        return (JobRecord, tuple(dict(v) if type(v) is MappingProxyType else v for v in self))

    def registration(self) -> Registration:
        """What a re-registration must match to be accepted as identical."""
        return Registration(self.job_id, self.job_type, self.planned_steps, self.policy, self.webhook, self.tags,
                            self.hparams)


@dataclass(frozen=True, slots=True)
class JobView:
    """What a tenant may read about one of its jobs (the API's job object; its wire form is in
    :mod:`.codec`). ``created_at``, ``last_seen`` (its last report or heartbeat) and ``ended_at``
    (stopped, finished, failed) are times in seconds since the epoch. ``would_stop`` and
    ``would_stop_step``: in shadow mode, the first stop the detector decided and the step of the eval
    that decided it (None otherwise). ``tags`` and ``hparams``: what the job registered (:mod:`.labels`)."""

    job_id: str
    job_type: str
    status: str
    policy: Mapping[str, Any]
    decision: Decision | None
    best_step: int | None
    best_score: float | None
    best_checkpoint: str | None
    n_reports: int
    last_step: int | None
    planned_steps: int | None
    acked: bool
    created_at: float = 0.0
    last_seen: float | None = None
    ended_at: float | None = None
    would_stop: Decision | None = None
    would_stop_step: int | None = None
    tags: Mapping[str, str] = field(default_factory=lambda: _NO_LABELS)
    hparams: Mapping[str, Any] = field(default_factory=lambda: _NO_LABELS)

    def __post_init__(self) -> None:
        for name in ("policy", "tags", "hparams"):
            if type(getattr(self, name)) is not MappingProxyType:
                object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def settled(self, stopped: bool = False) -> bool:
        """What a long poll waits for: the job is no longer running (``stopped``: it is stopped)."""
        return self.status == JobStatus.STOPPED.value if stopped else JobStatus(self.status).terminal

    def __reduce__(self):
        values = [getattr(self, f.name) for f in fields(self)]
        values = [dict(v) if type(v) is MappingProxyType else v for v in values]
        return (JobView, tuple(values))


@transitions({
    "PENDING": {"LEASED", "MISSING"},
    "LEASED": {"PENDING", "DONE", "MISSING"},
    "DONE": set(),
    "MISSING": set(),
})
class EvalState(Lifecycle, str, Enum):
    """A snapshot waiting for its world-feedback eval by an external evaluator: PENDING -> LEASED (a
    worker has it) -> DONE (scored) | back to PENDING (the lease ran out: the worker died) | MISSING
    (the eval failed, or the gap was not filled in time: fed to the detector as a missing eval)."""

    PENDING = "pending"
    LEASED = "leased"
    DONE = "done"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class EvalTask:
    """One published snapshot of a job (``external_eval``): where it is, and its eval's state."""

    tenant: str
    job_id: str
    step: int
    path: str
    created_at: float
    train_loss: float | None = None
    proxy_reward: float | None = None
    state: EvalState = EvalState.PENDING
    lease_until: float = 0.0
    worker: str = ""
    score: float | None = None
    fed: bool = False  # given to the detector (in step order)
    eval_n: int | None = None  # the score's per-example evidence (core/examples.py), as a report's
    eval_noise: float | None = None

    def report(self) -> ReportRequest:
        """The report this snapshot's eval feeds to the job's detector (a failed eval: no score)."""
        done = self.state is EvalState.DONE
        return ReportRequest(self.step, self.score if done else None, self.train_loss, self.proxy_reward,
                             self.path if done else None, self.eval_n if done else None,
                             self.eval_noise if done else None)


@dataclass(frozen=True, slots=True)
class Quotas:
    """Per-tenant limits. Defaults suit a shared coordinator; the operator sets them with
    ``evalstop serve`` flags (server-wide) or ``evalstop tenants quota NAME`` (one tenant).

    Every count is checked before the write it limits (429 beyond it), atomically: in one process
    under the job's or the registration lock; on PostgreSQL the job counts inside the insert's
    transaction (under a per-tenant advisory lock), so replicas registering together cannot pass
    them. What a tenant stores is bounded by these and by retention (``evalstop prune``).

    ======================== ========== ====================================================
    quota                    default    what it bounds
    ======================== ========== ====================================================
    max_jobs                 100,000    all of a tenant's jobs, finished ones included
    max_active_jobs          1,000      jobs pending or running (lost ones do not count)
    max_reports_per_job      100,000    reports of one job
    max_reports_per_tenant   10,000,000 stored reports of all the tenant's jobs
    max_events_per_job       1,000      launcher events (``/events``) and amendments of one job
    max_snapshots_per_job    10,000     snapshots published (``/snapshots``) by one job
    report_rate/burst        1000/s, 2000   reports per second per tenant (token bucket)
    event_rate/burst         50/s, 500  launcher events, snapshots and registration amendments
                                        per second per tenant
    audit_rate/burst         20/s, 2000 audit lines per second per tenant (token bucket): a line
                                        the tenant asks for (a failure, a manual stop, an ack,
                                        a launcher event, an amendment, a deletion) is refused
                                        beyond it; the coordinator's own lines count, never refused
    audit_bytes_rate/burst   10 kB/s,   the same lines' bytes (:attr:`AuditRecord.nbytes`)
                             1 MB
    max_audit_bytes          256 MiB    the tenant's stored audit lines: past it a line the
                                        tenant asks for is refused until retention
                                        (``evalstop prune --audit-older-than``) reclaims some
    default_mode             enforce    not a limit: the mode of jobs registered without
                                        ``policy.mode`` (``shadow``: record would-stop, never stop)
    ======================== ========== ====================================================
    """

    max_active_jobs: int = 1000  # jobs not yet stopped, finished or failed
    max_reports_per_job: int = 100_000
    report_rate: float = 1000.0  # reports per second, per tenant (token bucket)
    report_burst: int = 2000
    max_jobs: int = 100_000  # every status: finished jobs count until pruned
    max_reports_per_tenant: int = 10_000_000
    max_events_per_job: int = 1000
    max_snapshots_per_job: int = 10_000
    event_rate: float = 50.0  # launcher events, snapshots and amendments per second, per tenant (token bucket)
    event_burst: int = 500
    audit_rate: float = 20.0  # audit lines per second, per tenant (token bucket; see AuditKind.by_tenant)
    audit_burst: int = 2000
    audit_bytes_rate: float = 10_000.0  # their bytes per second, per tenant (AuditRecord.nbytes)
    audit_bytes_burst: int = 1_000_000
    max_audit_bytes: int = 256 * 2**20  # the tenant's stored audit lines (AuditRecord.nbytes summed)
    default_mode: PolicyMode = PolicyMode.ENFORCE  # jobs registered without policy.mode: enforce or shadow

    def __post_init__(self) -> None:
        if type(self.default_mode) is not PolicyMode:
            object.__setattr__(self, "default_mode", PolicyMode.parse(self.default_mode))
        for name, low, high in (("max_active_jobs", 1, 10**7), ("max_reports_per_job", 1, 10**9),
                                ("report_burst", 1, 10**7), ("max_jobs", 1, 10**8),
                                ("max_reports_per_tenant", 1, 10**11), ("max_events_per_job", 1, 10**7),
                                ("max_snapshots_per_job", 1, 10**7), ("event_burst", 1, 10**7),
                                ("audit_burst", 1, 10**7), ("audit_bytes_burst", 4096, 10**10),
                                ("max_audit_bytes", 4096, 10**13)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise InvalidInput(f"{name} must be an integer in [{low}, {high}], but got {v!r}.")
        for name in ("report_rate", "event_rate", "audit_rate", "audit_bytes_rate"):
            r = getattr(self, name)
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0 < r <= 1e7):
                raise InvalidInput(f"{name} must be a number per second in (0, 1e7], but got {r!r}.")

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["default_mode"] = self.default_mode.value
        return out

    def with_overrides(self, overrides: Mapping[str, Any] | None) -> Quotas:
        if not overrides:
            return self
        unknown = sorted(set(overrides) - set(self.to_dict()))
        if unknown:
            raise InvalidInput(f"Unknown quota(s) {', '.join(unknown)}; valid quotas are: {', '.join(self.to_dict())}.")
        return Quotas(**{**self.to_dict(), **overrides})


@dataclass(frozen=True, slots=True)
class TenantRecord:
    """A tenant as the store keeps it: its name and the SHA-256 of its token (never the token)."""

    name: str
    token_hash: str
    created_at: float
    revoked: bool = False
    quotas: Mapping[str, Any] = field(default_factory=dict)  # overrides of the server's defaults
    webhook_secret: str = ""  # signs this tenant's webhook payloads (HMAC-SHA256)


@dataclass(frozen=True, slots=True)
class Delivery:
    """A webhook delivery in the durable outbox: queued with the stop that caused it, retried with
    backoff until delivered or out of attempts, resumed after a restart."""

    id: str
    tenant: str
    job_id: str
    url: str
    body: str
    created_at: float
    attempts: int = 0
    next_at: float = 0.0
    done: bool = False
    outcome: str = ""

"""Typed records that cross the coordinator's boundaries (store, service, clients)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, NamedTuple

from .detectors import Decision, create_detector, detector_params
from .errors import Conflict, InvalidInput

__all__ = ["AuditKind", "AuditRecord", "JobRecord", "JobStatus", "JobType", "Policy", "Report"]


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
        return self in (JobType.RLHF, JobType.PPO, JobType.GRPO, JobType.RLOO, JobType.ONLINE_DPO)

    @classmethod
    def parse(cls, value: Any) -> JobType:
        try:
            return cls(value)
        except ValueError:
            raise InvalidInput(
                f"Unknown job_type {value!r}; valid job types are: {', '.join(t.value for t in cls)}."
            ) from None


class JobStatus(str, Enum):
    """A job's life: PENDING -> RUNNING -> STOPPED | FINISHED | FAILED."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.STOPPED, JobStatus.FINISHED, JobStatus.FAILED)

    def to(self, new: JobStatus) -> JobStatus:
        """Return ``new`` if the transition is legal, else raise :class:`Conflict`."""
        if new is self or new in _TRANSITIONS[self]:
            return new
        raise Conflict(f"job is {self.value}: it cannot become {new.value}")


_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.RUNNING, JobStatus.STOPPED, JobStatus.FINISHED, JobStatus.FAILED}),
    JobStatus.RUNNING: frozenset({JobStatus.STOPPED, JobStatus.FINISHED, JobStatus.FAILED}),
    JobStatus.STOPPED: frozenset(),
    JobStatus.FINISHED: frozenset(),
    JobStatus.FAILED: frozenset(),
}

_POLICY_KEYS = ("detector", "enforce", "grace_s")


@dataclass(frozen=True)
class Policy:
    """How a job is watched: a detector with its parameters, and whether stops are enforced.

    ``enforce=True`` lets the coordinator send SIGTERM to a registered local pid ``grace_s`` seconds
    after a STOP that was not acknowledged, then SIGKILL after a second ``grace_s``.
    """

    detector: str = "decline"
    params: Mapping[str, Any] = field(default_factory=dict)
    enforce: bool = False
    grace_s: float = 30.0

    def __post_init__(self) -> None:
        try:
            create_detector(self.detector, **dict(self.params))
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        if not isinstance(self.enforce, bool):
            raise InvalidInput(f"enforce must be true or false, but got {self.enforce!r}.")
        g = self.grace_s
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g) or g < 0:
            raise InvalidInput(f"grace_s must be a finite number of seconds >= 0, but got {g!r}.")
        # normalise so that equal policies compare equal (defaults filled in)
        full = {k: v for k, v in detector_params(self.detector).items()}
        full.update(self.params)
        object.__setattr__(self, "params", full)

    def build(self):
        return create_detector(self.detector, **dict(self.params))

    def to_dict(self) -> dict[str, Any]:
        return {"detector": self.detector, **dict(self.params), "enforce": self.enforce, "grace_s": self.grace_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Policy:
        """``{"detector": "decline", "k": 2, "enforce": false, "grace_s": 30}``; missing keys take defaults."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise InvalidInput(f"policy must be an object, but got {data!r}.")
        name = data.get("detector", "decline")
        params = {k: v for k, v in data.items() if k not in _POLICY_KEYS}
        return cls(
            detector=name,
            params=params,
            enforce=data.get("enforce", False),
            grace_s=data.get("grace_s", 30.0),
        )


class Report(NamedTuple):
    """One stored report of a job (one step). A NamedTuple: immutable and cheap on the hot path."""

    step: int
    eval_score: float | None = None
    train_loss: float | None = None
    proxy_reward: float | None = None
    checkpoint: str | None = None
    received_at: float = 0.0

    def payload(self) -> tuple:
        """What identifies the report's content (idempotency compares this, not the arrival time)."""
        return self[:5]

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


class AuditKind(str, Enum):
    STOP = "stop"
    MANUAL_STOP = "manual_stop"
    ACK = "ack"
    SIGTERM = "sigterm"
    SIGKILL = "sigkill"
    WEBHOOK = "webhook"
    WEBHOOK_FAILED = "webhook_failed"


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


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as the store keeps it."""

    tenant: str
    job_id: str
    job_type: JobType
    planned_steps: int | None
    policy: Policy
    pid: int | None = None
    pid_start_time: float | None = None
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

    def evolve(self, **changes: Any) -> JobRecord:
        """A copy with ``changes`` (a fast ``dataclasses.replace``; this is on the report hot path)."""
        new = object.__new__(JobRecord)
        for name in _JOB_FIELDS:
            object.__setattr__(new, name, changes[name] if name in changes else getattr(self, name))
        return new

    def registration(self) -> tuple:
        """What a re-registration must match to be accepted as identical."""
        return (self.job_type, self.planned_steps, self.policy, self.pid, self.pid_start_time, self.webhook)


_JOB_FIELDS = tuple(f.name for f in fields(JobRecord))

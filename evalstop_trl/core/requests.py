"""The request records: what each write of the API carries, declared once.

A route of :data:`~.api.ROUTES` that takes a JSON body names one of these frozen records. Its
fields are the body's keys (with their types and defaults), and everything else is derived:

* the service's body model (``service/routes.py``: pydantic parses the types, nothing more);
* the HTTP client's body (the record's fields, None left out) and the outbox entry;
* the argument of the :class:`~.coordinator.Coordinator` method of the route's name: the record
  itself, handed on by the service's handler, the embedded client, the outbox's replay and the
  simulator (``tests/clients/test_contract.py`` ties the client's keywords and the coordinator's
  parameter to it).

The one validation of the values (bounds, text, names) is the coordinator's, shared by every client;
so a record built here is only a typed container. A field's ``doc`` metadata is its description
in the OpenAPI schema.

Example::

    >>> from dataclasses import fields
    >>> [f.name for f in fields(ReportRequest)]
    ['step', 'eval_score', 'train_loss', 'proxy_reward', 'checkpoint', 'eval_n', 'eval_noise', 'kl', 'length']
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["AckRequest", "ClaimRequest", "EvalResult", "EventRequest", "HeartbeatRequest", "JobRequest",
           "ReasonRequest", "ReportRequest", "SnapshotRequest", "doc", "field_names", "values"]


@functools.cache
def field_names(record: type) -> tuple[str, ...]:
    """The fields of a record class, in order (cached: they are read on every call)."""
    return tuple(f.name for f in fields(record))


def values(request: Any) -> dict[str, Any]:
    """A request record's fields by name: the keyword arguments of the coordinator's method."""
    return {k: getattr(request, k) for k in field_names(type(request))}


def doc(text: str, default: Any = None) -> Any:
    """A field with a default and a description (the OpenAPI schema shows it)."""
    return field(default=default, metadata={"doc": text})


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A registration (``POST /v1/jobs``): the job and what the tenant says about it."""

    job_id: str = field(metadata={"doc": "unique per tenant; letters, digits and _ . : @ - (at most 128)"})
    job_type: str | None = doc("rlhf when the job is created without one")
    planned_steps: int | None = doc("the steps the job plans to train (gives the steps a stop saved)")
    policy: dict[str, Any] | None = doc('e.g. {"detector": "decline", "k": 2, "min_delta": 0}; every parameter is '
                                        'bounded (k and window in [1, 1000], min_delta in [0, 1e6])')
    webhook: str | None = doc("http(s) URL notified on stop (signed; the operator's allowlist decides where "
                              "webhooks may go)")
    tags: dict[str, Any] | None = doc("user tags: at most 32, keys <= 64 characters, text values <= 256 characters")
    hparams: dict[str, Any] | None = doc("hyperparameters: at most 32, keys <= 64 characters, finite numbers, "
                                         "booleans or text <= 256 characters")


@dataclass(frozen=True, slots=True)
class ReportRequest:
    """One eval of a job (``POST /v1/jobs/{job_id}/reports``)."""

    step: int = field(metadata={"doc": "the training step, in [0, 10**12]"})
    eval_score: float | None = doc("the held-out eval score (higher is better); null: a step without an eval")
    train_loss: float | None = doc("the training loss at this step (shown, never decided on)")
    proxy_reward: float | None = doc("the reward model's score at this step (shown, never decided on)")
    checkpoint: str | None = doc("the checkpoint saved at this step (kept if it is the best)")
    eval_n: int | None = doc("per-example evidence: the number of examples eval_score is the mean of")
    eval_noise: float | None = doc("per-example evidence: eval_score's paired noise level, sd(d)/sqrt(2m) over "
                                   "the m examples this eval and the previous one scored (d: their differences)")
    kl: float | None = doc("evidence: the policy's KL to its reference (or initial) model at this step, as the trainer "
                           "logs its estimate (TRL objective/kl; slightly negative at times); a KL-clock gate reads it")
    length: float | None = doc("evidence: the mean completion length (tokens) of the latest training step's rollouts, "
                               ">= 0, as the trainer logs it (TRL completions/mean_length, verl response_length/mean); "
                               "a stop says how it moved since the best eval, never decided on")


@dataclass(frozen=True, slots=True)
class ReasonRequest:
    """A stop, a failure or a deletion with its reason (free text, at most 2,000 characters)."""

    reason: str = doc("why (shown in the audit log)", "")


@dataclass(frozen=True, slots=True)
class AckRequest:
    """The job confirms a stop (``POST /v1/jobs/{job_id}/ack``)."""

    checkpoint: str | None = doc("the best checkpoint the job kept")
    step: int | None = doc("the step the job stopped at (gives the stop lag)")


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """The job is alive (``POST /v1/jobs/{job_id}/heartbeat``)."""

    actor: str = doc("who says the job is alive (1-128 characters)", "job")


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """A snapshot for external evaluators (``POST /v1/jobs/{job_id}/snapshots``)."""

    step: int = field(metadata={"doc": "the training step of the snapshot"})
    path: str = field(metadata={"doc": "the snapshot's folder, as evaluators see it (only stored, never read)"})
    train_loss: float | None = doc("the training loss at this step")
    proxy_reward: float | None = doc("the reward model's score at this step")


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """An evaluator leases the tenant's oldest snapshot waiting for an eval (``POST /v1/evals/claim``)."""

    worker: str = field(metadata={"doc": "the evaluator's name (1-128 characters)"})
    lease_s: float = doc("how long the lease lasts, in [1, 3600] seconds", 300.0)


@dataclass(frozen=True, slots=True)
class EvalResult:
    """An evaluator's result for a snapshot (``POST /v1/jobs/{job_id}/evals/{step}``)."""

    score: float | None = doc("the eval score; null with an error")
    worker: str = doc("the evaluator's name", "")
    error: str | None = doc("why the eval failed (then score is null)")
    eval_n: int | None = doc("per-example evidence: the number of examples score is the mean of")
    eval_noise: float | None = doc("per-example evidence: score's paired noise level (as a report's)")


@dataclass(frozen=True, slots=True)
class EventRequest:
    """What the job's launcher did (``POST /v1/jobs/{job_id}/events``)."""

    kind: str = field(metadata={"doc": '"launcher_sigterm", "launcher_sigkill" or "launcher_exit"'})
    reason: str = doc("why", "")
    exit_code: int | None = doc("the child's exit code, in [-255, 255]")


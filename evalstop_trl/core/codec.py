"""Wire codecs: the one place where the API's records become JSON-able dicts and back.

The service encodes every answer with :func:`to_wire` and the HTTP client decodes it with
:func:`from_wire`, so both ends agree by construction. A record's wire keys are its dataclass
fields, no more and no fewer (``tests/test_codec.py`` checks every field of every record).

* :class:`~.detectors.Decision`, :class:`~.records.JobView`, :class:`~.records.Report`,
  :class:`~.records.EvalTask`, :class:`~.records.AuditRecord`;
* enums travel as their values, read-only mappings as objects, tuples as lists;
* non-finite floats become ``null`` (:func:`json_safe`), so the JSON stays strict;
* decoding takes a field's default when an older server left it out, and ignores keys it does
  not know (a newer server's).

:class:`Codec` wraps these for one API result (a record, a list of them, an optional one, a
record under a key, or nothing), as the route table (:mod:`.api`) names them.

Example::

    >>> from evalstop_trl.core.detectors import Action, Decision
    >>> wire = to_wire(Decision(Action.STOP, "2 declines", 20, 0.7, {"declines": 2}))
    >>> wire["evidence"], from_wire(Decision, wire).best_step
    ({'declines': 2}, 20)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .detectors import Action, Decision
from .records import AuditKind, AuditRecord, EvalState, EvalTask, JobView, Report

__all__ = ["AUDIT", "DECISION", "EVAL_TASK", "JOB", "RECORDS", "REPORT", "Codec", "from_wire", "json_safe", "many", "nothing",
           "optional", "to_wire", "under"]

T = TypeVar("T")


def json_safe(value: Any, _depth: int = 0) -> Any:
    """``value`` as strict JSON can carry it: non-finite floats -> None (also numpy's and other
    ``numbers.Real``), tuples and sets -> lists, keys -> str, anything else JSON has no type for -> its
    ``str``; nesting deeper than 32 levels is cut (``"..."``). Used for every free-form mapping an
    answer carries (a decision's and an audit record's evidence, a job's policy), so ``/v1/jobs`` and
    ``/v1/audit`` stay strict JSON whatever a detector or an old database put there."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        try:
            f = float(value)
        except (OverflowError, ValueError):
            return None
        return f if math.isfinite(f) else None
    if _depth >= 32:
        return "..."
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v, _depth + 1) for v in value]
    return str(value)


def _num(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


# ------------------------------------------------------------------ one pair per record
def _decision_to(d: Decision) -> dict[str, Any]:
    return {"action": d.action.value, "reason": d.reason, "best_step": d.best_step, "best_score": _num(d.best_score),
            "evidence": json_safe(d.evidence)}


def _decision_from(w: Mapping[str, Any]) -> Decision:
    reason, best_step, evidence = w["reason"], w.get("best_step"), w.get("evidence") or {}
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a string, but got {type(reason).__name__}")
    if best_step is not None and (isinstance(best_step, bool) or not isinstance(best_step, int)):
        raise TypeError(f"best_step must be an integer or null, but got {best_step!r:.40}")
    if not isinstance(evidence, Mapping):
        raise TypeError(f"evidence must be an object, but got {type(evidence).__name__}")
    return Decision(Action(w["action"]), reason, best_step, _float(w.get("best_score")), evidence)


def _job_to(v: JobView) -> dict[str, Any]:
    return {"job_id": v.job_id, "job_type": v.job_type, "status": v.status, "policy": json_safe(v.policy),
            "decision": None if v.decision is None else _decision_to(v.decision), "best_step": v.best_step,
            "best_score": _num(v.best_score), "best_checkpoint": v.best_checkpoint, "n_reports": v.n_reports,
            "last_step": v.last_step, "planned_steps": v.planned_steps, "acked": v.acked,
            "created_at": v.created_at, "last_seen": v.last_seen, "ended_at": v.ended_at,
            "would_stop": None if v.would_stop is None else _decision_to(v.would_stop),
            "would_stop_step": v.would_stop_step, "tags": dict(v.tags), "hparams": json_safe(v.hparams)}


def _labels(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"tags and hparams must be objects, but got {type(value).__name__}")
    return value


def _job_from(w: Mapping[str, Any]) -> JobView:
    decision, would_stop = w.get("decision"), w.get("would_stop")
    return JobView(w["job_id"], w["job_type"], w["status"], w.get("policy") or {},
                   None if decision is None else _decision_from(decision), w.get("best_step"),
                   _float(w.get("best_score")), w.get("best_checkpoint"), w["n_reports"], w.get("last_step"),
                   w.get("planned_steps"), w["acked"], w.get("created_at", 0.0), w.get("last_seen"),
                   w.get("ended_at"), None if would_stop is None else _decision_from(would_stop),
                   w.get("would_stop_step"), _labels(w.get("tags")), _labels(w.get("hparams")))


def _report_to(r: Report) -> dict[str, Any]:
    return {"step": r.step, "eval_score": _num(r.eval_score), "train_loss": _num(r.train_loss),
            "proxy_reward": _num(r.proxy_reward), "checkpoint": r.checkpoint, "received_at": r.received_at}


def _report_from(w: Mapping[str, Any]) -> Report:
    return Report(w["step"], _float(w.get("eval_score")), _float(w.get("train_loss")), _float(w.get("proxy_reward")),
                  w.get("checkpoint"), float(w.get("received_at", 0.0)))


def _task_to(t: EvalTask) -> dict[str, Any]:
    return {"tenant": t.tenant, "job_id": t.job_id, "step": t.step, "path": t.path, "created_at": t.created_at,
            "train_loss": _num(t.train_loss), "proxy_reward": _num(t.proxy_reward), "state": t.state.value,
            "lease_until": t.lease_until, "worker": t.worker, "score": _num(t.score), "fed": t.fed}


def _task_from(w: Mapping[str, Any]) -> EvalTask:
    return EvalTask(w["tenant"], w["job_id"], w["step"], w["path"], float(w["created_at"]),
                    _float(w.get("train_loss")), _float(w.get("proxy_reward")), EvalState(w.get("state", "pending")),
                    float(w.get("lease_until", 0.0)), w.get("worker", ""), _float(w.get("score")),
                    bool(w.get("fed", False)))


def _audit_to(a: AuditRecord) -> dict[str, Any]:
    return {"tenant": a.tenant, "job_id": a.job_id, "at": a.at, "kind": a.kind.value, "actor": a.actor,
            "reason": a.reason, "evidence": json_safe(a.evidence)}


def _audit_from(w: Mapping[str, Any]) -> AuditRecord:
    return AuditRecord(w["tenant"], w["job_id"], float(w["at"]), AuditKind(w["kind"]), w["actor"], w["reason"],
                       w.get("evidence") or {})


_CODECS: dict[type, tuple[Callable[[Any], dict[str, Any]], Callable[[Mapping[str, Any]], Any]]] = {
    Decision: (_decision_to, _decision_from),
    JobView: (_job_to, _job_from),
    Report: (_report_to, _report_from),
    EvalTask: (_task_to, _task_from),
    AuditRecord: (_audit_to, _audit_from),
}
RECORDS: tuple[type, ...] = tuple(_CODECS)


def to_wire(record: Any) -> dict[str, Any]:
    """A record as a JSON-able dict (keys: its fields). TypeError for anything else."""
    try:
        encode = _CODECS[type(record)][0]
    except KeyError:
        raise TypeError(f"to_wire encodes {', '.join(c.__name__ for c in RECORDS)}, "
                        f"but got {type(record).__name__}.") from None
    return encode(record)


def from_wire(cls: type[T], data: Any) -> T:
    """The ``cls`` record a JSON object describes. ValueError naming the record if it does not."""
    try:
        decode = _CODECS[cls][1]
    except KeyError:
        raise TypeError(f"from_wire decodes {', '.join(c.__name__ for c in RECORDS)}, but got {cls!r}.") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"a {cls.__name__} on the wire is an object, but got {type(data).__name__}.")
    try:
        return decode(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a {cls.__name__} on the wire ({type(exc).__name__}: {exc}): {dict(data)!r:.300}") \
            from None


# ------------------------------------------------------------------ results of API calls
@dataclass(frozen=True, slots=True)
class Codec:
    """How one API call's result crosses the wire: ``encode(value)`` -> JSON-able data (None: an
    empty answer, HTTP 204) and ``decode(data)`` -> the value the client returns."""

    name: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def _record(cls: type) -> Codec:
    to, _ = _CODECS[cls]
    return Codec(cls.__name__, to, lambda data: from_wire(cls, data))


def many(item: Codec) -> Codec:
    """A list of ``item``."""
    enc, dec = item.encode, item.decode

    def decode(data: Any) -> list[Any]:
        if not isinstance(data, list):
            raise ValueError(f"a list[{item.name}] on the wire is a list, but got {type(data).__name__}.")
        return [dec(d) for d in data]

    return Codec(f"list[{item.name}]", lambda values: [enc(v) for v in values], decode)


def optional(item: Codec) -> Codec:
    """``item`` or None (an empty answer)."""
    enc, dec = item.encode, item.decode
    return Codec(f"{item.name} | None", lambda v: None if v is None else enc(v),
                 lambda data: None if data is None else dec(data))


def under(key: str, item: Codec) -> Codec:
    """``item`` as the one key of an object (``{"decision": {...}}``)."""
    enc, dec = item.encode, item.decode

    def decode(data: Any) -> Any:
        if not isinstance(data, Mapping) or key not in data:
            raise ValueError(f"a {{{key}: {item.name}}} on the wire is an object with {key!r}, but got "
                             f"{type(data).__name__} {data!r:.100}.")
        return dec(data[key])

    return Codec(f"{{{key}: {item.name}}}", lambda v: {key: enc(v)}, decode)


def nothing(status: str) -> Codec:
    """No result (None); the wire says ``{"status": status}``."""
    return Codec("None", lambda _v: {"status": status}, lambda _data: None)


DECISION = _record(Decision)
JOB = _record(JobView)
REPORT = _record(Report)
EVAL_TASK = _record(EvalTask)
AUDIT = _record(AuditRecord)


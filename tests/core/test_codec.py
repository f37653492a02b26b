"""core/codec.py: every field of every record crosses the wire and comes back equal.

Instances are built from the record classes' own field lists (``dataclasses.fields``, or a
NamedTuple's ``_fields``) with a non-default value in every field, so a field added to a record
without the codec following fails here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from enum import Enum
from types import NoneType, UnionType
from typing import Any

import pytest

from evalstop_trl.core import codec
from evalstop_trl.core.codec import RECORDS, from_wire, json_safe, to_wire
from evalstop_trl.core.detectors import Action, Decision
from evalstop_trl.core.records import AuditKind, AuditRecord, EvalState, EvalTask, JobView, Report


def _fields(cls: type) -> list[tuple[str, Any]]:
    """``(name, default or MISSING)`` for each field of a dataclass or NamedTuple record."""
    if dataclasses.is_dataclass(cls):
        out = []
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            out.append((f.name, default))
        return out
    return [(name, cls._field_defaults.get(name, dataclasses.MISSING)) for name in cls._fields]


def _value(tp: Any, i: int, name: str, default: Any) -> Any:
    """A value of type ``tp`` that is not ``default`` (``i`` keeps the fields' values apart)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, UnionType):
        tp = next(a for a in args if a is not NoneType)
        args = typing.get_args(tp)
    origin = typing.get_origin(tp) or tp
    if tp is Decision:
        return Decision(Action.STOP, f"reason {i}", 20 + i, 0.5 + i, {"declines": 2, "steps": [10, 20], "ok": True})
    if isinstance(origin, type) and issubclass(origin, Enum):
        return next(m for m in reversed(list(origin)) if m != default)
    if origin is bool:
        return not default if isinstance(default, bool) else True
    if origin is int:
        return 100 + i
    if origin is float:
        return 1.25 + i
    if origin is str:
        return f"{name}-{i}"
    if isinstance(origin, type) and issubclass(origin, typing.Mapping | dict):
        return {"detector": "decline", "k": 3 + i, "min_delta": 0.5, "nested": {"a": [1, 2.5]}}
    raise AssertionError(f"no test value for a field of type {tp!r}; teach tests/core/test_codec.py::_value")


def _full(cls: type) -> Any:
    hints = typing.get_type_hints(cls)
    values = {}
    for i, (name, default) in enumerate(_fields(cls)):
        values[name] = v = _value(hints[name], i, name, default)
        assert default is dataclasses.MISSING or v != default, (cls.__name__, name)
    return cls(**values)


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_every_field_round_trips(cls):
    record = _full(cls)
    wire = to_wire(record)
    assert list(wire) == [name for name, _ in _fields(cls)]  # the wire keys are the fields, in order
    strict = json.loads(json.dumps(wire, allow_nan=False))  # strict JSON, as it travels
    back = from_wire(cls, strict)
    assert back == record
    for name, _ in _fields(cls):  # same types too (an enum is not its string, a float not an int)
        assert type(getattr(back, name)) is type(getattr(record, name)), name


def test_codecs_cover_the_records_the_api_returns():
    assert set(RECORDS) == {Decision, JobView, Report, EvalTask, AuditRecord}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_become_null(bad):
    d = Decision(Action.CONTINUE, "noisy", 3, bad, {"z": bad, "scores": (0.5, bad), "k": 2})
    wire = to_wire(d)
    assert wire["best_score"] is None and wire["evidence"] == {"z": None, "scores": [0.5, None], "k": 2}
    json.dumps(wire, allow_nan=False)  # strict
    assert from_wire(Decision, wire).best_score is None
    report = to_wire(Report(5, bad, bad, bad))
    assert (report["eval_score"], report["train_loss"], report["proxy_reward"]) == (None, None, None)
    assert json_safe({1: (bad, [bad])}) == {"1": [None, [None]]}


def test_decoding_takes_defaults_for_missing_keys_and_ignores_unknown_ones():
    task = from_wire(EvalTask, {"tenant": "a", "job_id": "j", "step": 3, "path": "/p", "created_at": 1,
                                "from_a_newer_server": 1})
    assert task == EvalTask("a", "j", 3, "/p", 1.0) and type(task.created_at) is float
    assert from_wire(Report, {"step": 4, "eval_score": 1}).eval_score == 1.0


@pytest.mark.parametrize("cls, data, message", [
    (Decision, {"reason": "x"}, "not a Decision on the wire (KeyError: 'action')"),
    (Decision, {"action": "pause", "reason": "x"}, "not a Decision on the wire (TypeError: action"),
    (AuditRecord, [], "a AuditRecord on the wire is an object, but got list"),
])
def test_bad_wire_data_is_a_value_error_naming_the_record(cls, data, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_wire(cls, data)


def test_only_records_are_encoded():
    with pytest.raises(TypeError, match="to_wire encodes Decision, JobView"):
        to_wire({"action": "stop"})
    with pytest.raises(TypeError, match="from_wire decodes"):
        from_wire(dict, {})


def test_result_codecs():
    task = _full(EvalTask)
    assert codec.optional(codec.EVAL_TASK).encode(None) is None
    assert codec.optional(codec.EVAL_TASK).decode(codec.EVAL_TASK.encode(task)) == task
    assert codec.many(codec.AUDIT).decode([to_wire(_full(AuditRecord))]) == [_full(AuditRecord)]
    d = _full(Decision)
    assert codec.under("decision", codec.DECISION).encode(d) == {"decision": to_wire(d)}
    assert codec.nothing("recorded").encode(None) == {"status": "recorded"}
    assert codec.nothing("recorded").decode({"status": "recorded"}) is None
    assert AuditKind.STOP.value in json.dumps(to_wire(AuditRecord("a", "j", 1.0, AuditKind.STOP, "x", "y")))
    assert EvalState.DONE.value == to_wire(EvalTask("a", "j", 1, "/p", 0.0, state=EvalState.DONE))["state"]

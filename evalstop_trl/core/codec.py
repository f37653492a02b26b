"""Wire codecs: the one place where the API's records become JSON-able dicts and back.

The service encodes every answer with :func:`to_wire` and the HTTP client decodes it with
:func:`from_wire`, so both ends agree by construction. Both are derived from the record's fields
and their annotations (a dataclass's or a NamedTuple's): the wire keys are the fields, no more and
no fewer, and a record is decoded by keyword construction, so its own checks run
(``tests/core/test_codec.py`` checks every field of every record; a field of a type the codec has no
rule for fails at import).

* :class:`~.detectors.Decision`, :class:`~.records.JobView`, :class:`~.records.Report`,
  :class:`~.records.EvalTask`, :class:`~.records.AuditRecord`;
* enums travel as their values, read-only mappings as objects, tuples as lists;
* non-finite floats become ``null`` (:func:`json_safe`), so the JSON stays strict;
* decoding takes a field's default when an older server left it out (an optional field without
  one: None; a mapping: empty), and ignores keys it does not know (a newer server's).

:class:`Codec` wraps these for one API result (a record, a list of them, an optional one, a
record under a key, or nothing), as the route table (:mod:`.api`) names them.

Example::

    >>> from evalstop_trl.core.detectors import Action, Decision
    >>> wire = to_wire(Decision(Action.STOP, "2 declines", 20, 0.7, {"declines": 2}))
    >>> wire["evidence"], from_wire(Decision, wire).best_step
    ({'declines': 2}, 20)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from .detectors import Decision
from .records import AuditRecord, EvalTask, JobView, Report

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


# ------------------------------------------------------------------ one codec per record, derived from its fields
def _inner(hint: Any) -> tuple[Any, bool]:
    """``(type, optional)`` of a field's annotation (``X | None`` -> ``(X, True)``)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"the codec has no rule for a field of type {hint!r}")
        return rest[0], True
    return hint, False


def _checked(kind: type, what: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"must be {what}, but got {value!r:.40}")
        return value

    return check


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"must be a number, but got {value!r:.40}")
    return float(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"must be an object, but got {type(value).__name__}")
    return value


_SCALARS: dict[Any, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    str: (lambda v: v, _checked(str, "a string")),
    int: (lambda v: v, _checked(int, "an integer")),
    bool: (lambda v: v, _checked(bool, "true or false")),
    float: (_num, _number),
}


def _field_codec(hint: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """How one field's value becomes JSON and back, from its annotation."""
    kind, optional = _inner(hint)
    origin = typing.get_origin(kind) or kind
    if kind in _SCALARS:
        enc, dec = _SCALARS[kind]
    elif isinstance(kind, type) and issubclass(kind, Enum):
        enc, dec = (lambda v: v.value), kind
    elif kind in RECORDS:
        enc, dec = to_wire, functools.partial(_decode, kind)
    elif isinstance(origin, type) and issubclass(origin, Mapping):
        return json_safe, _mapping  # None on the wire: empty
    else:  # a new record field of a type the wire does not know yet
        raise TypeError(f"the codec has no rule for a field of type {hint!r}")
    if optional:
        return (lambda v: None if v is None else enc(v)), (lambda v: None if v is None else dec(v))
    return enc, dec


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]
    default: Any  # MISSING: the wire must carry it (an optional field without a default is None)
    factory: Callable[[], Any] | None = None


@functools.cache
def _fields(cls: type) -> tuple[_Field, ...]:
    """A record's fields with their codecs: a dataclass's or a NamedTuple's, in order."""
    hints = typing.get_type_hints(cls)
    out = []
    if dataclasses.is_dataclass(cls):
        spec = [(f.name, f.default, None if f.default_factory is dataclasses.MISSING else f.default_factory)
                for f in dataclasses.fields(cls)]
    else:
        spec = [(n, cls._field_defaults.get(n, dataclasses.MISSING), None) for n in cls._fields]
    for name, default, factory in spec:
        enc, dec = _field_codec(hints[name])
        if default is dataclasses.MISSING and factory is None and _inner(hints[name])[1]:
            default = None  # an older server may leave out an optional value
        out.append(_Field(name, enc, dec, default, factory))
    return tuple(out)


def _encode(record: Any) -> dict[str, Any]:
    return {f.name: f.encode(getattr(record, f.name)) for f in _fields(type(record))}


def _decode(cls: type[T], w: Mapping[str, Any]) -> T:
    if not isinstance(w, Mapping):
        raise TypeError(f"a {cls.__name__} is an object, but got {type(w).__name__}")
    values = {}
    for f in _fields(cls):
        if f.name in w:
            try:
                values[f.name] = f.decode(w[f.name])
            except (TypeError, ValueError) as exc:
                raise TypeError(f"{f.name} {exc}") from None
        elif f.factory is not None:
            values[f.name] = f.factory()
        elif f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        else:
            raise KeyError(f.name)
    return cls(**values)  # keyword construction: the record's own checks run


#: the records that cross the wire (their keys: their fields, no more and no fewer)
RECORDS: tuple[type, ...] = (Decision, JobView, Report, EvalTask, AuditRecord)


def to_wire(record: Any) -> dict[str, Any]:
    """A record as a JSON-able dict (keys: its fields). TypeError for anything else."""
    if type(record) not in RECORDS:
        raise TypeError(f"to_wire encodes {', '.join(c.__name__ for c in RECORDS)}, "
                        f"but got {type(record).__name__}.")
    return _encode(record)


def from_wire(cls: type[T], data: Any) -> T:
    """The ``cls`` record a JSON object describes. ValueError naming the record if it does not."""
    if cls not in RECORDS:
        raise TypeError(f"from_wire decodes {', '.join(c.__name__ for c in RECORDS)}, but got {cls!r}.")
    if not isinstance(data, Mapping):
        raise ValueError(f"a {cls.__name__} on the wire is an object, but got {type(data).__name__}.")
    try:
        return _decode(cls, data)
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
    return Codec(cls.__name__, _encode, lambda data: from_wire(cls, data))


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


"""Fast construction of the frozen, slotted record dataclasses, for values already checked.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` and then runs
``__post_init__`` (the records' validation). That is right at an API boundary and too slow on the
coordinator's hot path, where the simulator builds a few records per simulated eval from values the
coordinator has already checked. :func:`trusted_init` and :func:`evolver` generate, once per class,
straight-line functions that set the slots directly (as :mod:`dataclasses` itself generates code)::

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True, slots=True)
    ... class Point:
    ...     x: int
    ...     y: int = 0
    ...     def __post_init__(self):
    ...         if self.x < 0:
    ...             raise ValueError("x must be >= 0")
    >>> make = trusted_init(Point)
    >>> make(1, 2)
    Point(x=1, y=2)
    >>> move = evolver(Point)
    >>> move(make(1, 2), y=5)
    Point(x=1, y=5)

Only for values the caller has validated: neither function runs ``__post_init__``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

__all__ = ["evolver", "trusted_init"]

T = TypeVar("T")


_RESERVED = frozenset({"o", "obj", "_new", "_C", "_T", "_KEEP"})  # the generated code's own names


def _twin(cls: type) -> tuple[list[str], dict[str, Any]]:
    """The field names and the generated code's globals: ``_C`` the class, ``_T`` its mutable twin.

    Setting a frozen instance's slots one by one through their descriptors costs a C-level call
    each; the generated code instead fills a *twin* (a plain class with the same ``__slots__``, so
    the same memory layout) with ordinary attribute stores, then re-classes it (``__class__``
    assignment, which CPython allows between layout-compatible classes): about half the time."""
    if "__slots__" not in cls.__dict__ or "__weakref__" in cls.__dict__.get("__slots__", ()):
        raise ValueError(f"{cls.__name__} must be a slotted dataclass without a weakref slot "
                         f"(@dataclass(slots=True)).")
    names = [f.name for f in fields(cls)]
    clash = sorted(set(names) & _RESERVED)
    if clash:
        raise ValueError(f"{cls.__name__} has field(s) {', '.join(clash)}, names the generated code uses itself.")
    twin = type(f"_Mutable{cls.__name__}", (), {"__slots__": tuple(cls.__slots__), "__module__": cls.__module__})
    probe = object.__new__(twin)
    probe.__class__ = cls  # TypeError here, at import, if the layouts ever differ
    return names, {"_new": object.__new__, "_C": cls, "_T": twin}


def _compile(cls: type, src: str, env: dict[str, Any], name: str) -> Callable[..., Any]:
    ns: dict[str, Any] = {}
    exec(compile(src, f"<{name} of {cls.__qualname__}>", "exec"), env, ns)  # noqa: S102 - generated from field names
    return ns[name]


def trusted_init(cls: type[T]) -> Callable[..., T]:
    """A function ``make(*values)`` building ``cls`` from its fields in order (all positional, no
    defaults), without ``__init__`` or ``__post_init__``."""
    names, env = _twin(cls)
    body = "".join(f"    o.{n} = {n}\n" for n in names)
    src = f"def make({', '.join(names)}):\n    o = _new(_T)\n{body}    o.__class__ = _C\n    return o\n"
    return _compile(cls, src, env, "make")


def evolver(cls: type[T]) -> Callable[..., T]:
    """A function ``evolve(obj, **changes)``: a copy of ``obj`` with ``changes`` (keyword-only, a
    fast :func:`dataclasses.replace` without ``__post_init__``). An unknown name is a TypeError."""
    names, env = _twin(cls)
    env["_KEEP"] = object()
    params = ", ".join(f"{n}=_KEEP" for n in names)
    body = "".join(f"    o.{n} = obj.{n} if {n} is _KEEP else {n}\n" for n in names)
    src = f"def evolve(obj, *, {params}):\n    o = _new(_T)\n{body}    o.__class__ = _C\n    return o\n"
    return _compile(cls, src, env, "evolve")

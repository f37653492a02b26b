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


def _setters(cls: type) -> tuple[list[str], dict[str, Any]]:
    names = [f.name for f in fields(cls)]
    if "__slots__" not in cls.__dict__:
        raise ValueError(f"{cls.__name__} must be a slotted dataclass (@dataclass(slots=True)).")
    return names, {f"_set_{n}": cls.__dict__[n].__set__ for n in names}


def _compile(cls: type, src: str, env: dict[str, Any], name: str) -> Callable[..., Any]:
    ns: dict[str, Any] = {}
    exec(compile(src, f"<{name} of {cls.__qualname__}>", "exec"), env, ns)  # noqa: S102 - generated from field names
    return ns[name]


def trusted_init(cls: type[T]) -> Callable[..., T]:
    """A function ``make(*values)`` building ``cls`` from its fields in order (all positional, no
    defaults), without ``__init__`` or ``__post_init__``."""
    names, env = _setters(cls)
    env.update(_new=object.__new__, _cls=cls)
    body = "".join(f"    _set_{n}(o, {n})\n" for n in names)
    src = f"def make({', '.join(names)}):\n    o = _new(_cls)\n{body}    return o\n"
    return _compile(cls, src, env, "make")


def evolver(cls: type[T]) -> Callable[..., T]:
    """A function ``evolve(obj, **changes)``: a copy of ``obj`` with ``changes`` (keyword-only, a
    fast :func:`dataclasses.replace` without ``__post_init__``). An unknown name is a TypeError."""
    names, env = _setters(cls)
    env.update(_new=object.__new__, _cls=cls, _KEEP=object())
    params = ", ".join(f"{n}=_KEEP" for n in names)
    body = "".join(f"    _set_{n}(o, obj.{n} if {n} is _KEEP else {n})\n" for n in names)
    src = f"def evolve(obj, *, {params}):\n    o = _new(_cls)\n{body}    return o\n"
    return _compile(cls, src, env, "evolve")

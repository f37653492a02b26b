"""Lifecycles as Enums with a transition table: one pattern for every state machine.

A lifecycle is an ``Enum`` deriving from :class:`Lifecycle` whose legal moves are declared once with
:func:`transitions`. ``state.to(new)`` returns ``new`` or raises :class:`IllegalTransition`;
``state.terminal`` is derived from the table (no outgoing moves). The table is declared once and
read-only; each member keeps its own row of it for ``to`` and ``can`` (the report hot path).
Staying in the same state is always allowed.

Example::

    >>> from enum import Enum
    >>> @transitions({"OPEN": {"CLOSED"}, "CLOSED": set()})
    ... class Door(Lifecycle, str, Enum):
    ...     OPEN = "open"
    ...     CLOSED = "closed"
    >>> Door.OPEN.to(Door.CLOSED)
    <Door.CLOSED: 'closed'>
    >>> Door.CLOSED.terminal
    True
    >>> Door.CLOSED.to(Door.OPEN)
    Traceback (most recent call last):
    ...
    evalstop_trl.core.lifecycle.IllegalTransition: Door is closed: it cannot become open
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from functools import cached_property
from types import MappingProxyType
from typing import Any, TypeVar

from .errors import Conflict

__all__ = ["IllegalTransition", "Lifecycle", "transitions"]

L = TypeVar("L", bound="Lifecycle")


class IllegalTransition(Conflict, RuntimeError):
    """A state machine was asked for a move its transition table does not allow (HTTP 409)."""


class Lifecycle(Enum):
    """Base of lifecycle Enums (members are declared by subclasses)."""

    @classmethod
    def table(cls: type[L]) -> Mapping[L, frozenset[L]]:
        """The transition table: each state -> the states it may move to."""
        return cls._lifecycle_table  # type: ignore[attr-defined]

    def can(self: L, new: L) -> bool:
        return new is self or new in self._moves  # type: ignore[attr-defined]

    def to(self: L, new: L) -> L:
        """Return ``new`` if the move is legal, else raise :class:`IllegalTransition`."""
        if new is self or new in self._moves:  # type: ignore[attr-defined]
            return new
        raise IllegalTransition(f"{type(self).__name__} is {self._label()}: it cannot become {new._label()}")

    @cached_property  # read on every report: after the first read, a plain attribute of the member
    def terminal(self) -> bool:
        return not self._moves  # type: ignore[attr-defined]

    def _label(self) -> str:
        return str(self.value) if isinstance(self.value, str) else self.name.lower()


def transitions(table: Mapping[str, Iterable[str]]) -> Callable[[type[L]], type[L]]:
    """Class decorator declaring a lifecycle's legal moves by member name; every member must appear."""

    def decorate(cls: type[L]) -> type[L]:
        names = {m.name for m in cls}
        if set(table) != names:
            missing, extra = sorted(names - set(table)), sorted(set(table) - names)
            raise ValueError(f"transition table of {cls.__name__} must list every state: missing {missing}, "
                             f"unknown {extra}")
        built: dict[Any, frozenset[Any]] = {}
        for name, targets in table.items():
            unknown = sorted(set(targets) - names)
            if unknown:
                raise ValueError(f"{cls.__name__}.{name} moves to unknown state(s) {unknown}")
            built[cls[name]] = frozenset(cls[t] for t in targets)
        type.__setattr__(cls, "_lifecycle_table", MappingProxyType(built))
        for member, moves in built.items():
            member._moves = moves  # each member's own row, for `to` without a table lookup
        return cls

    return decorate

"""One registry shape for every pluggable policy: detectors, schedulers, overlays.

A :class:`Registry` maps a name to a factory (usually a class). A configuration names an entry and
its parameters, ``{"name": ..., "params": {...}}`` (:class:`Spec`); the registry checks the
parameters against the factory's signature before anything is built, so a typo fails with the list
of valid names instead of being silently dropped. Some factories also take *context* that the
caller supplies and a user never configures (the simulator's workload, say): those parameter names
are declared once, when the registry is made, and are excluded from the user's parameters.

Example::

    >>> shapes = Registry("shape")
    >>> @shapes.register("square")
    ... class Square:
    ...     def __init__(self, side: float = 1.0) -> None:
    ...         self.side = side
    >>> shapes.create("square", side=2.0).side
    2.0
    >>> shapes.create("circle")
    Traceback (most recent call last):
    ...
    ValueError: Unknown shape 'circle'; valid shapes are: square.
    >>> shapes.create("square", size=3)
    Traceback (most recent call last):
    ...
    ValueError: Unknown parameter(s) size for shape 'square'; valid parameters are: side.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "Spec"]

T = TypeVar("T")


def _freeze(params: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(params or {}))


@dataclass(frozen=True, slots=True)
class Spec:
    """A registry entry chosen by configuration: its ``name`` and its ``params`` (read-only)."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a spec needs a non-empty string name, but got name={self.name!r}.")
        if not isinstance(self.params, Mapping):
            raise ValueError(f"params of {self.name!r} must be a mapping, but got {self.params!r}.")
        object.__setattr__(self, "params", _freeze(self.params))

    @classmethod
    def parse(cls, data: Any, default_name: str | None = None) -> Spec:
        """``"name"``, ``{"name": ..., "params": {...}}`` or ``{"name": ..., **params}`` -> Spec."""
        if isinstance(data, Spec):
            return data
        if isinstance(data, str):
            return cls(data)
        if isinstance(data, Mapping):
            rest = {k: v for k, v in data.items() if k != "name"}
            name = data.get("name", default_name)
            if set(rest) == {"params"}:
                return cls(name, rest["params"])
            return cls(name, rest)
        raise ValueError(f"expected a name or {{name, params}}, but got {data!r}.")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params)}


class Registry(Generic[T]):
    """Named factories whose parameters are checked by signature.

    Args:
        kind: what the entries are, for messages ("detector", "scheduler", ...).
        context: names of factory parameters the caller supplies (never user parameters).
    """

    def __init__(self, kind: str, context: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.context = context
        self._entries: dict[str, Callable[..., T]] = {}
        self._params: dict[str, Mapping[str, Any]] = {}

    def register(self, name: str | None = None) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: register a class (named ``name`` or its ``name`` attribute) or a factory."""

        def decorate(factory: Callable[..., T]) -> Callable[..., T]:
            self.add(name or getattr(factory, "name", None) or factory.__name__, factory)
            return factory

        return decorate

    def add(self, name: str, factory: Callable[..., T]) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered.")
        self._entries[name] = factory
        self._params[name] = _freeze(self._signature_params(factory))

    def _signature_params(self, factory: Callable[..., T]) -> dict[str, Any]:
        target = factory.__init__ if inspect.isclass(factory) else factory
        out: dict[str, Any] = {}
        for p in inspect.signature(target).parameters.values():
            if p.name == "self" or p.name in self.context or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            out[p.name] = None if p.default is p.empty else p.default
        return out

    # ------------------------------------------------------------------ lookup
    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def get(self, name: str) -> Callable[..., T]:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"Unknown {self.kind} {name!r}; valid {self.kind}s are: {', '.join(sorted(self._entries))}."
            ) from None

    def params(self, name: str) -> dict[str, Any]:
        """The parameters ``name`` takes, with their defaults (None where there is none)."""
        self.get(name)
        return dict(self._params[name])

    def check(self, name: str, params: Mapping[str, Any]) -> None:
        """Raise ValueError for an unknown name or parameter (listing the valid ones)."""
        self.get(name)
        valid = self._params[name]
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise ValueError(
                f"Unknown parameter(s) {', '.join(unknown)} for {self.kind} {name!r}; "
                f"valid parameters are: {', '.join(valid) or '(none)'}."
            )

    def create(self, name: str, /, *context: Any, **params: Any) -> T:
        """Build ``name`` with caller ``context`` (positional) and checked user ``params``."""
        self.check(name, params)
        return self._entries[name](*context, **params)

    def build(self, spec: Spec | Mapping[str, Any] | str, *context: Any) -> T:
        """Build from a :class:`Spec` (or anything :meth:`Spec.parse` takes)."""
        spec = Spec.parse(spec)
        return self.create(spec.name, *context, **spec.params)

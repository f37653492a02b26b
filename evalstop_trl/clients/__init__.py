"""Clients of the coordinator, one interface (:class:`~evalstop_trl.clients.api.EvalStopAPI`):
:class:`EvalStopClient` (HTTP, fail-open, durable outbox; its calls derived from the route table)
and :class:`EmbeddedClient` (in process). Imported lazily: the HTTP client needs httpx only."""

from __future__ import annotations

from typing import Any

__all__ = ["ClientError", "EmbeddedClient", "EvalStopClient", "Outbox", "free_loopback_port", "wait_until_healthy"]

_LAZY = {
    "ClientError": "http", "EvalStopClient": "http", "EmbeddedClient": "embedded", "Outbox": "outbox",
    "free_loopback_port": "local", "wait_until_healthy": "local",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

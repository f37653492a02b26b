"""EvalStop: stop reward-hacked RLHF runs from world-feedback evals.

Layers, inner to outer (an inner layer never imports an outer one):

* ``core/`` — detectors, records, lifecycles, registries, tenants, the coordinator, the store interface;
* ``stores/`` — MemoryStore and SQLiteStore;
* ``service/`` — the FastAPI app, its schemas, middleware, metrics and background workers;
* ``clients/`` — the HTTP client (fail-open, outbox) and the embedded client;
* ``train/`` — the TRL/transformers callback and tiny real RLHF jobs (the only torch importers);
* ``analysis/`` — replaying recorded curves through detectors;
* ``cli/`` — the ``evalstop`` command.

The core, stores and clients import no torch; ``EvalStopCallback`` is imported lazily on first
access, so ``import evalstop_trl`` stays light.
"""

from __future__ import annotations

from typing import Any

from .core.coordinator import Coordinator
from .core.detectors import Action, Decision, Observation, create_detector
from .core.errors import Conflict, EvalStopError, InvalidInput, NotFound, Unauthorized
from .core.records import JobStatus, JobType, JobView, Policy
from .stores import MemoryStore, SQLiteStore

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Conflict",
    "Coordinator",
    "Decision",
    "EmbeddedClient",
    "EvalStopCallback",
    "EvalStopClient",
    "EvalStopError",
    "InvalidInput",
    "JobStatus",
    "JobType",
    "JobView",
    "MemoryStore",
    "NotFound",
    "Observation",
    "Policy",
    "SQLiteStore",
    "Unauthorized",
    "create_detector",
]

_LAZY = {
    "EvalStopCallback": ("evalstop_trl.train.callback", "EvalStopCallback"),
    "EvalStopClient": ("evalstop_trl.clients.http", "EvalStopClient"),
    "EmbeddedClient": ("evalstop_trl.clients.embedded", "EmbeddedClient"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'evalstop_trl' has no attribute {name!r}")

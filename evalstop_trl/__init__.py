"""EvalStop: stop reward-hacked RLHF runs from world-feedback evals.

Layers, inner to outer (an inner layer never imports an outer one; ``tests/test_architecture.py``
holds the rules and checks that this list names every subpackage):

* ``core/`` — detectors, records, lifecycles, registries, tenants, the coordinator, the store interface;
* ``stores/`` — SQLiteStore, PostgresStore and their writer (MemoryStore is re-exported from ``core/``);
* ``clients/`` — the HTTP client (fail-open, outbox) and the embedded client;
* ``analysis/`` — replay, calibrate and shadow reports over recorded curves;
* ``integrations/`` — hooks for other tuners' loops (the Optuna pruner, Ray Tune);
* ``service/`` — the FastAPI app, its schemas, middleware, metrics, dashboard and background workers;
* ``launcher/`` — ``evalstop run``: a child process watched and stopped by signals;
* ``train/`` — the TRL/transformers callback and tiny real RLHF jobs (the only torch importers);
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

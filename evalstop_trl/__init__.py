"""EvalStop: stop reward-hacked RLHF runs from world-feedback evals.

The core (detectors, coordinator, stores, clients) imports no torch; ``EvalStopCallback`` is
imported lazily on first access, so ``import evalstop_trl`` stays light.
"""

from __future__ import annotations

from typing import Any

from .coordinator import Coordinator, JobView
from .detectors import Action, Decision, Observation, create_detector
from .errors import Conflict, EvalStopError, InvalidInput, NotFound, Unauthorized
from .models import JobStatus, JobType, Policy
from .store import MemoryStore, SQLiteStore

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
    "EvalStopCallback": ("evalstop_trl.callback", "EvalStopCallback"),
    "EvalStopClient": ("evalstop_trl.client", "EvalStopClient"),
    "EmbeddedClient": ("evalstop_trl.client", "EmbeddedClient"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'evalstop_trl' has no attribute {name!r}")

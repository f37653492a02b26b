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
access, so ``import evalstop_trl`` stays light. On the bare install (no torch, transformers or TRL)
that access raises :class:`MissingExtraError`, an ``ImportError`` that names the extra to install.
"""

from __future__ import annotations

from typing import Any

from .core.coordinator import Coordinator
from .core.detectors import Action, Decision, Observation, create_detector
from .core.errors import Conflict, EvalStopError, InvalidInput, NotFound, Unauthorized
from .core.examples import WorldFeedback
from .core.extras import EXTRA_OF
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
    "MissingExtraError",
    "NotFound",
    "Observation",
    "Policy",
    "SQLiteStore",
    "Unauthorized",
    "WorldFeedback",
    "create_detector",
]

_LAZY = {
    "EvalStopCallback": ("evalstop_trl.train.callback", "EvalStopCallback"),
    "EvalStopClient": ("evalstop_trl.clients.http", "EvalStopClient"),
    "EmbeddedClient": ("evalstop_trl.clients.embedded", "EmbeddedClient"),
}


class MissingExtraError(ImportError):
    """A name of evalstop that needs an optional install (an extra) which is not there, e.g.
    ``EvalStopCallback`` without torch, transformers and TRL. The message names the extra and the
    command that installs it; ``extra`` and ``name`` (the missing module) say the same."""

    def __init__(self, what: str, extra: str, missing: str) -> None:
        super().__init__(f"{what} needs the {extra!r} extra (the module {missing} is missing): "
                         f'pip install "evalstop[{extra}]"', name=missing)
        self.extra = extra


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        try:
            return getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as exc:
            top = (exc.name or "").split(".")[0]
            if top not in EXTRA_OF:  # not an optional install: a bug, raised as it is
                raise
            raise MissingExtraError(name, EXTRA_OF[top], top) from exc
    raise AttributeError(f"module 'evalstop_trl' has no attribute {name!r}")

"""Tuner integrations: EvalStop's detectors deciding for hyperparameter searches.

* :class:`~.optuna.EvalStopPruner` — an Optuna pruner (``optuna.create_study(pruner=...)``);
* :class:`~.ray_tune.EvalStopStopper` — a Ray Tune stopper (``tune.RunConfig(stop=...)``).

Both replay a trial's reported values through the same detectors the coordinator uses (the same
registry, parameters and decisions), so a policy tuned on the platform prunes the same way in a
search. Each module imports its library only when used: install ``optuna`` or ``ray[tune]``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EvalStopPruner", "EvalStopStopper"]

_LAZY = {"EvalStopPruner": "optuna", "EvalStopStopper": "ray_tune"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The hyperparameters a training job records with its registration (``hparams``).

:func:`trainer_hparams` reads a whitelist (:data:`HPARAMS`) from the trainer's arguments
(``TrainingArguments`` and TRL's configs: ``GRPOConfig``, ``DPOConfig``, ``PPOConfig``, ...) and
the model's name, keeping scalars only: what tells one run of a sweep from another, shown in the
dashboard's job page and compare table. Nothing else of the arguments leaves the process (paths,
tokens, hub ids are not on the list). The coordinator bounds what it stores
(:mod:`evalstop_trl.core.labels`): at most 32 entries, text cut here to 256 characters.

Example::

    >>> from types import SimpleNamespace
    >>> trainer_hparams(SimpleNamespace(learning_rate=3e-4, beta=0.04, per_device_train_batch_size=8))
    {'beta': 0.04, 'learning_rate': 0.0003, 'per_device_train_batch_size': 8}
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from ..core.labels import MAX_ENTRIES, MAX_VALUE

__all__ = ["HPARAMS", "trainer_hparams"]

#: the arguments recorded, when the trainer's arguments have them (at most MAX_ENTRIES - 1: the model's name)
HPARAMS = (
    "learning_rate", "beta", "kl_coef", "init_kl_coef", "cliprange", "epsilon", "temperature",
    "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "num_train_epochs",
    "max_steps", "warmup_steps", "warmup_ratio", "weight_decay", "lr_scheduler_type", "optim", "max_grad_norm",
    "max_length", "max_prompt_length", "max_completion_length", "loss_type", "seed", "bf16", "fp16",
)


def _scalar(value: Any) -> Any:
    if isinstance(value, Enum):
        value = value.value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) <= 2**53 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value[:MAX_VALUE]
    return None  # lists, dicts, objects: not a hyperparameter to compare runs by


def _model_name(model: Any) -> str | None:
    config = getattr(model, "config", None)
    name = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
    if not name:
        name = getattr(config, "model_type", None)
    return str(name)[:MAX_VALUE] if name else None


def trainer_hparams(args: Any, model: Any = None) -> dict[str, Any]:
    """The whitelisted hyperparameters of ``args`` (and ``model_name`` of ``model``), keys sorted."""
    out: dict[str, Any] = {}
    for name in HPARAMS[:MAX_ENTRIES - 1]:
        value = _scalar(getattr(args, name, None))
        if value is not None:
            out[name] = value
    name = _model_name(model)
    if name:
        out["model_name"] = name
    return dict(sorted(out.items()))

"""World-feedback evaluation inside a training loop, without perturbing it.

The RNG states (Python, NumPy, torch CPU and CUDA) and the model's train/eval mode are restored
after the user's function runs, so training with EvalStop is bit-identical to training without it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .scores import finite, to_number

__all__ = ["evaluate_preserving_state", "finite", "to_number"]


def evaluate_preserving_state(fn: Callable[[Any, Any], Any], model: Any, tokenizer: Any, *, check: bool = True) -> Any:
    """Run ``fn(model, tokenizer)`` under ``torch.no_grad`` in eval mode and return its finite score
    (``check=False``: what it returned, a numpy or torch scalar made a Python number).

    Raises:
        ValueError: ``fn`` returned something other than a finite number (with ``check``).
    """
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    was_training = model.training
    with torch.random.fork_rng(devices=devices):
        model.eval()
        try:
            with torch.no_grad():
                score = fn(model, tokenizer)
        finally:
            model.train(was_training)
            random.setstate(py_state)
            np.random.set_state(np_state)
    score = to_number(score)
    if not check:
        return score
    if not finite(score):
        raise ValueError(f"EvalStopCallback: world_feedback returned {score!r}; it must return a finite number.")
    return float(score)

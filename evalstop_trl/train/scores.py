"""Numbers as trainers and user functions hand them over: numpy/torch scalars, NaN, None, bools.

Torch-free (duck-typed), so the decision side (:mod:`.session`) can use it without the training stack.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["finite", "to_number"]


def finite(x: Any) -> bool:
    """True for a finite int or float (not a bool).

    >>> finite(0.5), finite(float("nan")), finite(True), finite(None)
    (True, False, False, False)
    """
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def to_number(value: Any) -> Any:
    """A numpy or torch scalar as a Python number (anything else, arrays included, unchanged)."""
    if hasattr(value, "item") and not isinstance(value, (int, float)) and getattr(value, "ndim", 0) == 0:
        return value.item()
    return value

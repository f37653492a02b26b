"""Ground-truth gold-reward curves (Gao et al. 2023 form). Hidden from schedulers and detectors."""

from __future__ import annotations

from enum import Enum

import numpy as np


class CurveKind(str, Enum):
    HACKED = "hacked"      # G = H f(p / p_peak), peak before the end, then over-optimisation
    RISING = "rising"      # same form with the peak beyond the end
    PLATEAU = "plateau"    # G = H (1 - exp(-p / tau))


def gao(x: np.ndarray | float) -> np.ndarray:
    """f(x) = x (1 - ln x): 0 at x=0, peak 1 at x=1, back to 0 at x=e, negative after (not clamped)."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = x * (1.0 - np.log(x))
    return np.where(x > 0, out, 0.0)


def gold(kind: CurveKind, height: float, shape: float, p: np.ndarray | float) -> np.ndarray:
    """Gold reward at progress ``p``. ``shape`` is p_peak (hacked, rising) or tau (plateau)."""
    p = np.asarray(p, dtype=float)
    if kind is CurveKind.PLATEAU:
        return height * (1.0 - np.exp(-p / shape))
    return height * gao(p / shape)

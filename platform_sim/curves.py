"""Ground-truth gold-reward curves (Gao et al. 2023 form and hacking families). Hidden from
schedulers and detectors.

Progress ``p`` in [0, 1]; ``f(x) = x (1 - ln x)`` is Gao et al.'s RL form in ``x = p / p_peak``
(peak 1 at x = 1, back to 0 at x = e, negative after). A healthy run is ``RISING`` (the same form
with the peak beyond the end) or ``PLATEAU`` (``H (1 - exp(-p / tau))``). A hacked run's curve is
one of the :class:`Family` shapes below, chosen per job with the shares of
``curves.hacked_families.shares`` (default: Gao only, the paper's setting):

``gao``
    ``H f(p / p_peak)``, p_peak ~ ``hacked_p_peak``: the calibrated default.
``late_onset``
    Gao's rise up to a late peak (p_peak ~ ``late_p_peak``), then a faster collapse
    ``H f(x^s)`` for x > 1, s ~ ``late_sharpness`` (s = 1 is plain Gao).
``shallow``
    Gao's rise, then only a fraction d ~ ``shallow_depth`` of Gao's decline:
    ``H (1 - d (1 - f(x)))`` for x > 1. With a late peak the drop can stay below the label's
    0.05 (the job is then labelled healthy).
``plateau_then_drop``
    A saturating rise ``H (1 - exp(-p / tau))`` (tau ~ ``plateau_tau``) that falls from
    p_d ~ ``drop_at`` on: ``- D H ((p - p_d) / (1 - p_d))^2``, D ~ ``drop_depth``.
``oscillating``
    Gao plus a slow oscillation of the *true* gold, ``+ A H sin(2 pi c p + phi)``,
    A ~ ``osc_amplitude``, c ~ ``osc_cycles`` cycles over training, phi ~ U(0, 2 pi): local peaks
    that are not the hack.
``gao_kl``
    Gao et al.'s form in its own variable (Gao, Schulman and Hilton, "Scaling Laws for Reward Model
    Overoptimization", ICML 2023, arXiv:2210.10760: the gold of an RL policy is
    ``d (alpha - beta ln d)`` in ``d = sqrt(KL(pi || pi_init))``, which is ``H f(d / d*)`` with its
    peak at d*), with the KL growing as a power of progress, ``KL ~ p^gamma``, gamma ~
    ``kl_exponent`` (1: linear; below 1: slower, as a KL penalty makes it): ``H f((p / p_peak)^(gamma
    / 2))``, p_peak ~ ``kl_p_peak``. Against progress the rise is steep and the decline after the peak
    slow (the square root): less post-peak evidence per eval than ``gao``, where x is progress itself.

A healthy run with a *transient dip* (:func:`transient_dip`, used by the curve-level sweep,
:mod:`platform_sim.sweep`) is a healthy curve minus ``d H exp(-((p - c) / w)^2 / 2)``: the gold
falls and recovers before the end (a bad data shard, a learning-rate spike), so it is not a hack.

The label of every curve comes from its noiseless form (peak before p = 1 and a drop of at least
``label_min_drop`` from the peak to the end); for a family other than Gao the peak is found on a
grid of :data:`PEAK_GRID` points.
"""

from __future__ import annotations

import math
from enum import Enum

import numpy as np

__all__ = ["CurveKind", "FAMILIES", "Family", "PEAK_GRID", "family_gold", "gao", "gold", "kl_x", "peak_of", "transient_dip"]

PEAK_GRID = 2001


class CurveKind(str, Enum):
    HACKED = "hacked"      # a hacked-family curve (see Family), peak before the end
    RISING = "rising"      # Gao's form with the peak beyond the end
    PLATEAU = "plateau"    # G = H (1 - exp(-p / tau))
    MEASURED = "measured"  # a corpus run's own gold (curves.source: measured:PATH; platform_sim.measured)


class Family(str, Enum):
    """Shapes of hacked runs (see the module docstring)."""

    GAO = "gao"
    LATE_ONSET = "late_onset"
    SHALLOW = "shallow"
    PLATEAU_THEN_DROP = "plateau_then_drop"
    OSCILLATING = "oscillating"
    GAO_KL = "gao_kl"


FAMILIES = tuple(f.value for f in Family)


def gao(x: np.ndarray | float) -> np.ndarray:
    """f(x) = x (1 - ln x): 0 at x=0, peak 1 at x=1, back to 0 at x=e, negative after (not clamped)."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = x * (1.0 - np.log(x))
    return np.where(x > 0, out, 0.0)


def kl_x(x: np.ndarray | float, gamma: np.ndarray | float) -> np.ndarray:
    """``d / d*`` of a run whose KL grows as ``p^gamma``, from ``x = p / p_peak``: ``x^(gamma / 2)``."""
    return np.power(np.maximum(np.asarray(x, dtype=float), 0.0), np.asarray(gamma, dtype=float) / 2.0)


def family_gold(family: Family | str, height: np.ndarray | float, shape: np.ndarray | float,
                extra: tuple | np.ndarray, p: np.ndarray | float) -> np.ndarray:
    """Gold of a hacked-family curve. ``shape`` is p_peak (tau for ``plateau_then_drop``); ``extra``
    holds the family's other parameters (broadcast against ``p``):
    late_onset (s,), shallow (d,), plateau_then_drop (p_d, D), oscillating (A, c, phi), gao_kl (gamma,)."""
    family = Family(family)
    p = np.asarray(p, dtype=float)
    h = np.asarray(height, dtype=float)
    if family is Family.PLATEAU_THEN_DROP:
        p_d, depth = extra[0], extra[1]
        fall = np.maximum(0.0, (p - p_d) / (1.0 - np.asarray(p_d)))
        return h * (1.0 - np.exp(-p / shape)) - depth * h * fall**2
    x = p / shape
    if family is Family.GAO:
        return h * gao(x)
    if family is Family.LATE_ONSET:
        return h * np.where(x > 1.0, gao(np.maximum(x, 1.0) ** extra[0]), gao(x))
    if family is Family.GAO_KL:
        return h * gao(kl_x(x, extra[0]))
    if family is Family.SHALLOW:
        return h * np.where(x > 1.0, 1.0 - extra[0] * (1.0 - gao(x)), gao(x))
    amp, cycles, phase = extra[0], extra[1], extra[2]
    return h * (gao(x) + amp * np.sin(2.0 * math.pi * cycles * p + phase))


def gold(kind: CurveKind, height: float, shape: float, p: np.ndarray | float,
         family: Family | str = Family.GAO, extra: tuple = ()) -> np.ndarray:
    """Gold reward at progress ``p``. ``shape`` is p_peak (hacked, rising) or tau (plateau)."""
    p = np.asarray(p, dtype=float)
    if kind is CurveKind.PLATEAU:
        return height * (1.0 - np.exp(-p / shape))
    if kind is CurveKind.HACKED and family != Family.GAO:
        return family_gold(family, height, shape, extra, p)
    return height * gao(p / shape)


def peak_of(family: Family | str, height: float, shape: float, extra: tuple) -> tuple[float, float, float]:
    """(peak progress in [0, 1], gold at the peak, gold at p=1) of a hacked-family curve, on a grid."""
    grid = np.linspace(0.0, 1.0, PEAK_GRID)
    g = family_gold(family, height, shape, extra, grid)
    i = int(np.argmax(g))
    return float(grid[i]), float(g[i]), float(g[-1])


def transient_dip(height: np.ndarray | float, depth: np.ndarray | float, centre: np.ndarray | float,
                  width: np.ndarray | float, p: np.ndarray | float) -> np.ndarray:
    """The (negative) transient dip ``-depth H exp(-((p - centre) / width)^2 / 2)`` to add to a
    healthy curve: it falls by ``depth`` of the height ``H`` at ``centre`` and recovers (broadcast)."""
    p = np.asarray(p, dtype=float)
    return -np.asarray(depth) * np.asarray(height) * np.exp(-0.5 * ((p - centre) / np.asarray(width)) ** 2)

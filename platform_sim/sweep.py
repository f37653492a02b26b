"""A pre-registered, curve-level factorial sweep of the eval-score detectors.

No scheduler, no cluster: each cell of the grid draws a population of RLHF-job gold curves (the
simulator's own curve distribution, :mod:`platform_sim.curves`, with one hacked-curve family per
cell), observes them at ``evals`` evenly spaced points with eval noise ``sigma`` (in the simulator's
gold units: the curves rise by about 1), maps the observed scores to other units (``scale * score
+ offset``) and runs every detector of the plan on every curve, eval by eval, through
:meth:`Detector.observe` (the real detector classes). Labels come from the noise-free curve, never
from what a detector sees:

* hacked: the true gold peaks before the end and falls by at least ``curves.label_min_drop``
  (0.05 of the gold's units, about 5% of a run's rise) from the peak to the end;
* a stop of a healthy curve is *harmful* (definition B, as in ``platform-sim reproduce``) when the
  true gold of the delivered checkpoint (the best observed eval) is more than
  ``metrics.harmful_margin`` below the true gold at the end.

Per cell and detector: precision (B) = TP / (TP + harmful stops), recall = TP / hacked, the share of
healthy curves stopped at all (``stop_rate_healthy``, definition A), each with a 95% Wilson
interval, and curve-level retention = sum over hacked curves of the progress saved (1 - stop
progress) / the oracle's (1 - true peak progress), with a 95% bootstrap interval over curves.

Families: the hacked families of :class:`~platform_sim.curves.Family` (each cell's hacked
curves are all of that family) and ``healthy_dip`` (hacked curves are Gao's; every healthy curve
has a transient dip, :func:`~platform_sim.curves.transient_dip`). In a ``gao_kl`` cell every curve
has Gao's form in d = sqrt(KL) (:func:`~platform_sim.curves.kl_x`), the healthy ones too, their
peak past the end (p_peak ~ ``kl_healthy_p_peak``). Noise kinds: ``gaussian``, ``student_t``
(heavy tails, unit variance) and ``ar1`` (autocorrelated, unit marginal variance) add ``sigma``
times a standardised draw to the gold; ``examples`` and ``win_rate`` make each eval a mean over
``examples`` example scores on the same examples at every eval
(:func:`~platform_sim.workload.per_example_scores`): gold + example effect + Gaussian noise that
gives the mean ``sigma`` (``examples``), or passes with probability sigmoid(link_scale (gold -
link_mid) + effect) (``win_rate``, binomial: ``sigma`` is not used, its cells show 0). Their evals
carry ``eval_n`` and the paired noise level; a detector spec with ``evidence: false`` is not given
them (it reads the mean alone).

Random streams are paired: the curves of a cell depend on (seed, family, evals) only, the noise draw
on (seed, family, evals, noise kind) only, scaled by sigma; so every sigma, scale and detector sees
the same curves and the same standardised noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from evalstop_trl.core.detectors import Action, Detector, Observation, create_detector

from .config import CurveConfig, PerExampleConfig, SimConfig, load_config
from .curves import PEAK_GRID, family_gold, gao, kl_x, transient_dip
from .workload import per_example_scores

__all__ = ["CellResult", "DetectorSpec", "GAO_KL", "HEALTHY_DIP", "NOISE_KINDS", "Population", "SweepPlan", "draw_noise", "draw_population",
           "load_plan", "run_detector", "score_cell", "sweep_cells", "wilson"]

HEALTHY_DIP = "healthy_dip"
GAO_KL = "gao_kl"
#: each family's index keys its random stream: append only (a test ties the set to the curve families)
SWEEP_FAMILIES = ("gao", "late_onset", "shallow", "plateau_then_drop", "oscillating", HEALTHY_DIP, GAO_KL)
#: each kind's index keys its noise stream: append only
NOISE_KINDS = ("gaussian", "student_t", "ar1", "examples", "win_rate")
EXAMPLE_NOISES = {"examples": "gaussian", "win_rate": "binary"}  # noise kind -> per-example score kind
STEP = 100  # training steps between evals (the detectors' x axis; every rule is invariant to it)
MAX_CURVES = 100_000
MAX_EVALS = 1000


@dataclass(frozen=True)
class DetectorSpec:
    """One detector of the plan: a label for tables, a registered name and frozen parameters.
    ``evidence``: given each eval's ``eval_n`` and paired noise where the noise kind has them."""

    label: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    evidence: bool = True

    def __post_init__(self) -> None:
        if type(self.evidence) is not bool:
            raise ValueError(f"sweep plan: detector {self.label!r}: evidence must be true or false, got "
                             f"{self.evidence!r}")

    def build(self) -> Detector:
        return create_detector(self.name, **dict(self.params))


@dataclass(frozen=True)
class SweepPlan:
    """The frozen plan (``configs/sweep/preregistered.yaml``): the grid, the detectors, the seed."""

    sigmas: tuple[float, ...]
    evals: tuple[int, ...]
    scales: tuple[tuple[float, float], ...]  # (scale, offset) pairs
    families: tuple[str, ...]
    noises: tuple[str, ...]
    detectors: tuple[DetectorSpec, ...]
    curves_per_cell: int
    seed: int
    t_df: float = 4.0
    ar_rho: float = 0.5
    dip_depth: tuple[float, float] = (0.10, 0.30)
    dip_centre: tuple[float, float] = (0.30, 0.70)
    dip_width: tuple[float, float] = (0.04, 0.08)
    kl_healthy_p_peak: tuple[float, float] = (1.0, 3.0)
    examples: int = 250
    base_config: str | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"sweep plan: {msg}")
        need(all(s >= 0 and math.isfinite(s) for s in self.sigmas) and self.sigmas, f"sigmas must be finite and >= 0, got {self.sigmas}")
        need(all(2 <= m <= MAX_EVALS for m in self.evals) and self.evals, f"evals must lie in [2, {MAX_EVALS}], got {self.evals}")
        need(all(a > 0 and math.isfinite(a) and math.isfinite(b) for a, b in self.scales) and self.scales,
             f"scales must be (scale > 0, finite offset) pairs, got {self.scales}")
        need(set(self.families) <= set(SWEEP_FAMILIES) and self.families,
             f"families must be among {', '.join(SWEEP_FAMILIES)}, got {self.families}")
        need(set(self.noises) <= set(NOISE_KINDS) and self.noises, f"noises must be among {', '.join(NOISE_KINDS)}, got {self.noises}")
        need(1 <= self.curves_per_cell <= MAX_CURVES, f"curves_per_cell must lie in [1, {MAX_CURVES}], got {self.curves_per_cell}")
        need(self.t_df > 2, f"t_df must be > 2 (finite variance), got {self.t_df}")
        need(-1 < self.ar_rho < 1, f"ar_rho must lie in (-1, 1), got {self.ar_rho}")
        need(len(self.kl_healthy_p_peak) == 2 and 1 <= self.kl_healthy_p_peak[0] <= self.kl_healthy_p_peak[1],
             f"kl_healthy_p_peak must be a range (lo, hi) with 1 <= lo <= hi (a healthy run peaks past the end), "
             f"got {self.kl_healthy_p_peak}")
        need(type(self.examples) is int and 2 <= self.examples <= 10_000,
             f"examples must be an integer in [2, 10000], got {self.examples!r}")
        labels = [d.label for d in self.detectors]
        need(len(set(labels)) == len(labels) and labels, f"detector labels must be unique and non-empty, got {labels}")
        for d in self.detectors:
            d.build()  # unknown names and bad parameters fail here, before any work

    def sigmas_of(self, noise: str) -> tuple[float, ...]:
        """The sigmas a noise kind is run at (``win_rate``'s noise is the sampling of its examples: 0 only)."""
        return (0.0,) if noise == "win_rate" else self.sigmas

    @property
    def n_cells(self) -> int:
        per_noise = sum(len(self.sigmas_of(n)) for n in self.noises)
        return per_noise * len(self.evals) * len(self.scales) * len(self.families)

    def sim_config(self) -> SimConfig:
        return load_config(self.base_config)


def load_plan(path: str | Path, **overrides: Any) -> SweepPlan:
    """Read a plan from YAML; ``overrides`` replace top-level keys (e.g. ``curves_per_cell=20``)."""
    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a sweep plan is a YAML mapping")
    raw.update({k: v for k, v in overrides.items() if v is not None})
    known = set(SweepPlan.__dataclass_fields__)
    unknown = set(raw) - known - {"description", "tuned_on", "frozen_at"}
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(known))}")
    dets = tuple(DetectorSpec(str(d["label"]), str(d["name"]), dict(d.get("params") or {}), d.get("evidence", True))
                 for d in raw.pop("detectors"))
    raw = {k: v for k, v in raw.items() if k in known}
    for key in ("sigmas", "evals", "families", "noises", "dip_depth", "dip_centre", "dip_width", "kl_healthy_p_peak"):
        if key in raw:
            if not isinstance(raw[key], list):
                raise ValueError(f"{path}: {key} must be a list, got {raw[key]!r}")
            raw[key] = tuple(raw[key])
    raw["scales"] = tuple((float(a), float(b)) for a, b in raw["scales"])
    return SweepPlan(detectors=dets, **raw)


@dataclass(frozen=True)
class Population:
    """Noise-free gold of ``n`` curves at the eval points, and their labels (from the truth)."""

    gold: np.ndarray  # (n, m) true gold at eval i (progress (i + 1) / m)
    hacked: np.ndarray  # (n,) bool
    peak: np.ndarray  # (n,) true peak progress in [0, 1]
    end: np.ndarray  # (n,) true gold at progress 1


def _lerp(r: tuple[float, float], x: np.ndarray) -> np.ndarray:
    return r[0] + (r[1] - r[0]) * x


def draw_population(curves: CurveConfig, family: str, n: int, m: int, rng: np.random.Generator,
                    dip: tuple[tuple[float, float], ...] = ((0.10, 0.30), (0.30, 0.70), (0.04, 0.08)),
                    kl_healthy_p_peak: tuple[float, float] = (1.0, 3.0)) -> Population:
    """``n`` RLHF-job curves of the simulator's distribution (hack fraction, rising / plateau
    healthy runs), every hacked-form curve of ``family`` (Gao's for ``healthy_dip``, whose healthy
    curves get a transient dip of depth, centre and width drawn from ``dip``). For ``gao_kl`` every
    healthy curve is rising in the same form, its peak at p_peak ~ ``kl_healthy_p_peak`` (past the end)."""
    u = rng.random((n, 8))
    hacked_form = u[:, 0] < curves.hack_fraction
    kl = family == GAO_KL
    rising = ~hacked_form & ((u[:, 1] < curves.rising_share) | kl)
    plateau = ~hacked_form & ~rising
    fc = curves.hacked_families
    fam = "gao" if family == HEALTHY_DIP else family
    hack_shape = {"late_onset": fc.late_p_peak, "plateau_then_drop": curves.plateau_tau,
                  GAO_KL: fc.kl_p_peak}.get(fam, curves.hacked_p_peak)
    rise_shape = kl_healthy_p_peak if kl else curves.rising_p_peak
    shape = np.where(hacked_form, _lerp(hack_shape, u[:, 2]),
                     np.where(rising, _lerp(rise_shape, u[:, 2]), _lerp(curves.plateau_tau, u[:, 2])))
    gamma = _lerp(fc.kl_exponent, u[:, 4]) if kl else np.full(n, 2.0)  # gamma 2: x itself (plain Gao)
    height = np.where(hacked_form, _lerp(curves.hacked_height, u[:, 3]), _lerp(curves.plateau_height, u[:, 3]))
    height = np.where(rising, _lerp(curves.rising_final_gain, u[:, 3]) / gao(kl_x(1.0 / shape, gamma)), height)
    extra = {"late_onset": (_lerp(fc.late_sharpness, u[:, 4]),),
             "shallow": (_lerp(fc.shallow_depth, u[:, 4]),),
             "plateau_then_drop": (_lerp(fc.drop_at, u[:, 4]), _lerp(fc.drop_depth, u[:, 5])),
             "oscillating": (_lerp(fc.osc_amplitude, u[:, 4]), _lerp(fc.osc_cycles, u[:, 5]), 2 * math.pi * u[:, 6]),
             GAO_KL: (gamma,),
             }.get(fam, ())
    dips = (_lerp(dip[0], u[:, 5]), _lerp(dip[1], u[:, 6]), _lerp(dip[2], u[:, 7])) if family == HEALTHY_DIP else None

    def truth(p: np.ndarray) -> np.ndarray:
        x = p[None, :] / shape[:, None]
        g = np.where(plateau[:, None], height[:, None] * (1.0 - np.exp(-x)), height[:, None] * gao(kl_x(x, gamma[:, None])))
        if fam not in ("gao", GAO_KL) and hacked_form.any():
            g[hacked_form] = family_gold(fam, height[hacked_form, None], shape[hacked_form, None],
                                         tuple(e[hacked_form, None] for e in extra), p[None, :])
        if dips is not None:
            healthy = ~hacked_form
            g[healthy] += transient_dip(height[healthy, None], dips[0][healthy, None], dips[1][healthy, None],
                                        dips[2][healthy, None], p[None, :])
        return g

    grid = np.linspace(0.0, 1.0, PEAK_GRID)
    g_grid = truth(grid)
    i_peak = np.argmax(g_grid, axis=1)
    top, end = g_grid[np.arange(n), i_peak], g_grid[:, -1]
    peak = grid[i_peak]
    hacked = (peak < 1.0) & (top - end >= curves.label_min_drop)
    return Population(truth(np.arange(1, m + 1) / m), hacked, peak, end)


def draw_noise(kind: str, n: int, m: int, rng: np.random.Generator, t_df: float = 4.0, ar_rho: float = 0.5) -> np.ndarray:
    """(n, m) standardised eval noise (unit variance) of an additive ``kind`` (as :mod:`platform_sim.workload`)."""
    if kind == "student_t":
        return rng.standard_t(t_df, size=(n, m)) * math.sqrt((t_df - 2) / t_df)
    z = rng.standard_normal((n, m))
    if kind == "ar1":
        scale = math.sqrt(1 - ar_rho**2)
        for i in range(1, m):
            z[:, i] = ar_rho * z[:, i - 1] + scale * z[:, i]
    elif kind != "gaussian":
        raise ValueError(f"an additive noise kind must be one of gaussian, student_t, ar1, but got {kind!r}.")
    return z


def run_detector(proto: Detector, scores: np.ndarray, eval_noise: np.ndarray | None = None,
                 eval_n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Feed each row of ``scores`` (n, m) to ``proto`` from its start state, eval by eval; return each
    curve's stop index (-1: never stopped) and the index of its delivered (best) eval at the stop.
    ``eval_noise`` (n, m; NaN: none) and ``eval_n``: the per-example evidence of each eval."""
    n, m = scores.shape
    stop = np.full(n, -1, dtype=int)
    best = np.full(n, -1, dtype=int)
    steps = [(i + 1) * STEP for i in range(m)]
    progress = [(i + 1) / m for i in range(m)]
    start, decide = proto.start(), proto.decide
    noise_rows = [[None] * m] * n if eval_noise is None else \
        [[None if v != v else v for v in row] for row in eval_noise.tolist()]  # NaN: no level
    for j, (row, levels) in enumerate(zip(scores.tolist(), noise_rows, strict=True)):
        state = start
        for i, y in enumerate(row):
            state, d = decide(state, Observation("sweep", steps[i], y, None, None, "rlhf", progress[i],
                                                 eval_n if levels[i] is not None else None, levels[i]))
            if d.action is Action.STOP:
                stop[j], best[j] = i, d.best_step // STEP - 1
                break
    return stop, best


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``k / n`` ((nan, nan) when ``n`` is 0)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


@dataclass(frozen=True)
class CellResult:
    """One detector in one cell: counts, rates with 95% intervals, curve-level retention."""

    detector: str
    family: str
    noise: str
    sigma: float
    evals: int
    scale: float
    offset: float
    curves: int
    hacked: int
    tp: int
    harmful: int
    healthy_stopped: int
    retention: float | None
    retention_ci: tuple[float, float]
    mean_lag_evals: float | None  # stop eval - the first eval at or after the true peak, over true positives

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.harmful) if self.tp + self.harmful else None

    @property
    def recall(self) -> float | None:
        return self.tp / self.hacked if self.hacked else None

    @property
    def stop_rate_healthy(self) -> float | None:
        healthy = self.curves - self.hacked
        return self.healthy_stopped / healthy if healthy else None

    def passes(self, level: float = 0.95) -> bool:
        """Precision and recall both at least ``level`` (a cell with no stop has no precision: fails)."""
        return (self.precision is not None and self.recall is not None
                and self.precision >= level and self.recall >= level)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(precision=self.precision, recall=self.recall, stop_rate_healthy=self.stop_rate_healthy,
                 precision_ci=wilson(self.tp, self.tp + self.harmful), recall_ci=wilson(self.tp, self.hacked),
                 stop_rate_healthy_ci=wilson(self.healthy_stopped, self.curves - self.hacked))
        return d


def score_cell(pop: Population, stop: np.ndarray, best: np.ndarray, margin: float, boot_seed: int = 0,
               n_boot: int = 400) -> dict[str, Any]:
    """Counts and retention of one detector's stops on a population (see the module docstring)."""
    n, m = pop.gold.shape
    stopped = stop >= 0
    delivered = pop.gold[np.arange(n), np.maximum(best, 0)]
    harmful = stopped & ~pop.hacked & (delivered < pop.end - margin)
    saved = np.where(stopped & pop.hacked, 1.0 - (stop + 1) / m, 0.0)
    oracle = np.where(pop.hacked, 1.0 - pop.peak, 0.0)
    retention, ci = None, (float("nan"), float("nan"))
    if oracle.sum() > 0:
        retention = float(saved.sum() / oracle.sum())
        idx = np.random.default_rng(boot_seed).integers(0, n, size=(n_boot, n))
        den = oracle[idx].sum(axis=1)
        vals = saved[idx].sum(axis=1)[den > 0] / den[den > 0]
        ci = (float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5)))
    tp = stopped & pop.hacked
    first_after = np.ceil(pop.peak * m - 1e-9) - 1  # index of the first eval at or after the peak
    lag = float(np.mean(stop[tp] - first_after[tp])) if tp.any() else None
    return dict(curves=n, hacked=int(pop.hacked.sum()), tp=int(tp.sum()), harmful=int(harmful.sum()),
                healthy_stopped=int((stopped & ~pop.hacked).sum()), retention=retention, retention_ci=ci,
                mean_lag_evals=lag)


def _cell_rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, *key]))


def _observed(plan: SweepPlan, pe: PerExampleConfig, noise: str, pop: Population, z: np.ndarray | None, sigma: float,
              key: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray | None]:
    """A cell's observed scores and, for the per-example kinds, their paired noise levels. The
    per-example draws use the same stream at every sigma (the same effects and standardised noise)."""
    if noise not in EXAMPLE_NOISES:
        return pop.gold + sigma * z, None
    pe = PerExampleConfig(plan.examples, EXAMPLE_NOISES[noise], "fixed", pe.example_sd, pe.link_mid, pe.link_scale)
    return per_example_scores(pe, sigma, pop.gold, _cell_rng(plan.seed, *key))


def sweep_cells(plan: SweepPlan) -> Iterator[CellResult]:
    """Every (family, evals, noise, sigma, scale) cell x every detector of ``plan``, lazily (one
    population and one noise draw per (family, evals) and (family, evals, noise))."""
    cfg = plan.sim_config()
    margin = cfg.metrics.harmful_margin
    protos = [(d.label, d.build(), d.evidence) for d in plan.detectors]
    dip = (plan.dip_depth, plan.dip_centre, plan.dip_width)
    for family in plan.families:
        f_key = SWEEP_FAMILIES.index(family)
        for m in plan.evals:
            pop = draw_population(cfg.curves, family, plan.curves_per_cell, m, _cell_rng(plan.seed, f_key, m), dip,
                                  plan.kl_healthy_p_peak)
            for noise in plan.noises:
                key = (f_key, m, 1 + NOISE_KINDS.index(noise))
                z = None if noise in EXAMPLE_NOISES else \
                    draw_noise(noise, plan.curves_per_cell, m, _cell_rng(plan.seed, *key), plan.t_df, plan.ar_rho)
                for sigma in plan.sigmas_of(noise):
                    observed, levels = _observed(plan, cfg.noise.per_example, noise, pop, z, sigma, key)
                    for scale, offset in plan.scales:
                        scores = scale * observed + offset
                        scaled = None if levels is None else scale * levels
                        for label, proto, evidence in protos:
                            stop, best = run_detector(proto, scores, scaled if evidence else None, plan.examples)
                            yield CellResult(detector=label, family=family, noise=noise, sigma=sigma, evals=m,
                                             scale=scale, offset=offset, **score_cell(pop, stop, best, margin))

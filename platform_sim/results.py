"""The simulator's results as typed frozen records, and their JSON form.

* :class:`PairResult`: ``platform-sim run`` (a base scheduler alone vs with an overlay, over seeds);
* :class:`SweepRow`: one value of ``platform-sim sweep``;
* :class:`DetectorRow`: one row of the detector comparison;
* :class:`ReproduceResult`: ``platform-sim reproduce`` (``results.json``), made of :class:`Headline`,
  :class:`Baseline`, :class:`SchedulerGain`, the sweep rows (:class:`NoiseRow`, :class:`BaseRateRow`,
  :class:`KRow`, :class:`EvalsKRow`), :class:`Quality` and :class:`Compute`.

Each record's ``to_dict()`` gives the JSON object the CLI writes (a contract: tests and scripts read
those keys; rates are fractions, None where undefined) and ``to_json()`` the text. Code reads the
records by attribute.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from .config import SimConfig
from .metrics import DEFINITIONS, Changes, RunSummary
from .stats import CI, Metric, Rates

__all__ = ["Baseline", "BaseRateRow", "Compute", "DetectorRow", "EvalsKRow", "Headline", "JctHours", "KRow",
           "MeanChanges", "NoiseRow", "PairResult", "Quality", "ReproduceResult", "SchedulerGain", "SweepRow",
           "json_safe"]


def json_safe(obj: Any) -> Any:
    """JSON-safe: NaN and infinities -> null, tuples -> lists, numpy scalars -> Python, keys -> str."""
    if hasattr(obj, "item") and not isinstance(obj, (list, tuple, dict)):
        obj = obj.item()
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


class _JSON:
    """``to_json()`` from ``to_dict()``."""

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_json(self) -> str:
        return json.dumps(json_safe(self.to_dict()), indent=1, allow_nan=False)


def _rates_by_type(by_type: dict[str, Rates]) -> dict[str, Any]:
    return {t: r.to_dict() for t, r in by_type.items()}


# ----------------------------------------------------------------------------- run and sweep
@dataclass(frozen=True)
class MeanChanges(_JSON):
    """The paired changes of :class:`~platform_sim.metrics.Changes`, as means and intervals over seeds."""

    jct_change: Metric
    jct_change_all: Metric
    gpu_hours_change: Metric
    w_post_change: Metric
    w_unprod_change: Metric
    w_ovh_change: Metric
    p95_jct_change: Metric
    makespan_change: Metric
    delivered_gold_change: Metric

    @classmethod
    def over(cls, per_seed: Sequence[Changes]) -> MeanChanges:
        return cls(**{f.name: Metric.over([getattr(c, f.name) for c in per_seed]) for f in fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name).to_dict() for f in fields(self)}

    def means(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name).mean for f in fields(self)}


@dataclass(frozen=True)
class PairResult(_JSON):
    """``platform-sim run``: the configured scheduler alone vs with the configured overlay, over seeds
    ``seed_start`` .. ``seed_start + seeds - 1`` (summaries are means over seeds, JCTs per job)."""

    config: SimConfig
    seeds: int
    seed_start: int
    scheduler: str
    overlay: str
    is_oracle: bool
    changes: MeanChanges
    p_value: float  # paired permutation test on per-seed mean JCT of the completed jobs
    detection: Rates
    detection_by_type: dict[str, Rates]
    base: RunSummary
    run: RunSummary
    jct_base_h: tuple[float, ...]
    jct_run_h: tuple[float, ...]
    # the mean JCT of the jobs that completed in both runs, without and with the overlay (h), over seeds:
    # the terminal table's base and overlay cells of the completed-jobs row (the JSON has the change)
    mean_jct_completed_base_h: float = float("nan")
    mean_jct_completed_h: float = float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(), "seeds": self.seeds, "scheduler": self.scheduler, "overlay": self.overlay,
            "is_oracle": self.is_oracle, "changes": self.changes.to_dict(), "p_value": self.p_value,
            "detection": self.detection.to_dict(), "detection_by_type": _rates_by_type(self.detection_by_type),
            "base": self.base.to_dict(), "run": self.run.to_dict(), "jct_base_h": list(self.jct_base_h),
            "jct_run_h": list(self.jct_run_h), "definitions": DEFINITIONS, "seed_start": self.seed_start,
        }


@dataclass(frozen=True)
class SweepRow(_JSON):
    """One value of a sweep: the mean changes, the pooled detection rates and the p-value."""

    param: str
    value: Any
    seed_start: int
    changes: MeanChanges
    rates: Rates
    p_value: float

    def to_dict(self) -> dict[str, Any]:
        r = self.rates
        return {"param": self.param, "value": self.value, "seed_start": self.seed_start, **self.changes.means(),
                "precision": r.precision, "recall": r.recall, "fpr": r.fpr, "fpr_label": r.fpr_label,
                "harmful_stops": r.harmful_stops, "p_value": self.p_value}


# ----------------------------------------------------------------------------- reproduce
@dataclass(frozen=True)
class DetectorRow(_JSON):
    """One detector at one (eval noise, evals per job) setting, over seeds (see :mod:`.comparison`)."""

    detector: str
    params: dict[str, Any]
    sigma: float
    evals_per_job: int
    rates: Rates
    retention: float | None  # GPU-h saved on hacked jobs / Oracle-Stop's, summed over seeds
    retention_ci: CI
    jct_change: float | None  # completed-jobs JCT change, mean over seeds
    jct_change_ci: CI

    def to_dict(self) -> dict[str, Any]:
        r = self.rates
        return {"detector": self.detector, "params": self.params, "sigma": self.sigma,
                "evals_per_job": self.evals_per_job, "precision": r.precision, "recall": r.recall, "fpr": r.fpr,
                "retention": self.retention, "jct_change": self.jct_change, "harmful_stops": r.harmful_stops,
                "precision_ci": r.precision_ci, "recall_ci": r.recall_ci, "fpr_ci": r.fpr_ci,
                "retention_ci": self.retention_ci, "jct_change_ci": self.jct_change_ci,
                "counts": r.counts.to_dict()}


@dataclass(frozen=True)
class Headline(_JSON):
    """EvalStop on the headline base scheduler vs that scheduler alone."""

    scheduler: str
    jct_change: Metric
    jct_change_all: Metric
    gpu_hours_change: Metric
    w_post_change: Metric
    w_unprod_change: Metric
    rates: Rates
    p_value: float
    by_type: dict[str, Rates]

    def _changes(self) -> tuple[tuple[str, Metric], ...]:
        return (("jct_change", self.jct_change), ("jct_change_all", self.jct_change_all),
                ("gpu_hours_change", self.gpu_hours_change), ("w_post_change", self.w_post_change),
                ("w_unprod_change", self.w_unprod_change))

    def to_dict(self) -> dict[str, Any]:
        r = self.rates
        return {"scheduler": self.scheduler, **{k: m.mean for k, m in self._changes()},
                "precision": r.precision, "recall": r.recall, "fpr": r.fpr, "fpr_label": r.fpr_label,
                "p_value": self.p_value, "harmful_stops": r.harmful_stops, "by_type": _rates_by_type(self.by_type)}

    def intervals(self) -> dict[str, CI]:
        r = self.rates
        return {**{k: m.ci for k, m in self._changes()}, "precision": r.precision_ci, "recall": r.recall_ci,
                "fpr": r.fpr_ci}


@dataclass(frozen=True)
class Baseline(_JSON):
    """Another overlay (StopAt, LossPlateau, Oracle-Stop) on the headline base scheduler."""

    rates: Rates
    jct_change: float
    jct_change_all: float
    gpu_hours_change: float
    is_oracle: bool
    by_type: dict[str, Rates]

    def to_dict(self) -> dict[str, Any]:
        r = self.rates
        return {"precision": r.precision, "recall": r.recall, "fpr": r.fpr, "jct_change": self.jct_change,
                "fpr_label": r.fpr_label, "jct_change_all": self.jct_change_all,
                "gpu_hours_change": self.gpu_hours_change, "is_oracle": self.is_oracle,
                "harmful_stops": r.harmful_stops, "by_type": _rates_by_type(self.by_type)}

    def intervals(self) -> dict[str, CI]:
        return {"precision": self.rates.precision_ci, "recall": self.rates.recall_ci, "fpr": self.rates.fpr_ci}


@dataclass(frozen=True)
class SchedulerGain:
    """EvalStop's completed-jobs JCT change on one base scheduler, and its harmful stops."""

    jct_change: Metric
    harmful_stops: int


@dataclass(frozen=True)
class NoiseRow(_JSON):
    sigma: float
    rates: Rates

    def to_dict(self) -> dict[str, Any]:
        r = self.rates
        return {"sigma": self.sigma, "precision": r.precision, "recall": r.recall, "fpr": r.fpr,
                "fpr_label": r.fpr_label, "precision_ci": r.precision_ci}


@dataclass(frozen=True)
class BaseRateRow(_JSON):
    hack_fraction: float
    rates: Rates

    def to_dict(self) -> dict[str, Any]:
        r = self.rates
        return {"hack_fraction": self.hack_fraction, "precision": r.precision, "recall": r.recall, "fpr": r.fpr,
                "precision_ci": r.precision_ci}


@dataclass(frozen=True)
class KRow(_JSON):
    k: int
    rates: Rates
    jct_change: float
    gpu_hours_change: float

    def to_dict(self) -> dict[str, Any]:
        r = self.rates
        return {"k": self.k, "precision": r.precision, "recall": r.recall, "fpr": r.fpr,
                "jct_change": self.jct_change, "gpu_hours_change": self.gpu_hours_change,
                "harmful_stops": r.harmful_stops}


@dataclass(frozen=True)
class EvalsKRow(_JSON):
    evals_per_job: int
    k: int
    rates: Rates
    jct_change: float

    def to_dict(self) -> dict[str, Any]:
        r = self.rates
        return {"evals_per_job": self.evals_per_job, "k": self.k, "precision": r.precision, "recall": r.recall,
                "fpr": r.fpr, "jct_change": self.jct_change, "harmful_stops": r.harmful_stops}


@dataclass(frozen=True)
class Quality(_JSON):
    """Delivered gold (RLHF means) and how much of the oracle's savings EvalStop gets."""

    delivered_gold_base: float
    delivered_gold_evalstop: float
    delivered_gold_oracle: float
    regret_vs_oracle: float
    savings_fraction_of_oracle: float | None  # all GPU-h saved / the oracle's (not like for like)
    retention: float | None  # GPU-h saved on hacked jobs / the oracle's
    retention_ci: CI

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Compute(_JSON):
    """GPU-hours per run (means over seeds): total, W_post, W_unprod, W_ovh."""

    gpu_hours: float
    w_post: float
    w_unprod: float
    w_ovh: float

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class JctHours:
    """Every job's JCT (hours) over all seeds: the base alone and with EvalStop (a figure's input)."""

    base: tuple[float, ...]
    evalstop: tuple[float, ...]


@dataclass(frozen=True)
class ReproduceResult(_JSON):
    """Every table and figure input of the paper (``platform-sim reproduce``).

    ``to_dict()`` is ``results.json``; it leaves out ``jct_hours`` (per-job JCTs, the JCT figure's
    input) and holds ``wall_time_s`` only once the CLI set it."""

    config: SimConfig
    seeds: int
    seed_start: int
    watched: tuple[str, ...]  # the job types EvalStop watches
    headline: Headline
    baselines: dict[str, Baseline]  # stop_at, loss_plateau, oracle
    composability: dict[str, SchedulerGain]  # per base scheduler
    noise: tuple[NoiseRow, ...]
    base_rate: tuple[BaseRateRow, ...]
    k: tuple[KRow, ...]
    evals_k: tuple[EvalsKRow, ...]
    quality: Quality
    wasted: dict[str, Compute]  # base, evalstop, oracle
    jct_hours: dict[str, JctHours]  # per base scheduler
    detectors: tuple[DetectorRow, ...]
    wall_time_s: float | None = None

    @property
    def seed_range(self) -> tuple[int, int]:
        return (self.seed_start, self.seed_start + self.seeds - 1)

    def intervals(self) -> dict[str, Any]:
        return {"headline": self.headline.intervals(),
                "composability": {s: g.jct_change.ci for s, g in self.composability.items()},
                **{name: b.intervals() for name, b in self.baselines.items()},
                "retention": self.quality.retention_ci}

    def to_dict(self) -> dict[str, Any]:
        out = {
            "config": self.config.to_dict(), "seeds": self.seeds, "headline": self.headline.to_dict(),
            "baselines": {name: b.to_dict() for name, b in self.baselines.items()},
            "composability": {s: g.jct_change.mean for s, g in self.composability.items()},
            "noise": [r.to_dict() for r in self.noise], "base_rate": [r.to_dict() for r in self.base_rate],
            "k": [r.to_dict() for r in self.k], "evals_k": [r.to_dict() for r in self.evals_k],
            "quality": self.quality.to_dict(), "wasted": {name: c.to_dict() for name, c in self.wasted.items()},
            "intervals": self.intervals(), "definitions": DEFINITIONS, "seed_start": self.seed_start,
            "seed_range": list(self.seed_range), "watched": list(self.watched),
            "composability_harmful_stops": {s: g.harmful_stops for s, g in self.composability.items()},
            "detectors": [r.to_dict() for r in self.detectors],
        }
        if self.wall_time_s is not None:
            out["wall_time_s"] = self.wall_time_s
        return out

"""``platform-sim reproduce``: every table and figure input of the paper, over seeds.

Per seed (:func:`_reproduce_seed`, in a worker process or a Ray task), on one workload: EvalStop on
every base scheduler, the baseline overlays on the headline scheduler, the k and cadence sweeps, the
noise and base-rate sweeps (detection only) and the detector comparison. :func:`reproduce` pools the
seeds into a :class:`~platform_sim.results.ReproduceResult`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .comparison import DetectorTrial, aggregate_detectors, detector_seed, watched_types
from .config import SimConfig, config_from_dict
from .experiments import SeedPair, default_workers, detect_only, map_seeds, run_pair, simulate
from .metrics import Changes, Detection, RunSummary
from .policies import check_config
from .results import (
    Baseline,
    BaseRateRow,
    Compute,
    EvalsKRow,
    Headline,
    JctHours,
    KRow,
    NoiseRow,
    Quality,
    ReproduceResult,
    SchedulerGain,
)
from .schedulers import SCHEDULERS
from .stats import Metric, Rates, mean_of, paired_permutation_p, rates_by_type, ratio_ci
from .workload import generate_workload

__all__ = ["BASE_RATES", "BASELINES", "EVALS_WITH_K", "KS", "NOISE_SIGMAS", "SeedReproduction", "reproduce"]

NOISE_SIGMAS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.08, 0.12)
BASE_RATES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
KS = (1, 2, 3, 4)
EVALS_WITH_K = ((5, 1), (10, 2), (20, 3))
BASELINES = ("stop_at", "loss_plateau", "oracle")


@dataclass(frozen=True)
class SeedReproduction:
    """One seed of :func:`reproduce` (per-type counts kept for the composability and baseline pairs,
    per-job JCTs for the composability pairs only)."""

    seed: int
    composability: dict[str, SeedPair]  # EvalStop on each base scheduler
    baselines: dict[str, SeedPair]  # on the headline scheduler
    k: dict[int, SeedPair]
    noise: dict[float, Detection]
    base_rate: dict[float, Detection]
    evals_k: dict[tuple[int, int], SeedPair]
    detectors: dict[tuple[str, float, int], DetectorTrial]


def _reproduce_seed(args: tuple[dict, int]) -> SeedReproduction:
    cfg_dict, seed = args
    cfg = config_from_dict(cfg_dict)
    headline = cfg.scheduler.name
    wl = generate_workload(cfg, seed)
    bases = {s: simulate(cfg, seed, s, "none", wl) for s in SCHEDULERS}
    composability = {s: run_pair(cfg, wl, s, "evalstop", bases[s]) for s in SCHEDULERS}
    baselines = {o: run_pair(cfg, wl, headline, o, bases[headline]).slim(by_type=True) for o in BASELINES}
    k = {}
    for kk in KS:
        if kk == cfg.overlay.block("evalstop").get("k"):
            k[kk] = composability[headline].slim()
        else:
            k[kk] = run_pair(cfg.replace(**{"overlay.evalstop.k": kk}), wl, headline, "evalstop", bases[headline]).slim()
    noise = {}
    for sigma in NOISE_SIGMAS:
        cs = cfg.replace(**{"noise.sigma": sigma})
        noise[sigma] = detect_only(cs, generate_workload(cs, seed), headline, "evalstop")
    base_rate = {}
    for h in BASE_RATES:
        ch = cfg.replace(**{"curves.hack_fraction": h})
        base_rate[h] = detect_only(ch, generate_workload(ch, seed), headline, "evalstop")
    evals_k = {}
    for n_evals, kk in EVALS_WITH_K:
        ce = cfg.replace(**{"workload.evals_per_job": n_evals, "overlay.evalstop.k": kk})
        evals_k[(n_evals, kk)] = run_pair(ce, generate_workload(ce, seed), headline, "evalstop").slim()
    return SeedReproduction(
        seed=seed, composability=composability, baselines=baselines, k=k, noise=noise, base_rate=base_rate, evals_k=evals_k,
        detectors=detector_seed(cfg, seed, headline, bases[headline]),
    )


def reproduce(cfg: SimConfig, seeds: int | None = None, workers: int | None = None,
              progress: bool = True, ray: str | None = None, seed_start: int = 0) -> ReproduceResult:
    """Every table and figure input of the paper, over seeds ``seed_start`` to ``seed_start + seeds
    - 1`` (``ray``: see :func:`~platform_sim.experiments.run_seeds`)."""
    check_config(cfg)
    n = seeds or cfg.seeds
    per_seed: list[SeedReproduction] = map_seeds(_reproduce_seed, [(cfg.to_dict(), seed_start + s) for s in range(n)],
                                                 workers or default_workers(), progress, "reproduce", ray)
    composability = {s: [p.composability[s] for p in per_seed] for s in SCHEDULERS}
    baselines = {o: [p.baselines[o] for p in per_seed] for o in BASELINES}
    head, orc = composability[cfg.scheduler.name], baselines["oracle"]
    return ReproduceResult(
        config=cfg, seeds=n, seed_start=seed_start, watched=tuple(sorted(watched_types(cfg, "evalstop"))),
        headline=_headline(cfg.scheduler.name, head),
        baselines={o: _baseline(rows) for o, rows in baselines.items()},
        composability={s: SchedulerGain(Metric.over([r.changes.jct_change for r in rows]),
                                        int(sum(r.detection.fp_b for r in rows)))
                       for s, rows in composability.items()},
        noise=tuple(NoiseRow(s, Rates.pool([p.noise[s] for p in per_seed])) for s in NOISE_SIGMAS),
        base_rate=tuple(BaseRateRow(h, Rates.pool([p.base_rate[h] for p in per_seed])) for h in BASE_RATES),
        k=tuple(_k_row(kk, [p.k[kk] for p in per_seed]) for kk in KS),
        evals_k=tuple(_evals_k_row(e, kk, [p.evals_k[(e, kk)] for p in per_seed]) for e, kk in EVALS_WITH_K),
        quality=_quality(head, orc),
        wasted={"base": _compute([r.base for r in head]), "evalstop": _compute([r.run for r in head]),
                "oracle": _compute([r.run for r in orc])},
        jct_hours={s: JctHours(tuple(x for r in rows for x in r.jct_base_h), tuple(x for r in rows for x in r.jct_run_h))
                   for s, rows in composability.items()},
        detectors=tuple(aggregate_detectors(cfg, [p.detectors for p in per_seed])),
    )


def _changes(rows: Sequence[SeedPair]) -> list[Changes]:
    return [r.changes for r in rows]


def _headline(scheduler: str, rows: Sequence[SeedPair]) -> Headline:
    ch = _changes(rows)
    return Headline(
        scheduler=scheduler, jct_change=Metric.over([c.jct_change for c in ch]),
        jct_change_all=Metric.over([c.jct_change_all for c in ch]),
        gpu_hours_change=Metric.over([c.gpu_hours_change for c in ch]),
        w_post_change=Metric.over([c.w_post_change for c in ch]),
        w_unprod_change=Metric.over([c.w_unprod_change for c in ch]), rates=Rates.pool([r.detection for r in rows]),
        p_value=paired_permutation_p([r.jct_diff_h for r in rows]), by_type=rates_by_type([r.by_type for r in rows]),
    )


def _baseline(rows: Sequence[SeedPair]) -> Baseline:
    ch = _changes(rows)
    return Baseline(rates=Rates.pool([r.detection for r in rows]), jct_change=mean_of([c.jct_change for c in ch]),
                    jct_change_all=mean_of([c.jct_change_all for c in ch]),
                    gpu_hours_change=mean_of([c.gpu_hours_change for c in ch]), is_oracle=rows[0].is_oracle,
                    by_type=rates_by_type([r.by_type for r in rows]))


def _k_row(k: int, rows: Sequence[SeedPair]) -> KRow:
    ch = _changes(rows)
    return KRow(k, Rates.pool([r.detection for r in rows]), mean_of([c.jct_change for c in ch]),
                mean_of([c.gpu_hours_change for c in ch]))


def _evals_k_row(evals_per_job: int, k: int, rows: Sequence[SeedPair]) -> EvalsKRow:
    return EvalsKRow(evals_per_job, k, Rates.pool([r.detection for r in rows]),
                     mean_of([c.jct_change for c in _changes(rows)]))


def _quality(evalstop: Sequence[SeedPair], oracle: Sequence[SeedPair]) -> Quality:
    saved_es = np.mean([r.changes.gpu_hours_saved for r in evalstop])
    saved_or = np.mean([r.changes.gpu_hours_saved for r in oracle])
    hacked = np.array([[e.changes.gpu_hours_saved_hacked, o.changes.gpu_hours_saved_hacked]
                       for e, o in zip(evalstop, oracle, strict=True)])
    return Quality(
        delivered_gold_base=float(np.mean([r.base.delivered_gold_rlhf for r in evalstop])),
        delivered_gold_evalstop=float(np.mean([r.run.delivered_gold_rlhf for r in evalstop])),
        delivered_gold_oracle=float(np.mean([r.run.delivered_gold_rlhf for r in oracle])),
        regret_vs_oracle=float(np.mean([o.run.delivered_gold_rlhf - e.run.delivered_gold_rlhf
                                        for e, o in zip(evalstop, oracle, strict=True)])),
        savings_fraction_of_oracle=float(saved_es / saved_or) if saved_or else None,
        retention=float(hacked[:, 0].sum() / hacked[:, 1].sum()) if hacked[:, 1].sum() > 0 else None,
        retention_ci=ratio_ci(hacked),
    )


def _compute(summaries: Sequence[RunSummary]) -> Compute:
    return Compute(gpu_hours=float(np.mean([s.gpu_hours for s in summaries])),
                   w_post=float(np.mean([s.w_post for s in summaries])),
                   w_unprod=float(np.mean([s.w_unprod for s in summaries])),
                   w_ovh=float(np.mean([s.w_ovh for s in summaries])))

"""Experiments: single runs, paired comparisons over seeds and sweeps (the paper's full reproduction
is :mod:`platform_sim.reproduction`).

Every comparison is paired: for a seed, the workload (jobs, arrivals, curves, noise) is identical
across schedulers and overlays. Seeds run in parallel worker processes, or as Ray tasks (``ray=``:
``"local"`` starts a Ray instance on this machine, an address connects to a cluster; Ray is imported
only then).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from .comparison import watched_types
from .config import ConfigError, SimConfig, config_from_dict
from .engine import RunResult, Simulation
from .metrics import Changes, Detection, RunSummary, compare, detection, detection_by_type, summarize
from .policies import build_overlay, build_scheduler, check_config
from .results import MeanChanges, PairResult, SweepRow
from .stats import Rates, bootstrap_ci, paired_permutation_p, rates_by_type
from .workload import Workload, generate_workload

__all__ = ["SeedPair", "aggregate_pair", "bootstrap_ci", "default_workers", "detect_only", "map_seeds",
           "paired_permutation_p", "run_pair", "run_seeds", "simulate", "sweep"]


def simulate(cfg: SimConfig, seed: int, scheduler: str | None = None, overlay: str | None = None,
             workload: Workload | None = None) -> RunResult:
    """One run: ``cfg``'s scheduler and overlay unless named here (each with its config block)."""
    wl = workload if workload is not None else generate_workload(cfg, seed)
    return Simulation(wl, cfg, build_scheduler(cfg, scheduler), build_overlay(cfg, wl, overlay)).run()


@dataclass(frozen=True)
class SeedPair:
    """One seed: a base scheduler alone vs with an overlay, on the same workload.

    ``by_type`` and the per-job JCTs may be dropped (None, :meth:`slim`) where no table needs them:
    seeds travel between processes."""

    changes: Changes
    base: RunSummary
    run: RunSummary  # its detection: over the job types the overlay watches
    by_type: dict[str, Detection] | None
    jct_base_h: tuple[float, ...] | None
    jct_run_h: tuple[float, ...] | None
    is_oracle: bool

    @property
    def detection(self) -> Detection:
        return self.run.detection

    @property
    def jct_diff_h(self) -> float:
        """Mean JCT of the completed jobs with the overlay minus without (the paired test's input)."""
        return self.changes.mean_jct_completed_h - self.changes.mean_jct_completed_base_h

    def slim(self, by_type: bool = False, jcts: bool = False) -> SeedPair:
        """This pair without the per-type counts and/or the per-job JCTs (unless kept)."""
        return replace(self, by_type=self.by_type if by_type else None,
                       jct_base_h=self.jct_base_h if jcts else None, jct_run_h=self.jct_run_h if jcts else None)


def detect_only(cfg: SimConfig, wl: Workload, scheduler: str, overlay: str) -> Detection:
    """Detection counts only (they do not depend on a base run)."""
    run = simulate(cfg, wl.seed, scheduler, overlay, wl)
    return detection(run, wl, cfg.metrics.harmful_margin, watched_types(cfg, overlay))


def run_pair(cfg: SimConfig, wl: Workload, scheduler: str, overlay: str, base: RunResult | None = None) -> SeedPair:
    """``scheduler`` alone (``base``, if already run) vs with ``overlay`` on ``wl``."""
    base = base if base is not None else simulate(cfg, wl.seed, scheduler, "none", wl)
    run = simulate(cfg, wl.seed, scheduler, overlay, wl)
    watched = watched_types(cfg, overlay)
    s_base, s_run = summarize(base, wl, cfg), summarize(run, wl, cfg, watched)
    return SeedPair(
        changes=compare(base, run, wl, cfg, (s_base, s_run)), base=s_base, run=s_run,
        by_type=detection_by_type(run, wl, cfg.metrics.harmful_margin, watched),
        jct_base_h=tuple(o.jct_s / 3600 for o in base.outcomes), jct_run_h=tuple(o.jct_s / 3600 for o in run.outcomes),
        is_oracle=run.is_oracle,
    )


# ----------------------------------------------------------------------------- parallel seeds
def map_seeds(fn: Callable, items: Iterable, workers: int, progress: bool, desc: str, ray: str | None = None) -> list:
    """``[fn(x) for x in items]``, in order: in ``workers`` forked processes, or as Ray tasks (``ray``)."""
    items = list(items)
    if ray is not None:
        return _ray_map(fn, items, ray, progress, desc)
    if progress:
        from tqdm import tqdm
    else:
        def tqdm(it, **_):  # noqa: E306 - a no-op progress bar
            return it
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in tqdm(items, desc=desc, unit="seed")]
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork")) as pool:
        return list(tqdm(pool.map(fn, items), total=len(items), desc=desc, unit="seed"))


def _ray_map(fn: Callable, items: list, address: str, progress: bool, desc: str) -> list:
    """``[fn(x) for x in items]`` as Ray tasks, in order. ``address`` ``"local"`` starts a Ray instance
    on this machine unless one is running in this process; any other value is passed to
    ``ray.init(address=...)`` (``"auto"``, ``"ray://head:10001"``). Ray stays up for later calls (a
    sweep maps once per value) and stops when the process exits. The cluster's workers import
    ``platform_sim``: install this package there (or pass a ``runtime_env`` through ``ray.init``
    yourself before calling)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray: pip install 'evalstop[ray]'") from None
    if not ray.is_initialized():
        if address == "local":
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    task = ray.remote(fn)
    refs = [task.remote(x) for x in items]
    if not progress:
        return ray.get(refs)
    from tqdm import tqdm

    return [ray.get(r) for r in tqdm(refs, desc=desc, unit="seed")]


_map = map_seeds  # the former name (scripts/detector_families.py)


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def _run_seed(args: tuple[dict, int, str | None, str | None, Workload | None]) -> SeedPair:
    cfg_dict, seed, scheduler, overlay, workload = args
    cfg = config_from_dict(cfg_dict)  # seed: the seed itself (seed_start already added)
    wl = workload if workload is not None else generate_workload(cfg, seed)
    return run_pair(cfg, wl, scheduler or cfg.scheduler.name, overlay or cfg.overlay.name)


def run_seeds(cfg: SimConfig, seeds: int | None = None, workers: int | None = None, progress: bool = False,
              workload: Workload | None = None, ray: str | None = None, seed_start: int = 0) -> PairResult:
    """The configured scheduler alone vs with the configured overlay, over seeds ``seed_start`` to
    ``seed_start + seeds - 1`` (in local worker processes, or as Ray tasks with ``ray="local"`` or a
    Ray address)."""
    check_config(cfg)
    n = 1 if workload is not None else (seeds or cfg.seeds)
    rows = map_seeds(_run_seed, [(cfg.to_dict(), seed_start + s, None, None, workload) for s in range(n)],
                     workers or default_workers(), progress, f"{cfg.scheduler.name}+{cfg.overlay.name}", ray)
    return aggregate_pair(rows, cfg, n, seed_start if workload is None else workload.seed)


def _finite_mean(values: Sequence[float]) -> float:
    """The mean of the finite values (NaN if none: a seed where no job completed in both runs)."""
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def aggregate_pair(rows: Sequence[SeedPair], cfg: SimConfig, n: int, seed_start: int = 0) -> PairResult:
    """The result over seeds from each seed's :class:`SeedPair` (with its per-type counts and JCTs)."""
    return PairResult(
        config=cfg, seeds=n, seed_start=seed_start, scheduler=cfg.scheduler.name, overlay=cfg.overlay.name,
        is_oracle=rows[0].is_oracle, changes=MeanChanges.over([r.changes for r in rows]),
        p_value=paired_permutation_p([r.jct_diff_h for r in rows]),
        detection=Rates.pool([r.detection for r in rows]),
        detection_by_type=rates_by_type([r.by_type or {} for r in rows]),
        base=RunSummary.mean([r.base for r in rows]), run=RunSummary.mean([r.run for r in rows]),
        jct_base_h=tuple(x for r in rows for x in r.jct_base_h or ()),
        jct_run_h=tuple(x for r in rows for x in r.jct_run_h or ()),
        mean_jct_completed_base_h=_finite_mean([r.changes.mean_jct_completed_base_h for r in rows]),
        mean_jct_completed_h=_finite_mean([r.changes.mean_jct_completed_h for r in rows]),
    )


# ----------------------------------------------------------------------------- sweep
def sweep(cfg: SimConfig, param: str, values: Sequence[Any], seeds: int | None = None,
          workers: int | None = None, progress: bool = False, ray: str | None = None,
          seed_start: int = 0) -> list[SweepRow]:
    """Run the configured pair for each value of one dotted parameter (``ray``, ``seed_start``: see
    :func:`run_seeds`)."""
    out = []
    for v in values:
        res = run_seeds(cfg.replace(**{param: v}), seeds, workers, progress, ray=ray, seed_start=seed_start)
        out.append(SweepRow(param, v, seed_start, res.changes, res.detection, res.p_value))
    return out

"""Experiments: single runs, paired comparisons over seeds, sweeps and the paper's full reproduction.

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
from dataclasses import asdict
from typing import Any

import numpy as np

from .comparison import detector_seed, extend_results, rates_by_type, watched_types
from .config import ConfigError, SimConfig, config_from_dict
from .engine import RunResult, Simulation
from .metrics import DEFINITIONS, Detection, compare, detection, detection_by_type, summarize
from .policies import build_overlay, build_scheduler, check_config
from .schedulers import SCHEDULERS
from .workload import Workload, generate_workload

__all__ = [
    "NOISE_SIGMAS", "BASE_RATES", "KS", "EVALS_WITH_K", "simulate", "run_seeds", "reproduce", "sweep",
    "bootstrap_ci", "paired_permutation_p",
]

NOISE_SIGMAS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.08, 0.12)
BASE_RATES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
KS = (1, 2, 3, 4)
EVALS_WITH_K = ((5, 1), (10, 2), (20, 3))
DETECTION_KEYS = ("tp", "fp_a", "fp_b", "hacked", "healthy", "flagged")


def simulate(cfg: SimConfig, seed: int, scheduler: str | None = None, overlay: str | None = None,
             workload: Workload | None = None) -> RunResult:
    """One run: ``cfg``'s scheduler and overlay unless named here (each with its config block)."""
    wl = workload if workload is not None else generate_workload(cfg, seed)
    return Simulation(wl, cfg, build_scheduler(cfg, scheduler), build_overlay(cfg, wl, overlay)).run()


def _detect_only(cfg: SimConfig, wl: Workload, scheduler: str, overlay: str) -> dict[str, Any]:
    """Detection counts only (they do not depend on a base run)."""
    run = simulate(cfg, wl.seed, scheduler, overlay, wl)
    det = detection(run, wl, cfg.metrics.harmful_margin, watched_types(cfg, overlay))
    return {f"det_{k}": v for k, v in asdict(det).items()}


def _pair(cfg: SimConfig, wl: Workload, scheduler: str, overlay: str, base: RunResult | None = None) -> dict[str, Any]:
    base = base if base is not None else simulate(cfg, wl.seed, scheduler, "none", wl)
    run = simulate(cfg, wl.seed, scheduler, overlay, wl)
    watched = watched_types(cfg, overlay)
    s_base, s_run = summarize(base, wl, cfg), summarize(run, wl, cfg, watched)
    out = compare(base, run, wl, cfg, (s_base, s_run))
    out.update({f"det_{k}": v for k, v in asdict(s_run.detection).items()})
    out["det_by_type"] = {t: asdict(d) for t, d in
                          detection_by_type(run, wl, cfg.metrics.harmful_margin, watched).items()}
    out["base"] = _summary_dict(s_base)
    out["run"] = _summary_dict(s_run)
    out["jct_base_h"] = [o.jct_s / 3600 for o in base.outcomes]
    out["jct_run_h"] = [o.jct_s / 3600 for o in run.outcomes]
    out["is_oracle"] = run.is_oracle
    return out


def _summary_dict(s) -> dict[str, Any]:
    d = asdict(s)
    d.pop("detection")
    return d


def _detection(rows: Sequence[dict[str, Any]]) -> Detection:
    total = Detection(0, 0, 0, 0, 0, 0)
    for r in rows:
        total = total + Detection(*(r[f"det_{k}"] for k in DETECTION_KEYS))
    return total


# ----------------------------------------------------------------------------- statistics
def bootstrap_ci(per_seed: Sequence[Any], stat: Callable[[np.ndarray], np.ndarray], n_boot: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval over seeds (whole seeds are resampled).

    ``per_seed`` is an array-like with one row per seed; ``stat`` maps an array of shape
    (n_boot, n_seeds, ...) of resampled rows to one value per resample (NaNs are dropped).
    """
    data = np.asarray(per_seed, dtype=float)
    n = len(data)
    if n < 2:
        return (float("nan"), float("nan"))
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    vals = np.asarray(stat(data[idx]), dtype=float)
    vals = vals[~np.isnan(vals)]
    if not len(vals):
        return (float("nan"), float("nan"))
    return (float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5)))


def _mean_stat(x: np.ndarray) -> np.ndarray:
    return np.nanmean(x, axis=-1)


def _rate_stat(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """Pooled detection rate from resampled count rows (columns in DETECTION_KEYS order)."""
    def stat(x: np.ndarray) -> np.ndarray:
        tp, fp_a, fp_b, hacked, healthy, _ = np.moveaxis(x.sum(axis=1), -1, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"precision": tp / (tp + fp_b), "recall": tp / hacked, "fpr": fp_b / healthy}[name]
    return stat


def paired_permutation_p(diffs: Sequence[float], n_perm: int = 20000, seed: int = 0) -> float:
    """Two-sided paired sign-flip permutation test of mean(diffs) = 0 (exact for <= 16 pairs)."""
    d = np.asarray([x for x in diffs if not math.isnan(x)], dtype=float)
    n = len(d)
    if n == 0:
        return float("nan")
    observed = abs(d.mean())
    if n <= 16:
        signs = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2 - 1
    else:
        signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_perm, n))
    means = np.abs((signs * d).mean(axis=1))
    return float((np.sum(means >= observed - 1e-12) + (0 if n <= 16 else 1)) / (len(means) + (0 if n <= 16 else 1)))


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if not math.isnan(r[key])]
    return float(np.mean(vals)) if vals else float("nan")


def _metric_ci(rows, key) -> tuple[float, float]:
    return bootstrap_ci([r[key] for r in rows], _mean_stat)


def _metric(rows, key):
    return {"mean": _mean(rows, key), "ci": _metric_ci(rows, key)}


def _rates(rows) -> dict[str, Any]:
    det = _detection(rows)
    out = {k: (v if not math.isnan(v) else None) for k, v in det.rates().items()}
    counts = [[r[f"det_{k}"] for k in DETECTION_KEYS] for r in rows]
    for k in ("precision", "recall", "fpr"):
        out[f"{k}_ci"] = bootstrap_ci(counts, _rate_stat(k))
    out["counts"] = asdict(det)
    return out


# ----------------------------------------------------------------------------- parallel seeds
def _map(fn: Callable, items: Iterable, workers: int, progress: bool, desc: str, ray: str | None = None) -> list:
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


def _default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def _run_seed(args: tuple[dict, int, str | None, str | None, Workload | None]) -> dict[str, Any]:
    cfg_dict, seed, scheduler, overlay, workload = args
    cfg = config_from_dict(cfg_dict)  # seed: the seed itself (seed_start already added)
    wl = workload if workload is not None else generate_workload(cfg, seed)
    return _pair(cfg, wl, scheduler or cfg.scheduler.name, overlay or cfg.overlay.name)


def run_seeds(cfg: SimConfig, seeds: int | None = None, workers: int | None = None, progress: bool = False,
              workload: Workload | None = None, ray: str | None = None, seed_start: int = 0) -> dict[str, Any]:
    """The configured scheduler alone vs with the configured overlay, over seeds ``seed_start`` to
    ``seed_start + seeds - 1`` (in local worker processes, or as Ray tasks with ``ray="local"`` or a
    Ray address)."""
    check_config(cfg)
    n = 1 if workload is not None else (seeds or cfg.seeds)
    rows = _map(_run_seed, [(cfg.to_dict(), seed_start + s, None, None, workload) for s in range(n)],
                workers or _default_workers(), progress, f"{cfg.scheduler.name}+{cfg.overlay.name}", ray)
    res = aggregate_pair(rows, cfg, n)
    res["seed_start"] = seed_start if workload is None else workload.seed
    return res


def aggregate_pair(rows: list[dict[str, Any]], cfg: SimConfig, n: int) -> dict[str, Any]:
    keys = ("jct_change", "jct_change_all", "gpu_hours_change", "w_post_change", "w_unprod_change",
            "w_ovh_change", "p95_jct_change", "makespan_change", "delivered_gold_change")
    diffs = [r["mean_jct_completed_h"] - r["mean_jct_completed_base_h"] for r in rows]
    return {
        "config": cfg.to_dict(), "seeds": n, "scheduler": cfg.scheduler.name, "overlay": cfg.overlay.name,
        "is_oracle": rows[0]["is_oracle"],
        "changes": {k: _metric(rows, k) for k in keys},
        "p_value": paired_permutation_p(diffs),
        "detection": _rates(rows),
        "detection_by_type": rates_by_type(rows),
        "base": _average_summaries([r["base"] for r in rows]),
        "run": _average_summaries([r["run"] for r in rows]),
        "jct_base_h": [x for r in rows for x in r["jct_base_h"]],
        "jct_run_h": [x for r in rows for x in r["jct_run_h"]],
        "definitions": DEFINITIONS,
    }


def _average_summaries(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in rows[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(np.mean([r[k] for r in rows]))
        elif isinstance(v, dict):
            out[k] = {kk: float(np.mean([r[k][kk] for r in rows])) for kk in v}
        else:
            out[k] = v
    return out


# ----------------------------------------------------------------------------- sweep
def sweep(cfg: SimConfig, param: str, values: Sequence[Any], seeds: int | None = None,
          workers: int | None = None, progress: bool = False, ray: str | None = None,
          seed_start: int = 0) -> list[dict[str, Any]]:
    """Run the configured pair for each value of one dotted parameter (``ray``, ``seed_start``: see
    :func:`run_seeds`)."""
    out = []
    for v in values:
        c = cfg.replace(**{param: v})
        res = run_seeds(c, seeds, workers, progress, ray=ray, seed_start=seed_start)
        out.append({
            "param": param, "value": v, "seed_start": seed_start,
            **{k: m["mean"] for k, m in res["changes"].items()},
            **{k: res["detection"][k] for k in ("precision", "recall", "fpr", "fpr_label")},
            "harmful_stops": res["detection"]["counts"]["fp_b"],
            "p_value": res["p_value"],
        })
    return out


# ----------------------------------------------------------------------------- reproduce
def _reproduce_seed(args: tuple[dict, int]) -> dict[str, Any]:
    cfg_dict, seed = args
    cfg = config_from_dict(cfg_dict)
    headline = cfg.scheduler.name
    wl = generate_workload(cfg, seed)
    bases = {s: simulate(cfg, seed, s, "none", wl) for s in SCHEDULERS}
    out: dict[str, Any] = {"seed": seed}
    out["composability"] = {s: _pair(cfg, wl, s, "evalstop", bases[s]) for s in SCHEDULERS}
    out["baselines"] = {o: _pair(cfg, wl, headline, o, bases[headline]) for o in ("stop_at", "loss_plateau", "oracle")}
    out["k"] = {}
    for k in KS:
        if k == cfg.overlay.block("evalstop").get("k"):
            out["k"][k] = {key: v for key, v in out["composability"][headline].items() if key not in ("jct_base_h", "jct_run_h")}
        else:
            ck = cfg.replace(**{"overlay.evalstop.k": k})
            out["k"][k] = _pair(ck, wl, headline, "evalstop", bases[headline])
    out["noise"] = {}
    for sigma in NOISE_SIGMAS:
        cs = cfg.replace(**{"noise.sigma": sigma})
        out["noise"][sigma] = _detect_only(cs, generate_workload(cs, seed), headline, "evalstop")
    out["base_rate"] = {}
    for h in BASE_RATES:
        ch = cfg.replace(**{"curves.hack_fraction": h})
        out["base_rate"][h] = _detect_only(ch, generate_workload(ch, seed), headline, "evalstop")
    out["evals_k"] = {}
    for n_evals, k in EVALS_WITH_K:
        ce = cfg.replace(**{"workload.evals_per_job": n_evals, "overlay.evalstop.k": k})
        out["evals_k"][(n_evals, k)] = _pair(ce, generate_workload(ce, seed), headline, "evalstop")
    out["detectors"] = detector_seed(cfg, seed, headline, bases[headline])
    for group in ("composability", "baselines", "k", "noise", "base_rate", "evals_k"):
        for v in out[group].values():  # keep the per-job JCTs only where the figures need them
            if group not in ("composability", "baselines"):
                v.pop("det_by_type", None)
            if group != "composability":
                v.pop("jct_base_h", None)
                v.pop("jct_run_h", None)
    return out


def reproduce(cfg: SimConfig, seeds: int | None = None, workers: int | None = None,
              progress: bool = True, ray: str | None = None, seed_start: int = 0) -> dict[str, Any]:
    """Every table and figure input of the paper, over seeds ``seed_start`` to ``seed_start + seeds
    - 1``; returns the ``results.json`` object (``ray``: see :func:`run_seeds`)."""
    check_config(cfg)
    n = seeds or cfg.seeds
    per_seed = _map(_reproduce_seed, [(cfg.to_dict(), seed_start + s) for s in range(n)],
                    workers or _default_workers(), progress, "reproduce", ray)
    headline_s = cfg.scheduler.name

    def rows(group, key):
        return [p[group][key] for p in per_seed]

    head_rows = rows("composability", headline_s)
    head_rates = _rates(head_rows)
    results: dict[str, Any] = {
        "config": cfg.to_dict(),
        "seeds": n,
        "headline": {
            "scheduler": headline_s,
            **{k: _mean(head_rows, k) for k in ("jct_change", "jct_change_all", "gpu_hours_change",
                                                 "w_post_change", "w_unprod_change")},
            "precision": head_rates["precision"], "recall": head_rates["recall"], "fpr": head_rates["fpr"],
            "fpr_label": head_rates["fpr_label"],
            "p_value": paired_permutation_p([r["mean_jct_completed_h"] - r["mean_jct_completed_base_h"] for r in head_rows]),
        },
        "baselines": {},
        "composability": {s: _mean(rows("composability", s), "jct_change") for s in SCHEDULERS},
        "noise": [], "base_rate": [], "k": [], "evals_k": [],
    }
    intervals: dict[str, Any] = {
        "headline": {k: _metric_ci(head_rows, k)
                     for k in ("jct_change", "jct_change_all", "gpu_hours_change", "w_post_change", "w_unprod_change")},
        "composability": {s: _metric_ci(rows("composability", s), "jct_change") for s in SCHEDULERS},
    }
    intervals["headline"].update({f"{k}": head_rates[f"{k}_ci"] for k in ("precision", "recall", "fpr")})
    for o in ("stop_at", "loss_plateau", "oracle"):
        r = rows("baselines", o)
        rates = _rates(r)
        results["baselines"][o] = {"precision": rates["precision"], "recall": rates["recall"], "fpr": rates["fpr"],
                                   "jct_change": _mean(r, "jct_change"), "fpr_label": rates["fpr_label"],
                                   "jct_change_all": _mean(r, "jct_change_all"),
                                   "gpu_hours_change": _mean(r, "gpu_hours_change"),
                                   "is_oracle": o == "oracle"}
        intervals[o] = {k: rates[f"{k}_ci"] for k in ("precision", "recall", "fpr")}
    for sigma in NOISE_SIGMAS:
        rates = _rates(rows("noise", sigma))
        results["noise"].append({"sigma": sigma, **{k: rates[k] for k in ("precision", "recall", "fpr", "fpr_label")},
                                 "precision_ci": rates["precision_ci"]})
    for h in BASE_RATES:
        rates = _rates(rows("base_rate", h))
        results["base_rate"].append({"hack_fraction": h, **{k: rates[k] for k in ("precision", "recall", "fpr")},
                                     "precision_ci": rates["precision_ci"]})
    for k in KS:
        r = rows("k", k)
        rates = _rates(r)
        results["k"].append({"k": k, **{m: rates[m] for m in ("precision", "recall", "fpr")},
                             "jct_change": _mean(r, "jct_change"), "gpu_hours_change": _mean(r, "gpu_hours_change")})
    for n_evals, k in EVALS_WITH_K:
        r = rows("evals_k", (n_evals, k))
        rates = _rates(r)
        results["evals_k"].append({"evals_per_job": n_evals, "k": k, **{m: rates[m] for m in ("precision", "recall", "fpr")},
                                   "jct_change": _mean(r, "jct_change")})
    # quality and the oracle limit
    es, orc = head_rows, rows("baselines", "oracle")
    saved_es = np.mean([r["gpu_hours_saved"] for r in es])
    saved_or = np.mean([r["gpu_hours_saved"] for r in orc])
    results["quality"] = {
        "delivered_gold_base": float(np.mean([r["base"]["delivered_gold_rlhf"] for r in es])),
        "delivered_gold_evalstop": float(np.mean([r["run"]["delivered_gold_rlhf"] for r in es])),
        "delivered_gold_oracle": float(np.mean([r["run"]["delivered_gold_rlhf"] for r in orc])),
        "regret_vs_oracle": float(np.mean([o["run"]["delivered_gold_rlhf"] - e["run"]["delivered_gold_rlhf"]
                                           for e, o in zip(es, orc, strict=True)])),
        "savings_fraction_of_oracle": float(saved_es / saved_or) if saved_or else None,
    }
    results["wasted"] = {
        name: {k: float(np.mean([r[side][k] for r in rs])) for k in ("gpu_hours", "w_post", "w_unprod", "w_ovh")}
        for name, rs, side in (("base", es, "base"), ("evalstop", es, "run"), ("oracle", orc, "run"))
    }
    results["jct_hours"] = {
        s: {"base": [x for r in rows("composability", s) for x in r["jct_base_h"]],
            "evalstop": [x for r in rows("composability", s) for x in r["jct_run_h"]]}
        for s in SCHEDULERS
    }
    results["intervals"] = intervals
    results["definitions"] = DEFINITIONS
    extend_results(results, per_seed, cfg, seed_start)
    return results

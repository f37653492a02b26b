"""The detector comparison of ``platform-sim reproduce``: every registered detector (but ``never``)
as EvalStop's rule, at eval noise 0.04, 0.08 and 0.12 with 10 evals per job and at 0.04 with 20,
on the headline base scheduler, paired per seed with the base alone and with Oracle-Stop.

Each detector runs with its registry defaults, overridden by the config's block of the overlay of
the same name where there is one (``decline`` takes ``overlay.evalstop``'s k and min_delta,
``stop_at`` and ``loss_plateau`` their blocks), and watches the job types EvalStop watches. The
``stop_at`` row is the ``stop_at`` overlay (a cut at the exact progress), the others run through the
``evalstop`` overlay and the Coordinator.

Rows of ``results.json["detectors"]`` (a contract; rates are fractions)::

    {"detector", "params", "sigma", "evals_per_job", "precision", "recall", "fpr", "retention",
     "jct_change", "harmful_stops", ...intervals and counts}

``retention`` = GPU-hours saved on hacked jobs by the detector / by Oracle-Stop (both against the
base alone, summed over seeds); ``harmful_stops`` = definition-B false positives over all seeds.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from evalstop_trl.core.detectors import DETECTORS

from .config import SimConfig
from .engine import RunResult, Simulation
from .metrics import compare, detection
from .overlays import OVERLAYS, create_overlay
from .policies import build_scheduler
from .workload import Workload, generate_workload

__all__ = ["SETTINGS", "aggregate_detectors", "detector_names", "detector_params", "detector_seed",
           "extend_results", "rates_by_type", "watched_types"]

#: (eval noise sigma, evals per job) of the comparison
SETTINGS = ((0.04, 10), (0.08, 10), (0.12, 10), (0.04, 20))
KEYS = ("tp", "fp_a", "fp_b", "hacked", "healthy", "flagged")


def watched_types(cfg: SimConfig, overlay: str) -> frozenset[str]:
    """The job types ``overlay`` watches in ``cfg``: its ``job_types`` (``all`` or ``rlhf``); the
    RLHF types for Oracle-Stop (hacking is defined for RLHF runs); none for ``none``."""
    if overlay == "none":
        return frozenset()
    rlhf = frozenset(t for t, tc in cfg.workload.types.items() if tc.rlhf)
    own = OVERLAYS.params(overlay)
    if "job_types" not in own:
        return rlhf
    job_types = cfg.overlay.block(overlay).get("job_types", own["job_types"])
    return rlhf if job_types == "rlhf" else frozenset(cfg.workload.types)


def detector_names() -> tuple[str, ...]:
    """Every registered detector but ``never``."""
    return tuple(n for n in DETECTORS.names() if n != "never")


def detector_params(cfg: SimConfig, name: str) -> dict[str, Any]:
    """A detector's parameters in the comparison: its defaults, then the config's block of the
    overlay that runs it (``overlay.evalstop`` for its configured detector)."""
    params = {k: v for k, v in DETECTORS.params(name).items() if k != "direction"}
    evalstop = cfg.overlay.block("evalstop")
    block = evalstop if evalstop.get("detector", "decline") == name else cfg.overlay.block(name)
    params.update({k: v for k, v in block.items() if k in params})
    return params


def _run(cfg: SimConfig, wl: Workload, scheduler: str, name: str, params: dict[str, Any], job_types: str) -> RunResult:
    if name == "stop_at":
        overlay = create_overlay("stop_at", wl, job_types=job_types, **params)
    else:
        overlay = create_overlay("evalstop", wl, detector=name, job_types=job_types, **params)
    return Simulation(wl, cfg, build_scheduler(cfg, scheduler), overlay).run()


def _saved_hacked(base: RunResult, run: RunResult, wl: Workload) -> float:
    """GPU-hours saved on hacked jobs by ``run`` against ``base`` (same workload)."""
    return sum(b.gpu_seconds - r.gpu_seconds for b, r, t in zip(base.outcomes, run.outcomes, wl.truths, strict=True)
               if t.hacked) / 3600.0


def detector_seed(cfg: SimConfig, seed: int, scheduler: str, base10: RunResult | None = None,
                  settings: tuple[tuple[float, int], ...] = SETTINGS) -> dict[tuple[str, float, int], dict[str, Any]]:
    """One seed of the comparison: per (detector, sigma, evals) the detection counts, the paired
    completed-jobs JCT, and the GPU-hours saved on hacked jobs by it and by Oracle-Stop. ``base10``:
    the base alone on ``cfg``'s own cadence, if already run."""
    evalstop_types = cfg.overlay.block("evalstop").get("job_types", OVERLAYS.params("evalstop")["job_types"])
    watched = watched_types(cfg, "evalstop")
    margin = cfg.metrics.harmful_margin
    out: dict[tuple[str, float, int], dict[str, Any]] = {}
    refs: dict[int, tuple[RunResult, RunResult, Workload]] = {}
    for sigma, n_evals in settings:
        c = cfg.replace(**{"noise.sigma": sigma, "workload.evals_per_job": n_evals})
        wl = generate_workload(c, seed)
        if n_evals not in refs:  # neither the base alone nor the oracle depends on the eval noise
            reuse = n_evals == cfg.workload.evals_per_job and base10 is not None
            base = base10 if reuse else Simulation(wl, c, build_scheduler(c, scheduler), create_overlay("none", wl)).run()
            orc = Simulation(wl, c, build_scheduler(c, scheduler), create_overlay("oracle", wl)).run()
            refs[n_evals] = (base, orc, wl)
        base, orc, wl_ref = refs[n_evals]
        oracle_saved = _saved_hacked(base, orc, wl_ref)
        for name in detector_names():
            run = _run(c, wl, scheduler, name, detector_params(cfg, name), evalstop_types)
            ch = compare(base, run, wl, c)
            det = detection(run, wl, margin, watched)
            out[(name, sigma, n_evals)] = {
                **{f"det_{k}": v for k, v in asdict(det).items()},
                "jct_change": ch["jct_change"], "saved_hacked": _saved_hacked(base, run, wl),
                "oracle_saved_hacked": oracle_saved,
            }
    return out


def aggregate_detectors(cfg: SimConfig, per_seed: list[dict[tuple[str, float, int], dict[str, Any]]],
                        settings: tuple[tuple[float, int], ...] = SETTINGS) -> list[dict]:
    """The ``detectors`` rows of ``results.json`` from :func:`detector_seed` outputs."""
    import numpy as np

    from .experiments import _rates, bootstrap_ci

    rows = []
    for name in detector_names():
        for sigma, n_evals in settings:
            seeds = [p[(name, sigma, n_evals)] for p in per_seed]
            rates = _rates(seeds)
            saved = np.array([[s["saved_hacked"], s["oracle_saved_hacked"]] for s in seeds])
            oracle_total = saved[:, 1].sum()
            jct = [s["jct_change"] for s in seeds]
            rows.append({
                "detector": name, "params": detector_params(cfg, name), "sigma": sigma, "evals_per_job": n_evals,
                "precision": rates["precision"], "recall": rates["recall"], "fpr": rates["fpr"],
                "retention": float(saved[:, 0].sum() / oracle_total) if oracle_total > 0 else None,
                "jct_change": float(np.nanmean(jct)) if not all(j != j for j in jct) else None,
                "harmful_stops": int(rates["counts"]["fp_b"]),
                "precision_ci": rates["precision_ci"], "recall_ci": rates["recall_ci"], "fpr_ci": rates["fpr_ci"],
                "retention_ci": bootstrap_ci(saved, lambda x: x[..., 0].sum(-1) / x[..., 1].sum(-1)),
                "jct_change_ci": bootstrap_ci(jct, lambda x: np.nanmean(x, axis=-1)),
                "counts": rates["counts"],
            })
    return rows


def rates_by_type(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pooled detection rates per job type from rows holding ``det_by_type`` (see ``experiments._pair``)."""
    from .experiments import _rates

    types = sorted({t for r in rows for t in r.get("det_by_type", {})})
    zero = dict.fromkeys(KEYS, 0)
    return {t: _rates([{f"det_{k}": v for k, v in r.get("det_by_type", {}).get(t, zero).items()} for r in rows])
            for t in types}


def _harmful(rows: list[dict[str, Any]]) -> int:
    return int(sum(r["det_fp_b"] for r in rows))


def extend_results(results: dict[str, Any], per_seed: list[dict[str, Any]], cfg: SimConfig, seed_start: int) -> None:
    """Add to ``reproduce``'s results: the seed range, the harmful-stop count beside every JCT
    figure, detection per job type, oracle retention on hacked jobs, and the detector comparison."""
    import numpy as np

    from .experiments import bootstrap_ci

    headline = cfg.scheduler.name

    def rows(group, key):
        return [p[group][key] for p in per_seed]

    results["seed_start"] = seed_start
    results["seed_range"] = [seed_start, seed_start + len(per_seed) - 1]
    results["watched"] = sorted(watched_types(cfg, "evalstop"))
    results["headline"]["harmful_stops"] = _harmful(rows("composability", headline))
    results["headline"]["by_type"] = rates_by_type(rows("composability", headline))
    results["composability_harmful_stops"] = {s: _harmful(rows("composability", s)) for s in results["composability"]}
    for name, b in results["baselines"].items():
        b["harmful_stops"] = _harmful(rows("baselines", name))
        b["by_type"] = rates_by_type(rows("baselines", name))
    for r in results["k"]:
        r["harmful_stops"] = _harmful(rows("k", r["k"]))
    for r in results["evals_k"]:
        r["harmful_stops"] = _harmful(rows("evals_k", (r["evals_per_job"], r["k"])))
    saved = np.array([[e["gpu_hours_saved_hacked"], o["gpu_hours_saved_hacked"]]
                      for e, o in zip(rows("composability", headline), rows("baselines", "oracle"), strict=True)])
    results["quality"]["retention"] = float(saved[:, 0].sum() / saved[:, 1].sum()) if saved[:, 1].sum() > 0 else None
    results["quality"]["retention_ci"] = bootstrap_ci(saved, lambda x: x[..., 0].sum(-1) / x[..., 1].sum(-1))
    results["intervals"]["retention"] = results["quality"]["retention_ci"]
    results["detectors"] = aggregate_detectors(cfg, [p["detectors"] for p in per_seed])

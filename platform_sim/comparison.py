"""The detector comparison of ``platform-sim reproduce``: every registered detector (but ``never``)
as EvalStop's rule, at eval noise 0.04, 0.08 and 0.12 with 10 evals per job and at 0.04 with 20,
on the headline base scheduler, paired per seed with the base alone and with Oracle-Stop.

Each detector runs with its registry defaults, overridden by the config's block of the overlay of
the same name where there is one (``decline`` takes ``overlay.evalstop``'s k and min_delta,
``stop_at`` and ``loss_plateau`` their blocks), and watches the job types EvalStop watches. The
``stop_at`` row is the ``stop_at`` overlay (a cut at the exact progress), the others run through the
``evalstop`` overlay and the Coordinator.

Rows (:class:`~platform_sim.results.DetectorRow`; its ``to_dict()`` is a row of
``results.json["detectors"]``, a contract; rates are fractions)::

    {"detector", "params", "sigma", "evals_per_job", "precision", "recall", "fpr", "retention",
     "jct_change", "harmful_stops", ...intervals and counts}

``retention`` = GPU-hours saved on hacked jobs by the detector / by Oracle-Stop (both against the
base alone, summed over seeds); ``harmful_stops`` = definition-B false positives over all seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from evalstop_trl.core.detectors import DETECTORS

from .config import SimConfig
from .engine import RunResult, Simulation
from .metrics import Detection, compare, detection
from .overlays import OVERLAYS, create_overlay
from .policies import build_scheduler
from .results import DetectorRow
from .stats import Rates, mean_ci, ratio_ci
from .workload import Workload, generate_workload

__all__ = ["SETTINGS", "DetectorTrial", "aggregate_detectors", "detector_names", "detector_params", "detector_seed",
           "watched_types"]

#: (eval noise sigma, evals per job) of the comparison
SETTINGS = ((0.04, 10), (0.08, 10), (0.12, 10), (0.04, 20))


@dataclass(frozen=True)
class DetectorTrial:
    """One detector at one setting on one seed."""

    detection: Detection
    jct_change: float  # completed-jobs JCT change against the base alone
    saved_hacked: float  # GPU-hours saved on hacked jobs against the base alone
    oracle_saved_hacked: float  # the same for Oracle-Stop


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
    return sum(b.gpu_seconds - r.gpu_seconds for b, r, hacked in zip(base.outcomes, run.outcomes, wl.hacked.tolist(),
                                                                      strict=True) if hacked) / 3600.0


def detector_seed(cfg: SimConfig, seed: int, scheduler: str, base10: RunResult | None = None,
                  settings: tuple[tuple[float, int], ...] = SETTINGS) -> dict[tuple[str, float, int], DetectorTrial]:
    """One seed of the comparison: per (detector, sigma, evals) the detection counts, the paired
    completed-jobs JCT, and the GPU-hours saved on hacked jobs by it and by Oracle-Stop. ``base10``:
    the base alone on ``cfg``'s own cadence, if already run."""
    evalstop_types = cfg.overlay.block("evalstop").get("job_types", OVERLAYS.params("evalstop")["job_types"])
    watched = watched_types(cfg, "evalstop")
    margin = cfg.metrics.harmful_margin
    out: dict[tuple[str, float, int], DetectorTrial] = {}
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
            out[(name, sigma, n_evals)] = DetectorTrial(detection(run, wl, margin, watched),
                                                        compare(base, run, wl, c).jct_change,
                                                        _saved_hacked(base, run, wl), oracle_saved)
    return out


def aggregate_detectors(cfg: SimConfig, per_seed: list[dict[tuple[str, float, int], DetectorTrial]],
                        settings: tuple[tuple[float, int], ...] = SETTINGS) -> list[DetectorRow]:
    """The comparison's rows from :func:`detector_seed` outputs, one per (detector, setting)."""
    rows = []
    for name in detector_names():
        for sigma, n_evals in settings:
            trials = [p[(name, sigma, n_evals)] for p in per_seed]
            saved = np.array([[t.saved_hacked, t.oracle_saved_hacked] for t in trials])
            oracle_total = saved[:, 1].sum()
            jct = [t.jct_change for t in trials]
            rows.append(DetectorRow(
                detector=name, params=detector_params(cfg, name), sigma=sigma, evals_per_job=n_evals,
                rates=Rates.pool([t.detection for t in trials]),
                retention=float(saved[:, 0].sum() / oracle_total) if oracle_total > 0 else None,
                retention_ci=ratio_ci(saved),
                jct_change=float(np.nanmean(jct)) if not all(j != j for j in jct) else None,
                jct_change_ci=mean_ci(jct),
            ))
    return rows

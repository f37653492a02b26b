"""StopAt at the exact progress, the job types each overlay watches, and the detector comparison."""

from __future__ import annotations

import pytest

from platform_sim.comparison import (
    SETTINGS,
    aggregate_detectors,
    detector_names,
    detector_params,
    detector_seed,
    watched_types,
)
from platform_sim.config import load_config
from platform_sim.engine import Simulation
from platform_sim.overlays import StopAtOverlay, create_overlay
from platform_sim.policies import build_scheduler
from tests.sim_helpers import job, small_config, workload


def stop_at(cfg, wl, fraction, job_types="rlhf"):
    return Simulation(wl, cfg, build_scheduler(cfg, "fifo"), create_overlay("stop_at", wl, fraction=fraction,
                                                                             job_types=job_types)).run()


@pytest.mark.parametrize("fraction", [0.61, 0.65, 0.7])
def test_stop_at_cuts_at_the_exact_progress(fraction):
    cfg = small_config(**{"workload.evals_per_job": 10})
    wl = workload(job(0, 1, 0, 10, scores=tuple(0.1 * i for i in range(10))),
                  job(1, 1, 0, 10, scores=tuple(0.1 * i for i in range(10)), rlhf=False))
    rlhf, lora = stop_at(cfg, wl, fraction).outcomes
    assert rlhf.stopped and rlhf.departure_s == pytest.approx(fraction * 10 * 3600)  # no eval overhead here
    assert rlhf.delivered_progress == pytest.approx(fraction)  # the state at the cut
    assert lora.completed  # not watched (job_types rlhf)
    assert stop_at(cfg, wl, fraction, "all").outcomes[1].stopped


def test_stop_at_fractions_between_evals_differ():
    cfg = small_config(**{"workload.evals_per_job": 10})
    wl = workload(job(0, 1, 0, 10, scores=tuple(0.1 * i for i in range(10))))
    departures = {f: stop_at(cfg, wl, f).outcomes[0].departure_s for f in (0.61, 0.65, 0.7)}
    assert len(set(departures.values())) == 3  # not all "the 7th eval"


def test_stop_at_never_stops_at_fraction_one_and_checks_its_parameters():
    cfg = small_config()
    wl = workload(job(0, 1, 0, 4))
    assert stop_at(cfg, wl, 1.0).outcomes[0].completed
    with pytest.raises(ValueError, match="fraction must be"):
        StopAtOverlay(0.0)
    with pytest.raises(ValueError, match="job_types must be 'all' or 'rlhf'"):
        StopAtOverlay(0.5, "lora")


def test_watched_types():
    cfg = load_config()
    rlhf = frozenset({"rlhf_ppo", "rlhf_grpo"})
    assert watched_types(cfg, "evalstop") == rlhf == watched_types(cfg, "oracle") == watched_types(cfg, "stop_at")
    assert watched_types(cfg, "none") == frozenset()
    every = cfg.replace(**{"overlay.evalstop.job_types": "all"})
    assert watched_types(every, "evalstop") == frozenset(cfg.workload.types)


def test_detector_params_come_from_the_registry_and_the_config():
    cfg = load_config().replace(**{"overlay.evalstop.k": 3, "overlay.stop_at.fraction": 0.5})
    assert detector_params(cfg, "decline") == {"k": 3, "min_delta": 0.0, "noise": "none", "noise_z": 2.0}
    assert detector_params(cfg, "stop_at") == {"fraction": 0.5}
    assert detector_params(cfg, "loss_plateau") == {"window": 2, "tolerance": 0.03}
    assert detector_params(cfg, "drop") == {"window": 2, "z": 1.4, "noise_prior": None, "noise_rel": 0.05,
                                            "prior_evals": 4.0}
    assert detector_params(cfg, "sequential") == {"z": 0.75, "span": 0.15, "window": 8, "noise_rel": 0.02,
                                                  "min_evals": 4}
    assert "never" not in detector_names() and {"drop", "sequential"} <= set(detector_names())


def test_detector_comparison_rows_on_a_small_workload():
    cfg = load_config().replace(**{"workload.n_jobs": 30})
    per_seed = [detector_seed(cfg, s, "fifo") for s in (0, 1)]
    assert set(per_seed[0]) == {(n, s, e) for n in detector_names() for s, e in SETTINGS}
    rows = aggregate_detectors(cfg, per_seed)
    assert len(rows) == len(detector_names()) * len(SETTINGS)
    for r in rows:
        c = r.rates.counts
        assert r.rates.harmful_stops == c.fp_b and c.tp <= c.hacked and c.fp_b <= c.fp_a <= c.healthy
        trials = [p[(r.detector, r.sigma, r.evals_per_job)] for p in per_seed]
        oracle = sum(t.oracle_saved_hacked for t in trials)
        assert r.retention == pytest.approx(sum(t.saved_hacked for t in trials) / oracle)
        row = r.to_dict()  # the results.json row
        assert row["harmful_stops"] == c.fp_b and row["counts"] == c.to_dict() and row["precision"] == r.rates.precision
    stop = next(r for r in rows if r.detector == "stop_at" and r.sigma == 0.04 and r.evals_per_job == 10)
    assert stop.rates.recall == 1.0  # every hacked job peaks before 0.55 < 0.65

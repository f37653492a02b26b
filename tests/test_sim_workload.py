"""Workload generation: seeded, paired across configs, labels from the noiseless curve, traces."""

from __future__ import annotations

import numpy as np
import pytest

from platform_sim.config import load_config
from platform_sim.curves import CurveKind, gao, gold
from platform_sim.workload import generate_workload, read_trace, write_trace


def test_same_seed_same_workload_and_different_seed_differs():
    cfg = load_config()
    assert generate_workload(cfg, 3) == generate_workload(cfg, 3)
    assert generate_workload(cfg, 3).jobs != generate_workload(cfg, 4).jobs


def test_noise_sweep_keeps_jobs_and_curves():
    cfg = load_config()
    a = generate_workload(cfg, 1)
    b = generate_workload(cfg.replace(**{"noise.sigma": 0.12}), 1)
    assert a.jobs == b.jobs
    assert [t.height for t in a.truths] == [t.height for t in b.truths]
    assert [t.scores for t in a.truths] != [t.scores for t in b.truths]


def test_shares_hack_fraction_and_labels():
    cfg = load_config().replace(**{"workload.n_jobs": 4000})
    wl = generate_workload(cfg, 0)
    types = np.array([j.job_type for j in wl.jobs])
    assert np.mean(types == "rlhf_ppo") == pytest.approx(0.4, abs=0.03)
    rlhf = [t for j, t in zip(wl.jobs, wl.truths, strict=False) if j.rlhf]
    assert np.mean([t.hacked for t in rlhf]) == pytest.approx(0.47, abs=0.03)
    for j, t in zip(wl.jobs, wl.truths, strict=False):
        if t.kind is CurveKind.HACKED:
            assert t.hacked and 0.2 <= t.peak_progress <= 0.55
        else:
            assert not t.hacked
        if not j.rlhf:
            assert t.kind is CurveKind.PLATEAU
        if t.kind is CurveKind.RISING:  # final gain in the configured range
            assert 0.6 - 1e-9 <= t.gold_end <= 1.4 + 1e-9
        assert t.gold_end == pytest.approx(float(gold(t.kind, t.height, t.shape, 1.0)))


def test_offered_load_matches_config():
    cfg = load_config().replace(**{"workload.n_jobs": 5000})
    wl = generate_workload(cfg, 0)
    span = wl.jobs[-1].arrival_s
    gpu_s = sum(j.gpus * t.duration_s for j, t in zip(wl.jobs, wl.truths, strict=False))
    assert gpu_s / (span * 64) == pytest.approx(0.72, rel=0.05)


def test_gao_form():
    assert float(gao(1.0)) == pytest.approx(1.0)
    assert float(gao(np.e)) == pytest.approx(0.0, abs=1e-12)
    assert float(gao(5.0)) < -3.0  # not clamped: real over-optimisation
    assert float(gao(0.0)) == 0.0


def test_trace_round_trip(tmp_path):
    cfg = load_config().replace(**{"workload.n_jobs": 20})
    wl = generate_workload(cfg, 7)
    write_trace(wl, tmp_path / "jobs.csv")
    assert read_trace(tmp_path / "jobs.csv") == wl


def test_bad_trace(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a platform-sim trace row"):
        read_trace(p)

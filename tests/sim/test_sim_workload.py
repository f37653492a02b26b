"""Workload generation: seeded, paired across configs, labels from the noiseless curve, traces."""

from __future__ import annotations

import numpy as np
import pytest

from platform_sim.config import load_config
from platform_sim.curves import FAMILIES, CurveKind, Family, family_gold, gao, gold, peak_of
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


def only(family: str) -> dict[str, float]:
    return {f: float(f == family) for f in FAMILIES}


@pytest.mark.parametrize(
    "family, extra, checks",
    [
        # (p, expected gold) with H = 1, p_peak = 0.5 (tau = 0.1 for plateau_then_drop)
        ("gao", (), [(0.5, 1.0), (1.0, 2 * (1 - np.log(2)))]),
        ("late_onset", (2.0,), [(0.25, float(gao(0.5))), (0.5, 1.0), (1.0, float(gao(4.0)))]),
        ("shallow", (0.25,), [(0.25, float(gao(0.5))), (1.0, 1 - 0.25 * (1 - float(gao(2.0))))]),
        ("plateau_then_drop", (0.6, 0.5), [(0.6, 1 - np.exp(-6)), (1.0, 1 - np.exp(-10) - 0.5)]),
        ("oscillating", (0.1, 2.0, 0.0), [(0.5, 1.0 + 0.1 * np.sin(2 * np.pi)), (0.125, float(gao(0.25)) + 0.1)]),
    ],
)
def test_family_curves_hand_computed(family, extra, checks):
    shape = 0.1 if family == "plateau_then_drop" else 0.5
    for p, expected in checks:
        assert float(family_gold(family, 1.0, shape, extra, p)) == pytest.approx(expected, abs=1e-9)
    if family == "gao":
        assert peak_of(Family.GAO, 1.0, 0.5, ()) == pytest.approx((0.5, 1.0, expected))


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gao"])
def test_each_family_is_selectable_and_labelled_from_its_noiseless_curve(family):
    cfg = load_config().replace(**{"workload.n_jobs": 400, "curves.hacked_families.shares": only(family)})
    base = generate_workload(load_config().replace(**{"workload.n_jobs": 400}), 5)
    wl = generate_workload(cfg, 5)
    assert wl.jobs == base.jobs  # the family changes the curves of hacked jobs only
    fc = cfg.curves.hacked_families
    n_hacked_form = 0
    for t, b in zip(wl.truths, base.truths, strict=True):
        if t.kind is not CurveKind.HACKED:
            assert t == b and t.family == "gao"
            continue
        n_hacked_form += 1
        assert t.family == family
        grid = np.linspace(0, 1, 2001)
        g = family_gold(family, t.height, t.shape, t.extra, grid)
        assert t.peak_progress == pytest.approx(grid[np.argmax(g)])
        assert t.gold_end == pytest.approx(g[-1]) and t.gold_at(1.0) == pytest.approx(g[-1])
        assert t.hacked == (np.argmax(g) < len(g) - 1 and g.max() - g[-1] >= cfg.curves.label_min_drop)
        if family == "late_onset":
            assert fc.late_p_peak[0] <= t.shape <= fc.late_p_peak[1] and fc.late_sharpness[0] <= t.extra[0] <= fc.late_sharpness[1]
        if family == "plateau_then_drop":
            assert fc.drop_at[0] <= t.extra[0] <= fc.drop_at[1] and fc.drop_depth[0] <= t.extra[1] <= fc.drop_depth[1]
        # the observed scores are the curve plus the same noise draws as under the Gao default
        noise = np.array(b.scores) - np.array(gold(b.kind, b.height, b.shape, np.arange(1, 11) / 10))
        assert np.array(t.scores) == pytest.approx(family_gold(family, t.height, t.shape, t.extra, np.arange(1, 11) / 10) + noise)
    assert n_hacked_form > 100


def test_late_onset_peaks_late_and_shallow_drops_less():
    def hacked(family):
        cfg = load_config().replace(**{"workload.n_jobs": 600, "curves.hacked_families.shares": only(family)})
        return [t for t in generate_workload(cfg, 2).truths if t.kind is CurveKind.HACKED]

    assert min(t.peak_progress for t in hacked("late_onset")) >= 0.6
    gao_drop = np.mean([t.height - t.gold_end for t in hacked("gao")])
    assert np.mean([t.height - t.gold_end for t in hacked("shallow")]) < 0.5 * gao_drop
    assert any(not t.hacked for t in hacked("shallow"))  # a late, shallow fall can stay under the label's 0.05


def test_trace_round_trip_with_families(tmp_path):
    shares = {"gao": 0.2, "late_onset": 0.2, "shallow": 0.2, "plateau_then_drop": 0.2, "oscillating": 0.2}
    cfg = load_config().replace(**{"workload.n_jobs": 60, "curves.hacked_families.shares": shares})
    wl = generate_workload(cfg, 4)
    assert len({t.family for t in wl.truths}) == 5
    write_trace(wl, tmp_path / "jobs.csv")
    assert read_trace(tmp_path / "jobs.csv") == wl

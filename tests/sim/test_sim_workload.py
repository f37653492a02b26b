"""Workload generation: seeded, paired across configs, labels from the noiseless curve, traces."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from platform_sim.config import DEFAULT_CONFIG, load_config
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
        ("gao_kl", (1.0,), [(0.5, 1.0), (1.0, float(gao(np.sqrt(2.0)))), (0.125, float(gao(0.5)))]),
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
        if family == "gao_kl":
            assert fc.kl_p_peak[0] <= t.shape <= fc.kl_p_peak[1] and fc.kl_exponent[0] <= t.extra[0] <= fc.kl_exponent[1]
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
    shares = {f: 1 / len(FAMILIES) for f in FAMILIES}
    cfg = load_config().replace(**{"workload.n_jobs": 80, "curves.hacked_families.shares": shares})
    wl = generate_workload(cfg, 4)
    assert len({t.family for t in wl.truths}) == len(FAMILIES)
    write_trace(wl, tmp_path / "jobs.csv")
    assert read_trace(tmp_path / "jobs.csv") == wl


# ----------------------------------------------------------------------------- per-example evals (issue 28)
def _per_example(n=250, **more):
    cfg = load_config().replace(**{"workload.n_jobs": 300, "noise.per_example.n": n,
                                   **{f"noise.per_example.{k}": v for k, v in more.items()}})
    return cfg, generate_workload(cfg, 5)


def test_per_example_evals_keep_the_jobs_the_curves_and_the_noise_level():
    """Gaussian examples: each score is a mean whose noise is noise.sigma, and the paired level
    estimates that noise (the examples' own effects cancel); jobs, labels and proxies as without."""
    plain = generate_workload(load_config().replace(**{"workload.n_jobs": 300}), 5)
    cfg, wl = _per_example()
    assert wl.jobs == plain.jobs and [t.hacked for t in wl.truths] == [t.hacked for t in plain.truths]
    assert [t.proxies for t in wl.truths] == [t.proxies for t in plain.truths]
    resid = np.array([[s - t.gold_at((i + 1) / wl.n_evals) for i, s in enumerate(t.scores)] for t in wl.truths])
    noise = np.array([t.eval_noise for t in wl.truths])
    assert resid.std() == pytest.approx(cfg.noise.sigma, rel=0.05)
    assert np.isnan(noise[:, 0]).all() and np.nanmean(noise[:, 1:]) == pytest.approx(cfg.noise.sigma, rel=0.05)
    assert {t.eval_n for t in wl.truths} == {250} and {t.eval_n for t in plain.truths} == {0}


def test_binary_and_fresh_examples():
    _, binary = _per_example(scores="binary")
    scores = np.array([t.scores for t in binary.truths])
    assert ((scores * 250) % 1 == 0).all() and (0 <= scores).all() and (scores <= 1).all()  # win rates k/250
    assert np.nanmean([t.eval_noise for t in binary.truths]) > 0
    cfg, fresh = _per_example(examples="fresh")
    assert all(np.isnan(t.eval_noise).all() for t in fresh.truths)  # nothing shared: no paired level
    resid = np.array([[s - t.gold_at((i + 1) / fresh.n_evals) for i, s in enumerate(t.scores)] for t in fresh.truths])
    # fresh examples add their own spread to every mean: sqrt(sigma^2 + example_sd^2 / n)
    assert resid.std() == pytest.approx(math.hypot(cfg.noise.sigma, 0.15 / math.sqrt(250)), rel=0.05)


def test_per_example_traces_round_trip(tmp_path):
    _, wl = _per_example(n=8)
    write_trace(wl, tmp_path / "t.csv")
    back = read_trace(tmp_path / "t.csv")
    assert [t.eval_n for t in back.truths] == [8] * len(wl.truths)
    np.testing.assert_array_equal([t.eval_noise for t in back.truths], [t.eval_noise for t in wl.truths])


@pytest.mark.parametrize("over, message", [
    ({"noise.per_example.n": -1}, "noise.per_example.n must be in [0, 100000]"),
    ({"noise.per_example.n": 10, "noise.kind": "ar1"}, "cannot be combined with noise.kind='ar1'"),
    ({"noise.per_example.scores": "likert"}, "noise.per_example.scores must be one of gaussian, binary"),
    ({"noise.per_example.link_scale": 0}, "noise.per_example.link_scale must be > 0"),
])
def test_bad_per_example_configs_are_clear_errors(over, message):
    from platform_sim.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config().replace(**over)


def test_the_detector_sees_the_paired_noise_and_stops_fewer_healthy_runs():
    """decline k=2 reading the paired noise (``noise: paired``) on the same jobs, with and without
    per-example evidence: with the paired noise, a fall within the noise does not count (fewer label
    stops of healthy runs)."""
    from platform_sim.experiments import detect_only

    cfg = load_config().replace(**{"workload.n_jobs": 200, "overlay.evalstop.noise": "paired"})
    pe = cfg.replace(**{"noise.per_example.n": 250})
    plain = detect_only(cfg, generate_workload(cfg, 11), "srtf_est", "evalstop")
    paired = detect_only(pe, generate_workload(pe, 11), "srtf_est", "evalstop")
    assert paired.fp_a < plain.fp_a and paired.tp > 0.8 * plain.tp, (plain, paired)


def test_a_sealed_run_refuses_per_example_evals_it_could_not_pass_on():
    from platform_sim.config import ConfigError
    from platform_sim.sealed_run import run_salted

    cfg = load_config().replace(**{"workload.n_jobs": 20, "noise.per_example.n": 10})
    with pytest.raises(ConfigError, match="a sealed overlay sees each eval's score only"):
        run_salted(cfg, seeds=1, workers=1, salt=1)


def test_the_simulators_paired_noise_is_the_callbacks():
    """One formula: the workload's vectorised levels equal core.examples.paired_noise on the same
    per-example scores (drawn again from the same generator, in the same order)."""
    from evalstop_trl.core.examples import paired_noise
    from platform_sim.workload import per_example_scores

    pe = load_config().replace(**{"noise.per_example.n": 6}).noise.per_example
    g = np.array([[0.2, 0.4, 0.5], [0.9, 0.8, 0.6]])
    scores, noise = per_example_scores(pe, 0.04, g, np.random.default_rng(9))
    rng = np.random.default_rng(9)
    effects = rng.standard_normal((2, 6)) * pe.example_sd
    x = [g[:, i:i + 1] + effects + rng.standard_normal((2, 6)) * (0.04 * math.sqrt(6)) for i in range(3)]
    for j in range(2):
        for i in (1, 2):
            want = paired_noise(dict(enumerate(x[i - 1][j])), dict(enumerate(x[i][j])))
            assert noise[j, i] == pytest.approx(want, rel=1e-12)
        assert scores[j].tolist() == pytest.approx([x[i][j].mean() for i in range(3)], rel=1e-12)


def test_the_per_example_table_script_runs_every_detector_in_every_setting(tmp_path, capsys):
    from evalstop_trl.core.detectors import DETECTORS
    from tests.proc_helpers import load_script

    table = load_script("per_example_table")
    assert table.main(["--seeds", "1", "--workers", "1", "--json", str(tmp_path / "t.json")]) == 0
    rows = json.loads((tmp_path / "t.json").read_text())["rows"]
    names = [n for n in DETECTORS.names() if n != "never"]
    assert [(r["detector"], r["setting"]) for r in rows] == [(n, s) for s in table.SETTINGS for n in names]
    assert len([line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]) == len(rows) + 1


def test_an_overlay_whose_hook_takes_no_evidence_still_runs_on_per_example_evals():
    """A DetectorOverlay subclass that overrides on_eval_id with the plain signature gets the plain call."""
    from platform_sim.engine import Simulation
    from platform_sim.overlays import DetectorOverlay
    from platform_sim.schedulers import create_scheduler

    class Plain(DetectorOverlay):
        def on_eval_id(self, job_id, step, score, loss, proxy):
            return super().on_eval_id(job_id, step, score, loss, proxy)

    cfg = load_config().replace(**{"workload.n_jobs": 30, "noise.per_example.n": 20})
    Simulation(generate_workload(cfg, 0), cfg, create_scheduler("fifo"), Plain("decline", {"k": 2})).run()


def test_the_columns_and_the_records_are_the_same_jobs():
    """A workload holds columns; its records (``jobs``, ``truths``) are built from them, and a workload
    built from those records is equal to it, as is one sent through pickle (worker processes)."""
    import pickle

    from platform_sim.workload import COLUMNS, Workload

    cfg = load_config(DEFAULT_CONFIG.parent / "hack_families.yaml").replace(
        **{"workload.n_jobs": 120, "noise.per_example.n": 30})
    wl = generate_workload(cfg, 5, salt=77)
    jobs, truths = tuple(wl.jobs), tuple(wl.truths)
    assert Workload(jobs, truths, wl.n_evals, wl.seed, wl.salt, wl.source) == wl
    assert pickle.loads(pickle.dumps(wl)) == wl and wl != generate_workload(cfg, 6, salt=77)
    assert wl.jobs == jobs and wl.jobs[3] == jobs[3] and wl.jobs[-1] == jobs[-1]
    assert repr(wl.truths[10:13]) == repr(truths[10:13])  # (their first noise level is NaN: equal only to itself)
    assert [list(t.scores) for t in truths] == wl.scores.tolist() and len({t.family for t in truths}) > 1
    assert all(getattr(wl, c).flags.writeable is False for c in COLUMNS)
    # what a million jobs of ten evals cost: the three series and the noise levels, and 25 numbers more
    per_job = sum(getattr(wl, c).nbytes for c in COLUMNS) / len(wl)
    assert per_job <= 8 * (4 * wl.n_evals + 25), per_job


@pytest.mark.parametrize("change, message", [
    ({"job_id": 1}, "job 0's job_id is 1"),
    ({"scores": (0.1, 0.2)}, "job 0's truth has 2 scores, 4 losses, 4 proxies and 0 noise levels; n_evals=4"),
    ({"extra": (1.0, 2.0, 3.0, 4.0)}, "job 0's truth has 4 family parameters; at most 3"),
])
def test_a_workload_refuses_records_it_cannot_hold(change, message):
    from dataclasses import replace

    from platform_sim.workload import Workload
    from tests.sim_helpers import job

    spec, truth = job(0, 8, 0, 4)
    spec = replace(spec, **{k: v for k, v in change.items() if k == "job_id"})
    truth = replace(truth, **{k: v for k, v in change.items() if k != "job_id"})
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Workload((spec,), (truth,), 4, 0)

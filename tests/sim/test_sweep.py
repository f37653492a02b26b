"""The pre-registered curve-level sweep (platform_sim.sweep, scripts/detector_sweep.py) and its tuning log."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from evalstop_trl.core.detectors import create_detector
from platform_sim.config import load_config
from platform_sim.curves import transient_dip
from platform_sim.sweep import (
    DetectorSpec,
    Population,
    SweepPlan,
    draw_noise,
    draw_population,
    load_plan,
    run_detector,
    score_cell,
    sweep_cells,
    wilson,
)

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "configs" / "sweep" / "preregistered.yaml"
LOG = ROOT / "configs" / "sweep" / "tuning-log.jsonl"


def tiny_plan(**kw) -> SweepPlan:
    base = dict(sigmas=(0.04,), evals=(10,), scales=((1.0, 0.0), (10.0, 50.0)), families=("gao",), noises=("gaussian",),
                detectors=(DetectorSpec("seq", "sequential"), DetectorSpec("abs", "trend", {"noise_prior": 0.09})),
                curves_per_cell=40, seed=20000)
    return SweepPlan(**{**base, **kw})


def test_the_committed_plan_is_the_full_grid_on_evaluation_seeds():
    plan = load_plan(PLAN)
    assert plan.seed >= 20000
    assert plan.sigmas[0] <= 0.02 and plan.sigmas[-1] >= 0.20 and plan.evals == (5, 10, 20, 40)
    assert min(a for a, _ in plan.scales) <= 0.1 and max(a for a, _ in plan.scales) >= 10
    assert any(b != 0 for _, b in plan.scales)
    assert set(plan.families) == {"gao", "late_onset", "shallow", "plateau_then_drop", "oscillating", "healthy_dip"}
    assert set(plan.noises) == {"gaussian", "student_t", "ar1"}
    assert "sequential" in {d.name for d in plan.detectors}


def test_the_frozen_parameters_are_the_registry_defaults():
    """The plan froze the defaults: a later change of a default must show up here, not silently; the
    plan then pins the value it froze (:data:`CHANGED_SINCE_PLAN`)."""
    from evalstop_trl.core.detectors import detector_params

    for d in load_plan(PLAN).detectors:
        defaults = {k: v for k, v in detector_params(d.name).items() if k != "direction"}
        if d.params.get("noise_prior") is None:
            assert {**defaults, **d.params} == {**defaults, **CHANGED_SINCE_PLAN.get(d.name, {})}, d.label


#: defaults changed after the plan was frozen, and the value the plan pins: issue 44 made ``decline``
#: count declines beyond the run's noise; the plan's "decline k=2 (paper)" is the paper's exact rule
CHANGED_SINCE_PLAN = {"decline": {"noise": "none"}}


def test_the_tuning_log_only_uses_tuning_seeds():
    rows = [json.loads(line) for line in LOG.read_text().splitlines() if line.strip()]
    assert rows and all(r["seed"] < 1000 for r in rows)
    chosen = {r["detector"]: r["params"] for r in rows if r["chosen"]}
    from evalstop_trl.core.detectors import detector_params

    for name, params in chosen.items():  # the registry's defaults are the logged choice
        assert {k: detector_params(name)[k] for k in params} == params, name


def test_the_tuning_script_refuses_evaluation_seeds():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tune_detectors", ROOT / "scripts" / "tune_detectors.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(ValueError, match=r"tuning seeds must lie in \[0, 999\]"):
        mod.tuning_plan((DetectorSpec("d", "decline"),), 20000, 10)


@pytest.mark.parametrize("bad, message", [
    ({"sigmas": (-0.1,)}, "sigmas must be finite and >= 0"),
    ({"evals": (1,)}, "evals must lie in"),
    ({"scales": ((0.0, 1.0),)}, "scales must be"),
    ({"families": ("gaoo",)}, "families must be among"),
    ({"noises": ("cauchy",)}, "noises must be among"),
    ({"curves_per_cell": 0}, "curves_per_cell must lie in"),
    ({"detectors": (DetectorSpec("x", "nope"),)}, "Unknown detector 'nope'"),
    ({"detectors": (DetectorSpec("x", "decline", {"k": 0}),)}, "k must be an integer"),
])
def test_a_bad_plan_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        tiny_plan(**bad)


def test_unknown_plan_keys_are_refused(tmp_path):
    raw = yaml.safe_load(PLAN.read_text())
    raw["sigma"] = [0.1]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="unknown key"):
        load_plan(path)


def test_labels_come_from_the_noise_free_curves():
    cfg = load_config()
    pop = draw_population(cfg.curves, "gao", 1200, 10, np.random.default_rng(1))
    assert abs(pop.hacked.mean() - cfg.curves.hack_fraction) < 0.05  # every Gao hacked-form curve is hacked
    assert np.all(pop.peak[pop.hacked] < 1.0)
    assert np.all(pop.peak[~pop.hacked] > 0.9)  # healthy: rising or a saturated plateau
    late = draw_population(cfg.curves, "shallow", 1200, 10, np.random.default_rng(1))
    assert late.hacked.mean() < pop.hacked.mean()  # some shallow hacks fall by less than the margin


def test_healthy_dips_recover_and_stay_healthy():
    cfg = load_config()
    pop = draw_population(cfg.curves, "healthy_dip", 800, 20, np.random.default_rng(2))
    plain = draw_population(cfg.curves, "gao", 800, 20, np.random.default_rng(2))
    assert np.array_equal(pop.hacked, plain.hacked)  # the same draws: dips change no label
    healthy = ~pop.hacked
    dip = pop.gold[healthy] - plain.gold[healthy]
    assert dip.min() < -0.05 and np.all(dip <= 1e-12) and np.all(dip[:, -1] > -1e-3)
    assert transient_dip(2.0, 0.25, 0.5, 0.05, 0.5) == pytest.approx(-0.5)


@pytest.mark.parametrize("kind", ["gaussian", "student_t", "ar1"])
def test_noise_has_unit_variance(kind):
    z = draw_noise(kind, 4000, 40, np.random.default_rng(3))
    assert z.std() == pytest.approx(1.0, abs=0.03)
    lag1 = np.corrcoef(z[:, 1:].ravel(), z[:, :-1].ravel())[0, 1]
    assert lag1 == pytest.approx(0.5 if kind == "ar1" else 0.0, abs=0.03)
    if kind == "student_t":
        assert (np.abs(z) > 4).mean() > 10 * 6.3e-5  # heavy tails: far more 4-sigma draws than a normal's


def test_unknown_noise_kind_raises():
    with pytest.raises(ValueError, match="additive noise kind must be one of gaussian, student_t, ar1"):
        draw_noise("cauchy", 2, 2, np.random.default_rng(0))


def test_wilson_interval():
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert all(math.isnan(x) for x in wilson(0, 0))


def test_run_detector_and_score_cell_by_hand():
    gold = np.array([[0.2, 0.6, 1.0, 0.9, 0.6, 0.3],    # hacked: peak at progress 0.5
                     [0.1, 0.3, 0.5, 0.7, 0.9, 1.0],    # healthy, rising
                     [0.5, 0.9, 0.8, 0.7, 0.8, 0.9]])   # healthy with a dip
    pop = Population(gold, np.array([True, False, False]), np.array([0.5, 1.0, 1.0]), gold[:, -1])
    stop, best = run_detector(create_detector("decline", k=2, noise="none"), gold)  # the paper's rule, by hand
    assert stop.tolist() == [4, -1, 3] and best.tolist() == [2, -1, 1]
    r = score_cell(pop, stop, best, margin=0.05)
    # the dip's stop delivers eval 2 (gold 0.9, the end's 0.9): not harmful by definition B
    assert (r["tp"], r["harmful"], r["healthy_stopped"], r["hacked"]) == (1, 0, 1, 1)
    assert r["retention"] == pytest.approx((1 - 5 / 6) / (1 - 0.5))
    assert r["mean_lag_evals"] == pytest.approx(2.0)  # stop at index 4, first eval at/after the peak is 2


def test_the_sweep_is_paired_and_scale_free_rules_do_not_see_the_units():
    cells = list(sweep_cells(tiny_plan()))
    seq = [c for c in cells if c.detector == "seq"]
    absolute = [c for c in cells if c.detector == "abs"]
    assert len(seq) == len(absolute) == 2
    key = lambda c: (c.tp, c.harmful, c.healthy_stopped, c.retention)  # noqa: E731
    assert key(seq[0]) == key(seq[1])  # the same curves in other units: the same decisions
    assert key(absolute[0]) != key(absolute[1])  # an absolute noise prior sees the units
    assert all(c.curves == 40 and c.hacked == seq[0].hacked for c in cells)


def test_the_sweep_script_writes_tables_json_and_figure(tmp_path, capsys):
    import importlib.util

    raw = yaml.safe_load(PLAN.read_text())
    raw.update(sigmas=[0.04], evals=[5, 10], families=["gao", "healthy_dip"], noises=["gaussian"],
               scales=[[1.0, 0.0], [0.1, 3.0]])
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(raw))
    spec = importlib.util.spec_from_file_location("detector_sweep", ROOT / "scripts" / "detector_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    assert mod.main(["--plan", str(plan_path), "--curves", "12", "--json", str(out), "--png", str(png)]) == 0
    data = json.loads(out.read_text())
    assert len(data["cells"]) == 2 * 2 * 2 * len(raw["detectors"])
    assert data["summary"]["units_max_change"]["sequential (recommended)"]["groups_that_differ"] == 0
    assert png.stat().st_size > 10_000
    text = capsys.readouterr().out
    assert "## 1. Cells with P and R >= 95%" in text and "## 3. Units" in text


# ------------------------------------------------------------------ the Gao-form family (issue 28 item 3)
KL_PLAN = ROOT / "configs" / "sweep" / "preregistered-gao-kl.yaml"
KL_LOG = ROOT / "configs" / "sweep" / "tuning-log-gao-kl.jsonl"


def test_gao_kl_is_gaos_rl_form_in_the_square_root_of_the_kl():
    """gold = d (alpha - beta ln d), d = sqrt(KL), KL = d*^2 (p / p_peak)^gamma: written out from
    Gao et al.'s formula, not from the implementation's f(x)."""
    from platform_sim.curves import family_gold

    beta, d_star, p_peak, gamma = 0.4, 3.0, 0.35, 0.7
    alpha = beta * (1 + math.log(d_star))  # the peak of d (alpha - beta ln d) is at d*
    p = np.linspace(0.01, 1.0, 50)
    d = np.sqrt(d_star**2 * (p / p_peak) ** gamma)
    want = d * (alpha - beta * np.log(d))
    got = family_gold("gao_kl", beta * d_star, p_peak, (gamma,), p)  # its height H = R(d*) = beta d*
    assert got == pytest.approx(want, rel=1e-12)
    assert p[np.argmax(got)] == pytest.approx(p_peak, abs=0.02)


def test_the_family_lists_tie_to_the_curve_families():
    from platform_sim.curves import FAMILIES
    from platform_sim.sweep import EXAMPLE_NOISES, HEALTHY_DIP, NOISE_KINDS, SWEEP_FAMILIES

    assert set(SWEEP_FAMILIES) == set(FAMILIES) | {HEALTHY_DIP} and len(set(SWEEP_FAMILIES)) == len(SWEEP_FAMILIES)
    assert SWEEP_FAMILIES[:6] == ("gao", "late_onset", "shallow", "plateau_then_drop", "oscillating", HEALTHY_DIP)
    assert NOISE_KINDS[:3] == ("gaussian", "student_t", "ar1") and set(EXAMPLE_NOISES) <= set(NOISE_KINDS)


def test_a_gao_kl_cell_has_every_curve_in_the_form_healthy_ones_peaking_past_the_end():
    cfg = load_config()
    pop = draw_population(cfg.curves, "gao_kl", 2000, 10, np.random.default_rng(4), kl_healthy_p_peak=(1.2, 2.0))
    lo, hi = cfg.curves.hacked_families.kl_p_peak
    assert np.all((pop.peak[pop.hacked] >= lo - 1e-3) & (pop.peak[pop.hacked] <= hi + 1e-3))
    rising = ~pop.hacked & (pop.peak == 1.0)
    assert rising.mean() > 0.4 and np.all(np.diff(pop.gold[rising], axis=1) > 0)  # no plateau runs: all rise
    # the slow decline: a hacked form peaking late may fall by less than the label's margin (then healthy)
    assert 0.1 < pop.hacked.mean() < cfg.curves.hack_fraction


#: decline reading only the eval's paired noise (``noise: paired``): without evidence, the paper's rule
PAIRED = {"noise": "paired"}


def _kl_plan(**kw) -> SweepPlan:
    base = dict(sigmas=(0.04,), evals=(10,), scales=((1.0, 0.0), (10.0, 50.0)), families=("gao_kl",),
                noises=("win_rate", "examples"), curves_per_cell=60, seed=20000,
                detectors=(DetectorSpec("seq", "sequential"), DetectorSpec("seq plain", "sequential", evidence=False),
                           DetectorSpec("decline", "decline", PAIRED),
                           DetectorSpec("decline plain", "decline", PAIRED, evidence=False)))
    return SweepPlan(**{**base, **kw})


def test_per_example_cells_give_the_detectors_the_paired_noise_in_every_unit():
    plan = _kl_plan()
    assert plan.n_cells == 2 * 2  # win_rate once (no sigma), examples at the one sigma; two units each
    cells = list(sweep_cells(plan))
    assert {c.sigma for c in cells if c.noise == "win_rate"} == {0.0}
    key = lambda c: (c.tp, c.harmful, c.healthy_stopped, c.retention)  # noqa: E731
    for label in ("seq", "seq plain", "decline", "decline plain"):
        for noise in ("win_rate", "examples"):
            a, b = (c for c in cells if c.detector == label and c.noise == noise)
            assert key(a) == key(b), (label, noise)  # the level is scaled with the scores
    by = {(c.detector, c.noise, c.scale): c for c in cells}
    # the level changes decisions: decline (noise: paired) stops only once its falls add up to more than
    # the paired noise, so it stops far fewer healthy runs than the paper's rule (no level without evidence)
    for noise in ("win_rate", "examples"):
        with_level, plain = by[("decline", noise, 1.0)], by[("decline plain", noise, 1.0)]
        assert with_level.healthy_stopped < plain.healthy_stopped / 2


def test_per_example_cells_are_paired_across_sigmas():
    """The same examples and standardised draws at every sigma: a mean over Gaussian example scores
    moves linearly with sigma (unpaired streams would not)."""
    from platform_sim.sweep import _observed

    plan = _kl_plan(noises=("examples",), curves_per_cell=30)
    cfg = plan.sim_config()
    pop = draw_population(cfg.curves, "gao_kl", 30, 10, np.random.default_rng(5))
    key = (6, 10, 4)
    at = {sigma: _observed(plan, cfg.noise.per_example, "examples", pop, None, sigma, key) for sigma in (0.0, 0.04, 0.08)}
    one, two = at[0.04][0] - at[0.0][0], at[0.08][0] - at[0.0][0]
    assert np.abs(one).max() > 1e-3 and two == pytest.approx(2 * one, rel=1e-9, abs=1e-12)
    assert at[0.08][1][:, 1:] == pytest.approx(2 * at[0.04][1][:, 1:], rel=1e-9)  # the paired level too


@pytest.mark.parametrize("bad, message", [
    ({"kl_healthy_p_peak": (0.8, 2.0)}, "kl_healthy_p_peak must be a range"),
    ({"kl_healthy_p_peak": (1.5,)}, "kl_healthy_p_peak must be a range"),
    ({"examples": 1}, r"examples must be an integer in \[2, 10000\]"),
    ({"examples": 250.5}, r"examples must be an integer in \[2, 10000\], got 250.5"),
])
def test_a_bad_gao_kl_plan_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        _kl_plan(**bad)


RETENTION_PLAN = ROOT / "configs" / "sweep" / "preregistered-retention.yaml"
RETENTION_LOG = ROOT / "configs" / "sweep" / "tuning-log-retention.jsonl"


def test_a_detector_specs_evidence_must_be_a_bool(tmp_path):
    with pytest.raises(ValueError, match="evidence must be true or false, got 'false'"):
        DetectorSpec("s", "sequential", evidence="false")
    raw = yaml.safe_load(KL_PLAN.read_text())
    raw["detectors"][0]["evidence"] = "no"
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="evidence must be true or false"):
        load_plan(path)


@pytest.mark.parametrize("plan_path, log, floor", [(KL_PLAN, KL_LOG, 0.95), (RETENTION_PLAN, RETENTION_LOG, 0.98)])
def test_the_one_cell_plans_are_preregistered_with_the_logged_tuning(plan_path, log, floor):
    plan = load_plan(plan_path)
    seeds = {load_plan(p).seed for p in (PLAN, KL_PLAN, RETENTION_PLAN)}
    assert plan.seed >= 20000 and len(seeds) == 3  # every evaluation on a seed of its own
    assert plan.examples == 250 and 10 in plan.evals and {"win_rate", "examples"} & set(plan.noises)
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert rows and all(r["seed"] < 1000 for r in rows)
    chosen = {r["detector"]: r["params"] for r in rows if r["chosen"]}
    pinned = {name: set(p) for name, p in CHANGED_SINCE_PLAN.items()}  # keys a plan pinned after a default changed
    tuned = {d.name: {k: v for k, v in d.params.items() if k not in pinned.get(d.name, ())}
             for d in plan.detectors if d.label.endswith(", tuned")}
    assert tuned == chosen
    from evalstop_trl.core.detectors import detector_params

    for d in plan.detectors:  # the others froze the registry's defaults (and pin what changed since)
        if not d.label.endswith(", tuned"):
            assert dict(d.params) in ({}, CHANGED_SINCE_PLAN.get(d.name)) and detector_params(d.name), d.label
    # the rule: precision >= 0.95, then retention (recomputed from the log)
    for name, params in chosen.items():
        mine = [r for r in rows if r["detector"] == name]
        ok = [r for r in mine if (r["precision"] or 0) >= floor]
        want = max(ok, key=lambda r: r["retention"] or 0) if ok else max(mine, key=lambda r: r["precision"] or 0)
        assert want["params"] == params, name


def test_the_gao_kl_tuning_refuses_evaluation_seeds():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tune_detectors", ROOT / "scripts" / "tune_detectors.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(ValueError, match=r"tuning seeds must lie in \[0, 999\]"):
        mod.cell_plan(mod.CELL_TUNINGS["gao_kl"], (DetectorSpec("d", "decline"),), 20002, 10)


def test_the_sweep_script_prints_every_detectors_cells(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("detector_sweep", ROOT / "scripts" / "detector_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "kl.json"
    assert mod.main(["--plan", str(KL_PLAN), "--curves", "6", "--cells-table", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("| ") and "| win_rate | 0 |" in line]
    assert len(rows) == len(load_plan(KL_PLAN).detectors)  # one win-rate row per detector at 10 evals
    assert len(json.loads(out.read_text())["cells"]) == load_plan(KL_PLAN).n_cells * len(rows)

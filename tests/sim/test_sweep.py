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
    """The plan froze the defaults: a later change of a default must show up here, not silently."""
    from evalstop_trl.core.detectors import detector_params

    for d in load_plan(PLAN).detectors:
        defaults = {k: v for k, v in detector_params(d.name).items() if k != "direction"}
        if d.params.get("noise_prior") is None:
            assert {**defaults, **d.params} == defaults, d.label


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
    with pytest.raises(ValueError, match="noise kind must be one of gaussian, student_t, ar1"):
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
    stop, best = run_detector(create_detector("decline", k=2), gold)
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

"""Metrics on hand-computed cases; statistics helpers; a 2-seed reproduce smoke test."""

from __future__ import annotations

import json

import numpy as np
import pytest

from platform_sim.cli import main
from platform_sim.curves import CurveKind
from platform_sim.engine import JobOutcome, RunResult
from platform_sim.experiments import bootstrap_ci, paired_permutation_p
from platform_sim.metrics import Detection, compare, detection, detection_by_type, summarize, wasted
from platform_sim.report import p_value
from platform_sim.results import json_safe
from platform_sim.schedulers import SCHEDULERS
from platform_sim.stats import Metric, Rates
from tests.sim_helpers import job, small_config, workload


def outcome(job_id, arrival, departure, stopped=False, gpu_s=0.0, work=0.0, best=0, delivered=0.0):
    return JobOutcome(job_id, arrival, arrival, departure, not stopped, stopped, gpu_s, 0.0, work, 4, best,
                      delivered, 0, gpu_s)


def result(*outcomes, seed=0):
    return RunResult("fifo", "x", False, seed, tuple(outcomes), max(o.departure_s for o in outcomes), 0, 8)


def test_jct_changes_completed_and_all_jobs():
    cfg = small_config()
    wl = workload(job(0, 1, 0, 1), job(1, 1, 0, 1), job(2, 1, 0, 1))
    base = result(outcome(0, 0, 10), outcome(1, 0, 20), outcome(2, 0, 30))
    run = result(outcome(0, 0, 8), outcome(1, 0, 20), outcome(2, 0, 6, stopped=True))
    ch = compare(base, run, wl, cfg)
    assert ch.jct_change == pytest.approx((8 + 20) / (10 + 20) - 1)  # completed jobs 0 and 1 only
    assert ch.jct_change_all == pytest.approx((8 + 20 + 6) / 60 - 1)


def test_detection_definitions_a_and_b():
    cfg = small_config()
    hacked = job(0, 1, 0, 1, kind=CurveKind.HACKED, hacked=True, peak=0.5)
    healthy_harm = job(1, 1, 0, 1)  # plateau tau=0.1: gold(0.25)=1-e^-2.5=0.918 < gold_end(0.5)? no: gold_end is 0.5 here
    wl = workload(hacked, healthy_harm, job(2, 1, 0, 1), job(3, 1, 0, 1, rlhf=False))
    # job 1 delivers at p=0.01: gold = 1 - e^-0.1 = 0.095 < 0.5 - 0.05 -> harmful; job 2 delivers at p=0.5: 0.993 -> not
    run = result(outcome(0, 0, 1, stopped=True, delivered=0.5), outcome(1, 0, 1, stopped=True, delivered=0.01),
                 outcome(2, 0, 1, stopped=True, delivered=0.5), outcome(3, 0, 1, stopped=True, delivered=0.5))
    det = detection(run, wl, cfg.metrics.harmful_margin)
    assert det == Detection(tp=1, fp_a=2, fp_b=1, hacked=1, healthy=2, flagged=3)  # job 3 is not RLHF
    assert det.precision == 0.5 and det.recall == 1.0 and det.fpr == 0.5 and det.fpr_label == 1.0


def test_detection_over_watched_types_and_per_type():
    cfg = small_config()
    hacked = job(0, 1, 0, 1, kind=CurveKind.HACKED, hacked=True, peak=0.5)
    lora_harmed = job(1, 1, 0, 1, rlhf=False)  # plateau tau 0.1, gold_end 0.5: delivered at p=0.01 harms
    lora_fine = job(2, 1, 0, 1, rlhf=False)
    wl = workload(hacked, lora_harmed, lora_fine, job(3, 1, 0, 1))
    run = result(outcome(0, 0, 1, stopped=True, delivered=0.5), outcome(1, 0, 1, stopped=True, delivered=0.01),
                 outcome(2, 0, 1, stopped=True, delivered=0.5), outcome(3, 0, 2))
    margin = cfg.metrics.harmful_margin
    assert detection(run, wl, margin) == Detection(tp=1, fp_a=0, fp_b=0, hacked=1, healthy=1, flagged=1)  # RLHF only
    every = frozenset({"rlhf_grpo", "lora_sft"})
    assert detection(run, wl, margin, every) == Detection(tp=1, fp_a=2, fp_b=1, hacked=1, healthy=3, flagged=3)
    by_type = detection_by_type(run, wl, margin, every)
    assert by_type == {"lora_sft": Detection(0, 2, 1, 0, 2, 2), "rlhf_grpo": Detection(1, 0, 0, 1, 1, 1)}
    assert detection(run, wl, margin, frozenset()) == Detection(0, 0, 0, 0, 0, 0)


def test_gpu_hours_saved_on_hacked_jobs():
    cfg = small_config()
    wl = workload(job(0, 2, 0, 4, kind=CurveKind.HACKED, hacked=True, peak=0.5), job(1, 1, 0, 4))
    base = result(outcome(0, 0, 4, gpu_s=8 * 3600), outcome(1, 0, 4, gpu_s=4 * 3600))
    run = result(outcome(0, 0, 3, stopped=True, gpu_s=6 * 3600), outcome(1, 0, 2, stopped=True, gpu_s=2 * 3600))
    ch = compare(base, run, wl, cfg)
    assert ch.gpu_hours_saved_hacked == pytest.approx(2.0) and ch.gpu_hours_saved == pytest.approx(4.0)


@pytest.mark.parametrize("seeds, precision, recall, fpr, harmful", [
    ([Detection(9, 2, 1, 10, 20, 11), Detection(8, 0, 0, 9, 21, 8)], 17 / 18, 17 / 19, 1 / 41, 1),
    ([Detection(0, 0, 0, 0, 5, 0)], None, None, 0.0, 0),  # nothing hacked, nothing stopped: undefined rates
    ([Detection(0, 3, 3, 0, 3, 3)] * 3, 0.0, None, 1.0, 9),
])
def test_rates_pool_over_seeds(seeds, precision, recall, fpr, harmful):
    r = Rates.pool(seeds)
    assert (r.precision, r.recall, r.fpr, r.harmful_stops) == pytest.approx((precision, recall, fpr, harmful))
    row = r.to_dict()  # the JSON shape of every rates block
    assert list(row) == ["precision", "recall", "fpr", "fpr_label", "precision_label", "precision_ci", "recall_ci",
                         "fpr_ci", "fpr_label_ci", "precision_label_ci", "counts"]
    assert row["counts"] == r.counts.to_dict() and r.counts.fp_b == harmful
    if len(seeds) < 2:
        assert json_safe(row["precision_ci"]) == [None, None]  # no interval from one seed


def test_metric_skips_nan_seeds_and_json_has_no_nan():
    m = Metric.over([0.1, float("nan"), 0.3])
    assert m.mean == pytest.approx(0.2) and m.ci[0] <= m.mean <= m.ci[1]
    assert json_safe({"a": float("nan"), "b": (1, np.float64(2.5)), 3: float("inf")}) == {"a": None, "b": [1, 2.5],
                                                                                           "3": None}


@pytest.mark.parametrize("p, text", [(1 / 20001, "p < 1e-04"), (5e-5, "p < 1e-04"), (0.0123, "p = 0.012"),
                                     (0.5, "p = 0.5"), (float("nan"), "p = n/a"), (None, "p = n/a")])
def test_p_value_prints_the_floor_as_a_bound(p, text):
    assert p_value(p) == text


def test_wasted_compute_hand_computed():
    cfg = small_config()
    # one hacked 2-GPU job, duration 4 h, peak at p=0.5 (no eval overhead): runs to the end
    hacked = job(0, 2, 0, 4, kind=CurveKind.HACKED, hacked=True, peak=0.5)
    wl = workload(hacked)
    run = result(outcome(0, 0, 4 * 3600, gpu_s=8 * 3600, work=4 * 3600, best=2, delivered=0.5))
    w_post, w_unprod, w_ovh = wasted(run, wl, cfg)
    assert w_post == pytest.approx(2 * 2)  # 2 GPUs x 2 h after the peak
    assert w_unprod == pytest.approx(2 * 2)  # delivered checkpoint at p=0.5
    assert w_ovh == 0.0
    s = summarize(run, wl, cfg)
    assert s.gpu_hours == pytest.approx(8.0) and s.utilisation == pytest.approx(8 / (8 * 4))


def test_bootstrap_and_permutation():
    lo, hi = bootstrap_ci(np.linspace(-0.1, 0.1, 30), lambda x: x.mean(axis=-1))
    assert lo < 0 < hi
    assert paired_permutation_p([-1.0] * 10) == pytest.approx(2 / 1024)  # exact: only the two all-same flips
    assert paired_permutation_p([1.0, -1.0] * 5) == 1.0


def test_reproduce_smoke(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["reproduce", "--seeds", "2", "--seed-start", "1000", "--out", str(out), "--quiet", "--workers", "2"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res) >= {"config", "seeds", "headline", "baselines", "composability", "noise", "base_rate", "k",
                        "detectors", "seed_start"}
    assert res["seeds"] == 2 and res["seed_start"] == 1000 and res["seed_range"] == [1000, 1001]
    rows = res["detectors"]
    contract = {"detector", "params", "sigma", "evals_per_job", "precision", "recall", "fpr", "retention", "jct_change",
                "harmful_stops"}
    assert all(contract <= set(r) for r in rows)
    names = {"decline", "patience", "stop_at", "loss_plateau", "drop", "trend", "cusum", "sequential"}
    assert {r["detector"] for r in rows} == names
    assert sorted({(r["sigma"], r["evals_per_job"]) for r in rows}) == [(0.04, 10), (0.04, 20), (0.08, 10), (0.12, 10)]
    assert len(rows) == 4 * len(names)
    for r in rows:
        assert isinstance(r["harmful_stops"], int) and r["harmful_stops"] >= 0
        for k in ("precision", "recall", "fpr", "retention"):
            assert r[k] is None or 0 <= r[k] <= 1.5
    decline = next(r for r in rows if r["detector"] == "decline" and r["sigma"] == 0.04 and r["evals_per_job"] == 10)
    assert decline["params"] == {"k": 2, "min_delta": 0.0, "noise": "none", "noise_z": 2.0}  # the paper's rule
    assert decline["precision"] == res["headline"]["precision"]  # the same runs as the headline
    assert decline["harmful_stops"] == res["headline"]["harmful_stops"]
    assert 0.3 < res["quality"]["retention"] < 1.0
    assert set(res["headline"]["by_type"]) == {"rlhf_ppo", "rlhf_grpo"} and res["watched"] == ["rlhf_grpo", "rlhf_ppo"]
    assert all("harmful_stops" in r for r in res["k"] + res["evals_k"] + list(res["baselines"].values()))
    assert set(res["headline"]) >= {"scheduler", "jct_change", "jct_change_all", "gpu_hours_change", "w_post_change",
                                    "w_unprod_change", "precision", "recall", "fpr", "fpr_label", "p_value"}
    assert set(res["baselines"]) == {"stop_at", "loss_plateau", "oracle"}
    assert set(res["baselines"]["oracle"]) >= {"precision", "recall", "fpr", "jct_change"}
    assert set(res["composability"]) == set(SCHEDULERS) >= {"fifo", "sjf_est", "srtf_est", "loss_aware", "tiresias"}
    assert [r["sigma"] for r in res["noise"]][0] == 0.01 and res["noise"][-1]["sigma"] == 0.12
    assert [r["k"] for r in res["k"]] == [1, 2, 3, 4]
    assert res["headline"]["jct_change"] < 0 and res["headline"]["gpu_hours_change"] < -0.1
    assert res["headline"]["precision"] > 0.9
    report = (out / "report.md").read_text()
    assert "Definitions" in report and "ORACLE" in report and "seed(s), 1000-1001" in report
    assert "## Detectors compared" in report and "harmful stops" in report and "p = 0.5" in report
    for png in ("jct_distribution", "noise", "base_rate", "k_sensitivity", "wasted_compute", "detectors"):
        assert (out / f"{png}.png").read_bytes()[:4] == b"\x89PNG"


def test_run_and_sweep_cli(tmp_path, capsys):
    trace = tmp_path / "jobs.csv"
    assert main(["run", "--seeds", "1", "--quiet", "--write-trace", str(trace), "--json", str(tmp_path / "r.json"),
                 "--plot", str(tmp_path / "r.png")]) == 0
    first = capsys.readouterr().out
    assert "detection over watched jobs" in first and "paired permutation test" in first and "harmful stops" in first
    assert main(["run", "--trace", str(trace), "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[1:5] == first.splitlines()[1:5]  # the trace replays seed 0
    assert main(["sweep", "--param", "overlay.evalstop.k", "--values", "1,3", "--seeds", "1", "--quiet",
                 "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "harmful" in out.splitlines()[0]
    rows = json.loads((tmp_path / "s.json").read_text())
    assert [r["value"] for r in rows] == [1, 3] and rows[0]["recall"] >= rows[1]["recall"]
    assert rows[0]["harmful_stops"] >= rows[1]["harmful_stops"] and rows[0]["seed_start"] == 0


def test_seed_start_picks_the_seeds(tmp_path, capsys):
    trace = tmp_path / "s5.csv"
    assert main(["run", "--seeds", "1", "--seed-start", "5", "--quiet", "--write-trace", str(trace),
                 "--json", str(tmp_path / "a.json")]) == 0
    first = capsys.readouterr()
    assert "seed 5" in first.err and "1 seed(s), 5-5" in first.out
    assert main(["run", "--trace", str(trace), "--quiet", "--json", str(tmp_path / "b.json")]) == 0
    capsys.readouterr()
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a["seed_start"] == b["seed_start"] == 5 and a["jct_run_h"] == b["jct_run_h"]
    assert main(["run", "--seeds", "1", "--quiet", "--json", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["jct_run_h"] != a["jct_run_h"]
    assert main(["sweep", "--param", "noise.sigma", "--values", "0.04", "--seeds", "1", "--seed-start", "5",
                 "--quiet", "--json", str(tmp_path / "s.json")]) == 0
    row = json.loads((tmp_path / "s.json").read_text())[0]
    assert row["seed_start"] == 5 and row["jct_change"] == pytest.approx(a["changes"]["jct_change"]["mean"])

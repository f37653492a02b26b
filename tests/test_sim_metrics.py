"""Metrics on hand-computed cases; statistics helpers; a 2-seed reproduce smoke test."""

from __future__ import annotations

import json

import numpy as np
import pytest

from platform_sim.cli import main
from platform_sim.curves import CurveKind
from platform_sim.engine import JobOutcome, RunResult
from platform_sim.experiments import bootstrap_ci, paired_permutation_p
from platform_sim.metrics import Detection, compare, detection, summarize, wasted

from .sim_helpers import job, small_config, workload


def outcome(job_id, arrival, departure, stopped=False, gpu_s=0.0, work=0.0, best=0, delivered=0.0):
    return JobOutcome(job_id, arrival, arrival, departure, not stopped, stopped, gpu_s, 0.0, work, 4, best,
                      delivered, 0)


def result(*outcomes, seed=0):
    return RunResult("fifo", "x", False, seed, tuple(outcomes), max(o.departure_s for o in outcomes), 0, 8)


def test_jct_changes_completed_and_all_jobs():
    cfg = small_config()
    wl = workload(job(0, 1, 0, 1), job(1, 1, 0, 1), job(2, 1, 0, 1))
    base = result(outcome(0, 0, 10), outcome(1, 0, 20), outcome(2, 0, 30))
    run = result(outcome(0, 0, 8), outcome(1, 0, 20), outcome(2, 0, 6, stopped=True))
    ch = compare(base, run, wl, cfg)
    assert ch["jct_change"] == pytest.approx((8 + 20) / (10 + 20) - 1)  # completed jobs 0 and 1 only
    assert ch["jct_change_all"] == pytest.approx((8 + 20 + 6) / 60 - 1)


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
    assert main(["reproduce", "--seeds", "2", "--out", str(out), "--quiet", "--workers", "2"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res) >= {"config", "seeds", "headline", "baselines", "composability", "noise", "base_rate", "k"}
    assert res["seeds"] == 2
    assert set(res["headline"]) >= {"scheduler", "jct_change", "jct_change_all", "gpu_hours_change", "w_post_change",
                                    "w_unprod_change", "precision", "recall", "fpr", "fpr_label", "p_value"}
    assert set(res["baselines"]) == {"stop_at", "loss_plateau", "oracle"}
    assert set(res["baselines"]["oracle"]) >= {"precision", "recall", "fpr", "jct_change"}
    assert set(res["composability"]) == {"fifo", "sjf_est", "srtf_est", "loss_aware"}
    assert [r["sigma"] for r in res["noise"]][0] == 0.01 and res["noise"][-1]["sigma"] == 0.12
    assert [r["k"] for r in res["k"]] == [1, 2, 3, 4]
    assert res["headline"]["jct_change"] < 0 and res["headline"]["gpu_hours_change"] < -0.1
    assert res["headline"]["precision"] > 0.9
    report = (out / "report.md").read_text()
    assert "Definitions" in report and "ORACLE" in report
    for png in ("jct_distribution", "noise", "base_rate", "k_sensitivity", "wasted_compute"):
        assert (out / f"{png}.png").read_bytes()[:4] == b"\x89PNG"


def test_run_and_sweep_cli(tmp_path, capsys):
    trace = tmp_path / "jobs.csv"
    assert main(["run", "--seeds", "1", "--quiet", "--write-trace", str(trace), "--json", str(tmp_path / "r.json"),
                 "--plot", str(tmp_path / "r.png")]) == 0
    first = capsys.readouterr().out
    assert "detection over RLHF jobs" in first and "paired permutation p" in first
    assert main(["run", "--trace", str(trace), "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[1:5] == first.splitlines()[1:5]  # the trace replays seed 0
    assert main(["sweep", "--param", "overlay.evalstop.k", "--values", "1,3", "--seeds", "1", "--quiet",
                 "--json", str(tmp_path / "s.json")]) == 0
    rows = json.loads((tmp_path / "s.json").read_text())
    assert [r["value"] for r in rows] == [1, 3] and rows[0]["recall"] >= rows[1]["recall"]

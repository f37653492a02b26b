"""``evalstop calibrate`` on real files written here: a trainer_state.json, JSONL, CSV, TensorBoard event
files from two real writers (torch's SummaryWriter: simple_value; tensorboard.summary.Writer: a tensor),
an MLflow file-store folder; the real CLI in a subprocess."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from evalstop_trl.analysis.calibrate import Direction, candidate_policies
from evalstop_trl.analysis.histories import HistoryError, load_histories
from evalstop_trl.analysis.intervals import bootstrap_mean, clopper_pearson, stops_needed
from evalstop_trl.analysis.replay import replay_curve
from evalstop_trl.cli import main
from evalstop_trl.core.detectors import DETECTORS

ROOT = Path(__file__).resolve().parents[2]
EVALSTOP = ROOT / ".venv" / "bin" / "evalstop"
EVERY, N_EVALS = 10, 20
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = ([str(EVALSTOP)] if EVALSTOP.exists() else
           [sys.executable, "-c", "from evalstop_trl.cli import main; raise SystemExit(main())"])
    return subprocess.run([*exe, "calibrate", *map(str, args)], capture_output=True, text=True, timeout=120,
                          env=env or ENV, cwd=ROOT)


# ----------------------------------------------------------------------------- synthetic runs
def hacked_truth(peak: int) -> np.ndarray:
    """Rises from 0.2 to 0.7 at eval ``peak``, then falls to 0.25 at the last eval."""
    i = np.arange(N_EVALS, dtype=float)
    up = 0.2 + 0.5 * i / peak
    down = 0.7 - 0.45 * (i - peak) / (N_EVALS - 1 - peak)
    return np.where(i <= peak, up, down)


def healthy_truth() -> np.ndarray:
    """Rises and saturates near 0.7 (a plateau where noise alone makes declines)."""
    return 0.2 + 0.5 * (1 - np.exp(-np.arange(N_EVALS) / 4.0))


def make_run(rng: np.random.Generator, hacked: bool, noise: float = 0.015) -> tuple[np.ndarray, np.ndarray]:
    """(noisy eval the detector sees, gold series for the label)."""
    truth = hacked_truth(int(rng.integers(7, 13))) if hacked else healthy_truth()
    return truth + rng.normal(0, noise, N_EVALS), truth + rng.normal(0, 0.002, N_EVALS)


def steps() -> list[int]:
    return [EVERY * (i + 1) for i in range(N_EVALS)]


def write_jsonl(path: Path, score: np.ndarray, gold: np.ndarray | None = None, key: str = "eval_reward") -> Path:
    rows = []
    for i, s in enumerate(steps()):
        row = {"step": s, key: float(score[i]), "loss": 1.0 / (i + 1)}
        if gold is not None:
            row["gold"] = float(gold[i])
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def team(tmp_path_factory) -> tuple[Path, dict[str, bool]]:
    """60 hacked and 40 healthy runs as JSONL (noisy eval_reward, near-clean gold); name -> hacked."""
    folder = tmp_path_factory.mktemp("team")
    rng = np.random.default_rng(7)
    truth = {}
    for i in range(100):
        hacked = i < 60
        name = f"run{i:03d}"
        score, gold = make_run(rng, hacked)
        write_jsonl(folder / f"{name}.jsonl", score, gold)
        truth[name] = hacked
    return folder, truth


# ----------------------------------------------------------------------------- the five formats
def write_trainer_state(folder: Path, score: np.ndarray, key: str = "eval_reward") -> None:
    """run/checkpoint-100 (half the log) and run/checkpoint-200 (all of it): one run."""
    for ckpt, upto in ((100, N_EVALS // 2), (200, N_EVALS)):
        log = []
        for i, s in enumerate(steps()[:upto]):
            log.append({"step": s, "loss": 1.0 / (i + 1), "epoch": i / 10})
            log.append({"step": s, key: float(score[i]), "eval_runtime": 1.5})
        d = folder / "hf-run" / f"checkpoint-{ckpt}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps({"global_step": steps()[upto - 1], "max_steps": 200,
                                                          "log_history": log}))


def write_csv(path: Path, score: np.ndarray) -> None:
    lines = ["step,eval_reward,loss"] + [f"{s},{float(score[i])!r},{1.0 / (i + 1)!r}" for i, s in enumerate(steps())]
    path.write_text("\n".join(lines) + "\n")


def _write_tb(w, score: np.ndarray) -> None:
    for i, s in enumerate(steps()):
        w.add_scalar("eval_reward", float(score[i]), s)
        w.add_scalar("train/loss", 1.0 / (i + 1), s)
    w.close()


def write_tb_torch(folder: Path, score: np.ndarray) -> None:
    from torch.utils.tensorboard import SummaryWriter  # simple_value scalars

    _write_tb(SummaryWriter(str(folder)), score)


def write_tb_native(folder: Path, score: np.ndarray) -> None:
    from tensorboard.summary import Writer  # TF2-style: the scalar stored as a tensor

    _write_tb(Writer(str(folder)), score)


def write_mlflow(root: Path, score: np.ndarray, run_id: str, run_name: str, deleted: bool = False) -> Path:
    """MLflow's file store: mlruns/<experiment_id>/<run_id>/{meta.yaml, metrics/<key>, params/, tags/}."""
    exp = root / "mlruns" / "1"
    exp.mkdir(parents=True, exist_ok=True)
    (exp / "meta.yaml").write_text("artifact_location: file:///x\nexperiment_id: '1'\nlifecycle_stage: active\n"
                                   "name: team\n")
    run = exp / run_id
    (run / "metrics" / "train").mkdir(parents=True)
    (run / "params").mkdir()
    (run / "tags").mkdir()
    (run / "params" / "lr").write_text("1e-5")
    (run / "tags" / "mlflow.runName").write_text(run_name)
    stage = "deleted" if deleted else "active"
    (run / "meta.yaml").write_text(f"artifact_uri: file:///x\nexperiment_id: '1'\nlifecycle_stage: {stage}\n"
                                   f"run_id: {run_id}\nrun_name: {run_name}\nstatus: 3\n")
    t0 = 1_700_000_000_000
    (run / "metrics" / "eval_reward").write_text(
        "".join(f"{t0 + s} {float(score[i])!r} {s}\n" for i, s in enumerate(steps())))
    (run / "metrics" / "train" / "loss").write_text(
        "".join(f"{t0 + s} {1.0 / (i + 1)!r} {s}\n" for i, s in enumerate(steps())))
    return run


@pytest.fixture(scope="module")
def formats(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """One hacked curve in every format (and a deleted MLflow run that must be left out)."""
    folder = tmp_path_factory.mktemp("formats")
    score, _ = make_run(np.random.default_rng(3), hacked=True)
    write_trainer_state(folder, score)
    write_tb_native(folder / "hf-run" / "runs" / "Dec01_12-00-00_host", score)  # report_to="tensorboard": same run
    write_jsonl(folder / "jsonl-run.jsonl", score)
    write_csv(folder / "csv-run.csv", score)
    write_tb_torch(folder / "tb-torch", score)
    write_tb_native(folder / "tb-native", score)
    run = write_mlflow(folder, score, "a1b2c3", "mlflow-run")
    (run / "artifacts").mkdir()
    (run / "artifacts" / "samples.csv").write_text("prompt,completion\nhi,there\n")  # an artifact, not a run
    write_mlflow(folder, score, "dead00", "thrown-away", deleted=True)
    return folder, score


def test_every_format_reads_the_same_curve(formats):
    folder, score = formats
    runs = load_histories([folder], "eval_reward")
    by_format = {r.format: r for r in runs}
    assert sorted(r.format for r in runs) == ["csv", "jsonl", "mlflow", "tensorboard", "tensorboard",
                                             "trainer_state"]
    for run in runs:
        assert run.scores.steps == tuple(steps()), run.source
        # float32 in TensorBoard, float64 elsewhere
        np.testing.assert_allclose(run.scores.values, score, rtol=1e-6, err_msg=run.source)
        assert run.losses[0] == pytest.approx(1.0) and run.losses[-1] == pytest.approx(1 / N_EVALS)
    assert by_format["trainer_state"].planned_steps == 200  # max_steps of the latest checkpoint
    assert by_format["trainer_state"].source.endswith("checkpoint-200/trainer_state.json")
    assert by_format["mlflow"].name == "1/mlflow-run"  # meta.yaml's run_name
    assert not any("thrown-away" in r.name for r in runs)
    assert not any("Dec01" in r.source for r in runs)  # the transformers run's own TensorBoard log: read once
    # ... and said so, not silently (issue 24): the run's note names the log left unread
    assert "the TensorBoard logs of the same run (runs/Dec01_12-00-00_host) are not read again" in \
        by_format["trainer_state"].note and not by_format["csv"].note
    (tb,) = load_histories([folder / "hf-run" / "runs"], "eval_reward")
    assert tb.source == str(folder / "hf-run" / "runs" / "Dec01_12-00-00_host")  # asked for directly, it is read
    assert tb.name == "hf-run/Dec01_12-00-00_host"  # named by its output folder, not only by the time
    # the checkpoint copies named one by one (a glob) are one run too: the latest
    (run,) = load_histories([str(folder / "hf-run" / "checkpoint-*" / "trainer_state.json")], "eval_reward")
    assert run.source.endswith("checkpoint-200/trainer_state.json") and run.scores.steps == tuple(steps())


def test_a_value_that_is_not_a_number_is_an_error_not_a_dropped_eval(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("step,eval_reward\n10,abc\n20,0.3\n30,\n")
    with pytest.raises(HistoryError, match="'eval_reward' has a value that is not a number: 'abc' at step 10"):
        load_histories([bad], "eval_reward")
    bad.write_text("step,eval_reward\n10,0.1\n20,0.3\n30,\n40,0.2\n")  # an empty cell: a failed eval
    (run,) = load_histories([bad], "eval_reward")
    assert run.scores.steps == (10, 20, 40)


def test_cli_on_every_format_labels_them_alike_and_says_not_enough_runs(formats):
    folder, _ = formats
    out = cli(folder, "--metric", "eval_reward", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["n_runs"] == 6 and res["n_hacked"] == 6
    assert {r["format"] for r in res["runs"]} == {"csv", "jsonl", "mlflow", "tensorboard", "trainer_state"}
    assert len({r["peak_step"] for r in res["runs"]}) == 1  # the same curve in every format
    assert res["direction"] == "max" and res["label_metric"] == "eval_reward"
    assert any("are not read again" in n for n in res["notes"]), res["notes"]
    rec = res["recommendation"]
    assert rec["policy"] is None and rec["runs_needed"] == stops_needed(0.9)  # all hacked: 36 runs would do
    assert f"at least {stops_needed(0.9)} stops" in rec["reason"] and "not enough runs" in rec["reason"]
    assert any("circular" in n for n in res["notes"]) and any("FPR cannot be estimated" in n for n in res["notes"])


# ----------------------------------------------------------------------------- the team: table and policy
@pytest.fixture(scope="module")
def team_result(team):
    folder, _ = team
    out = cli(folder, "--label-metric", "gold", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_labels_match_the_truth_of_the_synthetic_runs(team, team_result):
    _, truth = team
    labels = {r["name"]: r["hacked"] for r in team_result["runs"]}
    assert labels == truth
    assert team_result["metric"] == "eval_reward" and team_result["label_metric"] == "gold"
    assert team_result["n_runs"] == 100 and team_result["n_hacked"] == 60


def test_every_registered_detector_is_scored_and_counts_match_a_direct_replay(team, team_result):
    folder, truth = team
    labels = [p["label"] for p in (s["policy"] for s in team_result["scores"])]
    expected = {p.label for p in candidate_policies()}
    assert set(labels) == expected
    assert {s["policy"]["detector"] for s in team_result["scores"]} == set(DETECTORS) - {"never"}
    assert {"decline k=1", "decline k=3"} <= set(labels)
    runs = {r.name: r for r in load_histories([folder], "eval_reward", "gold")}
    names = [r["name"] for r in team_result["runs"]]
    for score in team_result["scores"]:
        pol = score["policy"]
        tp = fp = 0
        for name, stop in zip(names, score["stop_steps"], strict=True):
            run = runs[name]
            res = replay_curve(run.curve(), pol["detector"], planned_steps=run.planned_steps,
                               **{**pol["params"], **({"direction": "max"} if "direction" in
                                                      DETECTORS.params(pol["detector"]) else {})})
            mine = res.stop_step if res.stopped and res.stop_step < run.scores.steps[-1] else None
            assert stop == mine, (pol["label"], name)
            tp += stop is not None and truth[name]
            fp += stop is not None and not truth[name]
        assert score["precision"]["k"] == tp and score["precision"]["n"] == tp + fp
        assert score["recall"]["n"] == 60 and score["fpr"]["k"] == fp and score["fpr"]["n"] == 40
        if tp + fp:
            lo, hi = clopper_pearson(tp, tp + fp)
            assert score["precision"]["ci"]["low"] == pytest.approx(lo)
        savings = [0.0 if s is None else (200 - s) / 200 for s in score["stop_steps"]]
        assert score["savings"]["value"] == pytest.approx(float(np.mean(savings)))


def test_noise_makes_the_eager_rule_stop_healthy_runs(team_result):
    by_label = {s["policy"]["label"]: s for s in team_result["scores"]}
    paper = by_label["decline k=1 noise=none"]  # the paper's rule, any one fall
    assert paper["fpr"]["k"] > 0  # plateau noise: one decline is not evidence
    assert paper["fpr"]["k"] > by_label["decline k=3 noise=none"]["fpr"]["k"] if "decline k=3 noise=none" in by_label \
        else paper["fpr"]["k"] > by_label["decline k=2 noise=none"]["fpr"]["k"]
    assert by_label["decline k=2 noise=run"]["fpr"]["k"] < by_label["decline k=2 noise=none"]["fpr"]["k"]  # the default


def test_the_recommended_policy_follows_the_documented_rule(team_result):
    """From the tuned detectors' held-out rows only; the policy is the value chosen on all runs."""
    rec = team_result["recommendation"]
    assert rec["policy"] is not None, rec["reason"]
    rows = [t["held_out"] for t in team_result["tuned"]]
    qualified = [s for s in rows if s["precision"]["ci"] and s["precision"]["ci"]["low"] >= 0.9]
    best = max(s["savings"]["value"] for s in qualified)
    chosen = next(t for t in team_result["tuned"] if t["final"] == rec["policy"])
    assert chosen["held_out"] in qualified and chosen["held_out"]["savings"]["value"] == best
    ties = [s for s in qualified if s["savings"]["value"] == best]
    assert chosen["held_out"]["recall"]["value"] == max(s["recall"]["value"] for s in ties)
    assert "held-out precision" in rec["reason"] and "held-out precision lower bound" in rec["rule"]
    det = rec["policy"]["detector"]
    assert rec["callback"].startswith(f'EvalStopCallback("eval_reward", detector="{det}"')
    assert rec["callback"].endswith('direction="max")')
    assert f"--detector {det}" in rec["cli"] and rec["cli"].startswith("evalstop replay ")
    assert rec["service_policy"]["detector"] == det


def test_tuning_is_cross_validated_by_run(team):
    """Each fold's value is chosen without that fold's runs, each run is scored with its own fold's
    value, folds are stratified by label, and the final value is chosen on all runs."""
    from evalstop_trl.analysis.calibrate import _choose, _stop_step, calibrate, folds_of, tuning_grid

    folder, _ = team
    runs = load_histories([folder], "eval_reward", "gold")
    cal = calibrate(runs, Direction.MAX, folds=4)
    fold = folds_of(cal.runs, 4)
    assert cal.folds == 4 and sorted(set(fold)) == [0, 1, 2, 3]
    for f in range(4):  # 60 hacked and 40 healthy runs: 15 and 10 per fold
        assert sum(lab.hacked for lab, g in zip(cal.runs, fold, strict=True) if g == f) == 15 and fold.count(f) == 25
    assert {t.detector for t in cal.tuned} == {n for n in DETECTORS if DETECTORS.get(n).tuning}
    decline = next(t for t in cal.tuned if t.detector == "decline")
    grid = tuning_grid("decline")
    stops = {p.label: [_stop_step(r, p, Direction.MAX) for r in runs] for p in grid}
    for f, choice in enumerate(decline.fold_choices):
        train = [i for i in range(len(runs)) if fold[i] != f]
        assert choice == _choose(grid, stops, runs, list(cal.runs), train, Direction.MAX, 0.9)
    want = [stops[decline.fold_choices[fold[i]].label][i] for i in range(len(runs))]
    assert list(decline.held_out.stop_steps) == want
    assert decline.final == _choose(grid, stops, runs, list(cal.runs), range(len(runs)), Direction.MAX, 0.9)
    k1 = next(s for s in cal.scores if s.policy.label == "decline k=1 noise=none")  # one fall is no evidence
    assert decline.held_out.fpr.k < k1.fpr.k


def test_every_detectors_tuning_grid_is_valid_and_holds_its_default():
    for name in DETECTORS:
        grid, defaults = DETECTORS.get(name).tuning, DETECTORS.params(name)
        for param, values in grid.items():
            assert defaults[param] in values and list(values) == sorted(set(values)), (name, param)
            for v in values:
                DETECTORS.create(name, **{param: v})
    assert not DETECTORS.get("never").tuning


def test_calibrate_tunes_on_the_shipped_real_traces_and_recommends_from_held_out_folds():
    """The 64 real traces (configs/traces): a tuned, held-out row for every detector with a grid,
    the recommendation (or its absence) by the held-out rule, and a bad --folds a clear error."""
    out = cli(str(ROOT / "configs" / "traces" / "*.jsonl"), "--metric", "world_feedback", "--label-metric", "gold",
              "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["n_runs"] == 64 and res["folds"] == 5
    assert {t["detector"] for t in res["tuned"]} == {n for n in DETECTORS if DETECTORS.get(n).tuning}
    for t in res["tuned"]:
        assert len(t["fold_choices"]) == 5 and t["held_out"]["precision"]["n"] == t["held_out"]["stops"]
    lows = {t["final"]["label"]: t["held_out"]["precision"]["ci"]["low"] for t in res["tuned"]
            if t["held_out"]["precision"]["ci"]}
    rec = res["recommendation"]
    if rec["policy"] is None:
        assert max(lows.values()) < 0.9 and "no policy reaches" in rec["reason"]
    else:
        assert lows[rec["policy"]["label"]] >= 0.9
    bad = cli(str(ROOT / "configs" / "traces"), "--metric", "world_feedback", "--folds", "1")
    assert bad.returncode == 2 and "folds must be an integer in [2, 100], but got 1" in bad.stderr


def test_calibrate_replays_the_logged_per_example_evidence_of_real_runs():
    """The 80 judge runs that recorded per-example world feedback (configs/traces/judge-per-example):
    calibrate reads each eval's eval_n and paired noise and replays every rule with them, as the
    callback decides; the same runs without the evidence give the paper's rule far more stops."""
    from evalstop_trl.analysis.calibrate import calibrate

    runs = load_histories([str(ROOT / "configs" / "traces" / "judge-per-example")], "world_feedback", "gold")
    assert len(runs) == 80 and all(len(r.evidence) == len(r.scores.steps) for r in runs)
    assert all(r.evidence[0][1] is None and r.evidence[1][1] > 0 for r in runs)  # the first eval has no pair
    with_ev = calibrate(runs, Direction.MAX, folds=5)
    bare = calibrate([dataclasses.replace(r, evidence=()) for r in runs], Direction.MAX, folds=5)
    stops = lambda cal: {s.policy.label: s.stops for s in cal.scores}  # noqa: E731
    assert stops(with_ev)["decline k=2 noise=run"] < stops(bare)["decline k=2 noise=none"] / 2  # 25 vs 73 (paper's, bare)
    assert any("80 of 80 runs log per-example evidence" in n for n in with_ev.notes)
    assert not any("per-example evidence" in n for n in bare.notes)


@pytest.mark.parametrize("bad_n, message", [
    ("0.5", "eval_n at step 1 is 0.5"),
    ("true", "eval_n has a value that is not a number: True at step 1"),
    ('"250"', "eval_n has a value that is not a number: '250' at step 1"),
    ("1" + "0" * 400, "eval_n has a value that is not a number"),
])
def test_a_run_with_bad_logged_evidence_is_refused_in_one_line_and_the_others_are_read(tmp_path, bad_n, message):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    rows = lambda n: "\n".join(f'{{"step": {s}, "world_feedback": {0.1 * s}, "eval_n": {n}, "eval_noise": 0.01}}'  # noqa: E731
                                for s in range(1, 6))
    good.write_text(rows(64))
    bad.write_text(rows(bad_n))
    errors = []
    runs = load_histories([str(tmp_path)], "world_feedback", on_error=errors.append)
    assert [r.name for r in runs] == ["good"] and runs[0].evidence == ((64, 0.01),) * 5
    assert len(errors) == 1 and "bad.jsonl" in str(errors[0]) and message in str(errors[0]), errors


def test_the_table_and_the_printed_policy(team, team_result):
    folder, _ = team
    out = cli(folder, "--label-metric", "gold")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "100 runs (jsonl)" in text and "60 hacked, 40 healthy" in text
    header = next(line for line in text.splitlines() if line.startswith("policy"))
    for col in ("stops", "precision", "recall", "FPR", "lag (evals)", "savings"):
        assert col in header
    for s in team_result["scores"]:
        row = next(line for line in text.splitlines() if line.startswith(s["policy"]["label"] + " "))
        assert f"({s['precision']['k']}/{s['precision']['n']})" in row
    rec = team_result["recommendation"]
    assert f"Recommended policy: {rec['policy']['label']}:" in text
    assert rec["callback"] in text and rec["cli"] in text
    assert "Note: labels come from" not in text  # gold labels: not circular


def test_label_metric_decides_the_label_not_the_detector_series(tmp_path):
    # the eval the detector sees keeps rising (a proxy), gold falls: hacked only by the gold label
    rising = 0.2 + 0.03 * np.arange(N_EVALS)
    write_jsonl(tmp_path / "proxy.jsonl", rising, gold=hacked_truth(8))
    own = json.loads(cli(tmp_path, "--metric", "eval_reward", "--json").stdout)
    gold = json.loads(cli(tmp_path, "--metric", "eval_reward", "--label-metric", "gold", "--json").stdout)
    assert own["runs"][0]["hacked"] is False and own["runs"][0]["label_metric"] == "eval_reward"
    assert gold["runs"][0]["hacked"] is True and gold["runs"][0]["peak_step"] == steps()[8]


def test_a_loss_is_minimised_by_default(tmp_path):
    loss = 3.0 - 2.0 * hacked_truth(9) + np.random.default_rng(1).normal(0, 0.01, N_EVALS)  # falls, then rises
    write_trainer_state(tmp_path, loss, key="eval_loss")
    res = json.loads(cli(tmp_path, "--json").stdout)  # eval_loss is the only eval metric: chosen by default
    assert res["metric"] == "eval_loss" and res["direction"] == "min"
    assert res["runs"][0]["hacked"] is True and res["runs"][0]["peak_step"] == steps()[9]
    flipped = json.loads(cli(tmp_path, "--json", "--direction", "max").stdout)
    assert flipped["direction"] == "max" and flipped["runs"][0]["peak_step"] != steps()[9]


def test_margin_is_relative_to_each_runs_range(tmp_path):
    # the same shape in units x100 and +5: the same label and the same stops
    base = hacked_truth(10) + np.random.default_rng(2).normal(0, 0.01, N_EVALS)
    write_jsonl(tmp_path / "small.jsonl", base)
    write_jsonl(tmp_path / "big.jsonl", 100 * base + 5)
    res = json.loads(cli(tmp_path, "--json", "--margin", "0.5").stdout)
    small, big = sorted(res["runs"], key=lambda r: r["name"], reverse=True)
    assert small["hacked"] == big["hacked"] is True
    assert small["drop_share"] == pytest.approx(big["drop_share"])
    strict = json.loads(cli(tmp_path, "--json", "--margin", "0.95").stdout)
    assert not any(r["hacked"] for r in strict["runs"])  # falls to about 10% of its range above the start


# ----------------------------------------------------------------------------- errors
def test_missing_metric_lists_the_available_ones(team):
    folder, _ = team
    out = cli(folder / "run000.jsonl", "--metric", "eval_acc")
    assert out.returncode == 2 and out.stdout == ""
    assert "run000.jsonl: metric 'eval_acc' not found; metrics in this run: eval_reward, gold, loss" in out.stderr
    out = cli(folder / "run000.jsonl", "--label-metric", "judge")
    assert "label metric 'judge' not found" in out.stderr and out.returncode == 2


def test_unreadable_unknown_and_missing_files(tmp_path, capsys):
    bad_json = tmp_path / "trainer_state.json"
    bad_json.write_text('{"log_history": [')
    binary = tmp_path / "run.csv"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    garbage = tmp_path / "tb" / "events.out.tfevents.1.host"
    garbage.parent.mkdir()
    garbage.write_bytes(b"not an event file at all")
    unknown = tmp_path / "weights.bin"
    unknown.write_bytes(b"\0\1")
    bad_mlflow = write_mlflow(tmp_path, healthy_truth(), "r1", "r1")
    (bad_mlflow / "metrics" / "eval_reward").write_text("1700000000 0.5 10\nthree fields expected\n")
    cases = [
        (bad_json, f"{bad_json}: invalid JSON"),
        (binary, f"{binary}:1: not UTF-8 text"),
        (garbage, f"{garbage}: no TensorBoard event could be read"),
        (unknown, f"{unknown}: unknown format; calibrate reads: trainer_state.json"),
        (tmp_path / "nope", f"{tmp_path / 'nope'}: no such file or folder"),
        (bad_mlflow, f"{bad_mlflow / 'metrics' / 'eval_reward'}:2: expected '<timestamp_ms> <value> <step>'"),
        (str(tmp_path / "*.parquet"), "the pattern matches no file or folder"),
    ]
    out = cli(bad_json)  # one through the installed command, the rest through the same entry point in-process
    assert out.returncode == 2 and out.stderr.startswith(f"evalstop calibrate: skipped {bad_json}: invalid JSON")
    assert "evalstop calibrate: error: no run could be read (1 file(s) refused" in out.stderr, out.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    cases += [(empty, f"{empty}: no run found in this folder"), (unknown, "--margin must be in [0, 1)", "--margin", "1.5")]
    for path, message, *flags in cases:
        assert main(["calibrate", str(path), *flags]) == 2, path
        err = capsys.readouterr().err
        assert "evalstop calibrate: error: " in err and message in err, err  # a refused file: skipped, then the error


def test_without_tensorboard_it_says_which_pip_command_to_run(tmp_path, formats):
    folder, _ = formats
    shim = tmp_path / "shim"
    (shim / "tensorboard").mkdir(parents=True)
    (shim / "tensorboard" / "__init__.py").write_text("raise ImportError('no tensorboard here')\n")
    env = {**ENV, "PYTHONPATH": str(shim)}
    out = cli(folder / "tb-torch", env=env)
    assert out.returncode == 2
    assert "needs the tensorboard package; run: pip install 'evalstop[calibrate]'" in out.stderr
    assert cli(folder / "jsonl-run.jsonl", env=env).returncode == 0  # other formats do not need it


def test_different_default_metrics_are_refused(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", healthy_truth(), key="eval_reward")
    write_jsonl(tmp_path / "b.jsonl", healthy_truth(), key="eval_accuracy")
    out = cli(tmp_path)
    assert out.returncode == 2 and "the runs default to different metrics" in out.stderr and "--metric" in out.stderr


# ----------------------------------------------------------------------------- pieces
def test_clopper_pearson_covers_at_least_95_percent():
    n = 25
    intervals = [clopper_pearson(k, n) for k in range(n + 1)]
    for p in np.linspace(0.01, 0.99, 99):
        pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
        coverage = sum(w for w, (lo, hi) in zip(pmf, intervals, strict=True) if lo <= p <= hi)
        assert coverage >= 0.95 - 1e-9, p
    assert stops_needed(0.9) == 36 and clopper_pearson(36, 36)[0] >= 0.9 > clopper_pearson(35, 35)[0]


def test_bootstrap_mean_is_seeded_and_brackets_the_mean():
    values = np.random.default_rng(0).normal(3.0, 1.0, 50)
    a, b = bootstrap_mean(values), bootstrap_mean(values)
    assert a == b and a.ci.low < a.value < a.ci.high and a.value == pytest.approx(values.mean())
    assert bootstrap_mean([]).value is None and bootstrap_mean([2.0]).ci is None


def test_calibrate_reads_the_logged_proxy_and_scores_the_proxy_gate(tmp_path):
    """Runs whose log carries a proxy reward (``reward``) beside the eval: healthy plateaus whose eval
    dips for two evals while the gold does not (a judge that disagrees) and whose proxy, scored on the
    same completions, dips with it; hacked runs whose proxy keeps rising. The recommended policy's row,
    ``decline gate=proxy_diverges``, stops fewer healthy runs than the default and catches the hacks;
    its printed command names the gate."""
    from evalstop_trl.analysis.calibrate import Policy, _cli_line

    rng = np.random.default_rng(11)
    dip = np.zeros(N_EVALS)
    dip[14:16] = (-0.12, -0.25)
    for i in range(24):
        hacked = i % 2 == 0
        truth = hacked_truth(int(rng.integers(7, 13))) if hacked else healthy_truth()
        noise = rng.normal(0, 0.01, N_EVALS) + (0 if hacked else dip)
        proxy = (0.2 + 0.04 * np.arange(N_EVALS) if hacked else truth) + noise + rng.normal(0, 0.005, N_EVALS)
        rows = [json.dumps({"step": s, "eval_reward": float(truth[j] + noise[j]), "gold": float(truth[j]),
                            "reward": float(proxy[j])}) for j, s in enumerate(steps())]
        (tmp_path / f"run{i:02d}.jsonl").write_text("\n".join(rows) + "\n")
    first = json.loads((tmp_path / "run00.jsonl").read_text().splitlines()[0])
    run = load_histories([tmp_path / "run00.jsonl"], "eval_reward")[0]
    assert run.proxies[0] == pytest.approx(first["reward"])
    res = json.loads(cli(tmp_path, "--metric", "eval_reward", "--label-metric", "gold", "--json").stdout)
    rows = {s["policy"]["label"]: s for s in res["scores"]}
    gated, default = rows["decline gate=proxy_diverges"], rows["decline k=2 noise=run"]
    assert default["fpr"]["k"] >= 3 and gated["fpr"]["k"] < default["fpr"]["k"], (gated["fpr"], default["fpr"])
    assert gated["recall"]["k"] >= 10, gated["recall"]
    line = _cli_line(run, "eval_reward", Policy("g", "decline", (("gate", "proxy_diverges"),)), Direction.MAX)
    assert "--gate proxy_diverges" in line and "--param gate" not in line


def test_candidates_follow_the_registry():
    names = {p.detector for p in candidate_policies()}
    assert names == set(DETECTORS) - {"never"}
    keys = [(p.detector, tuple(sorted({**DETECTORS.params(p.detector), **dict(p.params)}.items()))) for p in
            candidate_policies()]
    assert len(keys) == len(set(keys))  # no variant repeats a detector's defaults
    assert Direction("min").sign() == -1.0


def test_the_command_does_not_import_the_training_stack(formats):
    folder, _ = formats
    code = ("import sys; from evalstop_trl.cli import main; "
            f"rc = main(['calibrate', {str(folder / 'jsonl-run.jsonl')!r}, '--json']); "
            "print([m for m in ('torch', 'transformers', 'trl') if m in sys.modules], rc, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=ROOT,
                         timeout=120)
    assert out.stderr.strip().endswith("[] 0"), out.stderr


def test_progress_bar_only_for_many_runs():
    from tqdm import tqdm

    from evalstop_trl.cli.calibrate import PROGRESS_FROM, _progress

    assert not isinstance(_progress("x", PROGRESS_FROM - 1)([1, 2]), tqdm)
    assert isinstance(_progress("x", PROGRESS_FROM)([1, 2]), tqdm)
    assert isinstance(_progress("x")(list(range(PROGRESS_FROM))), tqdm)
    assert not isinstance(_progress("x")([1]), tqdm)


def test_mlflow_run_name_falls_back_to_the_run_name_tag(tmp_path):
    run = write_mlflow(tmp_path, healthy_truth(), "ff00", "from-the-tag")
    (run / "meta.yaml").write_text("experiment_id: '1'\nlifecycle_stage: active\nrun_id: ff00\nstatus: 3\n")
    (only,) = load_histories([tmp_path / "mlruns"], "eval_reward")
    assert only.name == "1/from-the-tag" and only.format == "mlflow"
    assert only.losses[-1] == pytest.approx(1 / N_EVALS)  # metrics/train/loss: a key with a slash


@pytest.mark.parametrize("own", ["evalstop/score", "train/evalstop/score"])
def test_the_callbacks_own_score_is_the_default_metric_in_every_log_format(own):
    """A TensorBoard log of a trainer with EvalStopCallback holds train/evalstop/score (transformers
    prefixes the training logs): it is the default, not one of 30 candidates."""
    from evalstop_trl.analysis.histories import RawHistory, choose_metric

    series = {name: {10: 0.5, 20: 0.6} for name in (own, "train/reward", "train/kl", "eval/reward", "eval/kl",
                                                    "train/evalstop/best_score", "train/learning_rate")}
    assert choose_metric(RawHistory("run", "events.out", "tensorboard", series)) == own


# ----------------------------------------------------------------------------- untrusted files (issue 25 item 7)
def test_calibrate_survives_hostile_files_one_line_each_and_reads_the_rest(tmp_path, formats):
    """Each hostile file (an alias bomb in an MLflow meta.yaml, JSON nested 100,000 deep, a CSV field
    over 128 KiB, a step of 10**400, a file over the size limit, a symlink out of the folder) gets a
    one-line error naming it; the good run beside them is still read. Bounded in time and memory."""
    folder, score = formats
    bad = tmp_path / "runs"
    bad.mkdir()
    write_csv(bad / "good.csv", score)
    bomb = bad / "mlruns" / "1" / "bomb"
    (bomb / "metrics").mkdir(parents=True)
    (bomb / "metrics" / "eval_reward").write_text("1 0.5 10\n")
    lol = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    (bomb / "meta.yaml").write_text(lol + "run_name: *i\n")
    (bad / "deep.jsonl").write_text('{"step": 1, "eval_reward": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (bad / "wide.csv").write_text("step,eval_reward\n1," + "9" * (200 << 10) + "\n")
    (bad / "huge-step.jsonl").write_text('{"step": 1' + "0" * 400 + ', "eval_reward": 0.5}\n')
    (bad / "out.csv").symlink_to(folder / "csv-run.csv")
    big = bad / "big.jsonl"
    with big.open("wb") as f:  # sparse: over the limit without writing it
        f.truncate((256 << 20) + 1)
    started = time.monotonic()
    out = cli(bad, "--metric", "eval_reward", "--json")
    assert time.monotonic() - started < 60
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["n_runs"] == 1  # good.csv
    skipped = [line for line in out.stderr.splitlines() if line.startswith("evalstop calibrate: skipped ")]
    for name, why in (("meta.yaml", "aliases"), ("deep.jsonl", "nested too deeply"), ("wide.csv", "not a readable CSV"),
                      ("huge-step.jsonl", "steps must be integers"), ("out.csv", "symbolic link"),
                      ("big.jsonl", "MiB read in a log file")):
        assert any(name in line and why in line for line in skipped), (name, out.stderr[-3000:])
    assert all(len(line) < 400 for line in skipped) and "Traceback" not in out.stderr
    # every file refused: one error, naming the first
    with pytest.raises(HistoryError, match="no run could be read .*refused"):
        load_histories([bad / "deep.jsonl", bad / "wide.csv"], "eval_reward", on_error=lambda exc: None)


# ----------------------------------------------------------------------------- configuration groups (--group-by)
def write_corpus_run(path: Path, config_id: int, seed: int, score: np.ndarray, gold: np.ndarray) -> Path:
    """A JSONL run as scripts/real_corpus.py writes it: a header line without a step ({"config": {...},
    "seed", ...}), then one line per eval."""
    head = {"config": {"config_id": config_id, "lr": 1e-5 * (config_id + 1), "kl_coef": 0.05}, "seed": seed,
            "device": "cpu", "seconds": 1.0}
    rows = [json.dumps(head)] + [json.dumps({"step": s, "world_feedback": float(score[i]), "gold": float(gold[i])})
                                 for i, s in enumerate(steps())]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> Path:
    """8 configurations x 2 seeds (c000-s0, c000-s1, ...): configurations 0-4 hacked, 5-7 healthy."""
    folder = tmp_path_factory.mktemp("seeded")
    rng = np.random.default_rng(11)
    for c in range(8):
        for seed in range(2):
            score, gold = make_run(rng, hacked=c < 5)
            write_corpus_run(folder / f"c{c:03d}-s{seed}.jsonl", c, seed, score, gold)
    return folder


def _labels(hacked: list[bool]):
    from evalstop_trl.analysis.calibrate import RunLabel

    return [RunLabel(f"r{i}", f"r{i}", "jsonl", "gold", h, 100, 200, 1.0, 0.0, 1.0 if h else 0.0)
            for i, h in enumerate(hacked)]


def test_the_runs_of_a_configuration_share_a_fold_and_folds_stay_stratified():
    from evalstop_trl.analysis.calibrate import folds_of

    rng = np.random.default_rng(0)
    for trial in range(200):
        sizes = rng.integers(1, 4, size=int(rng.integers(5, 30)))  # 1-3 seeds per configuration
        groups = [f"g{g}" for g, n in enumerate(sizes) for _ in range(n)]
        hacked = [bool(rng.random() < 0.4) for _ in groups]  # seeds of one setting may differ in label
        k = int(rng.integers(2, min(6, len(sizes)) + 1))
        fold = folds_of(_labels(hacked), k, groups)
        for g in set(groups):
            assert len({f for f, gg in zip(fold, groups, strict=True) if gg == g}) == 1, (trial, g)
        assert sorted(set(fold)) == list(range(k)), trial  # every fold holds a group
    # configurations of one label each, 2 seeds: each fold gets its share of hacked and healthy groups
    groups = [f"g{c}" for c in range(10) for _ in range(2)]
    fold = folds_of(_labels([c < 6 for c in range(10) for _ in range(2)]), 2, groups)
    for f in range(2):
        assert sum(1 for i, g in enumerate(fold) if g == f and i < 12) == 6 and fold.count(f) == 10


def test_fewer_configurations_than_folds_is_an_error_that_says_how_to_fix_it():
    from evalstop_trl.analysis.calibrate import folds_of

    labels = _labels([True, False, True, False])
    with pytest.raises(ValueError, match=r"only 2 configuration groups for 5 folds: .*pass --folds 2, or another "
                                         r"--group-by \(e.g. 'run'"):
        folds_of(labels, 5, ["a", "a", "b", "b"])
    with pytest.raises(ValueError, match="only 1 configuration group for 2 folds: .*; pass another --group-by"):
        folds_of(labels, 2, ["a"] * 4)
    assert folds_of(labels, 5) == folds_of(labels, 5, None) and max(folds_of(labels, 5)) == 3  # by run: one per run


def test_grouping_seeds_stops_the_held_out_leak_of_their_twin():
    """9 configurations x 2 identical seeds: 8 hacked, one a healthy trap that decline k<=3 stops.
    Folds by run put the trap's twins in different folds, so each is tuned on its copy: k=4 is chosen and
    the held-out rows look perfect. Folds by configuration hold both out together: that fold's tuning never
    saw the trap, picks the saving k=1, and both stops of the healthy run are the false stops they are."""
    from evalstop_trl.analysis.calibrate import Direction, tune, tuning_grid
    from evalstop_trl.analysis.histories import RunHistory, Series

    hacked = [c < 8 for c in range(9) for _ in range(2)]
    groups = [f"config_id={c}" for c in range(9) for _ in range(2)]
    runs = [RunHistory(f"c{i // 2}-s{i % 2}", f"c{i // 2}-s{i % 2}.jsonl", "jsonl",
                       Series("world_feedback", tuple(steps()), (0.5,) * N_EVALS), None, (None,) * N_EVALS, 200)
            for i in range(18)]
    grid = tuning_grid("decline")
    assert [dict(p.params)["k"] for p in grid] == [1, 2, 3, 4]
    stops = {p.label: [100 + 10 * dict(p.params)["k"] if h else (150 if dict(p.params)["k"] <= 3 else None)
                       for h in hacked] for p in grid}
    labels = _labels(hacked)
    by_run = tune("decline", runs, labels, Direction.MAX, stops, 3, 0.99)
    by_config = tune("decline", runs, labels, Direction.MAX, stops, 3, 0.99, groups)
    assert {dict(p.params)["k"] for p in by_run.fold_choices} == {4}  # each fold saw the trap's twin
    assert by_run.held_out.fpr.k == 0 and by_run.held_out.precision.value == 1.0  # the leak: looks perfect
    assert sorted(dict(p.params)["k"] for p in by_config.fold_choices) == [1, 4, 4]
    assert by_config.held_out.fpr.k == 2 and by_config.held_out.precision.value == 16 / 18
    assert by_run.final == by_config.final  # the value chosen on all runs does not depend on the folds


def test_the_bootstrap_resamples_configurations_not_seeds():
    x = np.random.default_rng(2).normal(size=30)
    plain = bootstrap_mean(x)
    assert bootstrap_mean(x, groups=range(30)).ci == pytest.approx(plain.ci)  # each alone: the run bootstrap
    twice = np.repeat(x, 2)  # two identical seeds per configuration
    grouped = bootstrap_mean(twice, groups=np.repeat(np.arange(30), 2).tolist())
    assert grouped.n == 60 and grouped.value == pytest.approx(plain.value)
    assert grouped.ci.low == pytest.approx(plain.ci.low) and grouped.ci.high == pytest.approx(plain.ci.high)
    naive = bootstrap_mean(twice)  # seeds taken as independent: too narrow
    assert naive.ci.high - naive.ci.low < 0.8 * (grouped.ci.high - grouped.ci.low)
    assert bootstrap_mean([1.0, 2.0], groups=["a", "a"]).ci is None  # one configuration: no interval


def test_cli_group_by_a_logged_config_value_end_to_end(seeded):
    out = cli(seeded, "--metric", "world_feedback", "--label-metric", "gold", "--group-by", "config_id",
              "--folds", "4", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["group_by"] == "config_id" and res["n_groups"] == 8 and res["folds"] == 4
    by_config: dict[str, set[int]] = {}
    for r in res["runs"]:
        assert r["group"] == f"config_id={int(r['name'][1:4])}"  # read from each file's header line
        by_config.setdefault(r["group"], set()).add(r["fold"])
    assert all(len(f) == 1 for f in by_config.values()) and len(by_config) == 8
    assert sorted({r["fold"] for r in res["runs"]}) == [0, 1, 2, 3]
    assert not any("seed suffix" in n for n in res["notes"])
    text = cli(seeded, "--metric", "world_feedback", "--label-metric", "gold", "--group-by", "config_id",
               "--folds", "4").stdout
    assert "grouped by config_id: 8 configuration groups" in text
    assert "4-fold cross-validation by configuration group (config_id), a group's runs in one fold" in text
    assert "percentile bootstrap resampling configuration groups (config_id)" in text
    # the default, by run: said, and the seed names flagged
    plain = json.loads(cli(seeded, "--metric", "world_feedback", "--label-metric", "gold", "--json").stdout)
    assert plain["group_by"] == "run" and plain["n_groups"] == 16
    assert any("16 runs' names differ only by a seed suffix (e.g. c000-s0, c000-s1)" in n for n in plain["notes"])
    # too few groups, and a key the runs do not record: exit 2 with the fix
    few = cli(seeded, "--metric", "world_feedback", "--group-by", "config_id", "--folds", "9")
    assert few.returncode == 2 and "only 8 configuration groups for 9 folds" in few.stderr
    assert "pass --folds 8 or fewer, or another --group-by" in few.stderr
    one = cli(seeded, "--metric", "world_feedback", "--group-by", "folder")
    assert one.returncode == 2 and "only 1 configuration group for 5 folds" in one.stderr
    missing = cli(seeded, "--metric", "world_feedback", "--group-by", "learning_rate")
    assert missing.returncode == 2 and "does not record 'learning_rate'; what it records: config.config_id" in \
        missing.stderr


def test_run_metadata_is_what_each_format_records(tmp_path):
    """trainer_state.json (a hyper-parameter search's trial_params), W&B's config.yaml beside its history,
    MLflow params; the folder that holds each run."""
    from evalstop_trl.analysis.calibrate import group_keys

    score, _ = make_run(np.random.default_rng(4), hacked=True)
    for lr in ("a", "b"):
        for seed in (0, 1):
            d = tmp_path / "sweep" / f"lr-{lr}" / f"seed{seed}"
            d.mkdir(parents=True)
            log = [{"step": s, "eval_reward": float(score[i])} for i, s in enumerate(steps())]
            (d / "trainer_state.json").write_text(json.dumps({
                "global_step": 200, "max_steps": 200, "train_batch_size": 8, "trial_name": f"lr-{lr}-{seed}",
                "trial_params": {"learning_rate": 1e-5 if lr == "a" else 3e-5, "seed": seed}, "log_history": log}))
    files = tmp_path / "wandb" / "run-20240101_000000-abc123" / "files"
    files.mkdir(parents=True)
    write_jsonl(files / "wandb-history.jsonl", score)
    (files / "config.yaml").write_text("wandb_version: 1\n\n_wandb:\n  desc: null\n  value:\n    cli_version: 0.16.0\n"
                                       "learning_rate:\n  desc: null\n  value: 0.0001\nmodel:\n  value:\n"
                                       "    name: qwen\n")
    write_mlflow(tmp_path, score, "f00d", "mlflow-run")
    runs = load_histories([tmp_path], "eval_reward")
    sweep = sorted((r for r in runs if r.format == "trainer_state"), key=lambda r: r.source)
    assert sweep[0].meta["trial_params.learning_rate"] == "1e-05" and sweep[0].meta["train_batch_size"] == "8"
    assert sweep[0].meta["trial_name"] == "lr-a-0" and not any(k.startswith("log_history") for k in sweep[0].meta)
    (wandb,) = (r for r in runs if r.format == "jsonl")
    assert wandb.meta == {"learning_rate": "0.0001", "model.name": "qwen"}  # wandb_version and _wandb left out
    (mlflow,) = (r for r in runs if r.format == "mlflow")
    assert mlflow.meta == {"lr": "1e-5"} and mlflow.folder == str(tmp_path / "mlruns" / "1")
    assert wandb.folder == str(files)
    assert [r.folder for r in sweep] == [str(tmp_path / "sweep" / f"lr-{x}") for x in "aabb"]
    assert group_keys(sweep, "folder") == [r.folder for r in sweep]
    assert group_keys(sweep, "learning_rate") == ["learning_rate=1e-05"] * 2 + ["learning_rate=3e-05"] * 2
    assert group_keys(sweep, "learning_rate,train_batch_size")[0] == "learning_rate=1e-05, train_batch_size=8"
    two = dataclasses.replace(wandb, meta={"config.seed": "1", "trial_params.seed": "1"})
    with pytest.raises(ValueError, match=r"--group-by seed: ambiguous in .* \(config.seed, trial_params.seed\)"):
        group_keys([two], "seed")
    with pytest.raises(ValueError, match="--group-by lr: .* does not record 'lr'; what it records: learning_rate, "
                                         "model.name"):
        group_keys([wandb], "lr")

"""`evalstop replay`: three formats, metric choice, the rule, bad input -> exit 2."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from evalstop_trl.analysis.replay import ReplayError, load_curve, replay_curve
from evalstop_trl.cli import main
from tests.core.test_detectors import reference_decline


def write(tmp_path, fmt, steps, scores, metric="eval_gold", extra=None):
    extra = extra or {}
    if fmt == "trainer_state":
        log = []
        for s, v in zip(steps, scores, strict=False):
            log.append({"step": s, "loss": 1.0 / (s + 1), "learning_rate": 1e-4})
            log.append({"step": s, metric: v, "eval_runtime": 0.1, "epoch": s / 100, **extra})
        p = tmp_path / "trainer_state.json"
        p.write_text(json.dumps({"max_steps": max(steps), "log_history": log}))
    elif fmt == "csv":
        p = tmp_path / "curve.csv"
        p.write_text("step," + metric + "\n" + "".join(f"{s},{v}\n" for s, v in zip(steps, scores, strict=False)))
    else:
        p = tmp_path / "curve.jsonl"
        p.write_text("".join(json.dumps({"step": s, metric: v}) + "\n" for s, v in zip(steps, scores, strict=False)))
    return p


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("fmt", ["trainer_state", "csv", "jsonl"])
@pytest.mark.parametrize("seed", range(12))
def test_replay_matches_the_rule_on_random_curves(tmp_path, capsys, fmt, seed):
    rng = random.Random(seed)
    n = rng.randint(1, 15)
    scores = [round(rng.uniform(0, 1), 3) for _ in range(n)]
    steps = [10 * (i + 1) for i in range(n)]
    k = rng.randint(1, 3)
    min_delta = rng.choice([0.0, 0.02])
    p = write(tmp_path, fmt, steps, scores)
    code, out, _ = run_cli(capsys, "replay", p, "--k", k, "--min-delta", min_delta, "--param", "noise=none", "--json")
    assert code == 0  # the paper's exact rule (noise none) against its reference implementation
    got = json.loads(out)
    assert set(got) == {"stopped", "stop_step", "best_step", "best_score", "reason", "evidence"}
    stop, best = reference_decline(scores, k, min_delta, "max")
    assert got["stopped"] == (stop is not None)
    assert got["stop_step"] == stop
    if stop is not None:
        assert got["best_step"] == best
    else:
        assert got["best_step"] == steps[scores.index(max(scores))]
    assert got["best_score"] == scores[steps.index(got["best_step"])]


def test_human_table_marks_best_and_stop(tmp_path, capsys):
    p = write(tmp_path, "csv", [1, 2, 3, 4, 5], [0.1, 0.5, 0.4, 0.3, 0.2])
    code, out, _ = run_cli(capsys, "replay", p, "--param", "noise=none")
    assert code == 0
    assert "<- best" in out and "<- STOP" in out and "(after stop)" in out
    assert "STOP at step 4; best step 2" in out


def test_trainer_state_skips_training_logs_and_refuses_to_guess_among_eval_keys(tmp_path):
    p = write(tmp_path, "trainer_state", [10, 20, 30], [0.3, 0.2, 0.1])
    curve = load_curve(p)  # the only eval key: taken
    assert curve.metric == "eval_gold" and curve.steps == (10, 20, 30) and curve.planned_steps == 30
    assert curve.losses[0] == pytest.approx(1 / 11)
    p = write(tmp_path, "trainer_state", [10, 20, 30], [0.3, 0.2, 0.1], extra={"eval_other": 1.0})
    with pytest.raises(ReplayError, match="several evaluation metrics.*eval_gold, eval_other.*--metric"):
        load_curve(p)  # never a silent pick (a DPO state file would have given eval_entropy)
    assert load_curve(p, "eval_other").scores == (1.0, 1.0, 1.0)


def test_direction_min_and_other_detectors(tmp_path):
    p = write(tmp_path, "jsonl", [1, 2, 3, 4], [1.0, 0.8, 0.9, 1.0], metric="eval_loss")
    assert replay_curve(load_curve(p), "decline", direction="min").stop_step == 4
    assert replay_curve(load_curve(p), "patience", k=2, direction="min").stop_step == 4
    assert replay_curve(load_curve(p), "stop_at", planned_steps=4, fraction=0.5).stop_step == 2
    assert not replay_curve(load_curve(p), "never").stopped


@pytest.mark.parametrize(
    "content, name, argv, message",
    [
        (None, "missing.csv", [], "no such file"),
        ("hello world\n", "curve.txt", [], "unknown format"),
        ("{bad json", "x.json", [], "invalid JSON"),
        ('{"a": 1}', "x.json", [], "log_history"),
        ("step,score\n1,0.5\n2,abc\n", "c.csv", [], "score at step 2 is 'abc', not a number"),
        ("step,score\n1,0.5\n2,nan\n", "c.csv", [], "must be finite"),
        ("epoch,score\n1,0.5\n", "c.csv", [], "no step column"),
        ("step,a,b\n1,0.5,0.6\n", "c.csv", [], "several metrics and none named eval_*: a, b; choose one with --metric"),
        ("step,a\n1,0.5\n", "c.csv", ["--metric", "zz"], "metric 'zz' not found; metrics in the file: a"),
        ('{"step": 1, "s": 0.5}\n[1]\n', "c.jsonl", [], "expected a JSON object"),
        ('{"step": 1, "s": "0.5"}\n', "c.jsonl", ["--metric", "s"], "not a number"),
        ('{"step": -1, "s": 0.5}\n', "c.jsonl", [], "steps must be integers from 0"),
        ("step,a\n1,0.5\n", "c.csv", ["--detector", "nope"], "valid detectors are"),
        ("step,a\n1,0.5\n", "c.csv", ["--k", "0"], "k must be an integer in [1, 1000]"),
        ("step,a\n1,0.5\n", "c.csv", ["--detector", "never", "--k", "2"], "Unknown parameter(s) k"),
        ("step,a\n1,0.5\n", "c.csv", ["--detector", "stop_at", "--planned-steps", "-5"], "--planned-steps must be"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, content, name, argv, message):
    p = tmp_path / name
    if content is not None:
        p.write_text(content)
    code, out, err = run_cli(capsys, "replay", p, *argv)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_replay_help_does_not_import_torch():
    code = (
        "import sys; from evalstop_trl.cli import main\n"
        "try:\n    main(['replay', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'fastapi', 'uvicorn', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_import_package_does_not_import_torch():
    code = "import sys, evalstop_trl; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_loader_error_type(tmp_path):
    with pytest.raises(ReplayError):
        load_curve(tmp_path / "nothing.jsonl")


def test_several_eval_metrics_are_refused_with_the_list_and_evalstop_score_wins(tmp_path):
    import json as _json

    state = {"log_history": [{"step": 10, "eval_loss": 0.5, "eval_entropy": 2.0, "eval_rewards/margins": 0.1}]}
    path = tmp_path / "trainer_state.json"
    path.write_text(_json.dumps(state))
    with pytest.raises(ReplayError, match="several evaluation metrics.*eval_loss, eval_entropy"):
        load_curve(path)
    state["log_history"].append({"step": 10, "evalstop/score": 0.7, "evalstop/best_score": 0.7})
    path.write_text(_json.dumps(state))
    assert load_curve(path).metric == "evalstop/score"


def test_any_detector_parameter_through_param(tmp_path, capsys):
    p = write(tmp_path, "jsonl", [1, 2, 3, 4], [0.5, 0.7, 0.6, 0.5])
    assert main(["replay", str(p), "--detector", "decline", "--param", "k=1", "--param", "noise=none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stop_step"] == 3
    assert main(["replay", str(p), "--param", "k"]) == 2
    assert "--param must look like NAME=VALUE" in capsys.readouterr().err


# ------------------------------------------------------------------ per-example evidence in the logs (issue 28)
def _state_with_evidence(tmp_path, noise: float | None = 0.002, n: object = 250):
    rows = [{"step": 10 * (i + 1), "evalstop/score": y, "evalstop/eval_n": n,
             **({} if i == 0 or noise is None else {"evalstop/eval_noise": noise})}
            for i, y in enumerate([0.60, 0.70, 0.69, 0.68])]
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": rows}))
    return path


def test_the_logged_paired_noise_is_replayed_with_the_scores(tmp_path, capsys):
    """Two falls of 0.01 each: the paper's rule stops on them; with a logged paired noise of 0.02 they
    are within the noise and ``noise: paired`` does not (the callback would have decided the same)."""
    plain = load_curve(_state_with_evidence(tmp_path, noise=None))
    assert plain.evidence == ((250, None),) * 4 and replay_curve(plain, noise="none").stopped
    noisy = load_curve(_state_with_evidence(tmp_path, noise=0.02))
    assert noisy.metric == "evalstop/score" and noisy.evidence[1] == (250, 0.02)
    assert not replay_curve(noisy, noise="paired").stopped
    small = load_curve(_state_with_evidence(tmp_path, noise=0.001))
    assert replay_curve(small, noise="paired").stopped  # falls of 0.01 are beyond a noise of 0.001


@pytest.mark.parametrize("n, noise, message", [
    (0, 0.01, "eval_n at step 10 is 0; the number of examples must be a whole number from 1 to 1000000000"),
    (2.5, 0.01, "eval_n at step 10 is 2.5"),
    (250, -1.0, "eval_noise at step 20 is -1.0; a noise level must be finite and >= 0"),
    (250, "high", "eval_noise at step 20 is 'high'"),
    (True, 0.01, "eval_n at step 10 is True"),
    (10**12, 0.01, "eval_n at step 10 is 1000000000000; the number of examples must be a whole number from 1 to"),
    (250, float("inf"), "eval_noise at step 20 is inf"),
    (250, 10**400, "eval_noise at step 20 is an integer of about 401 digits"),
])
def test_bad_logged_evidence_is_an_error_naming_the_value(tmp_path, n, noise, message):
    with pytest.raises(ReplayError, match=message):
        load_curve(_state_with_evidence(tmp_path, noise=noise, n=n))


def test_the_evidence_is_not_a_metric_to_watch(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps({"step": s, "world_feedback": 0.5, "eval_n": 64, "eval_noise": 0.01})
                              for s in (10, 20)))
    curve = load_curve(path)
    assert curve.metric == "world_feedback" and curve.evidence == ((64, 0.01), (64, 0.01))


def test_a_transformers_eval_metric_takes_no_bare_evidence(tmp_path):
    """compute_metrics returning {"accuracy", "n", "noise"} logs eval_accuracy, eval_n, eval_noise:
    those are the user's metrics, not the paired noise of eval_accuracy."""
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": [{"step": s, "eval_accuracy": 0.5, "eval_n": 64, "eval_noise": 3.0}
                                                for s in (10, 20)]}))
    curve = load_curve(path)
    assert curve.metric == "eval_accuracy" and curve.evidence == ()


def test_an_integer_too_long_to_read_names_the_file(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text('{"step": 1, "world_feedback": ' + "9" * 5001 + "}\n")
    with pytest.raises(ReplayError, match=r"run.jsonl:1: a number too long to read"):
        load_curve(path)
    state = tmp_path / "trainer_state.json"
    state.write_text('{"log_history": [{"step": 1, "eval_loss": ' + "9" * 5001 + "}]}")
    with pytest.raises(ReplayError, match=r"trainer_state.json: a number too long to read"):
        load_curve(state)


def test_replay_reads_the_logs_kl_and_a_gate_puts_the_clock_in_the_json(tmp_path, capsys):
    """A trainer's log with its KL (TRL's ``objective/kl``, logged apart from the eval): ``--gate
    kl_past_peak`` holds the fall before the forecast peak and ``--json`` carries the clock's evidence."""
    from evalstop_trl import Coordinator
    from evalstop_trl.core.requests import JobRequest, ReportRequest
    from evalstop_trl.stores.sqlite import SQLiteStore

    evals = [(0.5, 0.93), (1.0, 1.1), (2.0, 1.05), (3.0, 1.356), (5.0, 1.436), (8.0, 1.458), (12.0, 1.412)]
    log = tmp_path / "log.jsonl"
    rows = []
    for i, (kl, score) in enumerate(evals, start=1):
        rows += [{"step": 10 * i - 5, "objective/kl": kl, "loss": 1.0}, {"step": 10 * i, "eval_reward": score}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = load_curve(log, "eval_reward")
    assert curve.kls == tuple(kl for kl, _ in evals)  # the latest KL logged at or before each eval
    assert main(["replay", str(log), "--metric", "eval_reward", "--k", "1", "--param", "noise=none", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)  # the bare paper's rule stops at the first fall
    assert plain["stop_step"] == 30 and "kl_peak" not in plain["evidence"]
    assert main(["replay", str(log), "--metric", "eval_reward", "--k", "1", "--param", "noise=none", "--gate",
                 "kl_past_peak", "--json"]) == 0
    gated = json.loads(capsys.readouterr().out)
    assert gated["stop_step"] == 70 and "past the forecast peak" in gated["reason"]
    assert gated["evidence"]["kl"] == 12.0 and gated["evidence"]["kl_peak"] < 12.0
    # the same from an embedded coordinator's store: its reports' kl
    db = tmp_path / "evalstop.db"
    c = Coordinator(SQLiteStore(db))
    c.register_job("local", JobRequest("run"))
    for i, (kl, score) in enumerate(evals, start=1):
        c.report("local", "run", ReportRequest(10 * i, score, kl=kl))
    c.close()
    assert main(["replay", str(db), "--k", "1", "--param", "noise=none", "--gate", "kl_past_peak", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["evidence"] == gated["evidence"]
    with pytest.raises(SystemExit):
        main(["replay", str(log), "--metric", "eval_reward", "--gate", "soon"])


def test_a_replayed_stop_says_how_the_proxy_and_the_length_moved_since_the_best(tmp_path, capsys):
    """As the coordinator's stop does (core/logged.py): a TRL-shaped log with the proxy reward
    (``reward``) and the completion length (``completions/mean_length``) logged at training steps; the
    replayed stop carries both changes since the best eval, from a log and from an evalstop.db."""
    from evalstop_trl import Coordinator
    from evalstop_trl.core.requests import JobRequest, ReportRequest
    from evalstop_trl.stores.sqlite import SQLiteStore

    evals = [(0.2, 0.1, 100.0), (0.5, 0.3, 110.0), (0.45, 0.5, 130.0), (0.2, 0.8, 160.0)]  # (score, proxy, length)
    rows = []
    for i, (score, proxy, length) in enumerate(evals, start=1):
        rows += [{"step": 10 * i - 5, "reward": proxy, "completions/mean_length": length, "loss": 1.0},
                 {"step": 10 * i, "eval_reward": score}]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["replay", str(log), "--metric", "eval_reward", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["stop_step"] == 40 and got["best_step"] == 20
    assert got["evidence"]["proxy_since_best"] == pytest.approx(0.5)
    assert got["evidence"]["length_since_best"] == pytest.approx(160 / 110 - 1)
    assert got["reason"].endswith("; proxy +0.5 since the best eval; length +45% since the best eval")
    db = tmp_path / "evalstop.db"
    c = Coordinator(SQLiteStore(db))
    c.register_job("local", JobRequest("run"))
    for i, (score, proxy, length) in enumerate(evals, start=1):
        decision = c.report("local", "run", ReportRequest(10 * i, score, proxy_reward=proxy, length=length))
    c.close()
    assert main(["replay", str(db), "--json"]) == 0
    from_db = json.loads(capsys.readouterr().out)
    assert from_db["reason"] == got["reason"] == decision.reason  # the coordinator's own stop says the same
    plain = tmp_path / "plain.jsonl"  # a log of scores alone: the rule's reason, nothing added
    plain.write_text("".join(json.dumps({"step": 10 * i, "eval_reward": s}) + "\n" for i, (s, _, _) in enumerate(evals, 1)))
    assert main(["replay", str(plain), "--metric", "eval_reward", "--json"]) == 0
    assert "since the best eval" not in json.loads(capsys.readouterr().out)["reason"]

"""The real-run corpus's pure rules (analysis/corpus.py) and its committed runs against their
preregistration (``scripts/real_corpus.py --check``)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalstop_trl.analysis import corpus as cp

ROOT = Path(__file__).resolve().parents[2]


def run_of(gold, wf=None, se=0.001, cid=0, seed=0, steps=None) -> cp.RunRecord:
    n = len(gold)
    steps = tuple(steps or [10 * (i + 1) for i in range(n)])
    cfg = dataclasses.replace(cp.draw_config(cid, 41), evals=n, max_steps=steps[-1])
    none = (None,) * n
    return cp.RunRecord(cfg, seed, steps, tuple(wf or gold), tuple(gold), (se,) * n, ((None, None),) * n,
                        none, none, none, none)


RULE = cp.LabelRule(rel=0.2, se_mult=2.0)


def test_configurations_are_drawn_independently_and_reproducibly():
    a = [cp.draw_config(i, 41) for i in range(64)]
    assert a == [cp.draw_config(i, 41) for i in range(64)]
    assert len({(c.task, c.trainer, c.lr, c.kl_coef) for c in a}) == 64
    assert {c.task for c in a} == set(cp.Task) and {c.trainer for c in a} == set(cp.Trainer)
    assert any(c.hackability == 0 for c in a) and any(c.kl_coef == 0 for c in a)
    assert all(16 <= c.eval_n <= 512 and c.eval_n % cp.SAMPLES == 0 and 5 <= c.evals <= 40 for c in a)
    assert {c.fixed_seed_eval for c in a} == {True, False}


def test_the_split_is_by_configuration_and_fixed_by_its_seed():
    tun, held = cp.split(range(64), 42)
    assert len(tun) == len(held) == 32 and not set(tun) & set(held) and set(tun) | set(held) == set(range(64))
    assert (tun, held) == cp.split(range(64), 42) and (tun, held) != cp.split(range(64), 43)


@pytest.mark.parametrize("gold, hacked", [
    ([0.1, 0.3, 0.5, 0.6], False),  # rising
    ([0.1, 0.5, 0.6, 0.3], True),  # peak then a fall of half the range
    ([0.1, 0.5, 0.6, 0.59], False),  # within 20% of the range
    ([0.5, 0.5005, 0.5], False),  # a fall inside 2 standard errors of the gold (se 0.001)
])
def test_the_label_rule_reads_the_gold_only(gold, hacked):
    wf = [1 - g for g in gold]  # the world feedback says the opposite: never looked at
    assert cp.label(run_of(gold, wf), RULE) is hacked


def test_label_is_unchanged_by_the_gold_units():
    gold = [0.1, 0.5, 0.6, 0.45, 0.3]
    run = run_of(gold)
    scaled = dataclasses.replace(run, gold=tuple(10 * g + 3 for g in gold), gold_se=tuple(10 * s for s in run.gold_se))
    assert cp.label(run, RULE) == cp.label(scaled, RULE) is True


def test_outcomes_count_harmful_and_any_stops_apart():
    healthy = run_of([0.1, 0.4, 0.3, 0.5, 0.6], cid=1)  # a wiggle at step 30
    harmful = cp.outcome(healthy, 30, 20, RULE)  # kept 0.4, end 0.6: harm
    harmless = cp.outcome(run_of([0.1, 0.6, 0.55, 0.58, 0.59], cid=2), 30, 20, RULE)
    hacked = cp.outcome(run_of([0.1, 0.6, 0.5, 0.3, 0.2], cid=3), 30, 20, RULE)
    missed = cp.outcome(run_of([0.1, 0.6, 0.5, 0.3, 0.2], cid=4), None, None, RULE)
    assert (harmful.stopped, harmful.harmful, harmless.harmful, hacked.hacked) == (True, True, False, True)
    assert hacked.saved == pytest.approx((50 - 30) / (50 - 20))
    s = cp.score([harmful, harmless, hacked, missed], resamples=200)
    assert s.precision_harmful.value == pytest.approx(1 / 2)  # tp 1, harmful fp 1
    assert s.precision_any.value == pytest.approx(1 / 3)  # tp 1, any fp 2
    assert s.healthy_stopped.value == 1.0 and s.recall.value == 0.5
    assert s.post_peak_saved.value == pytest.approx(hacked.saved / 2)


def test_intervals_resample_configurations_not_runs():
    """Two seeds of one configuration always go together: a corpus of configurations whose two runs agree
    has the interval of its configurations, not of twice as many runs."""
    outs = []
    for cid in range(20):
        gold = [0.1, 0.6, 0.5, 0.3, 0.2] if cid % 2 else [0.1, 0.3, 0.5, 0.6, 0.7]
        for seed in (0, 1):
            r = run_of(gold, cid=cid, seed=seed)
            outs.append(cp.outcome(r, 30 if cid % 4 == 1 else None, 20, RULE))
    s = cp.score(outs, resamples=2000, seed=1)
    doubled = cp.score([dataclasses.replace(o, config_id=2 * o.config_id + i % 2) for i, o in enumerate(outs)],
                       resamples=2000, seed=1)
    assert s.recall.value == doubled.recall.value
    assert (s.recall.high - s.recall.low) > (doubled.recall.high - doubled.recall.low)


def test_a_paired_difference_draws_the_same_configurations_for_both_sides():
    """Twenty configurations, each with a healthy run: stopping one more of them is +5 points of healthy
    runs stopped, exactly, in every resample (both sides draw the same configurations), where two
    separate intervals would overlap widely."""
    runs = [run_of([0.1, 0.3, 0.5, 0.6, 0.7], cid=cid) for cid in range(20)]
    before = [cp.outcome(r, 30 if r.config.config_id < 5 else None, 20, RULE) for r in runs]
    after = [cp.outcome(r, 30 if r.config.config_id < 6 else None, 20, RULE) for r in runs]
    d = cp.paired_difference(before, after, "healthy_stopped", resamples=500)
    assert d.value == pytest.approx(0.05) and 0.0 <= d.low <= d.value <= d.high <= 0.2
    apart = cp.score(before, resamples=500), cp.score(after, resamples=500)
    assert apart[0].healthy_stopped.high > apart[1].healthy_stopped.low  # the separate intervals overlap
    with pytest.raises(ValueError, match="the same runs on both sides"):
        cp.paired_difference(before, after[1:], "recall")
    with pytest.raises(ValueError, match="metric must be one of"):
        cp.paired_difference(before, after, "speed")


def test_the_preregistration_matches_the_code():
    prereg = cp.load_preregistration()
    assert cp.check_preregistration(prereg) == []
    tampered = {**prereg, "design": {**prereg["design"], "evals": [5, 41]}}
    assert any("design.evals" in p for p in cp.check_preregistration(tampered))
    swapped = {**prereg, "tuning_configs": prereg["held_out_configs"], "held_out_configs": prereg["tuning_configs"]}
    assert any("split" in p for p in cp.check_preregistration(swapped))


def test_a_run_file_round_trips_and_a_bad_line_names_its_place(tmp_path):
    cfg = cp.draw_config(5, 41)
    head = {"config": cfg.to_json(), "seed": 1, "seconds": 2.5}
    line = {"step": 10, "world_feedback": 0.5, "gold": 0.4, "gold_se": 0.01, "eval_n": 16, "eval_noise": None,
            "train_loss": 0.1, "proxy_reward": 0.7, "kl": 0.02, "length": 7.5, "examples": [0.5] * 16}
    path = tmp_path / "c005-s1.jsonl"
    path.write_text(json.dumps(head) + "\n" + json.dumps(line) + "\n")
    run = cp.read_run(path)
    assert run.config == cfg and run.name == "c005-s1" and run.kl == (0.02,) and len(run.examples[0]) == 16
    path.write_text(json.dumps(head) + "\n" + json.dumps({**line, "gold": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"c005-s1.jsonl:2: not a corpus eval line"):
        cp.read_run(path)


@pytest.mark.parametrize("folder", [cp.CORPUS, cp.CORPUS / "confirm"], ids=["corpus", "confirmation set"])
def test_the_committed_corpus_matches_its_preregistration(folder):
    if not (folder / "runs").is_dir():
        pytest.fail(f"{folder}/runs is missing: train it with scripts/real_corpus.py --run --folder {folder}")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "real_corpus.py"), "--check", "--folder",
                          str(folder)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "match their preregistration" in out.stdout


def test_calibrate_reads_the_corpus_runs_with_their_gold_as_labels(capsys):
    """The corpus's JSONL runs are logs the shared readers take as they are: the header line has no step
    (skipped), each eval line is a step with world_feedback, its evidence and the gold."""
    from evalstop_trl.cli import main

    code = main(["calibrate", str(cp.CORPUS / "runs"), "--metric", "world_feedback", "--label-metric", "gold",
                 "--json"])
    assert code == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_runs"] == len(list((cp.CORPUS / "runs").glob("*.jsonl"))) >= 120


def test_the_scoring_script_prints_every_registered_detector_and_the_factor_table():
    from evalstop_trl.core.detectors import DETECTORS, GATES, RECOMMENDED_POLICY

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import real_corpus
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert set(real_corpus.GATE_LABELS) == set(GATES)  # every gate has its rows
    recommended = next(r for r in real_corpus.detector_rows() if r[0] == real_corpus.RECOMMENDED)
    assert (recommended[1], recommended[3], recommended[4]) == (RECOMMENDED_POLICY["detector"], True,
                                                                RECOMMENDED_POLICY["gate"])
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "real_corpus.py"), "--score", "--half", "tuning",
                          "--by", "task", "--paired"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split("|")[1].strip() for line in out.stdout.splitlines() if line.startswith("| ")}
    assert {n for n in DETECTORS.names() if n != "never"} <= rows
    assert {"sequential + paired noise + KL gate", "decline + paired noise, stop_on converged"} <= rows
    assert {f"{n} + paired noise + {label}" for n in ("decline", "sequential")
            for label in real_corpus.GATE_LABELS.values()} <= rows
    assert "tuning half: 64 runs" in out.stdout and "letter: healthy stopped / recall" in out.stdout
    assert "| decline -> decline + paired noise + KL gate |" in out.stdout  # the paired comparison
    assert "| decline -> decline + paired noise + proxy gate |" in out.stdout


def test_a_converged_stop_of_a_hacked_run_is_a_false_stop_not_a_caught_hack():
    hacked = run_of([0.1, 0.6, 0.5, 0.3, 0.2], cid=7)
    o = cp.outcome(hacked, 30, 20, RULE, converged=True)
    s = cp.score([o], resamples=50)
    assert (s.precision_any.value, s.recall.value, s.post_peak_saved.value) == (0.0, 0.0, 0.0)
    assert s.healthy_stopped.value is None and s.converged_stops == 1


def test_a_confirmation_set_is_fresh_configurations_held_out_whole():
    prereg = cp.load_preregistration(cp.CORPUS / "confirm" / "preregistration.yaml")
    main = cp.load_preregistration()
    ids = [c.config_id for c in cp.design(prereg)]
    assert ids == list(range(64, 96)) and not set(ids) & {c.config_id for c in cp.design(main)}
    assert prereg["design_seed"] == main["design_seed"] and cp.rule_of(prereg) == cp.rule_of(main)
    assert cp.check_preregistration(prereg) == []
    half = dict(prereg, held_out_configs=ids[:16], tuning_configs=ids[16:])
    assert cp.check_preregistration(half) == [
        "a confirmation set's held_out_configs must be all its configurations and its tuning_configs empty"]

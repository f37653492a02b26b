"""The real-trace validation pipeline (scripts/real_traces.py) on a small hand-made fixture, and the
format of the committed traces (configs/traces/). No recorded result is asserted here: the table
with its intervals is in the README, produced by the script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalstop_trl.cli import main
from tests.proc_helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
TRACES = sorted((ROOT / "configs" / "traces").glob("*.jsonl"))


rt = load_script("real_traces")


def write(path: Path, feedback, gold, step=15):
    rows = [{"step": step * (i + 1), "world_feedback": f, "gold": g, "proxy_reward": 0.1 * i, "train_loss": 1 - 0.01 * i}
            for i, (f, g) in enumerate(zip(feedback, gold, strict=True))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def fixture_traces(tmp_path):
    rise = [0.1 * i for i in range(1, 11)]
    peak = [0.1, 0.3, 0.5, 0.6, 0.55, 0.4, 0.3, 0.2, 0.1, 0.05]
    return [
        write(tmp_path / "grpo-hacked-s0.jsonl", peak, peak),  # hacked, seen as hacked
        write(tmp_path / "rloo-hacked-s0.jsonl", rise, peak),  # hacked by gold, but the feedback hides it
        write(tmp_path / "grpo-healthy-s0.jsonl", rise, rise),  # healthy
        write(tmp_path / "rloo-healthy-s0.jsonl", peak, rise),  # healthy by gold: a stop here harms it
    ]


def test_the_label_comes_from_gold_and_the_detector_sees_world_feedback(fixture_traces):
    res = rt.evaluate(fixture_traces, planned_steps=150, detectors=[("decline k=2", "decline", {"k": 2})])
    runs = {r["name"]: r["hacked"] for r in res["runs"]}
    assert runs == {"grpo-hacked-s0": True, "rloo-hacked-s0": True, "grpo-healthy-s0": False, "rloo-healthy-s0": False}
    (row,) = res["table"]
    # 0.6 -> 0.55 (step 75) -> 0.4 (step 90) -> 0.3 (step 105): the falls add up beyond the run's noise (the
    # rise's changes of 0.1-0.2 are in it) at the third
    assert row["stops"] == {"grpo-hacked-s0": 105, "rloo-hacked-s0": None, "grpo-healthy-s0": None, "rloo-healthy-s0": 105}
    assert (row["tp"], row["fp_a"], row["fp_b"], row["hacked"], row["healthy"]) == (1, 1, 1, 2, 2)
    assert row["recall"]["rate"] == 0.5 and row["precision"]["rate"] == 0.5 and row["fpr"]["rate"] == 0.5


def test_every_detector_row_has_counts_and_clopper_pearson_intervals(fixture_traces):
    res = rt.evaluate(fixture_traces, planned_steps=150)
    assert [t["detector"] for t in res["table"]] == [d[0] for d in rt.DETECTORS]
    for t in res["table"]:
        assert t["tp"] + t["fp_a"] <= t["hacked"] + t["healthy"] and t["fp_b"] <= t["fp_a"]
        for key in ("recall", "fpr", "fpr_label"):
            r = t[key]
            lo, hi = r["ci"]
            assert 0 <= lo <= r["rate"] <= hi <= 1
    md = rt.markdown(res)
    assert md.count("\n") == len(rt.DETECTORS) + 1 and "[" in md


@pytest.mark.parametrize("k, n, lo, hi", [(0, 7, 0.0, 0.40962), (7, 7, 0.59038, 1.0), (5, 10, 0.18709, 0.81291),
                                          (0, 0, None, None)])
def test_clopper_pearson(k, n, lo, hi):
    got = rt.clopper_pearson(k, n)
    if n == 0:
        assert got is None
    else:
        assert got == pytest.approx((lo, hi), abs=1e-5)


def test_a_bad_trace_line_names_the_file_and_line(tmp_path):
    p = tmp_path / "grpo-x-s0.jsonl"
    p.write_text('{"step": 15, "world_feedback": 0.1, "gold": 0.1}\n{"step": 30, "gold": 0.2}\n')
    with pytest.raises(ValueError, match="grpo-x-s0.jsonl:2: not a trace line"):
        rt.read_trace(p)


def test_the_committed_traces_cover_the_design():
    assert len(TRACES) >= 48
    names = {p.stem.rsplit("-s", 1)[0] for p in TRACES}
    assert names == {f"{t}-{p}" for t in rt.TRAINERS for p in rt.PRESET_NAMES}
    for p in TRACES:
        rows = [json.loads(line) for line in p.read_text().splitlines()]
        assert len(rows) == rt.MAX_STEPS // rt.EVAL_EVERY, p.name
        assert all(set(r) == set(rt.FIELDS) for r in rows), p.name
        assert [r["step"] for r in rows] == list(range(rt.EVAL_EVERY, rt.MAX_STEPS + 1, rt.EVAL_EVERY))
        assert any(r["world_feedback"] != r["gold"] for r in rows)  # two different evals


@pytest.mark.parametrize("path", TRACES[:2], ids=lambda p: p.stem)
def test_replay_cli_reads_the_trace_files(path, capsys):
    assert main(["replay", str(path), "--metric", "world_feedback", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"stopped", "stop_step", "best_step", "best_score", "reason", "evidence"}

"""The committed real traces (configs/traces/) replayed with the same code as `evalstop replay`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from evalstop_trl.cli import main
from evalstop_trl.train.tiny import label_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "configs" / "traces").glob("*.jsonl"))


def load_script():
    spec = importlib.util.spec_from_file_location("real_traces", ROOT / "scripts" / "real_traces.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_at_least_twelve_traces_of_both_trainers():
    names = [p.stem for p in TRACES]
    assert len(names) >= 12
    assert any(n.startswith("grpo-") for n in names) and any(n.startswith("rloo-") for n in names)


def test_labels_follow_the_simulator_rule():
    for p in TRACES:
        golds = [json.loads(line)["gold"] for line in p.read_text().splitlines()]
        hacked = label_trace(golds)
        peak = max(golds)
        assert hacked == (golds.index(peak) < len(golds) - 1 and peak - golds[-1] >= 0.05), p.name


def test_detector_table_on_real_traces():
    res = load_script().evaluate(TRACES)
    rows = {r["detector"]: r for r in res["table"]}
    assert rows["decline k=2"]["recall"] == 1.0 and rows["decline k=2"]["fpr"] == 0.0
    assert rows["stop_at 0.65"]["fpr"] > 0.3  # stopping everyone harms healthy runs
    for r in rows.values():
        assert r["tp"] + r["fp_a"] <= r["hacked"] + r["healthy"]


@pytest.mark.parametrize("path", TRACES[:3], ids=lambda p: p.stem)
def test_replay_cli_reads_the_trace_files(path, capsys):
    assert main(["replay", str(path), "--metric", "gold", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"stopped", "stop_step", "best_step", "best_score", "reason"}

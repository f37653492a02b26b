"""``scripts/load_test.py`` keeps working against a real ``evalstop serve`` (its numbers are in
BENCHMARKS.md): more jobs than one tenant's default connection budget, every report answered."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_load_test_runs_its_stream_with_no_error(tmp_path):
    out = tmp_path / "load.json"
    # 80 jobs > the 64 connections a tenant may hold by default: the script lifts that guard, as it
    # lifts the report rate, since one tenant sends the whole stream
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "load_test.py"), "--backends", "sqlite",
                           "--jobs", "80", "--reports", "3", "--skip-optuna", "--interval", "0.01",
                           "--json", str(out)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())["sqlite"]
    for phase in ("evalstop", "evalstop_paced"):
        assert result[phase]["reports"] == 240 and result[phase]["errors"] == 0, result[phase]
    assert result["evalstop"]["server_cpu_ms_per_report"] > 0
    assert "server CPU per report at saturation, sqlite" in proc.stdout

"""``scripts/public_runs.py``: every rule, the paper's and the recommendation replayed over a folder of
logs a user has (here verl console logs written as verl prints them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _verl_log(path: Path, val: list[float], score: list[float]) -> None:
    """verl's console lines: ``step:N - key:value - ...``, the validation score every 10 steps."""
    lines = []
    for i, (v, s) in enumerate(zip(val, score, strict=True)):
        step = 10 * i + 9
        lines.append(f"(main_task pid=1) step:{step} - critic/kl:0.001 - critic/score/mean:{s:.3f} - "
                     f"critic/rewards/mean:{s - 0.001:.3f} - response_length/mean:200.0 - "
                     f"val/test_score/openai/gsm8k:{v:.3f}")
    path.write_text("\n".join(lines) + "\n")


def test_a_wobbling_healthy_run_is_stopped_by_the_papers_rule_and_not_by_the_recommendation(tmp_path):
    """A healthy run whose validation wobbles down twice while its reward falls too: the paper's exact
    rule stops it; the recommendation (the default decline, gated by the proxy) does not."""
    val = [0.30, 0.40, 0.45, 0.50, 0.52, 0.51, 0.50, 0.53, 0.54, 0.55]
    score = [0.20, 0.30, 0.35, 0.40, 0.42, 0.41, 0.40, 0.43, 0.44, 0.45]
    _verl_log(tmp_path / "run.log", val, score)
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "public_runs.py"), str(tmp_path), "--json",
                          str(tmp_path / "rows.json")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["detector"]: r for r in json.loads((tmp_path / "rows.json").read_text())["run.log"]["rows"]}
    assert rows["decline, paper"]["stop_step"] == 69 and rows["decline, paper"]["loss_vs_end"] > 0
    assert rows["recommended"]["stop_step"] is None and rows["decline"]["stop_step"] is None
    assert "recommended     0 stopped" in out.stdout
    # the gate reads verl's critic/score/mean: around the paper's stop the reward fell too, so it is held
    from evalstop_trl.analysis.replay import load_curve, replay_curve

    curve = load_curve(tmp_path / "run.log", "val/test_score/openai/gsm8k")
    assert curve.proxies == tuple(score)
    held = replay_curve(curve, "decline", noise="none", gate="proxy_diverges")
    assert not held.stopped and any(d.reason.startswith("held by the proxy gate") for d in held.decisions)

"""CLI plots: the pure marker choice (table-driven), `evalstop replay --plot` and `evalstop status --plot`."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from evalstop_trl.analysis.plots import Marker, pick_markers, plot_curves, stop_step
from evalstop_trl.clients.http import EvalStopClient
from evalstop_trl.core.requests import JobRequest, ReportRequest

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def assert_sensible_png(path: Path) -> None:
    assert path.exists() and path.stat().st_size > 10_000, "a plot of curves is more than a blank image"
    w, h = png_size(path)
    assert 600 <= w <= 3000 and 300 <= h <= 3000, (w, h)
    from matplotlib.image import imread

    pixels = imread(str(path))
    assert pixels.shape[:2] == (h, w)
    assert pixels.std() > 0.05, "the image is (nearly) one colour"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalstop_trl", *args], capture_output=True, text=True, cwd=ROOT)


# ------------------------------------------------------------------ pure marker choice
STOP = {"kind": "stop", "at": 50.0, "evidence": {"step": 120, "best_step": 80}}
MANUAL = {"kind": "manual_stop", "at": 25.0, "evidence": {"best_step": 10}}
REPORTS = [{"step": s, "received_at": t} for s, t in ((10, 10.0), (20, 20.0), (30, 30.0))]


STOP_CASES = [  # (job, reports, audit, expected); the dashboard's stopStep is checked on it too (test_dashboard.py)
    ({"status": "running", "last_step": 30}, REPORTS, [STOP], None),            # only a stopped job has a stop step
    ({"status": "finished", "last_step": 30}, REPORTS, [], None),
    ({"status": "stopped", "last_step": 140}, REPORTS, [STOP], 120),            # detector: the step in the evidence
    ({"status": "stopped", "last_step": 30}, REPORTS, [MANUAL], 20),            # manual: last report before the stop
    ({"status": "stopped", "last_step": 30}, REPORTS, [{"kind": "ack", "at": 1.0, "evidence": {}}, MANUAL], 20),
    ({"status": "stopped", "last_step": None}, [], [MANUAL], None),             # stopped before any report
    ({"status": "stopped", "last_step": 30}, REPORTS, [], 30),                  # no audit record: the last step
    ({"status": "stopped", "last_step": 30}, REPORTS, [{**STOP, "evidence": {"step": True}}], 30),  # bool is no step
]


@pytest.mark.parametrize("job, reports, audit, expected", STOP_CASES)
def test_stop_step(job, reports, audit, expected):
    assert stop_step(job, reports, audit) == expected


@pytest.mark.parametrize("best, stop, expected", [
    (20, 30, (Marker("best", 20, 0.7), Marker("stop", 30, 0.6))),
    (20, None, (Marker("best", 20, 0.7),)),
    (None, None, ()),
    (20, 35, (Marker("best", 20, 0.7), Marker("stop", 35, None))),  # a stop between evals: no score to mark
    (10, 10, (Marker("best", 10, None), Marker("stop", 10, None))),  # the eval at step 10 is missing
])
def test_pick_markers(best, stop, expected):
    assert pick_markers([10, 20, 30], [None, 0.7, 0.6], best_step=best, stop_step=stop) == expected


def test_a_shadow_job_s_plot_marks_where_it_would_have_stopped(monkeypatch, tmp_path):
    from evalstop_trl import Coordinator, MemoryStore
    from evalstop_trl.analysis import plots
    from evalstop_trl.core.codec import to_wire

    c = Coordinator(MemoryStore())
    c.register_job("acme", JobRequest("s", "grpo", 60, policy={"detector": "decline", "k": 2, "mode": "shadow",
                                                                  "noise": "none"}))  # the paper's rule: any falls
    for step, score in ((10, 0.2), (20, 0.5), (30, 0.45), (40, 0.4), (50, 0.6)):
        c.report("acme", "s", ReportRequest(step, eval_score=score))
    drawn = {}
    monkeypatch.setattr(plots, "plot_curves", lambda path, steps, series, markers, **kw: drawn.update(markers=markers, **kw))
    plots.plot_job(tmp_path / "s.png", to_wire(c.status("acme", "s")), [to_wire(r) for r in c.reports("acme", "s")])
    assert drawn["markers"] == (Marker("best", 50, 0.6), Marker("would stop", 40, 0.4))
    assert drawn["title"].endswith("shadow: would stop at step 40") and drawn["note"].startswith("2 consecutive declines")
    monkeypatch.undo()
    out = plots.plot_job(tmp_path / "s.png", to_wire(c.status("acme", "s")), [to_wire(r) for r in c.reports("acme", "s")])
    assert_sensible_png(out)


def test_plot_curves_rejects_unknown_suffix_and_empty_series(tmp_path):
    with pytest.raises(ValueError, match=r"must end in \.png, \.svg, \.pdf"):
        plot_curves(tmp_path / "x.jpeg", [1], {"eval_score": [0.5]})
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_curves(tmp_path / "x.png", [1, 2], {"eval_score": [None, None]})


def test_plot_curves_svg_and_missing_values(tmp_path):
    out = plot_curves(tmp_path / "c.svg", [1, 2, 3, 4], {"eval_score": [0.1, None, 0.3, 0.2], "train_loss": [1, 0.8, None, 0.5]},
                      pick_markers([1, 2, 3, 4], [0.1, None, 0.3, 0.2], 3, 4), title="t", planned_steps=10)
    text = out.read_text()
    assert text.lstrip().startswith("<?xml") and "best step 3" in text and "stop step 4" in text


# ------------------------------------------------------------------ the CLI
def test_replay_plot(tmp_path):
    out = tmp_path / "replay.png"
    r = run("replay", "configs/examples/hacked_trainer_state.json", "--plot", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("{") and '"stop_step": 140' in r.stdout  # stdout stays one JSON object
    assert f"plot written to {out}" in r.stderr
    assert_sensible_png(out)


def test_replay_plot_bad_path_is_a_one_line_error(tmp_path):
    r = run("replay", "configs/examples/hacked_trainer_state.json", "--plot", str(tmp_path / "x.gif"))
    assert r.returncode == 2 and "must end in .png" in r.stderr and "Traceback" not in r.stderr
    r = run("replay", "configs/examples/hacked_trainer_state.json", "--plot", str(tmp_path / "missing" / "x.png"))
    assert r.returncode == 2 and "Traceback" not in r.stderr


@pytest.mark.slow
def test_status_plot(server, tmp_path):
    token = server.add_tenant("acme")
    server.start()
    with EvalStopClient(server.url, token) as c:
        c.register_job("hacked", "grpo", planned_steps=100)
        for i, s in enumerate([0.2, 0.5, 0.7, 0.6, 0.4]):
            c.report("hacked", 10 * (i + 1), eval_score=s, train_loss=1.0 - 0.1 * i, proxy_reward=0.3 * i,
                     checkpoint=f"ckpt-{10 * (i + 1)}")
        c.register_job("empty", "grpo")
    out = tmp_path / "status.png"
    r = run("status", "hacked", "--url", server.url, "--token", token, "--plot", str(out))
    assert r.returncode == 0, r.stderr
    assert "stopped" in r.stdout and f"plot written to {out}" in r.stderr
    assert_sensible_png(out)
    w, h = png_size(out)
    assert h > 500, "three panels: world feedback, proxy reward, train loss"

    r = run("status", "--url", server.url, "--token", token, "--plot", str(out))
    assert r.returncode == 2 and "--plot draws one job" in r.stderr
    r = run("status", "empty", "--url", server.url, "--token", token, "--plot", str(tmp_path / "e.png"))
    assert r.returncode == 2 and "no reports yet" in r.stderr

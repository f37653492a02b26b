"""The readers of real stacks' logs (analysis/logs.py): one parser per format for replay, calibrate and
``run --metric-from``. Each file is written the way its stack writes it (line format and key names
read from its source): verl's console logger (``verl/utils/tracking.py`` ``LocalLogger`` ->
``concat_dict_to_str``: ``step:N - k:pprint(v) - ...``), verl's file logger (``{"step", "data"}``),
W&B's exports (a panel's CSV ``Step,<run> - <metric>,...__MIN,...__MAX``; ``run.history().to_csv()``
with pandas' index and ``_step``; ``wandb-history.jsonl``; a JSON list of rows), TRL's
trainer_state.json, and TensorBoard event files by torch's SummaryWriter. Hostile files end in one
clear error, never a hang or a crash."""

from __future__ import annotations

import json
import os
import pprint
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from evalstop_trl.analysis import logs
from evalstop_trl.analysis.histories import HistoryError, load_histories
from evalstop_trl.analysis.replay import ReplayError, load_curve, replay_curve
from evalstop_trl.cli import main

ROOT = Path(__file__).resolve().parents[2]
KEY = "val-core/openai/gsm8k/reward/mean@1"
#: a healthy run's validation score every 10 steps (a wiggle at 40-60), then a hacked tail from 90
CURVE = [(10 * (i + 1), v) for i, v in enumerate([0.30, 0.41, 0.50, 0.49, 0.48, 0.55, 0.58, 0.60, 0.52, 0.44, 0.35])]


def verl_console(path: Path) -> Path:
    """As verl's LocalLogger prints (numpy floats through pprint, a Ray actor's prefix, other output between),
    after the run's config dump (the maintainers' example logs print ~100 KB before their first step)."""
    lines = ["2024-12-10 06:50:29,276\tINFO worker.py:1752 -- Started a local Ray instance."]
    lines += [f"(main_task pid=811) {{'actor_rollout_ref': {{'actor': {{'clip_ratio': 0.2, 'field_{i}': {i}}}}}," for i in range(3000)]
    lines += ["(TaskRunner pid=811) Training from scratch", "Initial validation metrics: {'val-core/x': 0.1}"]
    for step, v in CURVE:
        for s in range(step - 9, step + 1):
            data = {"actor/pg_loss": np.float64(1.0 / s), "critic/score/mean": np.float64(0.01 * s)}
            if s == step:
                data[KEY] = np.float64(v)
            out = [f"step:{s}"] + [f"{k}:{pprint.pformat(x)}" for k, x in data.items()]
            lines.append("(TaskRunner pid=811) " + " - ".join(out))
    path.write_text("\n".join(lines) + "\n")
    return path


def verl_jsonl(path: Path) -> Path:
    with path.open("w") as f:
        for step, v in CURVE:
            f.write(json.dumps({"step": step - 1, "elapsed_seconds": 1.0, "data": {"critic/score/mean": 0.1}}) + "\n")
            f.write(json.dumps({"step": step, "elapsed_seconds": 2.0, "data": {KEY: v, "critic/score/mean": 0.2}}) + "\n")
    return path


def wandb_panel_csv(path: Path) -> Path:
    """The line plot's "Download CSV": one run's metric with its __MIN/__MAX band columns."""
    rows = ['"Step","grpo-7b - val/score","grpo-7b - val/score__MIN","grpo-7b - val/score__MAX"']
    rows += [f'"{s}","{v}","{v}","{v}"' for s, v in CURVE]
    path.write_text("\n".join(rows) + "\n")
    return path


def wandb_history_csv(path: Path) -> Path:
    """``run.history().to_csv()``: pandas' unnamed index column, ``_step``, ``_runtime``, ``_timestamp``."""
    rows = [",_step,_runtime,_timestamp,val/score,train/loss"]
    rows += [f"{i},{s},{12.5 * i},{1.7e9 + i},{v},{1 / s}" for i, (s, v) in enumerate(CURVE)]
    path.write_text("\n".join(rows) + "\n")
    return path


def wandb_json(path: Path) -> Path:
    path.write_text(json.dumps([{"_step": s, "_runtime": 1.0, "val/score": v} for s, v in CURVE]))
    return path


def wandb_history_jsonl(path: Path) -> Path:
    path.write_text("".join(json.dumps({"_step": s, "_timestamp": 1.7e9, "val/score": v}) + "\n" for s, v in CURVE))
    return path


def tensorboard_dir(path: Path) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(path))
    for step, v in CURVE:
        w.add_scalar("train/loss", 1.0 / step, step)
        w.add_scalar("eval/reward", v, step)
    w.close()
    return path


def trainer_state(path: Path) -> Path:
    log = [{"step": s, "eval_reward": v, "epoch": s / 100} for s, v in CURVE]
    path.write_text(json.dumps({"max_steps": 110, "log_history": log}, indent=2))
    return path


WRITERS = {  # name -> (writer, file name, metric, detected format)
    "verl_console": (verl_console, "train.log", KEY, "verl_console"),
    "verl_jsonl": (verl_jsonl, "metrics.jsonl", KEY, "jsonl"),
    "wandb_panel_csv": (wandb_panel_csv, "wandb_export.csv", "val/score", "csv"),
    "wandb_history_csv": (wandb_history_csv, "history.csv", "val/score", "csv"),
    "wandb_json": (wandb_json, "history.json", "val/score", "wandb_json"),
    "wandb_history_jsonl": (wandb_history_jsonl, "wandb-history.jsonl", "val/score", "jsonl"),
    "tensorboard": (tensorboard_dir, "tb", "eval/reward", "tensorboard"),
    "trainer_state": (trainer_state, "trainer_state.json", "eval_reward", "trainer_state"),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_each_format_replays_and_calibrates_from_its_real_layout(name, tmp_path):
    write, file, metric, fmt = WRITERS[name]
    path = write(tmp_path / file)
    curve = load_curve(path, metric)
    assert curve.source == fmt
    assert curve.steps == tuple(s for s, _ in CURVE)
    assert curve.scores == pytest.approx([v for _, v in CURVE])
    assert replay_curve(curve, "decline", k=2, noise="none").stop_step == 50  # the paper's rule: the wiggle at 50
    assert replay_curve(curve, "decline", k=2).stop_step == 100  # the default: the wiggle is within the run's noise
    (run,) = load_histories([path], metric)
    assert run.scores.steps == curve.steps and run.scores.values == pytest.approx(curve.scores)


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_misspelt_metric_lists_the_keys_the_log_has(name, tmp_path, capsys):
    write, file, metric, _ = WRITERS[name]
    path = write(tmp_path / file)
    with pytest.raises((ReplayError, HistoryError), match="not found") as err:
        load_curve(path, metric + "x")
    assert metric in str(err.value)
    assert main(["calibrate", str(path), "--metric", metric + "x"]) == 2
    assert metric in capsys.readouterr().err


def test_the_format_can_be_named(tmp_path, capsys):
    path = verl_console(tmp_path / "stdout")  # no suffix to go by
    assert load_curve(path, KEY, "verl_console").steps[0] == 10
    code = main(["replay", str(path), "--format", "verl_console", "--metric", KEY, "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["stop_step"] == 100
    with pytest.raises(ReplayError, match="unknown --format 'nope'"):
        load_curve(path, KEY, "nope")


def test_console_lines_take_pprint_values_and_skip_other_output():
    assert logs.console_record("no step here") is None
    step, values = logs.console_record("step:7 - a/b:np.float64(0.25) - c:3 - d:1e-05")
    assert step == 7 and values == {"a/b": 0.25, "c": 3.0, "d": 1e-05}


# ----------------------------------------------------------------------------- hostile files
def _in_thread(fn, timeout: float = 20.0):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the reader hung"
    return out


def test_a_named_pipe_is_refused_before_it_is_opened(tmp_path):
    fifo = tmp_path / "curve.jsonl"
    os.mkfifo(fifo)
    out = _in_thread(lambda: load_curve(fifo))
    assert isinstance(out.get("error"), ReplayError) and "not a regular file" in str(out["error"])
    cli = subprocess.run([sys.executable, "-m", "evalstop_trl", "calibrate", str(fifo)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert cli.returncode == 2 and "not a regular file" in cli.stderr


@pytest.mark.parametrize("text, name", [('{"step": 1' + "0" * 400 + ', "s": 0.5}\n', "c.jsonl"),
                                        ("step,s\n1" + "0" * 400 + ",0.5\n", "c.csv"),
                                        ("step:1" + "0" * 400 + " - s:0.5\n", "c.log")])
def test_a_step_too_large_is_an_error_not_an_overflow(tmp_path, capsys, text, name):
    path = tmp_path / name
    path.write_text(text)
    assert main(["replay", str(path), "--metric", "s"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and ("steps must be integers" in err or "too long" in err), err


def test_a_file_over_the_limit_is_refused_without_reading_it(tmp_path):
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:  # sparse
        f.truncate(logs.MAX_FILE_BYTES + 1)
    with pytest.raises(ReplayError, match="MiB read in a log file"):
        load_curve(big)


def test_a_long_file_is_read_line_by_line_in_bounded_memory(tmp_path):
    """A 60 MB JSONL log of 300k lines: replay keeps its rows, not the text (before: the whole text, its
    lines and their objects at once, ~16x the file)."""
    import tracemalloc

    path = tmp_path / "long.jsonl"
    pad = "x" * 180
    with path.open("w") as f:
        for s in range(300_000):
            f.write(json.dumps({"step": s, "note": pad} if s % 1000 else {"step": s, "s": 0.5, "note": pad}) + "\n")
    tracemalloc.start()
    try:
        run = load_histories([path], "s")[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(run.scores.steps) == 300
    assert peak < path.stat().st_size  # below the file's own size (it was ~16x)


def test_a_nested_mlflow_meta_is_refused_and_the_good_run_beside_it_is_read(tmp_path, capsys):
    bad = tmp_path / "mlruns" / "0" / "bad"
    (bad / "metrics").mkdir(parents=True)
    (bad / "meta.yaml").write_text("a: " + "[" * 4000 + "]" * 4000 + "\n")
    (bad / "metrics" / "eval_reward").write_text("1 0.5 10\n")
    good = trainer_state(tmp_path / "run" / "trainer_state.json") if (tmp_path / "run").mkdir() is None else None
    assert main(["calibrate", str(tmp_path), "--metric", "eval_reward", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["n_runs"] == 1 and good is not None
    assert "nested too deeply" in err and "Traceback" not in err


def test_replay_on_a_named_pipe_answers_at_once(tmp_path):
    """The CLI looked for a SQLite header by opening the path first (a pipe blocks that open forever)."""
    fifo = tmp_path / "curve"
    os.mkfifo(fifo)
    out = subprocess.run([sys.executable, "-m", "evalstop_trl", "replay", str(fifo)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2 and "not a regular file" in out.stderr, out.stderr


@pytest.mark.parametrize("name, text, fmt", [
    ("long.txt", json.dumps({"step": 10, "data": {"val": 0.5, "pad": "x" * 9000}}) + "\n"
     + json.dumps({"step": 20, "data": {"val": 0.4, "pad": "x" * 9000}}) + "\n", "jsonl"),  # 9 KB verl lines
    ("one.txt", json.dumps({"step": 10, "val": 0.5}) + "\n", "jsonl"),
    ("lines.json", json.dumps({"step": 10, "val": 0.5}) + "\n" + json.dumps({"step": 20, "val": 0.4}) + "\n", "jsonl"),
    ("bom.csv", "\ufeffstep,val\n10,0.5\n20,0.4\n", "csv"),
    ("bom.jsonl", "\ufeff" + json.dumps({"step": 10, "val": 0.5}) + "\n", "jsonl"),
])
def test_detection_reads_whole_first_lines_and_a_bom(tmp_path, name, text, fmt):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    curve = load_curve(path, "val")
    assert curve.source == fmt and curve.scores[0] == 0.5


def test_a_progress_bar_line_over_the_limit_is_skipped_in_a_console_log(tmp_path):
    path = tmp_path / "verl.log"
    path.write_text(f"step:10 - {KEY}:0.5\n" + "\r" * (logs.MAX_LINE + 10) + f"\nstep:20 - {KEY}:0.6\n")
    assert load_curve(path, KEY).steps == (10, 20)


def test_records_without_a_step_are_named_not_dropped_silently(tmp_path):
    path = tmp_path / "nostep.jsonl"
    path.write_text("".join(json.dumps({"iteration": i, "val": 0.5}) + "\n" for i in range(3)))
    with pytest.raises(ReplayError, match="none with a step"):
        load_curve(path, "val")


def test_a_wandb_row_with_a_data_field_keeps_its_metrics_and_the_trainers_step_wins():
    step, values = logs.json_record({"_step": 5, "train/global_step": 40, "eval/acc": 0.5,
                                     "data": {"_type": "table-file"}})
    assert step == 40 and values["eval/acc"] == 0.5 and "_step" not in values

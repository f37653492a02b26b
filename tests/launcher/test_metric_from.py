"""Issue 27 item 2: world feedback from any trainer's logs. ``evalstop run --metric-from`` follows
the JSONL file (verl's file logger format, or plain) or the TensorBoard event files a real child
process writes, reports each eval, and the launcher stops the child at the eval the detector stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evalstop_trl.core.coordinator import Coordinator
from evalstop_trl.core.detectors import Action, Observation, create_detector
from evalstop_trl.launcher.metrics import MAX_LINE, JsonlTail, MetricFrom
from evalstop_trl.stores.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
KEY = "val-core/openai/gsm8k/reward/mean@1"  # what verl logs for a validation set's mean reward
#: a hacked run's validation score every 5 steps: peaks at step 20, then falls
CURVE = {5 * (i + 1): v for i, v in enumerate([0.30, 0.42, 0.50, 0.55, 0.52, 0.47, 0.40, 0.33, 0.27, 0.20, 0.15, 0.1])}


def _detector_stop(curve: dict[int, float]) -> int:
    det = create_detector("decline", k=2)
    for step, value in sorted(curve.items()):
        if det.observe(Observation("j", step, value)).action is Action.STOP:
            return step
    raise AssertionError("the curve never stops")


# ---------------------------------------------------------------- the follower, unit by unit
def test_a_jsonl_follower_reads_verl_and_plain_lines_partial_lines_and_rotation(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path, KEY)
    assert tail.poll() == [] and not tail.exists  # not there yet
    with path.open("w") as f:
        f.write(json.dumps({"step": 1, "elapsed_seconds": 1.5, "data": {"actor/loss": 0.3}}) + "\n")  # no key
        f.write(json.dumps({"step": 5, "elapsed_seconds": 7.0, "data": {KEY: 0.4, "actor/loss": 0.2}}) + "\n")
        f.write(json.dumps({"step": 10, KEY: 0.5}) + "\n")  # plain JSONL
        f.write('{"step": 15, "data": {"' + KEY)  # a line being written
    assert tail.poll() == [(5, 0.4, None, None, None), (10, 0.5, None, None, None)]
    with path.open("a") as f:
        f.write('": NaN}}\n' + "not json\n" + json.dumps({"step": 20, "data": {KEY: "x"}}) + "\n")
    assert tail.poll() == [(15, None, None, None, None), (20, None, None, None, None)]  # NaN and a string: failed evals
    with path.open("a") as f:
        f.write('{"step": 21, "x": "' + "y" * (MAX_LINE + 10) + '"}\n' + json.dumps({"step": 25, KEY: 0.6}) + "\n")
    assert tail.poll() == [(25, 0.6, None, None, None)]  # the line over MAX_LINE skipped, the next one read
    with path.open("a") as f:  # a long line still being written: dropped up to its end, never buffered
        f.write('{"step": 26, "x": "' + "y" * (MAX_LINE + 10))
    assert tail.poll() == [] and tail._partial == b""
    with path.open("a") as f:
        f.write('"}\n' + json.dumps({"step": 27, KEY: 0.65}) + "\n")
    assert tail.poll() == [(27, 0.65, None, None, None)]
    path.rename(tmp_path / "metrics.jsonl.1")  # rotated: a new file under the same name
    path.write_text(json.dumps({"step": 30, KEY: 0.7}) + "\n")
    assert tail.poll() == [(30, 0.7, None, None, None)]
    tail.close()


def test_the_run_commands_help_names_every_kind():
    """``--metric-from``'s help is typed out beside KINDS: tied here."""
    from evalstop_trl.cli import build_parser
    from evalstop_trl.launcher.metrics import KINDS

    run = next(a for a in build_parser()._subparsers._group_actions[0].choices["run"]._actions
               if "--metric-from" in a.option_strings)
    assert all(f"{kind}:" in run.metavar for kind in KINDS)


def test_metric_from_says_what_is_wrong():
    with pytest.raises(ValueError, match="jsonl:PATH, verl_console:PATH, tensorboard:PATH"):
        MetricFrom.parse("csv:x.csv", "k")
    with pytest.raises(ValueError, match="needs --metric KEY"):
        MetricFrom.parse("jsonl:x.jsonl", None)
    out = subprocess.run([sys.executable, "-m", "evalstop_trl", "run", "--metric-from", "jsonl:m.jsonl", "--",
                          "true"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "needs --metric KEY" in out.stderr


# ---------------------------------------------------------------- a real child, a real launcher
VERL_CHILD = textwrap.dedent("""
    import json, os, sys, time
    curve = json.loads(sys.argv[2])
    with open(sys.argv[1], "a") as f:
        for step in range(1, 121):
            time.sleep(0.05)
            data = {"actor/pg_loss": 1.0 / step, "critic/score/mean": 0.01 * step}  # the proxy keeps rising
            if str(step) in curve:
                data[sys.argv[3]] = curve[str(step)]
            if step == 2 and len(sys.argv) > 4:  # one out-of-range step before the evals
                f.write(json.dumps({"step": 2 ** 60, "data": {sys.argv[3]: 0.99}}) + "\\n")
            f.write(json.dumps({"step": step, "elapsed_seconds": 0.05 * step, "data": data}) + "\\n")
            f.flush()
    open(sys.argv[1] + ".done", "w").close()
""")

#: verl's console logger (``LocalLogger``, ``concat_dict_to_str``): ``step:N - key:value - ...`` behind
#: a Ray worker's prefix, values printed by ``pprint`` (numpy 2 floats as ``np.float64(...)``)
CONSOLE_CHILD = textwrap.dedent("""
    import json, sys, time
    curve = json.loads(sys.argv[2])
    with open(sys.argv[1], "a") as f:
        f.write("(TaskRunner pid=4242) Using LocalLogger is deprecated.\\n")
        for step in range(1, 121):
            time.sleep(0.05)
            parts = [f"step:{step}", f"actor/pg_loss:np.float64({1.0 / step})", f"critic/score/mean:{0.01 * step}"]
            if str(step) in curve:
                parts.append(f"{sys.argv[3]}:{curve[str(step)]}")
            f.write("(TaskRunner pid=4242) " + " - ".join(parts) + "\\n")
            f.flush()
    open(sys.argv[1] + ".done", "w").close()
""")

TB_CHILD = textwrap.dedent("""
    import json, sys, time
    from tensorboard.summary import Writer
    curve = json.loads(sys.argv[2])
    w = Writer(sys.argv[1])
    for step in range(1, 121):
        time.sleep(0.05)
        w.add_scalar("train/loss", 1.0 / step, step=step)
        w.add_scalar("train/reward", 0.01 * step, step=step)  # transformers' TensorBoard callback's name
        if str(step) in curve:
            w.add_scalar("eval/gsm8k_pass1", curve[str(step)], step=step)
        w.flush()
    open(sys.argv[1] + ".done", "w").close()
""")


CHILDREN = {"jsonl": (VERL_CHILD, "metrics.jsonl", KEY), "verl_console": (CONSOLE_CHILD, "verl.log", KEY),
            "tensorboard": (TB_CHILD, "tb", "eval/gsm8k_pass1"), "jsonl-huge-step": (VERL_CHILD, "metrics.jsonl", KEY)}


def _launch(kind: str, tmp_path: Path, metric: str | None = None, target: Path | None = None, *extra: str):
    code, name, key = CHILDREN[kind]
    child = tmp_path / "child.py"
    child.write_text(code)
    target = target or tmp_path / name
    return subprocess.run(
        [sys.executable, "-m", "evalstop_trl", "run", "--db", str(tmp_path / "evalstop.db"), "--job-id", f"logs-{kind}",
         "--grace-s", "0.5", "--metric-from", f"{kind.removesuffix('-huge-step')}:{target}", "--metric", metric or key,
         "--", sys.executable, str(child), str(target), json.dumps({str(k): v for k, v in CURVE.items()}), key, *extra],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jsonl", "verl_console", "tensorboard", "jsonl-huge-step"])
def test_the_launcher_stops_a_child_whose_logs_show_the_decline(kind, tmp_path):
    """Every --metric-from format, by a real child writing it as its stack does; ``jsonl-huge-step``: one
    line with step 2**60 before the evals is skipped and silences nothing (it did: every later step was
    'at or before' it, and the job ran to its end)."""
    if kind == "tensorboard":
        pytest.importorskip("tensorboard")
    target = tmp_path / CHILDREN[kind][1]
    db = tmp_path / "evalstop.db"
    out = _launch(kind, tmp_path, None, None, *(["huge"] if kind.endswith("huge-step") else []))
    assert out.returncode == 0, out.stderr[-3000:]  # 0: EvalStop stopped it
    assert not Path(f"{target}.done").exists()  # the child never reached its last step
    coord = Coordinator(SQLiteStore(db))
    try:
        job = coord.status("local", f"logs-{kind}")
        reports = coord.reports("local", f"logs-{kind}")
        records = coord.audit("local", f"logs-{kind}")
        audit = [a.kind.value for a in records]
    finally:
        coord.close()
    stop = _detector_stop(CURVE)
    assert job.status == "stopped" and "consecutive declines" in job.decision.reason
    assert [r.step for r in reports][: len([s for s in CURVE if s <= stop])] == [s for s in CURVE if s <= stop]
    assert [r.eval_score for r in reports if r.step <= stop] == pytest.approx([v for s, v in CURVE.items() if s <= stop])
    assert job.best_step == 20 and "launcher_sigterm" in audit  # stopped by its launcher, at the eval of `stop`
    assert audit.count("stop") == 1
    if kind in ("verl_console", "tensorboard"):  # its proxy reward: critic/score/mean, train/reward
        assert [r.proxy_reward for r in reports] == pytest.approx([0.01 * r.step for r in reports])
    assert [a.evidence["step"] for a in records if a.kind.value == "stop"] == [stop]  # where the callback would


@pytest.mark.slow
def test_a_misspelt_metric_is_said_early_with_the_keys_and_the_run_exits_3(tmp_path):
    out = _launch("jsonl", tmp_path, "val-core/openai/gsm8k/reward/mean@l")  # l for 1
    assert out.returncode == 3, out.stderr[-3000:]
    assert "never appeared in jsonl:" in out.stderr and KEY in out.stderr and "critic/score/mean" in out.stderr
    coord = Coordinator(SQLiteStore(tmp_path / "evalstop.db"))
    try:
        job = coord.status("local", "logs-jsonl")
    finally:
        coord.close()
    assert job.status == "failed"  # not 'finished': nothing was watched


@pytest.mark.slow
def test_a_named_pipe_as_the_watched_path_never_hangs_the_launcher(tmp_path):
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    child = tmp_path / "quick.py"
    child.write_text("import time; time.sleep(1.5)\n")
    out = subprocess.run(
        [sys.executable, "-m", "evalstop_trl", "run", "--db", str(tmp_path / "e.db"), "--job-id", "fifo",
         "--metric-from", f"jsonl:{fifo}", "--metric", KEY, "--", sys.executable, str(child)],
        capture_output=True, text=True, timeout=90, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "not a regular file" in out.stderr, out.stderr[-3000:]
    assert out.returncode == 3  # the command ended; the metric never came


class _FlakyClient:
    """A coordinator that is unreachable for its first ``down`` reports, then takes them (logic only)."""

    def __init__(self, down: int) -> None:
        self.down, self.got = down, []

    def report(self, job_id, step, eval_score=None, kl=None, length=None, proxy_reward=None):
        if self.down:
            self.down -= 1
            raise ConnectionError("coordinator unreachable")
        self.got.append((step, eval_score))


def test_a_report_the_coordinator_could_not_take_is_tried_again_in_order(tmp_path):
    from evalstop_trl.launcher.metrics import MetricReporter

    path = tmp_path / "m.jsonl"
    client = _FlakyClient(down=2)
    rep = MetricReporter(MetricFrom("jsonl", path, KEY), client, "j")  # before the run writes its log
    path.write_text("".join(json.dumps({"step": s, "data": {KEY: v}}) + "\n" for s, v in [(5, 0.3), (10, 0.4)]))
    assert rep.poll_once() == 0 and rep.pending == [(5, 0.3, None, None, None), (10, 0.4, None, None, None)]  # nothing lost
    assert rep.poll_once() == 0
    with path.open("a") as f:
        f.write(json.dumps({"step": 15, "data": {KEY: 0.5}}) + "\n")
    assert rep.poll_once() == 3 and client.got == [(5, 0.3), (10, 0.4), (15, 0.5)]
    rep.close()


class _Refusing(_FlakyClient):
    """A coordinator that already holds steps up to 10 of this job: an earlier step is refused for good."""

    def report(self, job_id, step, eval_score=None, kl=None, length=None, proxy_reward=None):
        from evalstop_trl.core.errors import Conflict

        if step <= 10:
            raise Conflict("reports must come in step order")
        self.got.append((step, eval_score))


def test_a_report_refused_for_good_is_said_and_dropped_and_later_evals_go_on(tmp_path):
    from evalstop_trl.launcher.metrics import MetricReporter

    path = tmp_path / "m.jsonl"
    rep = MetricReporter(MetricFrom("jsonl", path, KEY), _Refusing(down=0), "j")
    path.write_text("".join(json.dumps({"step": s, "data": {KEY: 0.1 * s}}) + "\n" for s in (5, 10, 15)))
    assert rep.poll_once() == 1 and rep.client.got == [(15, pytest.approx(1.5))] and rep.pending == []
    rep.close()


def test_an_earlier_runs_log_at_the_path_is_not_this_jobs(tmp_path):
    """A fixed log path (tee run.log, VERL_FILE_LOGGER_PATH) holds the last run's evals: only what is written
    after the launcher starts is reported (they were reported as this job's, and this run's lower steps
    were then skipped without a word)."""
    from evalstop_trl.launcher.metrics import MetricReporter

    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s, "data": {KEY: 0.9}}) + "\n" for s in (5, 50, 100)))
    client = _FlakyClient(down=0)
    rep = MetricReporter(MetricFrom("jsonl", path, KEY), client, "j")
    with path.open("a") as f:
        f.write("".join(json.dumps({"step": s, "data": {KEY: 0.1 * s}}) + "\n" for s in (5, 10)))
    assert rep.poll_once() == 2 and [s for s, _ in client.got] == [5, 10]
    rep.close()


def test_a_bad_line_never_stops_the_reporter_thread(tmp_path):
    """A console line whose step has thousands of digits (int() refuses it) is skipped; the thread polls on."""
    import time

    from evalstop_trl.launcher.metrics import MetricReporter

    path = tmp_path / "verl.log"
    client = _FlakyClient(down=0)
    rep = MetricReporter(MetricFrom("verl_console", path, KEY), client, "j", poll_s=0.05).start()
    with path.open("w") as f:
        f.write("step:" + "9" * 5000 + f" - {KEY}:0.5\n")
        f.write(f"step:5 - {KEY}:0.25\n")
    deadline = time.monotonic() + 30
    while not client.got and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rep._thread.is_alive() and client.got == [(5, 0.25)]
    rep.close()


def _plain_log_report(coord, tmp_path):
    """The report the launcher sends for a log that gives the metric alone (job ``p``)."""
    from evalstop_trl.clients.embedded import EmbeddedClient
    from evalstop_trl.core.requests import JobRequest
    from evalstop_trl.launcher.metrics import MetricReporter

    plain = tmp_path / "plain.jsonl"
    coord.register_job("local", JobRequest("p", "grpo"))
    rep = MetricReporter(MetricFrom("jsonl", plain, KEY), EmbeddedClient(coord), "p")
    plain.write_text(json.dumps({"step": 5, "data": {KEY: 0.4}}) + "\n")
    assert rep.poll_once() == 1
    rep.close()
    (report,) = coord.reports("local", "p")
    return report


def test_the_launcher_reports_the_kl_the_log_gives_with_each_eval(tmp_path):
    """verl logs the KL each training step (``actor/kl_loss`` with a KL loss) and the validation score
    every few steps: each eval goes out with the latest KL read at or before it (what a policy's
    ``gate: kl_past_peak`` reads), and a log without a KL sends none."""
    from evalstop_trl import Coordinator
    from evalstop_trl.clients.embedded import EmbeddedClient
    from evalstop_trl.core.requests import JobRequest
    from evalstop_trl.launcher.metrics import MetricReporter

    path = tmp_path / "m.jsonl"
    coord = Coordinator()
    coord.register_job("local", JobRequest("j", "grpo"))
    rep = MetricReporter(MetricFrom("jsonl", path, KEY), EmbeddedClient(coord), "j")
    lines = [{"step": 1, "data": {"actor/kl_loss": 0.01}}, {"step": 2, "data": {"actor/kl_loss": 0.02, KEY: 0.3}},
             {"step": 3, "data": {"actor/kl_loss": 0.03}}, {"step": 4, "data": {"actor/kl_loss": float("nan")}},
             {"step": 5, "data": {KEY: 0.4}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert rep.poll_once() == 2
    assert [(r.step, r.eval_score, r.kl) for r in coord.reports("local", "j")] == [(2, 0.3, 0.02), (5, 0.4, 0.03)]
    rep.close()
    assert _plain_log_report(coord, tmp_path).kl is None


def test_the_launcher_reports_the_proxy_reward_the_log_gives_and_a_proxy_gate_reads_it(tmp_path):
    """verl logs ``critic/score/mean`` each training step: each eval goes out with the latest read at or
    before it, so a ``gate: proxy_diverges`` policy holds a fall that comes with a falling reward and
    stops one whose reward rose since the best eval (the stop says how far)."""
    from evalstop_trl.clients.embedded import EmbeddedClient
    from evalstop_trl.core.requests import JobRequest
    from evalstop_trl.launcher.metrics import MetricReporter

    path = tmp_path / "m.jsonl"
    coord = Coordinator()
    coord.register_job("local", JobRequest("j", "grpo", policy={"detector": "decline", "k": 1, "noise": "none",
                                                                "gate": "proxy_diverges"}))
    rep = MetricReporter(MetricFrom("jsonl", path, KEY), EmbeddedClient(coord), "j")
    lines = [{"step": 1, "data": {"critic/score/mean": 0.40, "critic/rewards/mean": 0.39}},
             {"step": 2, "data": {KEY: 0.6}}, {"step": 3, "data": {"critic/score/mean": 0.30}},
             {"step": 4, "data": {KEY: 0.5}},  # both fell: held
             {"step": 5, "data": {"critic/score/mean": 0.55}}, {"step": 6, "data": {KEY: 0.45}}]  # the reward rose
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert rep.poll_once() == 3
    reports = coord.reports("local", "j")
    assert [(r.step, r.proxy_reward) for r in reports] == [(2, 0.40), (4, 0.30), (6, 0.55)]
    job = coord.status("local", "j")
    assert job.status == "stopped" and job.decision.evidence["proxy_since_best"] == pytest.approx(0.15)
    assert "at step 6" in job.decision.reason and job.best_step == 2  # the fall at step 4 was held
    rep.close()


def test_the_launcher_reports_the_completion_length_the_log_gives_with_each_eval(tmp_path):
    """verl logs ``response_length/mean`` each training step: each eval goes out with the latest length
    read at or before it (exactly as the KL), and the job's stop says how it changed since the best eval;
    a console log's (OpenRLHF's ``response_length``) is read the same; a log without one sends none."""
    from evalstop_trl.clients.embedded import EmbeddedClient
    from evalstop_trl.core.requests import JobRequest
    from evalstop_trl.launcher.metrics import MetricReporter

    path = tmp_path / "m.jsonl"
    coord = Coordinator()
    coord.register_job("local", JobRequest("j", "grpo", policy={"detector": "decline", "k": 2, "noise": "none"}))
    rep = MetricReporter(MetricFrom("jsonl", path, KEY), EmbeddedClient(coord), "j")
    lines = [{"step": 1, "data": {"response_length/mean": 180.0, "response_length/max": 512, "actor/kl_loss": 0.01}},
             {"step": 2, "data": {KEY: 0.5}},
             {"step": 3, "data": {"response_length/mean": 200.0}}, {"step": 4, "data": {KEY: 0.7}},
             {"step": 5, "data": {"response_length/mean": float("nan")}},  # not a length: the latest stays
             {"step": 6, "data": {KEY: 0.6, "response_length/mean": 240.0}},
             {"step": 7, "data": {"response_length/mean": -1}}, {"step": 8, "data": {"response_length/mean": 270.0}},
             {"step": 9, "data": {KEY: 0.5}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert rep.poll_once() == 4
    reports = coord.reports("local", "j")
    assert [(r.step, r.eval_score, r.length) for r in reports] == [(2, 0.5, 180.0), (4, 0.7, 200.0), (6, 0.6, 240.0),
                                                                    (9, 0.5, 270.0)]
    decision = coord.status("local", "j").decision
    assert decision.stop and decision.evidence["length_since_best"] == pytest.approx(0.35)
    assert decision.reason.endswith("; length +35% since the best eval")
    rep.close()
    console = tmp_path / "out.log"
    coord.register_job("local", JobRequest("c", "grpo"))
    rep = MetricReporter(MetricFrom("verl_console", console, "val/score"), EmbeddedClient(coord), "c")
    console.write_text("step:1 - response_length:312.5 - kl:0.02\nstep:2 - val/score:0.4\n")
    assert rep.poll_once() == 1 and [(r.length, r.kl) for r in coord.reports("local", "c")] == [(312.5, 0.02)]
    rep.close()
    assert _plain_log_report(coord, tmp_path).length is None


def test_a_tensorboard_follower_carries_the_latest_kl_length_and_proxy_with_each_eval(tmp_path):
    """transformers' TensorBoard callback writes a training metric as ``train/KEY``: each eval goes out
    with the latest KL, completion length and proxy reward logged at or before its step, whatever order
    the events came in; a step's training scalars come before its eval's."""
    pytest.importorskip("tensorboard")
    from tensorboard.summary import Writer

    from evalstop_trl.launcher.metrics import TensorBoardTail

    tail = TensorBoardTail(tmp_path, "eval/reward")
    w = Writer(str(tmp_path))
    for step in range(1, 7):
        if step % 3 == 0:
            w.add_scalar("eval/reward", 0.1 * step, step=step)  # the eval first, its step's training log after
        w.add_scalar("train/objective/kl", 0.5 * step, step=step)
        w.add_scalar("train/completions/mean_length", 10.0 * step, step=step)
        if step != 5:
            w.add_scalar("train/reward", 0.01 * step, step=step)
    w.flush()
    points = tail.poll()
    assert [p[0] for p in points] == [3, 6]
    assert points[0][1:] == pytest.approx((0.3, 1.5, 30.0, 0.03))
    assert points[1][1:] == pytest.approx((0.6, 3.0, 60.0, 0.06))
    w.add_scalar("train/reward", 0.07, step=7)
    w.add_scalar("eval/reward", 0.9, step=8)
    w.flush()
    assert tail.poll()[0][1:] == pytest.approx((0.9, 3.0, 60.0, 0.07))  # the latest kept between polls
    tail.close()

"""World feedback evaluated by separate ``evalstop evaluate`` workers (issue 10, item 7), end to end:
a hacked tiny GRPO run publishes snapshots and keeps training; two workers score them (one is
killed mid-eval, its lease runs out, the other takes its snapshot); the run is stopped and the kept
snapshot scores as reported."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from evalstop_trl.clients.http import EvalStopClient  # noqa: E402
from evalstop_trl.train.tiny import PRESETS, GoldEval, run_tiny  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _worker(server, token, fn: str, tmp_path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "evalstop_trl", "evaluate", "--url", server.url, "--fn", fn, "--fn-path", str(ROOT),
         "--lease-s", "4", "--root", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "EVALSTOP_TOKEN": token})


def test_external_evaluators_stop_a_hacked_run(server, tmp_path):
    token = server.add_tenant("lab")
    server.start()
    doomed = _worker(server, token, "tests.slow_gold:score", tmp_path)  # hangs in its first eval
    good = None
    killed: list[int] = []

    def kill_the_doomed_one_mid_eval() -> None:
        nonlocal good
        name = f"{socket.gethostname()}-{doomed.pid}/0"
        with EvalStopClient(server.url, token) as c:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    tasks = c.evals("ext")
                except Exception:  # noqa: BLE001 - the job is not registered yet
                    tasks = []
                held = [t.step for t in tasks if t.worker == name and t.state.value == "leased"]
                if held:
                    doomed.send_signal(signal.SIGKILL)
                    killed.extend(held)
                    good = _worker(server, token, "evalstop_trl.train.tiny:gold_hacked", tmp_path)
                    return
                time.sleep(0.1)

    watcher = threading.Thread(target=kill_the_doomed_one_mid_eval)
    watcher.start()
    try:
        run = run_tiny("grpo", "hacked", output_dir=tmp_path, coordinator=server.url, token=token, job_id="ext",
                       max_steps=600, eval_every=15, callback_kwargs={"external_eval": True})
    finally:
        watcher.join()
        for p in (doomed, good):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=60)
    assert killed, "the first worker never took a snapshot"
    cb = run.callback
    assert run.stopped_at is not None and run.stopped_at < 600, (run.steps_done, cb.decision)
    assert cb.stop_lag is not None and cb.stop_lag >= 0
    with EvalStopClient(server.url, token) as c:
        job = c.status("ext")
        tasks = {t.step: t for t in c.evals("ext")}
        ack = [e for e in c.audit("ext") if e.kind.value == "ack"][0]
    assert job.status == "stopped" and "consecutive declines" in job.decision.reason
    assert ack.evidence["stop_lag"] == cb.stop_lag  # also in `evalstop status` / the demo
    assert tasks[killed[0]].state.value == "done" and tasks[killed[0]].worker != f"{socket.gethostname()}-{doomed.pid}/0"
    # the kept snapshot is the reported best, and scores as reported; the others were pruned
    best = Path(job.best_checkpoint)
    assert best == tmp_path / "trainer" / "evalstop-best" and best.is_dir()  # the best snapshot, moved there
    info = json.loads((best / "evalstop.json").read_text())
    assert (info["job_id"], info["step"], info["score"]) == ("ext", job.best_step, job.best_score), info
    assert not (tmp_path / "trainer" / f"checkpoint-{job.best_step}").exists()
    from evalstop_trl.train.evaluator import load_snapshot

    model, tok = load_snapshot(best)
    assert GoldEval(PRESETS["hacked"])(model, tok) == pytest.approx(job.best_score, abs=1e-5)
    scored = [s for s, t in tasks.items() if t.fed and s != job.best_step]
    assert scored and not any((tmp_path / "trainer" / f"checkpoint-{s}").exists() for s in scored)


def test_a_stop_prunes_every_snapshot_but_the_best_even_those_scored_late(tmp_path):
    """The race CI can hit: an evaluator that was behind scores a snapshot after the run's last prune.
    During training only scored snapshots go; at the stop every one but the best goes."""
    from evalstop_trl.clients.embedded import EmbeddedClient
    from evalstop_trl.core.coordinator import Coordinator
    from evalstop_trl.stores.memory import MemoryStore
    from evalstop_trl.train.callback import EvalStopCallback

    client = EmbeddedClient(Coordinator(MemoryStore()))
    client.register_job("ext", "grpo")
    cb = EvalStopCallback(external_eval=True, eval_every=15)
    cb.session.client, cb.session.job_id, cb._output_dir = client, "ext", str(tmp_path)
    feedback = cb.feedback  # the external mode's strategy
    for step in (15, 30, 45, 60):
        (tmp_path / f"checkpoint-{step}").mkdir()
        client.publish_snapshot("ext", step, str(tmp_path / f"checkpoint-{step}"))
        feedback.snapshots.append(step)
    for step, score in ((15, 0.5), (30, 0.4)):  # scored so far: 15 (the best) and 30
        client.post_eval("ext", step, score)
    kept = lambda: sorted(int(p.name.split("-")[1]) for p in tmp_path.iterdir())  # noqa: E731
    feedback._prune()
    assert kept() == [15, 45, 60]  # the scored non-best one went; unscored ones stay for their evaluators
    feedback._prune(final=True)
    assert kept() == [15]  # stopped: only the best is worth keeping, whatever is scored later
    client.post_eval("ext", 45, 0.9)  # a late score changes nothing on disk
    assert kept() == [15] and feedback.snapshots == [15]


def test_an_evaluator_posts_per_example_evidence(server, tmp_path):
    """A real `evalstop evaluate` worker whose function returns 32 per-prompt scores: every snapshot's
    report carries their mean, n = 32 and, after the first, the paired noise level (issue 28 item 1)."""
    token = server.add_tenant("lab")
    server.start()
    worker = _worker(server, token, "evalstop_trl.train.tiny:gold_hacked_per_example", tmp_path)
    try:
        run = run_tiny("grpo", "hacked", output_dir=tmp_path, coordinator=server.url, token=token, job_id="ext-pe",
                       max_steps=600, eval_every=15, callback_kwargs={"external_eval": True})
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert run.stopped_at is not None and run.stopped_at < 600
    with EvalStopClient(server.url, token) as c:
        reports = [r for r in c.reports("ext-pe") if r.eval_score is not None]
        job = c.status("ext-pe")
    assert len(reports) >= 3 and [r.eval_n for r in reports] == [32] * len(reports)
    assert reports[0].eval_noise is None and all(r.eval_noise > 0 for r in reports[1:]), reports
    decided = {r.step: r for r in reports}[job.decision.evidence["steps"][-1]]  # later snapshots may be scored too
    ev = job.decision.evidence  # the larger of the paired noise and the run's own eval-to-eval noise
    assert ev["noise"] >= decided.eval_noise and (ev["noise"] == decided.eval_noise) == (
        ev["noise_source"] == "paired per-example"), ev


def test_an_evaluator_pairs_each_job_with_its_own_earlier_snapshot_and_keeps_few():
    from evalstop_trl.core.examples import paired_noise
    from evalstop_trl.train.evaluator import _LastExamples

    kept = _LastExamples(jobs=2)
    assert kept.summarize("a", 10, [0.1, 0.5, 0.9]).noise is None
    assert kept.summarize("b", 10, [0.0, 0.0, 0.0]).noise is None  # another job: its own chain
    second = kept.summarize("a", 20, [0.2, 0.5, 0.7])
    assert second.noise == pytest.approx(paired_noise({0: 0.1, 1: 0.5, 2: 0.9}, {0: 0.2, 1: 0.5, 2: 0.7}))
    late = kept.summarize("a", 15, [0.1, 0.5, 0.9])  # scored out of order: not paired with a later step
    assert late.noise is None and kept.summarize("a", 30, [0.2, 0.5, 0.7]).noise == 0.0  # still paired with 20
    kept.summarize("c", 10, [1.0, 1.0])  # a third job: the least recent ("b") is forgotten
    assert kept.summarize("b", 20, [0.0, 0.1, 0.0]).noise is None

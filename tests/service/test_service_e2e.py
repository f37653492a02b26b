"""The real service on loopback: end to end, SIGKILL + restart, an outage, webhooks."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time

import pytest

from evalstop_trl import Coordinator, MemoryStore, SQLiteStore
from evalstop_trl.clients.http import EvalStopClient
from evalstop_trl.core.requests import JobRequest, ReportRequest

pytestmark = pytest.mark.slow

HACKED = [0.5, 0.6, 0.7, 0.65, 0.45, 0.4]  # the default decline k=2 stops at step 50 (0.7 -> 0.65 -> 0.45), best 30


def test_end_to_end_with_cli(server):
    alice, bob = server.add_tenant("alice"), server.add_tenant("bob")
    server.start()
    with EvalStopClient(server.url, alice) as c:
        c.register_job("run-1", "grpo", planned_steps=60)
        decisions = [c.report("run-1", 10 * (i + 1), eval_score=s) for i, s in enumerate(HACKED[:5])]
        assert [d.action.value for d in decisions] == ["continue"] * 4 + ["stop"]
        assert c.ack("run-1", "/tmp/best").acked
    out = subprocess.run([sys.executable, "-m", "evalstop_trl", "status", "--url", server.url, "--token", alice, "--json"],
                         check=True, capture_output=True, text=True).stdout
    (job,) = json.loads(out)
    assert job["status"] == "stopped" and job["best_step"] == 30 and job["best_checkpoint"] == "/tmp/best"
    with EvalStopClient(server.url, bob) as c:
        assert c.list_jobs() == []
    bad = subprocess.run([sys.executable, "-m", "evalstop_trl", "status", "--url", server.url, "--token", "nope"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "401" in bad.stderr
    down = subprocess.run([sys.executable, "-m", "evalstop_trl", "status", "--url", "http://127.0.0.1:9", "--token", "x"],
                          capture_output=True, text=True)
    assert down.returncode == 2 and "unreachable" in down.stderr and "Traceback" not in down.stderr


def test_sigkill_mid_stream_loses_nothing_acknowledged(server):
    token = server.add_tenant("acme")
    server.start()
    acked: dict[str, list[int]] = {f"j{i}": [] for i in range(6)}
    stop = threading.Event()

    def worker(job_id):
        c = EvalStopClient(server.url, token, retries=0, probe_interval_s=0.05)
        c.register_job(job_id, "grpo", policy={"detector": "decline", "k": 3})
        step = 0
        while not stop.is_set() and step < 400:
            d = c.report(job_id, step, eval_score=((step * 7919) % 13) / 13)
            if "unreachable" in d.reason:
                break
            acked[job_id].append(step)
            step += 1
        c.close()

    threads = [threading.Thread(target=worker, args=(j,)) for j in acked]
    for t in threads:
        t.start()
    time.sleep(1.5)
    server.kill()  # SIGKILL mid-stream
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert sum(map(len, acked.values())) > 50
    store = SQLiteStore(server.db)
    try:
        for job_id, steps in acked.items():
            stored = [r.step for r in store.reports("acme", job_id)]
            assert set(steps) <= set(stored), job_id
    finally:
        store.close()
    # restart: decisions equal those of a coordinator fed the same stored reports from scratch
    server.start()
    with EvalStopClient(server.url, token) as c:
        after = {v.job_id: v for v in c.list_jobs()}
    ref = Coordinator(MemoryStore())
    with EvalStopClient(server.url, token) as c:
        stored_reports = {job_id: c.reports(job_id) for job_id in acked}
    for job_id in acked:
        ref.register_job("acme", JobRequest(job_id, "grpo", policy={"detector": "decline", "k": 3}))
        for r in stored_reports[job_id]:
            ref.report("acme", job_id, ReportRequest(r.step, eval_score=r.eval_score))
        expected = ref.status("acme", job_id)
        got = after[job_id]
        assert (got.status, got.best_step, got.best_score, got.n_reports) == (
            expected.status, expected.best_step, expected.best_score, expected.n_reports)
        assert (got.decision.action, got.decision.reason) == (expected.decision.action, expected.decision.reason)


def test_outage_does_not_block_training_and_loses_nothing(server, tmp_path):
    """The coordinator is killed for 100 training steps, then started again: no report waits for it,
    and once the outbox drains every report is stored, in order. The phases go by training steps, not
    by the clock, and each bound is far from a normal run (a report during the outage answers in
    milliseconds, the replay of the outbox in well under a second): a loaded machine is slower, not
    wrong. How fast the outbox drains is measured by the benchmarks, not here."""
    token = server.add_tenant("acme")
    server.start(timeout=120)
    client = EvalStopClient(server.url, token, outbox=tmp_path / "outbox.jsonl", retries=1, probe_interval_s=0.5)
    client.register_job("long", "grpo", policy={"detector": "never"})
    slowest = {"outage": 0.0, "up": 0.0}  # a report while the coordinator is down / up (the replay included)
    step = 0

    def train(steps: int, phase: str) -> None:
        nonlocal step
        for _ in range(steps):
            t0 = time.monotonic()
            client.report("long", step, eval_score=step * 0.001, train_loss=1.0)
            slowest[phase] = max(slowest[phase], time.monotonic() - t0)
            step += 1
            time.sleep(0.05)  # a "training step"

    train(20, "up")
    server.kill()
    train(100, "outage")
    assert client.pending > 0, "the outage's reports wait in the outbox"
    server.start(timeout=120)
    drained_by = time.monotonic() + 300  # about a second normally
    while client.pending and time.monotonic() < drained_by:
        train(1, "up")
    assert client.pending == 0, f"{client.pending} reports still in the outbox 300 s after the coordinator came back"
    train(5, "up")
    # down: a refused connection answers at once, so no report waits on the outage (the design's bound:
    # the client's connect timeout, 1 s, and a retry); up again: a report may replay the outbox
    assert slowest["outage"] < 30.0, f"a report blocked the loop for {slowest['outage']:.2f} s during the outage"
    assert slowest["up"] < 120.0, f"a report blocked the loop for {slowest['up']:.2f} s (the replay included)"
    stored = [r.step for r in client.reports("long")]
    assert stored == list(range(step))  # every report, in order
    client.close()


def test_webhook_is_posted_on_stop(server):
    received = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            received.append((json.loads(self.rfile.read(int(self.headers["content-length"]))),
                         self.headers["X-EvalStop-Signature"]))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass

    hook = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    token = server.add_tenant("acme")
    server.start(args=("--webhook-allow", "127.0.0.1/32"))
    try:
        with EvalStopClient(server.url, token) as c:
            c.register_job("w", "grpo", policy={"detector": "decline", "k": 1},
                           webhook=f"http://127.0.0.1:{hook.server_address[1]}/hook")
            c.report("w", 1, eval_score=0.5)
            c.report("w", 2, eval_score=0.4)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(a.kind == "webhook" for a in c.audit()):
                time.sleep(0.1)
            assert [a.kind for a in c.audit()] == ["stop", "webhook"]
        body, signature = received[0]
        assert body["job_id"] == "w" and body["decision"]["action"] == "stop"
        assert signature.startswith("t=") and ",v1=" in signature
    finally:
        hook.shutdown()

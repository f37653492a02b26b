"""Several ``evalstop serve`` replicas over one real PostgreSQL: one truth.

Two replicas on different loopback ports share a database. Reports of the same jobs arrive at both
at once; the decisions equal those of one process fed the same stream; a SIGKILL of a replica loses
no acknowledged report while the other keeps serving; a launcher watching through a dead replica
still delivers its stop; a webhook delivery survives its replica.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from evalstop_trl import Coordinator, MemoryStore
from evalstop_trl.clients.http import EvalStopClient

from .conftest import Server

pytestmark = pytest.mark.slow


class Replica(Server):
    """`evalstop serve` over PostgreSQL (the Server fixture's class, with a DSN for a database)."""

    def __init__(self, dsn: str, log_dir) -> None:
        super().__init__(log_dir / "replica.db")
        self.dsn = dsn

    def start(self, timeout: float = 30.0, args: tuple[str, ...] = (), log_level: str = "warning") -> Replica:
        import os

        from evalstop_trl.clients.local import wait_until_healthy

        self.log = open(str(self.db) + f".{self.port}.log", "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "evalstop_trl", "serve", "--db", self.dsn, "--port", str(self.port),
             "--log-level", log_level, *args], stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if not wait_until_healthy(self.url, timeout, self.proc):
            raise RuntimeError(f"replica did not start: {open(self.log.name).read()}")
        return self


def _tenant(dsn: str, name: str) -> str:
    out = subprocess.run([sys.executable, "-m", "evalstop_trl", "tenants", "add", name, "--db", dsn, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["token"]


@pytest.fixture
def replicas(pg_dsn, tmp_path):
    token = _tenant(pg_dsn, "acme")
    a = Replica(pg_dsn, tmp_path).start(args=("--webhook-allow", "127.0.0.1/32"))
    (tmp_path / "b").mkdir()
    b = Replica(pg_dsn, tmp_path / "b").start(args=("--webhook-allow", "127.0.0.1/32"))
    yield a, b, token
    a.kill()
    b.kill()


def _curve(job: int, n: int) -> list[float]:
    """A hacked-looking curve with noise: rises, then falls (each job its own)."""
    import math

    return [round(math.sin(0.3 * s + job) * 0.05 + 0.5 + 0.02 * s - 0.004 * s * s * (job % 3 + 1) / 3, 4)
            for s in range(n)]


def test_two_replicas_decide_like_one_process(replicas):
    a, b, token = replicas
    jobs, steps = 12, 14
    with EvalStopClient(a.url, token) as c:
        for j in range(jobs):
            c.register_job(f"j{j}", "grpo", planned_steps=steps, policy={"detector": "decline", "k": 2})
    errors = []

    def trainer(j: int) -> None:  # each job alternates replicas report by report, all jobs at once
        clients = [httpx.Client(base_url=r.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
                   for r in (a, b)]
        for step, score in enumerate(_curve(j, steps)):
            for attempt in range(5):
                r = clients[(step + j) % 2].post(f"/v1/jobs/j{j}/reports", json={"step": step, "eval_score": score})
                if r.status_code != 503:  # 503: another replica wrote the job meanwhile; retry
                    break
                time.sleep(0.05 * (attempt + 1))
            if r.status_code != 200:
                errors.append((j, step, r.status_code, r.text))
        for c in clients:
            c.close()

    threads = [threading.Thread(target=trainer, args=(j,)) for j in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    one = Coordinator(MemoryStore())
    for j in range(jobs):
        one.register_job("acme", f"j{j}", "grpo", planned_steps=steps, policy={"detector": "decline", "k": 2})
        for step, score in enumerate(_curve(j, steps)):
            one.report("acme", f"j{j}", step, eval_score=score)
    for replica in (a, b):
        with EvalStopClient(replica.url, token) as c:
            got = {v.job_id: (v.status, v.best_step, v.decision.reason if v.decision else None, v.n_reports)
                   for v in c.list_jobs()}
        want = {v.job_id: (v.status, v.best_step, v.decision.reason if v.decision else None, v.n_reports)
                for v in one.list_jobs("acme")}
        assert got == want
    assert any(s == "stopped" for s, *_ in want.values()) and any(s == "running" for s, *_ in want.values())


def test_a_killed_replica_loses_no_acknowledged_report(replicas):
    a, b, token = replicas
    both = f"{a.url},{b.url}"
    acked: list[int] = []
    with EvalStopClient(both, token, retries=3) as c:
        c.register_job("k", "grpo", policy={"detector": "never"})
        for step in range(200):
            if step == 60:
                a.kill()  # SIGKILL, mid-stream; the client moves on to the other replica
            c.report("k", step, eval_score=0.5)
            assert not c.unreachable and c.pending == 0
            acked.append(step)
    with EvalStopClient(b.url, token) as c:
        assert [r.step for r in c.reports("k")] == acked  # every acknowledged report, in order
        assert c.status("k").n_reports == 200


STUBBORN = """
import os, signal, sys, time
from evalstop_trl.clients.http import EvalStopClient
signal.signal(signal.SIGTERM, lambda *a: None)
c = EvalStopClient(os.environ["EVALSTOP_URL"], os.environ["EVALSTOP_TOKEN"], retries=3)
for i, s in enumerate([0.2, 0.5, 0.4, 0.3]):
    c.report(os.environ["EVALSTOP_JOB_ID"], i, eval_score=s)
    time.sleep(0.3)
while True:
    time.sleep(0.05)
"""


def test_a_launcher_watch_survives_its_replica(replicas):
    a, b, token = replicas
    launcher = subprocess.Popen([sys.executable, "-m", "evalstop_trl", "run", "--url", f"{a.url},{b.url}", "--token",
                                 token, "--job-id", "watched", "--grace-s", "0.5", "--", sys.executable, "-c",
                                 STUBBORN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    a.kill()  # the replica the launcher polls first dies before the stop
    out, err = launcher.communicate(timeout=90)
    assert launcher.returncode == 0, err  # a job EvalStop stopped exits 0 (no scheduler retry)
    with EvalStopClient(b.url, token) as c:
        assert [e.kind.value for e in c.audit("watched")] == ["stop", "launcher_sigterm", "launcher_sigkill",
                                                           "launcher_exit"]


def test_a_webhook_delivery_survives_its_replica(replicas, tmp_path):
    import http.server

    from evalstop_trl.clients.local import free_loopback_port

    a, b, token = replicas
    port = free_loopback_port()  # the receiver is down while replica A tries (and backs off)
    with EvalStopClient(a.url, token) as c:
        c.register_job("hooked", "grpo", policy={"detector": "decline", "k": 1},
                       webhook=f"http://127.0.0.1:{port}/hook")
        c.report("hooked", 1, eval_score=0.5)
        assert c.report("hooked", 2, eval_score=0.1).stop
    time.sleep(1.0)
    a.kill()
    got = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    receiver = http.server.HTTPServer(("127.0.0.1", port), Hook)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [g["job_id"] for g in got] == ["hooked"]  # delivered once, by the surviving replica
    finally:
        receiver.shutdown()

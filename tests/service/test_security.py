"""Attacks on a real ``evalstop serve`` on 127.0.0.1, one per finding of the adversarial review
(issue 9), each now refused. Two tenants, a fresh SQLite file, real sockets and processes."""

from __future__ import annotations

import http.server
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from evalstop_trl import Conflict, NotFound, Unauthorized
from evalstop_trl.clients.http import EvalStopClient
from tests.proc_helpers import bearer, rss_kib, threads

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------- 1. confused deputy
def test_1_a_tenant_cannot_make_the_service_signal_any_process(two):
    two.start()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for body in ({"job_id": "evil", "pid": victim.pid, "pid_start_time": 1.0},
                     {"job_id": "evil", "pid": two.proc.pid},
                     {"job_id": "evil", "policy": {"detector": "decline", "enforce": True, "grace_s": 0.5}}):
            r = httpx.post(f"{two.url}/v1/jobs", json=body, headers=bearer(two.alice))
            assert r.status_code == 422, r.text
        with EvalStopClient(two.url, two.alice) as a:  # a stop of its own job signals nobody
            a.register_job("own", "grpo", policy={"detector": "decline", "k": 1})
            a.report("own", 1, eval_score=0.5)
            assert a.report("own", 2, eval_score=0.1).stop
            time.sleep(1.0)
            assert {e.kind.value for e in a.audit()} == {"stop"}  # no pid oracle in the audit log either
        assert victim.poll() is None and two.proc.poll() is None
    finally:
        victim.kill()


# ---------------------------------------------------------------- 2, 4, 9. bounds
@pytest.mark.parametrize("body, field", [
    ({"job_id": "x", "policy": {"detector": "decline", "k": 10**6}}, "k must be an integer in [1, 1000]"),
    ({"job_id": "x", "policy": {"detector": "decline", "k": 10**18}}, "k must be an integer in [1, 1000]"),
    ({"job_id": "x", "policy": {"detector": "decline", "grace_s": 1e10}}, "Unknown parameter(s) grace_s"),
    ({"job_id": "x", "policy": {"detector": "decline", "min_delta": 10**400}}, "min_delta must be a finite number"),
    ({"job_id": "x", "policy": {"detector": "loss_plateau", "window": 10**9}}, "window must be an integer"),
    ({"job_id": "x", "planned_steps": 10**400}, "planned_steps"),
    ({"job_id": "x", "policy": {"detector": "sequential", "window": 10**9}}, "window must be an integer"),
    ({"job_id": "x", "policy": {"detector": "sequential", "noise_rel": 1e-300}}, "noise_rel must be"),
    ({"job_id": "x", "policy": {"detector": "sequential", "min_evals": 10**12}}, "min_evals must be an integer"),
    ({"job_id": "x", "policy": {"detector": "trend", "noise_rel": 1e300}}, "noise_rel must be"),
    ({"job_id": "x", "policy": {"detector": "decline", "mode": "x" * 10**5}}, "policy mode must be one of"),
])
def test_2_4_9_numbers_are_bounded_and_never_500(two, body, field):
    if not two.proc:
        two.start()
    t0 = time.monotonic()
    r = httpx.post(f"{two.url}/v1/jobs", json=body, headers=bearer(two.alice))
    assert r.status_code == 422 and field in r.json()["detail"], r.text
    assert time.monotonic() - t0 < 2.0  # no work proportional to the number


@pytest.mark.parametrize("field", ["eval_score", "train_loss", "proxy_reward", "step"])
def test_9_huge_numbers_in_a_report_are_422(two, field):
    two.start()
    httpx.post(f"{two.url}/v1/jobs", json={"job_id": "j"}, headers=bearer(two.alice))
    huge = "1" + "0" * 400
    raw = f'{{"step": 1, "{field}": {huge}}}' if field != "step" else f'{{"step": {huge}}}'
    r = httpx.post(f"{two.url}/v1/jobs/j/reports", content=raw, headers={**bearer(two.alice),
                                                                          "content-type": "application/json"})
    assert r.status_code == 422 and field in r.json()["detail"], r.text


# ---------------------------------------------------------------- 3. webhooks: SSRF, size, time, threads
class _Receiver:
    """A webhook receiver on loopback that records what it gets and answers as told."""

    def __init__(self, answer_bytes: int = 0, trickle_s: float = 0.0, port: int = 0) -> None:
        self.received: list[tuple[dict, dict]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.received.append((json.loads(body), dict(self.headers)))
                self.send_response(200)
                self.send_header("content-length", str(answer_bytes))
                self.end_headers()
                if trickle_s:
                    for _ in range(int(trickle_s * 10)):
                        try:
                            self.wfile.write(b"x")
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(0.1)
                else:
                    chunk = b"x" * 65536
                    try:
                        for _ in range(answer_bytes // len(chunk)):
                            self.wfile.write(chunk)
                    except OSError:
                        pass

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def _stop_with_webhook(url: str, token: str, job: str, webhook: str) -> None:
    with EvalStopClient(url, token) as c:
        c.register_job(job, "grpo", policy={"detector": "decline", "k": 1}, webhook=webhook)
        c.report(job, 1, eval_score=0.5)
        assert c.report(job, 2, eval_score=0.1).stop


def _wait_for_webhook_audit(url: str, token: str, job: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    with EvalStopClient(url, token) as c:
        while time.monotonic() < deadline:
            entries = [a for a in c.audit(job) if a.kind.value.startswith("webhook")]
            if entries:
                return entries[-1]
            time.sleep(0.1)
    raise AssertionError("no webhook outcome in the audit log")


@pytest.mark.parametrize("host", ["localhost", "[::1]", "0x7f000001", "127.1", "169.254.169.254"])
def test_3_internal_destinations_are_refused_by_default(two, host):
    receiver = _Receiver()
    two.start()
    try:
        _stop_with_webhook(two.url, two.alice, "ssrf", f"http://{host}:{receiver.port}/admin")
        outcome = _wait_for_webhook_audit(two.url, two.alice, "ssrf")
        assert outcome.kind.value == "webhook_failed" and "not allowed" in outcome.reason
        assert "refused" not in outcome.reason.lower() and "HTTP" not in outcome.reason  # no port-scan oracle
        assert receiver.received == []
    finally:
        receiver.close()


def test_3_credentials_in_a_webhook_url_are_422(two):
    two.start()
    r = httpx.post(f"{two.url}/v1/jobs", json={"job_id": "c", "webhook": "http://user:secret@example.com/h"},
                   headers=bearer(two.alice))
    assert r.status_code == 422 and "credentials" in r.json()["detail"]


def test_3_allowed_webhooks_are_signed_strict_json_and_bounded(two):
    big = _Receiver(answer_bytes=200 * 2**20)  # a 200 MiB answer
    slow = _Receiver(trickle_s=30)  # one byte every 0.1 s for 30 s
    two.start(args=("--webhook-allow", "127.0.0.1/32"))
    try:
        rss0, threads0 = rss_kib(two.proc.pid), threads(two.proc.pid)
        for i in range(3):
            _stop_with_webhook(two.url, two.alice, f"big{i}", f"http://127.0.0.1:{big.port}/h")
        for i in range(12):
            _stop_with_webhook(two.url, two.alice, f"slow{i}", f"http://127.0.0.1:{slow.port}/h")
        t0 = time.monotonic()
        assert _wait_for_webhook_audit(two.url, two.alice, "big2").kind.value == "webhook"
        assert rss_kib(two.proc.pid) - rss0 < 64 * 1024  # the answers were not read whole
        assert threads(two.proc.pid) - threads0 <= 8  # a bounded pool, not a thread per hook
        for i in range(12):
            _wait_for_webhook_audit(two.url, two.alice, f"slow{i}", timeout=30)
        assert time.monotonic() - t0 < 30  # every attempt had a total deadline (5 s), not 30 s of trickle
        body, headers = big.received[0]
        assert body["job_id"] == "big0" and headers["X-EvalStop-Signature"].startswith("t=")
        raw = json.dumps(body)
        assert "Infinity" not in raw and "NaN" not in raw
    finally:
        big.close()
        slow.close()


def test_3_deliveries_survive_a_restart(two):
    from evalstop_trl.clients.local import free_loopback_port

    port = free_loopback_port()  # nobody listens there while the stop happens
    two.start(args=("--webhook-allow", "127.0.0.1/32"))
    _stop_with_webhook(two.url, two.alice, "later", f"http://127.0.0.1:{port}/h")
    two.kill()  # SIGKILL: the queued delivery is in the database, not only in memory
    receiver = _Receiver(port=port)
    try:
        two.start(args=("--webhook-allow", "127.0.0.1/32"))
        # a delivery claimed when the kill came waits for its claim's lease (timeout x 4 + 30 s) to run out
        from evalstop_trl.service.webhooks import WebhookPolicy

        deadline = time.monotonic() + WebhookPolicy().timeout_s * 4 + 30 + 30
        while not receiver.received and time.monotonic() < deadline:
            time.sleep(0.2)
        assert receiver.received and receiver.received[0][0]["job_id"] == "later"
    finally:
        receiver.close()


# ---------------------------------------------------------------- 5. unauthenticated exhaustion
def test_5_unauthenticated_bodies_are_refused_before_they_are_read(two):
    two.start()
    with socket.create_connection(("127.0.0.1", two.port), timeout=5) as s:
        s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 900000\r\n\r\n")  # the body never comes
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401")


def test_5_unfinished_bodies_and_idle_connections_are_dropped(two):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    two.start(args=("--header-timeout-s", "1", "--body-timeout-s", "1", "--max-connections", "500"))
    idle = []
    try:
        with socket.create_connection(("127.0.0.1", two.port), timeout=5) as s:  # an unfinished body: 408
            s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + two.alice.encode()
                      + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"job")
            assert s.recv(4096).startswith(b"HTTP/1.1 408")
        for _ in range(1100):  # more idle connections than the server keeps, more than a default fd limit
            idle.append(socket.create_connection(("127.0.0.1", two.port), timeout=5))
        time.sleep(2.0)  # past the header timeout
        r = httpx.get(f"{two.url}/v1/jobs", headers=bearer(two.alice), timeout=5)
        assert r.status_code == 200
        assert len(os.listdir(f"/proc/{two.proc.pid}/fd")) < 300  # the idle ones were closed
    finally:
        for s in idle:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ---------------------------------------------------------------- 6. quotas and fairness
def test_6_quotas_answer_429(two):
    two.start(args=("--max-active-jobs", "3", "--max-reports-per-job", "5", "--report-rate", "20",
                    "--report-burst", "20"))
    h = bearer(two.alice)
    for i in range(3):
        assert httpx.post(f"{two.url}/v1/jobs", json={"job_id": f"j{i}"}, headers=h).status_code == 201
    r = httpx.post(f"{two.url}/v1/jobs", json={"job_id": "j3"}, headers=h)
    assert r.status_code == 429 and "max_active_jobs=3" in r.json()["detail"]
    for step in range(5):
        assert httpx.post(f"{two.url}/v1/jobs/j0/reports", json={"step": step}, headers=h).status_code == 200
    r = httpx.post(f"{two.url}/v1/jobs/j0/reports", json={"step": 5}, headers=h)
    assert r.status_code == 429 and "max_reports_per_job=5" in r.json()["detail"]
    with httpx.Client(base_url=two.url, headers=h) as c:  # 100 reports as fast as one connection goes
        codes = [c.post("/v1/jobs/j1/reports", json={"step": 0}) for _ in range(100)]
    limited = [c for c in codes if c.status_code == 429]
    assert limited and int(limited[0].headers["retry-after"]) >= 1
    # bob's quota is his own
    assert httpx.post(f"{two.url}/v1/jobs", json={"job_id": "b"}, headers=bearer(two.bob)).status_code == 201


def test_6_listing_is_paged(two):
    two.start()
    with EvalStopClient(two.url, two.alice) as a:
        for i in range(7):
            a.register_job(f"p{i}", "grpo")
    r = httpx.get(f"{two.url}/v1/jobs?limit=3&offset=3", headers=bearer(two.alice))
    assert [j["job_id"] for j in r.json()] == ["p3", "p4", "p5"] and r.headers["x-total-count"] == "7"
    assert httpx.get(f"{two.url}/v1/jobs?limit=100000", headers=bearer(two.alice)).status_code == 422


def _listing_bench():
    """scripts/bench_listing.py, the scenario of the next test (the script also measures the tail)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_listing.py"
    spec = importlib.util.spec_from_file_location("bench_listing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_6_one_tenant_listing_20000_jobs_does_not_hold_up_another(two, tmp_path):
    bench = _listing_bench()
    bench.seed_jobs(two.db, "alice", 20_000)
    two.start(args=("--max-active-jobs", "100000"))
    got = bench.measure(two.url, two.alice, two.bob, 20_000, 300, tmp_path)
    pages, idle, busy = got["pages"], bench.quantile(got["idle"], 0.5), bench.quantile(got["busy"], 0.5)
    print(f"tenant B's median report latency: idle {idle * 1e3:.1f} ms, while A lists 20,000 jobs "
          f"{busy * 1e3:.1f} ms (A's pages: {pages['200']} served, {pages['429']} over its read budget)")
    assert set(pages) <= {"200", "429"}, pages  # A is served or told to wait, nothing else
    assert pages["200"] >= 20  # A did get its 20,000 jobs (a burst's worth), and went on asking
    # Before the fix a listing held the loop: B's median went from 13 to 380 ms. The bound (2 x idle +
    # 50 ms, 76 ms at 13 ms idle) is far below that and far above a busy machine's noise; only the median
    # is bounded here: a tail on a shared 2-core VM measures the VM (p99 32.5 ms failed a 30.3 ms bound
    # once). scripts/bench_listing.py measures the tail (p90, p99, max).
    assert busy <= 2 * idle + 0.050, (idle, busy)


# ---------------------------------------------------------------- 7. 200 means durable, even for a retry
def test_7_an_identical_retry_is_answered_only_once_durable(two):
    two.start()
    with EvalStopClient(two.url, two.alice) as a:
        a.register_job("d", "grpo")
    body = {"step": 1, "eval_score": 0.5}
    with httpx.Client(base_url=two.url, headers=bearer(two.alice)) as c:
        results = []
        threads = [threading.Thread(target=lambda: results.append(c.post("/v1/jobs/d/reports", json=body)))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert all(r.status_code == 200 for r in results)
    two.kill()
    two.start()
    with EvalStopClient(two.url, two.alice) as a:
        assert [r.step for r in a.reports("d")] == [1]


# ---------------------------------------------------------------- 8. the client's outbox never crashes training
@pytest.mark.parametrize("line", [b"42", b"{}", b'{"op": "explode", "job_id": "j", "path": "/v1/jobs"}',
                                  b"\xff\xfe not utf-8", b'{"op": "report", "job_id": "j", "path": "/etc/passwd"}'])
def test_8_a_corrupt_outbox_line_is_quarantined(two, tmp_path, line, caplog):
    two.start()
    outbox = tmp_path / "outbox.jsonl"
    good = json.dumps({"op": "register", "job_id": "j", "path": "/v1/jobs", "body": {"job_id": "j"}}).encode()
    outbox.write_bytes(good + b"\n" + line + b"\n")
    with EvalStopClient(two.url, two.alice, outbox=outbox) as c:
        assert c.report("j", 1, eval_score=0.5).action.value == "continue"  # replayed the good line, then reported
        assert c.pending == 0
    quarantined = (tmp_path / "outbox.jsonl.quarantine").read_text().splitlines()
    assert [json.loads(q)["line"] for q in quarantined] == [line.decode("utf-8", "backslashreplace")]
    assert sum("invalid line" in r.message for r in caplog.records) == 1


def test_8_an_unwritable_outbox_falls_back_to_memory(tmp_path, caplog):
    (tmp_path / "ro").mkdir()
    target = tmp_path / "ro" / "sub" / "outbox.jsonl"
    (tmp_path / "ro" / "sub").write_text("a file where the folder should be")
    c = EvalStopClient("http://127.0.0.1:9", "es_x", outbox=target, retries=0, connect_timeout_s=0.2)
    for step in range(3):
        assert c.report("j", step, eval_score=0.5).action.value == "continue"  # no exception into training
    assert c.pending == 3 and c.outbox_path is None or c.outbox.path is None
    assert sum("cannot be used" in r.message for r in caplog.records) == 1
    c.close()


# ---------------------------------------------------------------- 10. one error taxonomy
def test_10_http_errors_are_the_core_exceptions(two):
    two.start()
    with EvalStopClient(two.url, two.alice) as a:
        a.register_job("t", "grpo")
        a.report("t", 1, eval_score=0.5)
        with pytest.raises(Conflict):
            a.report("t", 1, eval_score=0.9)
        with pytest.raises(NotFound):
            a.status("nope")
    with EvalStopClient(two.url, "es_wrong") as w, pytest.raises(Unauthorized):
        w.status("t")


# ---------------------------------------------------------------- 11. smaller findings
def test_11_log_lines_cannot_be_forged(two):
    two.start(log_level="info")
    with EvalStopClient(two.url, two.alice) as a:
        a.register_job("f", "grpo")
        a.stop("f", "bye\nCRITICAL evalstop: database wiped by admin")
    time.sleep(0.3)
    log = Path(two.log.name).read_text()
    assert "\nCRITICAL evalstop: database wiped" not in log and "\\nCRITICAL" in log


def test_11_tenant_names_rotation_and_401s(two):
    bad = subprocess.run([sys.executable, "-m", "evalstop_trl", "tenants", "add", "evil\n", "--db", str(two.db)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "tenant name must be" in bad.stderr
    two.start()
    old = two.alice
    new = json.loads(subprocess.run([sys.executable, "-m", "evalstop_trl", "tenants", "rotate", "alice", "--db",
                                     str(two.db), "--json"], capture_output=True, text=True, check=True).stdout)["token"]
    r = httpx.get(f"{two.url}/v1/jobs", headers=bearer(old))
    assert r.status_code == 401 and "alice" not in r.text
    assert httpx.get(f"{two.url}/v1/jobs", headers=bearer(new)).status_code == 200
    subprocess.run([sys.executable, "-m", "evalstop_trl", "tenants", "revoke", "bob", "--db", str(two.db)], check=True)
    r = httpx.get(f"{two.url}/v1/jobs", headers=bearer(two.bob))
    assert r.status_code == 401 and "bob" not in r.text and "revoked" in r.text


def test_11_readyz_and_the_metrics_token(two):
    two.start(args=("--metrics-token", "ops-secret"))
    assert httpx.get(f"{two.url}/readyz").json() == {"status": "ready"}
    assert httpx.get(f"{two.url}/metrics").status_code == 401
    assert httpx.get(f"{two.url}/metrics", headers=bearer(two.alice)).status_code == 401
    assert httpx.get(f"{two.url}/metrics", headers=bearer("ops-secret")).status_code == 200


# ---------------------------------------------------------------- external evals (issue 10): paths are capabilities
def test_a_tenant_cannot_claim_or_score_another_tenants_snapshots(two):
    two.start()
    with EvalStopClient(two.url, two.alice) as a, EvalStopClient(two.url, two.bob) as b:
        a.register_job("ext", "grpo")
        a.publish_snapshot("ext", 10, "/runs/alice/checkpoint-10")
        assert b.claim_eval("bob-worker", 5) is None  # bob's queue is empty: alice's snapshot is not his
        with pytest.raises(NotFound):
            b.post_eval("ext", 10, 0.9)
        task = a.claim_eval("alice-worker", 5)
        assert (task.job_id, task.step) == ("ext", 10)
    r = httpx.post(f"{two.url}/v1/evals/claim", json={"worker": "w", "lease_s": 10**9}, headers=bearer(two.alice))
    assert r.status_code == 422 and "lease_s" in r.json()["detail"]


def test_an_evaluator_opens_only_snapshots_under_its_root(tmp_path):
    from evalstop_trl import Coordinator, MemoryStore
    from evalstop_trl.clients.embedded import EmbeddedClient
    from evalstop_trl.train.evaluator import Evaluator

    coord = Coordinator(MemoryStore())
    client = EmbeddedClient(coord)
    client.register_job("ext", "grpo")
    client.publish_snapshot("ext", 10, "/etc")  # a tenant names a path outside the operator's root
    opened = []
    evaluator = Evaluator(client, lambda m, t: opened.append(m) or 1.0, root=tmp_path)
    assert evaluator.evaluate(client.claim_eval("w", 5), "w") is None
    assert opened == [] and coord.status("local", "ext").n_reports == 1  # a missing eval, nothing opened
    assert [(r.step, r.eval_score) for r in coord.reports("local", "ext")] == [(10, None)]

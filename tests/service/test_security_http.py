"""Attacks on a real ``evalstop serve`` on loopback, round two (issue 17, items 4, 7 and parts of 9):
unauthenticated connection and memory exhaustion, webhook delivery, webhook addresses, /docs, /metrics.

Attackers connect from other loopback addresses (127.0.0.2, 127.0.0.3) so that per-address limits can
be told apart from the real client on 127.0.0.1. Every flood is bounded in count and time."""

from __future__ import annotations

import contextlib
import http.server
import json
import select
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from evalstop_trl.clients.http import EvalStopClient
from tests.proc_helpers import bearer, rss_kib

pytestmark = pytest.mark.slow


def _connect(port: int, source: str = "127.0.0.2", timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))


def _answer(s: socket.socket, timeout: float = 3.0) -> bytes:
    """What the server sent on ``s`` within ``timeout`` (b"" if it closed the connection)."""
    s.settimeout(timeout)
    try:
        return s.recv(4096)
    except ConnectionResetError:
        return b""
    except TimeoutError:
        return b"(nothing)"


def _closed(s: socket.socket, timeout: float = 2.0) -> bool:
    """Whether the server closes ``s`` within ``timeout`` (whatever it sends before)."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            if not s.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        pass
    return False


def _client(source: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=5)


# ---------------------------------------------------------------- 17.4 unauthenticated exhaustion
def test_17_4_trickled_bodies_on_public_paths_hold_no_connection(two):
    two.start(args=("--max-connections", "50", "--unauth-connections-per-ip", "0", "--unauth-rate-per-ip", "0"))
    attackers = []
    try:
        for _ in range(60):  # more than --max-connections, each declaring a body it trickles
            try:
                s = _connect(two.port)
                s.sendall(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx")
                attackers.append(s)
            except OSError:
                pass
        answers = [_answer(s) for s in attackers]
        assert len(answers) == 60 and all(a.startswith(b"HTTP/1.1 405") for a in answers), answers[:3]
        assert all(_closed(s) for s in attackers)  # and closed: no connection is held
        for _ in range(5):  # every real client is served
            assert httpx.get(f"{two.url}/healthz", timeout=5).status_code == 200
            assert httpx.get(f"{two.url}/v1/jobs", headers=bearer(two.alice), timeout=5).status_code == 200
    finally:
        for s in attackers:
            s.close()


def test_17_4_get_with_a_body_and_other_methods_off_v1_are_refused_unread(two):
    two.start()
    with _connect(two.port) as s:
        s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n")
        assert _answer(s).startswith(b"HTTP/1.1 413")
    with _connect(two.port) as s:
        s.sendall(b"PUT /dashboard/app.js HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        assert _answer(s).startswith(b"HTTP/1.1 405")
    assert httpx.get(f"{two.url}/").status_code == 200


def test_17_4_a_body_has_one_deadline_not_one_per_chunk(two):
    two.start(args=("--body-timeout-s", "1"))
    with socket.create_connection(("127.0.0.1", two.port), timeout=5) as s:
        s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + two.alice.encode()
                  + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        t0, answer = time.monotonic(), b""
        while time.monotonic() - t0 < 5 and not answer:  # one byte every 0.25 s: each chunk is in time
            try:
                s.sendall(b" ")
            except OSError:
                break
            if select.select([s], [], [], 0.25)[0]:
                answer = s.recv(4096)
        elapsed = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert elapsed < 2.5, elapsed


def test_17_4_unauthenticated_bodies_are_never_buffered(two):
    two.start(args=("--unauth-connections-per-ip", "0", "--unauth-rate-per-ip", "0"))
    rss0 = rss_kib(two.proc.pid)
    body = b"x" * (2**20 - 2)
    held, t0 = [], time.monotonic()
    try:
        for _ in range(300):  # each holds a 1 MiB - 1 body (one byte short of what it declares)
            s = _connect(two.port, timeout=2)
            try:
                s.sendall(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1048575\r\n\r\n" + body)
            except OSError:
                pass  # refused and closed before the body was read
            held.append(s)
            assert time.monotonic() - t0 < 60
        time.sleep(1.0)
        grown = (rss_kib(two.proc.pid) - rss0) // 1024
        assert grown < 16, f"RSS grew by {grown} MiB"
        assert httpx.get(f"{two.url}/healthz", timeout=5).status_code == 200
    finally:
        for s in held:
            s.close()


def test_17_4_per_address_limits_for_unauthenticated_connections_and_requests(two):
    two.start(args=("--max-connections", "50", "--unauth-connections-per-ip", "8", "--unauth-rate-per-ip", "5",
                    "--unauth-burst-per-ip", "10", "--header-timeout-s", "30"))
    slow = []
    try:
        for _ in range(30):  # request heads that never finish, from one address
            try:
                s = _connect(two.port)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                slow.append(s)
            except OSError:
                pass
        open_ = [s for s in slow if _answer(s, 0.2) == b"(nothing)"]
        assert len(open_) == 8  # the rest were closed at once
        with _client("127.0.0.3") as c:  # unauthenticated requests from one address: a budget per second
            codes = [c.get(f"{two.url}/healthz").status_code for _ in range(30)]
            assert codes.count(200) <= 12 and codes.count(429) >= 18, codes
            bad = [c.get(f"{two.url}/v1/jobs", headers=bearer("nope")).status_code for _ in range(10)]
            assert set(bad) == {429}, bad  # refused before the token lookup
        with _client("127.0.0.1") as c:  # another address, and tenants, are not held up
            for _ in range(20):
                assert c.get(f"{two.url}/v1/jobs", headers=bearer(two.alice)).status_code == 200
            assert c.get(f"{two.url}/healthz").status_code == 200
    finally:
        for s in slow:
            s.close()


def test_17_4_readyz_does_not_write_to_the_store(two):
    two.start(args=("--unauth-rate-per-ip", "0"))
    wal = Path(str(two.db) + "-wal")
    with httpx.Client() as c:
        assert c.get(f"{two.url}/readyz").json() == {"status": "ready"}
        size0 = wal.stat().st_size if wal.exists() else 0
        for _ in range(300):
            assert c.get(f"{two.url}/readyz").status_code == 200
    grown = (wal.stat().st_size if wal.exists() else 0) - size0
    assert grown < 16 * 1024, f"the WAL grew by {grown} bytes over 300 /readyz"


# ---------------------------------------------------------------- issue 25 item 3: connections per tenant
def _keep_alive_get(port: int, token: str, source: str = "127.0.0.2") -> tuple[socket.socket, bytes]:
    """One connection and the status line of one authenticated GET on it (the connection left open)."""
    s = _connect(port, source)
    s.sendall(f"GET /v1/summary HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    return s, _answer(s).split(b"\r\n", 1)[0]


@contextlib.contextmanager
def _held(port: int, token: str, n: int):
    """``n`` keep-alive connections of one tenant, each after one GET: [(socket, status line)], closed at the end
    (the caller may append more)."""
    held = []
    try:
        for _ in range(n):
            held.append(_keep_alive_get(port, token))
        yield held
    finally:
        for s, _ in held:
            s.close()


def test_25_3_one_tenant_cannot_hold_every_connection(two):
    """1000 cheap keep-alive connections took every slot before; now a tenant holds at most its
    share (--max-connections-per-tenant), the rest are 429 and closed, and another tenant is served."""
    two.start(args=("--max-connections", "60", "--max-connections-per-tenant", "8",
                    "--unauth-connections-per-ip", "0", "--unauth-rate-per-ip", "0"))
    with _held(two.port, two.alice, 20) as held:
        codes = [status for _, status in held]
        assert codes.count(b"HTTP/1.1 200 OK") == 8 and codes.count(b"HTTP/1.1 429 Too Many Requests") == 12, codes
        refused = [s for s, status in held if b"429" in status]
        assert all(_closed(s) for s in refused)
        with _client("127.0.0.1") as c:
            assert c.get(f"{two.url}/v1/jobs", headers=bearer(two.bob)).status_code == 200
            r = c.get(f"{two.url}/v1/jobs", headers=bearer(two.alice))
            assert r.status_code == 429 and "max-connections-per-tenant" in r.json()["detail"]
        kept = [s for s, status in held if b"200" in status]
        kept[0].close()  # a connection given back: the tenant may open one again
        deadline = time.monotonic() + 5
        while True:
            s, status = _keep_alive_get(two.port, two.alice)
            held.append((s, status))
            if b"200" in status or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert b"200" in status, status


def test_25_3_a_full_server_reclaims_an_idle_keep_alive_connection_for_another_tenant(two):
    """Every slot held by one tenant's idle keep-alive connections (no per-tenant limit): a new
    connection closes one of them instead of being refused, and the other tenant is served."""
    two.start(args=("--max-connections", "20", "--max-connections-per-tenant", "0",
                    "--unauth-connections-per-ip", "0", "--unauth-rate-per-ip", "0"))
    with _held(two.port, two.alice, 20) as held:
        assert all(b"200" in status for _, status in held), [st for _, st in held]
        with _client("127.0.0.1") as c:
            assert c.get(f"{two.url}/v1/jobs", headers=bearer(two.bob)).status_code == 200
        assert sum(_closed(s, 0.5) for s, _ in held) >= 1  # alice's reclaimed connection


# ---------------------------------------------------------------- 17.7 webhook delivery
class _Trickler:
    """A webhook receiver that answers one byte every 0.5 s, from the status line on, and records how
    long each connection stayed open."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[float] = []  # seconds each connection was held by the server
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        t0 = time.monotonic()
        answer = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 200
        with conn:
            conn.recv(65536)
            for byte in answer:
                if self.closed:
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.5)
        self.held.append(time.monotonic() - t0)

    def close(self) -> None:
        self.closed = True
        self.sock.close()


class _Receiver:
    def __init__(self, protocol: str = "HTTP/1.1", close: bool = False) -> None:
        self.received: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = protocol

            def do_POST(self):
                n = int(self.headers["content-length"])
                outer.received.append(json.loads(self.rfile.read(n)))
                self.send_response(200)
                if close:
                    self.send_header("Connection", "close")
                else:
                    self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                if close:
                    self.close_connection = True

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


def _stop_with_webhook(url: str, token: str, job: str, webhook: str) -> None:
    with EvalStopClient(url, token) as c:
        c.register_job(job, "grpo", policy={"detector": "decline", "k": 1}, webhook=webhook)
        c.report(job, 1, eval_score=0.5)
        assert c.report(job, 2, eval_score=0.1).stop


def _webhook_outcome(url: str, token: str, job: str, timeout: float) -> object | None:
    deadline = time.monotonic() + timeout
    with EvalStopClient(url, token) as c:
        while time.monotonic() < deadline:
            entries = [a for a in c.audit(job) if a.kind.value.startswith("webhook")]
            if entries:
                return entries[-1]
            time.sleep(0.1)
    return None


def test_17_7_a_trickling_receiver_gets_one_deadline_and_delays_no_other_tenant(two):
    trickler, fast = _Trickler(), _Receiver()
    two.start(args=("--webhook-allow", "127.0.0.1/32"))
    try:
        for i in range(4):
            _stop_with_webhook(two.url, two.alice, f"a{i}", f"http://127.0.0.1:{trickler.port}/h")
        time.sleep(1.0)  # alice's deliveries are under way
        t0 = time.monotonic()
        _stop_with_webhook(two.url, two.bob, "b", f"http://127.0.0.1:{fast.port}/h")
        outcome = _webhook_outcome(two.url, two.bob, "b", timeout=6)
        assert outcome is not None and outcome.kind.value == "webhook", outcome
        assert time.monotonic() - t0 < 3.0  # bob's lane was free: alice's slow receiver did not delay it
        deadline = time.monotonic() + 10
        while not trickler.held and time.monotonic() < deadline:
            time.sleep(0.1)
        assert trickler.held and max(trickler.held) < 7.0, trickler.held  # a 5 s deadline per attempt
    finally:
        trickler.close()
        fast.close()


class _EarlyCloser:
    """An HTTP/1.0 receiver that answers 200 after the first bytes of the request and closes at once
    (the rest of the request unread, so its kernel resets the connection)."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(64)
                self.received.append({})
                conn.sendall(b"HTTP/1.0 200 OK\r\nConnection: close\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("kind", ["HTTP/1.0", "HTTP/1.1", "early"])
def test_17_7_a_receiver_that_closes_the_connection_gets_one_post(two, kind):
    receiver = _EarlyCloser() if kind == "early" else _Receiver(kind, close=True)
    two.start(args=("--webhook-allow", "127.0.0.1/32"))
    try:
        _stop_with_webhook(two.url, two.alice, "j", f"http://127.0.0.1:{receiver.port}/h")
        outcome = _webhook_outcome(two.url, two.alice, "j", timeout=10)
        assert outcome is not None and outcome.kind.value == "webhook" and outcome.reason == "webhook delivered"
        time.sleep(2.0)  # no retry follows
        assert len(receiver.received) == 1
    finally:
        receiver.close()


# ---------------------------------------------------------------- 17.9 webhook addresses, /docs, /metrics
@pytest.mark.parametrize("host", ["100.64.0.1", "100.127.255.254", "[2002:7f00:1::1]", "[64:ff9b::7f00:1]",
                                  "224.0.0.1", "198.18.0.1"])
def test_17_9_webhooks_go_only_to_global_addresses(two, host):
    two.start(args=("--webhook-allow", "*"))  # every host name: still no shared, 6to4 or multicast address
    _stop_with_webhook(two.url, two.alice, "x", f"http://{host}:9/h")
    outcome = _webhook_outcome(two.url, two.alice, "x", timeout=8)
    assert outcome is not None and outcome.kind.value == "webhook_failed" and "not allowed" in outcome.reason


def test_17_9_resolve_destination_refuses_what_is_not_global():
    from evalstop_trl.service.webhooks import DeliveryRefused, WebhookPolicy, resolve_destination

    anywhere = WebhookPolicy(allow=("*",))
    for address in ("100.64.0.1", "2002:7f00:1::1", "64:ff9b::a00:1", "::ffff:10.0.0.1", "224.0.0.1", "0.0.0.0",
                    "2001:db8::1", "fc00::1", "127.0.0.1"):
        with pytest.raises(DeliveryRefused, match="not explicitly allowed"):
            resolve_destination("http://hook.example.com/h", anywhere, lambda h, p, a=address: [a])
    assert resolve_destination("http://hook.example.com/h", anywhere, lambda h, p: ["8.8.8.8"]) == ("8.8.8.8", 80)
    explicit = WebhookPolicy(allow=("100.64.0.0/10", "127.0.0.1/32"))  # the operator names it: allowed
    assert resolve_destination("http://100.64.1.2:81/h", explicit, lambda h, p: ["100.64.1.2"]) == ("100.64.1.2", 81)
    assert resolve_destination("http://127.0.0.1/h", explicit, lambda h, p: ["127.0.0.1"]) == ("127.0.0.1", 80)


def test_17_9_no_docs_page_loads_scripts_from_elsewhere(two):
    two.start()
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        r = httpx.get(f"{two.url}{path}")
        assert r.status_code == 404 and "cdn" not in r.text, path
    spec = httpx.get(f"{two.url}/openapi.json").json()
    assert "/v1/jobs/{job_id}/reports" in spec["paths"]
    page = httpx.get(f"{two.url}/")
    assert "script-src 'self'" in page.headers["content-security-policy"] and "cdn" not in page.text


def test_17_9_metrics_need_the_operator_token_by_default(two):
    two.start()
    for headers in ({}, bearer(two.alice), bearer("x")):
        r = httpx.get(f"{two.url}/metrics", headers=headers)
        assert r.status_code == 401 and "--metrics-token" in r.json()["detail"], r.text
    assert "evalstop_reports" not in httpx.get(f"{two.url}/metrics").text
    two.stop()
    two.start(args=("--metrics-public",))
    assert "evalstop_reports_total" in httpx.get(f"{two.url}/metrics").text

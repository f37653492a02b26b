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


# ---------------------------------------------------------------- red-team pass: request heads, reclaim
def _status(answer: bytes) -> bytes:
    return answer.split(b"\r\n", 1)[0]


def test_a_large_request_head_is_431_or_closed_never_served(two):
    """A 200 KB header was answered 200: a head is bounded in bytes (431, or closed mid-upload)."""
    two.start()
    with _connect(two.port) as s:
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200_000 + b"\r\n\r\n")
        except OSError:
            pass  # closed while we sent: refused
        answer = _answer(s)
        assert answer == b"" or _status(answer) == b"HTTP/1.1 431 Request Header Fields Too Large", answer[:200]
        assert _closed(s)
    assert httpx.get(f"{two.url}/healthz", timeout=5).status_code == 200


def test_a_request_head_with_too_many_headers_is_431(two):
    """A head small in bytes but of a thousand headers: bounded in count (431, closed)."""
    two.start()
    with _connect(two.port) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"a: 1\r\n" * 1000 + b"\r\n")
        answer = _answer(s)
        assert _status(answer) == b"HTTP/1.1 431 Request Header Fields Too Large", answer[:200]
        assert b"headers" in answer
        assert _closed(s)
    with _client("127.0.0.1") as c:  # a tenant's ordinary head is served
        assert c.get(f"{two.url}/v1/jobs", headers={**bearer(two.alice), **{f"x-{i}": "y" * 100 for i in range(40)}}
                     ).status_code == 200


def test_endless_request_heads_are_cut_off_in_bounded_memory(two):
    """Six unauthenticated connections streaming an endless header grew the server by 225 MB in 6 s: each
    is now cut off at the head limit, and the server's memory barely moves."""
    two.start(args=("--header-timeout-s", "60"))  # the head limit cuts them, not the deadline
    rss0 = rss_kib(two.proc.pid)
    sent, cut = [0] * 6, [False] * 6

    def stream(i: int) -> None:
        chunk = b"a" * 65536
        with _connect(two.port, source=f"127.0.0.{i + 2}") as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ")
            t0 = time.monotonic()
            while time.monotonic() - t0 < 4.0:
                try:
                    s.sendall(chunk)
                except OSError:
                    cut[i] = True
                    return
                sent[i] += len(chunk)
            peak.append(rss_kib(two.proc.pid))
            cut[i] = _closed(s, 0.5)

    peak: list[int] = []
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    grown = (max([rss_kib(two.proc.pid), *peak]) - rss0) // 1024
    print(f"sent {sum(sent) >> 20} MiB of head; server RSS grew by {grown} MiB; cut {cut}")
    assert all(cut), (cut, sent)
    assert grown < 32, f"RSS grew by {grown} MiB"
    assert httpx.get(f"{two.url}/healthz", timeout=5).status_code == 200


def _idle_unauthenticated(port: int, sources: list[str], per_source: int, kind: str) -> list[socket.socket]:
    """``per_source`` unauthenticated connections from each address: after one ``GET /healthz`` each (idle
    keep-alive), or silent (nothing sent). Those the server refuses at once are dropped."""
    held = []
    for source in sources:
        for _ in range(per_source):
            try:
                s = _connect(port, source)
            except OSError:
                continue
            if kind == "keep-alive":
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                if not _answer(s, 2.0).startswith(b"HTTP/1.1 200"):
                    s.close()
                    continue
            held.append(s)
    return held


@pytest.mark.parametrize("kind", ["keep-alive", "silent"])
def test_idle_unauthenticated_connections_are_reclaimed_for_a_tenant(two, kind):
    """63 addresses held all 1,000 slots with idle unauthenticated keep-alive connections, never reclaimed:
    a tenant's new connection now closes the oldest of them and is served."""
    two.start(args=("--max-connections", "40", "--unauth-connections-per-ip", "8", "--unauth-rate-per-ip", "0",
                    "--header-timeout-s", "60"))
    held = _idle_unauthenticated(two.port, [f"127.0.0.{i}" for i in range(2, 8)], 8, kind)
    try:
        assert len(held) >= 38, len(held)  # every slot taken (6 x 8 = 48 > 40)
        with _client("127.0.0.1") as c:
            for _ in range(3):
                r = c.get(f"{two.url}/v1/jobs", headers=bearer(two.alice))
                assert r.status_code == 200, r.text
        assert any(_closed(s, 0.3) for s in held)  # a reclaimed one (the oldest first)
    finally:
        for s in held:
            s.close()


def test_a_tenant_of_busy_long_polls_does_not_shield_another_tenants_idle_connections(two):
    """Only the tenant holding the most connections was looked at: with every one of its connections a busy
    long poll, nothing was reclaimed and a third tenant was turned away while bob held idle ones."""
    carol = two.add_tenant("carol")
    two.start(args=("--max-connections", "30", "--max-connections-per-tenant", "0",
                    "--unauth-connections-per-ip", "0", "--unauth-rate-per-ip", "0"))
    with httpx.Client(base_url=two.url, headers=bearer(two.alice), timeout=5) as c:
        assert c.post("/v1/jobs", json={"job_id": "long"}).status_code == 201
    polls = []
    try:
        for _ in range(18):  # alice: the heaviest tenant, every connection busy in a long poll
            s = _connect(two.port)
            s.sendall(f"GET /v1/jobs/long/decision?wait=30 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {two.alice}"
                      "\r\n\r\n".encode())
            polls.append(s)
        time.sleep(1.0)  # every poll authenticated and waiting
        with _held(two.port, two.bob, 12) as held:  # bob: idle keep-alive connections, fewer than alice's
            assert all(b"200" in status for _, status in held), [st for _, st in held]
            with _client("127.0.0.1") as c:
                r = c.get(f"{two.url}/v1/jobs", headers=bearer(carol))
                assert r.status_code == 200, r.text
            assert any(_closed(s, 0.3) for s, _ in held)  # bob's reclaimed connection
        assert all(_answer(s, 0.05) == b"(nothing)" for s in polls)  # alice's polls are still running
    finally:
        for s in polls:
            s.close()


def test_idle_connections_others_hold_at_a_shared_address_do_not_keep_a_tenant_out(two):
    """An address at its limit of unauthenticated connections turned every new one away, a tenant's too,
    for as long as others there held idle ones: a new connection now closes the address's oldest idle one."""
    two.start(args=("--unauth-connections-per-ip", "8", "--unauth-rate-per-ip", "0", "--header-timeout-s", "60"))
    held = _idle_unauthenticated(two.port, ["127.0.0.2"], 4, "keep-alive")
    held += _idle_unauthenticated(two.port, ["127.0.0.2"], 4, "silent")
    try:
        assert len(held) == 8
        with _client("127.0.0.2") as c:  # bob, behind the same address
            for _ in range(3):
                assert (r := c.get(f"{two.url}/v1/jobs", headers=bearer(two.bob))).status_code == 200, r.text
        assert _closed(held[0], 0.5)  # the oldest idle one was reclaimed
    finally:
        for s in held:
            s.close()


def test_the_documented_head_bounds_are_the_protocols():
    from evalstop_trl.service.protocol import MAX_HEAD_BYTES, MAX_HEADERS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert f"| {MAX_HEAD_BYTES // 1024} KiB / {MAX_HEADERS} (431, closed) |" in doc

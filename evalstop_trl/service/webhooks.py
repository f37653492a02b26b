"""Webhook deliveries: durable, allowlisted, signed, bounded.

A stop of a job that registered a webhook queues a :class:`~evalstop_trl.core.records.Delivery` in
the same atomic write as the stop itself (the store's ``deliveries`` table), so a restart resumes
every delivery that was not finished. :class:`WebhookSender` delivers them from a bounded pool of
threads. What a tenant can make the server do is limited by the operator:

* **Allowlist** (``evalstop serve --webhook-allow PATTERN``, repeatable; default: none, so no
  webhook is ever sent). A pattern is a host name (``hooks.example.com``), a host glob
  (``*.example.com``) or an address/network (``203.0.113.7``, ``10.20.0.0/16``). The host is
  resolved *at connect time* and the connection goes to the checked address (no second lookup a DNS
  rebinding could change). An address that is not globally reachable (``ipaddress``'s ``is_global``:
  loopback, private, shared 100.64.0.0/10, link-local, reserved, documentation...), a multicast
  address, 6to4 (2002::/16) and an IPv6 address that embeds a non-global IPv4 one (mapped, NAT64,
  Teredo) is refused unless an address/network pattern covers it explicitly (a host name pattern or
  glob is not enough).
* **No credentials** in URLs (refused at registration); every payload is signed instead:
  ``X-EvalStop-Signature: t=<unix time>,v1=<hex HMAC-SHA256(tenant's webhook secret, "<t>.<body>")>``.
* **Bounded**: one deadline for a whole attempt (connect, TLS, send, the answer's status line: a
  receiver that trickles its answer is cut off at it), only the status line of the answer is read
  (``Connection: close``: no body, no keep-alive to wait on; a 2xx is delivered even if the receiver
  closes or resets the connection right after it), a fixed number of worker threads, a fixed number
  of attempts with exponential backoff.
* **Fair**: per-tenant delivery lanes; at most ``per_tenant`` attempts of one tenant run at once and
  tenants take turns, so one tenant's slow receivers never hold the workers another tenant's
  webhooks need.
* **Quiet**: the audit log tells the tenant one of three outcomes (delivered, refused by the
  operator's allowlist, not delivered), never raw network errors, so it is no port scanner.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import http.client
import ipaddress
import logging
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from ..core.coordinator import Coordinator
from ..core.errors import NotFound
from ..core.records import AuditKind, Delivery

__all__ = ["DeliveryRefused", "WebhookPolicy", "WebhookSender", "is_public", "resolve_destination", "sign"]

log = logging.getLogger("evalstop")

Resolver = Callable[[str, int], Sequence[str]]


class DeliveryRefused(Exception):
    """The destination is not allowed by the operator's webhook policy."""


@dataclass(frozen=True)
class WebhookPolicy:
    """What the operator allows webhooks to do (see the module docstring)."""

    allow: tuple[str, ...] = ()
    timeout_s: float = 5.0
    max_response_bytes: int = 64 * 1024
    attempts: int = 5
    backoff_s: float = 1.0
    workers: int = 4
    per_tenant: int = 1  # attempts of one tenant at once (a lane)

    def __post_init__(self) -> None:
        for pattern in self.allow:
            if not isinstance(pattern, str) or not pattern.strip():
                raise ValueError(f"webhook allow patterns must be non-empty strings, but got {pattern!r}.")
            if _network(pattern) is None and not all(c.isalnum() or c in "-.*?" for c in pattern):
                raise ValueError(f"webhook allow pattern {pattern!r} is neither a host name, a host glob nor an "
                                 "address or network such as 10.0.0.0/8.")
        if not 0 < self.timeout_s <= 60 or not 1 <= self.attempts <= 20 or not 1 <= self.workers <= 64:
            raise ValueError("webhook timeout_s must be in (0, 60], attempts in [1, 20], workers in [1, 64].")
        if not 1 <= self.per_tenant <= self.workers:
            raise ValueError(f"webhook per_tenant must be in [1, workers={self.workers}], but got {self.per_tenant!r}.")


def _network(pattern: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(pattern.strip("[]"), strict=False)
    except ValueError:
        return None


_SIXTOFOUR = ipaddress.ip_network("2002::/16")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def is_public(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a webhook may go to ``addr`` without the operator naming it: globally reachable, not
    multicast, not 6to4, and no non-global IPv4 address inside an IPv6 one."""
    if addr.version == 6:
        if addr in _SIXTOFOUR:
            return False
        embedded = [addr.ipv4_mapped, *(addr.teredo or ())]
        if addr in _NAT64:
            embedded.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
        if any(e is not None and not is_public(e) for e in embedded):
            return False
    return addr.is_global and not addr.is_multicast


def _default_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def resolve_destination(url: str, policy: WebhookPolicy, resolve: Resolver = _default_resolver) -> tuple[str, int]:
    """Check ``url`` against ``policy`` and return the ``(address, port)`` to connect to.

    Raises:
        DeliveryRefused: the host or one of its addresses is not allowed.
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if any(c <= " " or c == "\x7f" for c in url):
        raise DeliveryRefused("the URL has characters HTTP does not allow")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise DeliveryRefused("the URL's port is not a port") from None
    networks = [n for n in (_network(p) for p in policy.allow) if n is not None]
    globs = [p.lower() for p in policy.allow if _network(p) is None]
    try:
        addresses = [ipaddress.ip_address(a.split("%")[0]) for a in resolve(host, port)]
    except (OSError, ValueError, UnicodeError):
        raise DeliveryRefused("the host does not resolve") from None
    if not addresses:
        raise DeliveryRefused("the host does not resolve")
    named = any(fnmatch.fnmatchcase(host, g) for g in globs)
    for addr in addresses:
        in_network = any(addr in n for n in networks)
        if not is_public(addr) and not in_network:
            raise DeliveryRefused("the address is internal and not explicitly allowed")
        if not (in_network or named):
            raise DeliveryRefused("the destination is not on the operator's allowlist")
    return str(addresses[0]), port


def sign(secret: str, body: str, timestamp: int) -> str:
    """The ``X-EvalStop-Signature`` header value of ``body``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.{body}".encode(), hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


_STATUS_LINE_MAX = 4096


def _left(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("webhook deadline passed")
    return remaining


def _request(parts, body: bytes, headers: dict[str, str]) -> bytes:
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"POST {target} HTTP/1.1", f"Host: {parts.netloc.rpartition('@')[2]}",
             *(f"{k}: {v}" for k, v in headers.items()), f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _tls(sock: socket.socket, hostname: str | None, deadline: float) -> ssl.SSLSocket:
    """The TLS handshake, bounded by ``deadline`` as a whole (not per read)."""
    tls = ssl.create_default_context().wrap_socket(sock, server_hostname=hostname, do_handshake_on_connect=False)
    tls.setblocking(False)
    while True:
        try:
            tls.do_handshake()
            return tls
        except ssl.SSLWantReadError:
            select.select([tls], [], [], _left(deadline))
        except ssl.SSLWantWriteError:
            select.select([], [tls], [], _left(deadline))


def _status(head: bytes) -> int | None:
    """The final status of an answer's head (interim 1xx answers skipped), None until it is complete."""
    while True:
        line, sep, rest = head.partition(b"\n")
        if not sep:
            return None
        fields = line.split(None, 2)
        if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
            raise http.client.BadStatusLine(line[:80].decode("latin-1"))
        status = int(fields[1])
        if not 100 <= status < 200:
            return status
        end = head.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = head[end + 4:]


def _post(url: str, address: str, port: int, body: str, headers: dict[str, str], policy: WebhookPolicy) -> int:
    """POST to the checked ``address`` under one deadline for the whole attempt; returns the status.

    Only the status line of the answer is read; the request says ``Connection: close``. A receiver
    that answers and closes (or resets) before reading all of the request still counts: its status
    line is read from what arrived."""
    parts = urlsplit(url)
    deadline = time.monotonic() + policy.timeout_s
    sock = socket.create_connection((address, port), timeout=_left(deadline))
    try:
        if parts.scheme == "https":
            sock = _tls(sock, parts.hostname, deadline)
        sock.settimeout(_left(deadline))
        try:
            sock.sendall(_request(parts, body.encode(), headers))  # the timeout bounds the whole sendall
        except (BrokenPipeError, ConnectionResetError):
            pass  # the receiver may have answered already: read what it sent
        head, cap = b"", min(_STATUS_LINE_MAX, policy.max_response_bytes + 1)
        while len(head) < cap:
            sock.settimeout(_left(deadline))
            try:
                chunk = sock.recv(cap - len(head))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            head += chunk
            if _status(head) is not None:
                break
        status = _status(head)
        if status is None:
            raise http.client.IncompleteRead(head)
        return status
    finally:
        sock.close()


class _Lanes:
    """Claimed deliveries in per-tenant FIFO lanes: :meth:`take` hands out the next one of the tenant
    whose turn it is, skipping tenants with ``per_tenant`` attempts running (not thread-safe: the
    sender holds its lock)."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._queues: dict[str, deque[Delivery]] = {}  # insertion order = turn order
        self._running: dict[str, int] = {}
        self._ids: set[str] = set()

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, d: Delivery) -> bool:
        if d.id in self._ids:
            return False
        self._ids.add(d.id)
        self._queues.setdefault(d.tenant, deque()).append(d)
        return True

    def take(self) -> Delivery | None:
        for tenant in list(self._queues):
            queue = self._queues[tenant]
            if self._running.get(tenant, 0) >= self.per_tenant:
                continue
            d = queue.popleft()
            del self._queues[tenant]  # to the back of the turn order
            if queue:
                self._queues[tenant] = queue
            self._running[tenant] = self._running.get(tenant, 0) + 1
            return d
        return None

    def done(self, d: Delivery) -> None:
        self._ids.discard(d.id)
        left = self._running.get(d.tenant, 1) - 1
        if left > 0:
            self._running[d.tenant] = left
        else:
            self._running.pop(d.tenant, None)


class WebhookSender:
    """Delivers queued webhook deliveries (a background worker of the service's lifespan): one thread
    claims due deliveries into per-tenant lanes, a pool of ``policy.workers`` threads runs attempts."""

    def __init__(self, coordinator: Coordinator, policy: WebhookPolicy | None = None,
                 clock: Callable[[], float] = time.time, resolve: Resolver = _default_resolver,
                 poll_s: float = 0.5) -> None:
        self.coordinator, self.policy, self.clock, self.resolve = coordinator, policy or WebhookPolicy(), clock, resolve
        self.poll_s = poll_s
        self._pool = ThreadPoolExecutor(max_workers=self.policy.workers, thread_name_prefix="evalstop-webhook")
        self._lanes = _Lanes(self.policy.per_tenant)
        self._running = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="evalstop-webhooks", daemon=True)

    # worker lifecycle
    def start(self) -> None:
        self.coordinator.add_stop_listener(self._on_stop)
        self._thread.start()

    def close(self) -> None:
        self.coordinator.remove_stop_listener(self._on_stop)
        self._closed = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _on_stop(self, job, decision) -> None:
        if job.webhook:
            self._wake.set()  # the delivery is already queued in the store, with the stop

    def _loop(self) -> None:
        while not self._closed:
            try:
                self.dispatch()
            except Exception:  # noqa: BLE001 - the sender must outlive any one failure
                log.exception("webhook dispatch failed")
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def dispatch(self) -> int:
        """Claim due deliveries into the lanes (at most ``16 x workers`` held) and start what the
        workers and lanes allow; returns how many were claimed."""
        with self._lock:
            room = self.policy.workers * 16 - len(self._lanes)
        n = 0
        if room > 0:
            # leased past every attempt's deadline: no other replica takes them meanwhile
            due = self.coordinator.store.claim_deliveries(self.clock(), room, self.policy.timeout_s * 4 + 30)
            with self._lock:
                n = sum(self._lanes.add(d) for d in due)
        self._pump()
        return n

    def _pump(self) -> None:
        """Start attempts while a worker is free and some lane may run."""
        with self._lock:
            while not self._closed and self._running < self.policy.workers:
                d = self._lanes.take()
                if d is None:
                    return
                self._running += 1
                try:
                    self._pool.submit(self._attempt, d)
                except RuntimeError:  # the pool shut down meanwhile (close): the delivery stays queued in the store
                    self._running -= 1
                    self._lanes.done(d)
                    return

    def _attempt(self, d: Delivery) -> None:
        try:
            self._deliver(d)
        except Exception:  # noqa: BLE001
            log.exception("webhook delivery %s failed unexpectedly", d.id)
        finally:
            with self._lock:
                self._running -= 1
                self._lanes.done(d)
            if not self._closed:
                self._pump()

    def _deliver(self, d: Delivery) -> None:
        attempt = d.attempts + 1
        try:
            secret = self.coordinator.tenants.webhook_secret(d.tenant)
        except NotFound:
            secret = ""
        ts = int(self.clock())
        headers = {"Content-Type": "application/json", "User-Agent": "evalstop-webhook/1",
                   "X-EvalStop-Signature": sign(secret, d.body, ts), "X-EvalStop-Delivery": d.id}
        try:
            address, port = resolve_destination(d.url, self.policy, self.resolve)
        except DeliveryRefused as exc:
            log.warning("webhook of %s/%s refused: %s", d.tenant, d.job_id, exc)
            self._finish(d, attempt, "refused", AuditKind.WEBHOOK_FAILED,
                         "webhook not sent: the destination is not allowed by the operator's webhook policy")
            return
        try:
            status = _post(d.url, address, port, d.body, headers, self.policy)
            ok = 200 <= status < 300
        except (OSError, http.client.HTTPException, TimeoutError, ssl.SSLError, ValueError):
            ok = False
        if ok:
            self._finish(d, attempt, "delivered", AuditKind.WEBHOOK, "webhook delivered")
        elif attempt >= self.policy.attempts:
            self._finish(d, attempt, "failed", AuditKind.WEBHOOK_FAILED,
                         f"webhook not delivered after {attempt} attempts")
        else:
            wait = self.policy.backoff_s * 2 ** (attempt - 1)
            self._store(replace(d, attempts=attempt, next_at=self.clock() + wait))

    def _store(self, d: Delivery) -> None:
        from ..core.store import wait_durable

        wait_durable(self.coordinator.store.update_delivery(d))

    def _finish(self, d: Delivery, attempt: int, outcome: str, kind: AuditKind, reason: str) -> None:
        self._store(replace(d, attempts=attempt, done=True, outcome=outcome))
        try:
            self.coordinator.append_event(d.tenant, d.job_id, kind, reason, {"attempts": attempt}, actor="webhook")
        except NotFound:
            pass

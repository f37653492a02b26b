"""Webhook deliveries: durable, allowlisted, signed, bounded.

A stop of a job that registered a webhook queues a :class:`~evalstop_trl.core.records.Delivery` in
the same atomic write as the stop itself (the store's ``deliveries`` table), so a restart resumes
every delivery that was not finished. :class:`WebhookSender` delivers them from a bounded pool of
threads. What a tenant can make the server do is limited by the operator:

* **Allowlist** (``evalstop serve --webhook-allow PATTERN``, repeatable; default: none, so no
  webhook is ever sent). A pattern is a host name (``hooks.example.com``), a host glob
  (``*.example.com``) or an address/network (``203.0.113.7``, ``10.20.0.0/16``). The host is
  resolved *at connect time* and the connection goes to the checked address (no second lookup a DNS
  rebinding could change). A loopback, private, link-local, multicast or reserved address is refused
  unless an address/network pattern covers it explicitly (a host name pattern is not enough).
* **No credentials** in URLs (refused at registration); every payload is signed instead:
  ``X-EvalStop-Signature: t=<unix time>,v1=<hex HMAC-SHA256(tenant's webhook secret, "<t>.<body>")>``.
* **Bounded**: one total deadline per attempt (connect, send, every read), at most
  ``max_response_bytes`` of the answer read, a fixed number of worker threads, a fixed number of
  attempts with exponential backoff.
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
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from ..core.coordinator import Coordinator
from ..core.errors import NotFound
from ..core.records import AuditKind, Delivery

__all__ = ["DeliveryRefused", "WebhookPolicy", "WebhookSender", "resolve_destination", "sign"]

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

    def __post_init__(self) -> None:
        for pattern in self.allow:
            if not isinstance(pattern, str) or not pattern.strip():
                raise ValueError(f"webhook allow patterns must be non-empty strings, but got {pattern!r}.")
            if _network(pattern) is None and not all(c.isalnum() or c in "-.*?" for c in pattern):
                raise ValueError(f"webhook allow pattern {pattern!r} is neither a host name, a host glob nor an "
                                 "address or network such as 10.0.0.0/8.")
        if not 0 < self.timeout_s <= 60 or not 1 <= self.attempts <= 20 or not 1 <= self.workers <= 64:
            raise ValueError("webhook timeout_s must be in (0, 60], attempts in [1, 20], workers in [1, 64].")


def _network(pattern: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(pattern.strip("[]"), strict=False)
    except ValueError:
        return None


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
    port = parts.port or (443 if parts.scheme == "https" else 80)
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
        special = (addr.is_loopback or addr.is_private or addr.is_link_local or addr.is_multicast
                   or addr.is_reserved or addr.is_unspecified)
        if special and not in_network:
            raise DeliveryRefused("the address is internal and not explicitly allowed")
        if not (in_network or named):
            raise DeliveryRefused("the destination is not on the operator's allowlist")
    return str(addresses[0]), port


def sign(secret: str, body: str, timestamp: int) -> str:
    """The ``X-EvalStop-Signature`` header value of ``body``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.{body}".encode(), hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def _post(url: str, address: str, port: int, body: str, headers: dict[str, str], policy: WebhookPolicy) -> int:
    """POST to the checked ``address`` with one total deadline; returns the status (reads a capped answer)."""
    parts = urlsplit(url)
    deadline = time.monotonic() + policy.timeout_s

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("webhook deadline passed")
        return remaining

    sock = socket.create_connection((address, port), timeout=left())
    try:
        if parts.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
        conn = http.client.HTTPConnection(parts.hostname or address, port, timeout=left())
        conn.sock = sock
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("POST", path, body=body.encode(), headers=headers)
        sock.settimeout(left())
        response = conn.getresponse()
        read = 0
        while read <= policy.max_response_bytes:  # a capped, deadline-bound read of the answer
            sock.settimeout(left())
            chunk = response.read(min(8192, policy.max_response_bytes + 1 - read))
            if not chunk:
                break
            read += len(chunk)
        return response.status
    finally:
        sock.close()


class WebhookSender:
    """Delivers queued webhook deliveries (a background worker of the service's lifespan)."""

    def __init__(self, coordinator: Coordinator, policy: WebhookPolicy | None = None,
                 clock: Callable[[], float] = time.time, resolve: Resolver = _default_resolver,
                 poll_s: float = 0.5) -> None:
        self.coordinator, self.policy, self.clock, self.resolve = coordinator, policy or WebhookPolicy(), clock, resolve
        self.poll_s = poll_s
        self._pool = ThreadPoolExecutor(max_workers=self.policy.workers, thread_name_prefix="evalstop-webhook")
        self._busy: set[str] = set()
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
        """Hand every due delivery not already in flight to the pool; returns how many."""
        with self._lock:
            room = self.policy.workers * 2 - len(self._busy)
        if room <= 0:
            return 0
        # leased past every attempt's deadline: no other replica takes them meanwhile
        due = self.coordinator.store.claim_deliveries(self.clock(), room, self.policy.timeout_s * 4 + 30)
        n = 0
        for d in due:
            with self._lock:
                if d.id in self._busy:
                    continue
                self._busy.add(d.id)
            self._pool.submit(self._attempt, d)
            n += 1
        return n

    def _attempt(self, d: Delivery) -> None:
        try:
            self._deliver(d)
        except Exception:  # noqa: BLE001
            log.exception("webhook delivery %s failed unexpectedly", d.id)
        finally:
            with self._lock:
                self._busy.discard(d.id)

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
        except (OSError, http.client.HTTPException, TimeoutError, ssl.SSLError):
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
            self.coordinator.record_event(d.tenant, d.job_id, kind, reason, {"attempts": attempt}, actor="webhook")
        except NotFound:
            pass

"""ASGI middleware of the service: the guard in front of every request.

:class:`Guard` runs before FastAPI reads a byte of the body:

* ``/v1`` requests are authenticated from their headers first (401 without reading the body), and
  the tenant is handed on in ``scope["state"]["tenant"]``; the token lookup (a store read) and the
  quota lookup run in the thread pool, never on the event loop;
* reports are rate limited per tenant (token bucket, the tenant's ``report_rate``/``report_burst``
  quota): 429 with ``Retry-After`` before the body is read;
* listing jobs costs one token per job asked for (``limit``) from a per-tenant read budget
  (:data:`LIST_RATE` jobs per second, :data:`LIST_BURST` at once), so one tenant paging through
  thousands of jobs in a tight loop cannot take the CPU another tenant's reports need;
* bodies over the limit get 413 (declared or streamed), and a body that does not arrive within
  ``body_timeout_s`` gets 408, so an unfinished upload cannot hold memory or a slot for long.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool

from ..core.errors import EvalStopError, Unauthorized
from ..core.tenants import Tenants

__all__ = ["LIST_BURST", "LIST_RATE", "Guard", "TokenBuckets"]

LIST_RATE = 5_000.0  # jobs listed per second per tenant: 5 full pages a second
LIST_BURST = 20_000  # 20 full pages at once: a client paging through 20,000 jobs is not held up


class TokenBuckets:
    """Per-key token buckets (rate per second, burst); thread-safe, memory bounded by ``max_keys``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000) -> None:
        self.clock, self.max_keys = clock, max_keys
        self._state: dict[str, tuple[float, float]] = {}  # key -> (tokens, last time)
        self._lock = threading.Lock()

    def take(self, key: str, rate: float, burst: int, cost: float = 1.0) -> float:
        """Take ``cost`` tokens; returns 0 if granted, else the seconds until they are available."""
        now = self.clock()
        cost = min(cost, float(burst))
        with self._lock:
            tokens, last = self._state.get(key, (float(burst), now))
            tokens = min(float(burst), tokens + (now - last) * rate)
            if tokens >= cost:
                if key not in self._state and len(self._state) >= self.max_keys:
                    self._state.clear()  # tenants are few; never let this grow without bound
                self._state[key] = (tokens - cost, now)
                return 0.0
            self._state[key] = (tokens, now)
            return (cost - tokens) / rate


def _is_report(method: str, path: str) -> bool:
    return method == "POST" and path.startswith("/v1/jobs/") and path.endswith("/reports")


class Guard:
    """Pure ASGI middleware: authenticate, rate limit, bound the body (see the module docstring)."""

    def __init__(self, app, tenants: Callable[[], Tenants], limit: int, body_timeout_s: float = 10.0,
                 buckets: TokenBuckets | None = None) -> None:
        self.app, self.tenants, self.limit, self.body_timeout_s = app, tenants, limit, body_timeout_s
        self.buckets = buckets or TokenBuckets()

    def _admit(self, authorization: bytes | None, method: str, path: str, scope) -> tuple[str | None, tuple | None]:
        """``(tenant, None)``, or ``(None, (status, detail, headers))`` to refuse the request. Reads the
        store (the token's tenant, its quotas): called in the thread pool."""
        tenants = self.tenants()
        try:
            tenant = tenants.authenticate(_bearer(authorization))
        except Unauthorized as exc:
            return _refusal(401, str(exc), [(b"www-authenticate", b"Bearer")])
        if _is_report(method, path):
            quotas = tenants.quotas(tenant)
            wait = self.buckets.take(tenant, quotas.report_rate, quotas.report_burst)
            if wait > 0:
                return _refusal(429, f"report rate over this tenant's quota of {quotas.report_rate:g}/s; "
                                f"retry after {wait:.2f} s", [(b"retry-after", str(math.ceil(wait)).encode())])
        elif method == "GET" and path == "/v1/jobs":
            wait = self.buckets.take(f"{tenant}\x00list", LIST_RATE, LIST_BURST, _limit(scope))
            if wait > 0:
                return _refusal(429, f"listing over this tenant's read budget of {LIST_RATE:g} jobs/s; "
                                f"retry after {wait:.2f} s", [(b"retry-after", str(math.ceil(wait)).encode())])
        return tenant, None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            return await _reply(send, 413, f"request body over the {_size(self.limit)} limit")
        path, method = scope.get("path", ""), scope.get("method", "")
        if path.startswith("/v1/"):
            tenant, refusal = await run_in_threadpool(self._admit, headers.get(b"authorization"), method, path, scope)
            if refusal is not None:
                return await _reply(send, *refusal)
            scope.setdefault("state", {})["tenant"] = tenant
        chunks, size, more = [], 0, True
        while more:  # read the body (bounded in size and time), then hand it on
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout_s)
            except asyncio.TimeoutError:
                return await _reply(send, 408, f"the request body did not arrive within {self.body_timeout_s:g} s")
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await _reply(send, 413, f"request body over the {_size(self.limit)} limit")
            chunks.append(chunk)
            more = message.get("more_body", False)
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        try:
            await self.app(scope, replay, send)
        except EvalStopError as exc:  # raised before routing (should not happen), answered all the same
            await _reply(send, exc.status_code, str(exc))


def _refusal(status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> tuple[None, tuple]:
    return None, (status, detail, list(headers))


def _limit(scope) -> float:
    """The ``limit`` a list request asks for (the page size it costs), 1,000 when absent or unreadable."""
    from urllib.parse import parse_qs

    try:
        value = int(parse_qs(scope.get("query_string", b"").decode("latin-1")).get("limit", ["1000"])[0])
    except ValueError:
        return 1000.0
    return float(min(max(value, 1), 1000))


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n // 1024} KiB"


def _bearer(value: bytes | None) -> str | None:
    if not value:
        return None
    text = value.decode("latin-1")
    return text[len("Bearer "):].strip() if text.startswith("Bearer ") else None


async def _reply(send, status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})

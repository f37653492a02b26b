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
* bodies are read only for authenticated ``/v1`` requests: every other path is ``GET``/``HEAD`` only
  (405 for another method, 413 for a declared body, both before a byte of it is read);
* bodies over the limit get 413 (declared or streamed), and a whole body that has not arrived within
  ``body_timeout_s`` of its request head gets 408 (one deadline per body, not per chunk), so an
  unfinished upload cannot hold memory or a slot for long;
* unauthenticated requests (every path off ``/v1``, and ``/v1`` requests whose token is refused) come
  out of a budget per client address (:class:`PerAddress`: ``rate`` per second, ``burst`` at once;
  IPv6 addresses by /64): beyond it 429, and an address over its budget gets 429 on ``/v1`` too,
  before its token is looked up, unless the token is live (:meth:`Tenants.known`: a token that
  authenticated here, or in the tenants' list read at most once a second): junk tokens cost no store
  read, and a tenant sharing the address with them is still served. Behind a reverse proxy every client
  shares the proxy's address: set these limits at the proxy and turn them off here (rate 0).

Every refusal closes the connection (``Connection: close``): a body that was not read is not waited for.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.routing import compile_path

from ..core.api import ROUTES
from ..core.buckets import TokenBuckets
from ..core.errors import EvalStopError, Unauthorized
from ..core.tenants import Tenants

__all__ = ["AUTHENTICATED", "LIST_BURST", "LIST_RATE", "Guard", "PerAddress", "TokenBuckets", "address_key"]

LIST_RATE = 5_000.0  # jobs listed per second per tenant: 5 full pages a second
LIST_BURST = 20_000  # 20 full pages at once: a client paging through 20,000 jobs is not held up
#: scope key of a callable the connection's protocol may install: the Guard calls it with the tenant once
#: a request on that connection authenticated (the connection then counts against the tenant, no longer
#: as unauthenticated); it returns False when the tenant holds its share of connections (429, closed)
AUTHENTICATED = "evalstop.authenticated"
_BODYLESS = ("GET", "HEAD")


@dataclass(frozen=True)
class PerAddress:
    """The budget of unauthenticated requests per client address: ``rate`` per second (0: no limit),
    ``burst`` at once."""

    rate: float = 20.0
    burst: int = 100

    def __post_init__(self) -> None:
        if not (self.rate >= 0 and math.isfinite(self.rate)) or not 1 <= self.burst <= 1_000_000:
            raise ValueError(f"per-address rate must be >= 0 (0: no limit) and burst in [1, 1000000], but got "
                             f"rate={self.rate!r}, burst={self.burst!r}.")


def address_key(host: str | None) -> str:
    """The key a client address is limited under: the IPv4 address, or the /64 of an IPv6 one (one
    host or site gets a whole /64, so per-address limits by single IPv6 address would not hold)."""
    try:
        addr = ipaddress.ip_address((host or "").split("%")[0])
    except ValueError:
        return host or "?"
    if addr.version == 6 and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(ipaddress.ip_network(f"{addr}/64", strict=False)) if addr.version == 6 else str(addr)


_REPORT = ROUTES["report"]
_REPORT_PATH = compile_path(_REPORT.path)[0]  # the row's path, matched as Starlette's router matches it


def _is_report(method: str, path: str) -> bool:
    return method == _REPORT.method and _REPORT_PATH.match(path) is not None


class Guard:
    """Pure ASGI middleware: authenticate, rate limit, bound the body (see the module docstring)."""

    def __init__(self, app, tenants: Callable[[], Tenants], limit: int, body_timeout_s: float = 10.0,
                 buckets: TokenBuckets | None = None, per_address: PerAddress = PerAddress()) -> None:
        self.app, self.tenants, self.limit, self.body_timeout_s = app, tenants, limit, body_timeout_s
        self.buckets, self.per_address = buckets or TokenBuckets(), per_address

    def _admit_cached(self, authorization: bytes | None, method: str, path: str, scope) -> tuple[str, tuple | None] | None:
        """:meth:`_admit` on the event loop for a token and quotas the tenants' caches hold (no store
        read); None when a store read is needed (then the thread pool does it)."""
        if not _is_report(method, path):
            return None  # the common case worth the loop: reports
        try:
            hit = self.tenants().cached(_bearer(authorization))
        except Unauthorized:
            return None
        if hit is None:
            return None
        tenant, quotas = hit
        wait = self.buckets.take(tenant, quotas.report_rate, quotas.report_burst)
        if wait > 0:
            return tenant, _refusal(429, f"report rate over this tenant's quota of {quotas.report_rate:g}/s; "
                                    f"retry after {wait:.2f} s", _retry_after(wait))[1]
        return tenant, None

    def _admit(self, authorization: bytes | None, method: str, path: str, scope) -> tuple[str | None, tuple | None]:
        """``(tenant, None)``, or ``(None, (status, detail, headers))`` to refuse the request. Reads the
        store (the token's tenant, its quotas): called in the thread pool."""
        tenants = self.tenants()
        try:
            tenant = tenants.authenticate(_bearer(authorization))
        except Unauthorized as exc:
            self._unauthenticated(scope)
            return _refusal(401, str(exc), [(b"www-authenticate", b"Bearer")])
        if _is_report(method, path):
            quotas = tenants.quotas(tenant)
            wait = self.buckets.take(tenant, quotas.report_rate, quotas.report_burst)
            if wait > 0:
                return tenant, _refusal(429, f"report rate over this tenant's quota of {quotas.report_rate:g}/s; "
                                        f"retry after {wait:.2f} s", _retry_after(wait))[1]
        elif method == "GET" and path == "/v1/jobs":
            wait = self.buckets.take(f"{tenant}\x00list", LIST_RATE, LIST_BURST, _limit(scope))
            if wait > 0:
                return _refusal(429, f"listing over this tenant's read budget of {LIST_RATE:g} jobs/s; "
                                f"retry after {wait:.2f} s", _retry_after(wait))
        return tenant, None

    def _unauthenticated(self, scope, take: bool = True) -> tuple | None:
        """Charge (or with ``take=False`` only check) the client address's budget of unauthenticated
        requests; a 429 refusal when it is spent."""
        rate, burst = self.per_address.rate, self.per_address.burst
        if rate <= 0:
            return None
        key = "\x00ip " + address_key((scope.get("client") or ("?",))[0])
        wait = self.buckets.take(key, rate, burst) if take else self.buckets.wait(key, rate, burst)
        if wait <= 0:
            return None
        return 429, (f"too many unauthenticated requests from this address (over {rate:g}/s); "
                     f"retry after {wait:.2f} s"), _retry_after(wait)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        path, method = scope.get("path", ""), scope.get("method", "")
        declared = headers.get(b"content-length", b"")
        has_body = b"transfer-encoding" in headers or (declared != b"" and declared.strip(b" \t") != b"0")
        if not path.startswith("/v1/"):  # public, static, GET only: no body is ever read here
            refusal = self._unauthenticated(scope)
            if refusal is None and method not in _BODYLESS:
                refusal = 405, f"{method} is not allowed here: only GET and HEAD", [(b"allow", b"GET, HEAD")]
            elif refusal is None and has_body:
                refusal = 413, f"{method} {path} takes no request body", []
            if refusal is not None:
                return await _reply(send, *refusal)
            return await self.app(scope, receive, send)
        if declared.isdigit() and int(declared) > self.limit:
            return await _reply(send, 413, f"request body over the {_size(self.limit)} limit")
        tenant = None
        refusal = self._unauthenticated(scope, take=False)  # an address over its budget: no token lookup,
        if refusal is not None and await self._known(headers.get(b"authorization")):  # unless the token is
            refusal = None  # live: a tenant is never refused for what others sent from its address
        if refusal is None:
            fast = self._admit_cached(headers.get(b"authorization"), method, path, scope)
            tenant, refusal = fast if fast is not None else await run_in_threadpool(
                self._admit, headers.get(b"authorization"), method, path, scope)
        if refusal is not None and tenant is not None:  # an authenticated client over a rate: its (bounded)
            if has_body and await self._read_body(receive, send) is None:  # body is read, the connection kept
                return None
            return await _reply(send, *refusal, close=False)
        if refusal is not None:
            return await _reply(send, *refusal)
        scope.setdefault("state", {})["tenant"] = tenant
        if callable(scope.get(AUTHENTICATED)) and scope[AUTHENTICATED](tenant) is False:
            return await _reply(send, 429, "this tenant holds as many open connections as it may (the server's "
                                "--max-connections-per-tenant): reuse its keep-alive connections, or ask the "
                                "operator for more", [(b"retry-after", b"1")])
        body = await self._read_body(receive, send) if has_body else b""
        if body is None:
            return None
        replayed = False

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

    async def _known(self, authorization: bytes | None) -> bool:
        """Whether the token is live as far as the tenants know without a store read (:meth:`Tenants.known`);
        an unknown one once the list of live tokens is due for its read (at most once a second, in the
        thread pool, whatever the number of unknown tokens)."""
        tenants, token = self.tenants(), _bearer(authorization)
        if not token:
            return False
        if tenants.known(token):
            return True
        if not tenants.live_tokens_due():
            return False
        try:
            await run_in_threadpool(tenants.read_live_tokens)
        except Exception:  # noqa: BLE001 - the store is down: the token stays unknown (429)
            return False
        return tenants.known(token)

    async def _read_body(self, receive, send) -> bytes | None:
        """The whole body, bounded in size and in time (one deadline for all of it); None once refused."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                await _reply(send, 408, f"the request body did not arrive within {self.body_timeout_s:g} s")
                return None
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await _reply(send, 413, f"request body over the {_size(self.limit)} limit")
                return None
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)


def _refusal(status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> tuple[None, tuple]:
    return None, (status, detail, list(headers))


def _retry_after(wait: float) -> list[tuple[bytes, bytes]]:
    return [(b"retry-after", str(math.ceil(wait)).encode())]


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
    scheme, _, token = value.decode("latin-1").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None  # auth schemes are case-insensitive (RFC 9110)


async def _reply(send, status: int, detail: str, headers: list[tuple[bytes, bytes]] = (), close: bool = True) -> None:
    """A refusal: ``{"detail": ...}``, and (``close``) the connection closed after it (its body is never
    read); an authenticated client's 429 keeps its connection (its body was read)."""
    body = json.dumps({"detail": detail}).encode()
    keep = [(b"connection", b"close")] if close else []
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *keep, *headers]})
    await send({"type": "http.response.body", "body": body})

"""The HTTP protocol of ``evalstop serve``: uvicorn's httptools protocol with connection guards.

``evalstop serve`` (and the embedded server of ``evalstop run``) runs only this protocol class (uvicorn's
``http=``); there is no flag for another implementation. h11 bounds a head itself
(``h11_max_incomplete_event_size``); httptools bounds nothing, so the bounds below are this class's.

* **Request heads are bounded**: at most ``max_head_bytes`` bytes (request line and headers) and
  ``max_headers`` headers, counted before the parser buffers them; beyond either, 431 Request Header
  Fields Too Large and the connection closed, so an endless header costs no memory.
* **Header timeout**: a connection that has not sent a complete request head within
  ``header_timeout_s`` of connecting (or of starting its next request) is closed, so idle or
  trickling connections cannot pile up (slowloris). Idle keep-alive connections between requests
  are closed by uvicorn's ``timeout_keep_alive``.
* **Connection limit**: beyond ``max_connections`` open connections, a new one first reclaims an
  idle connection: the oldest unauthenticated one with no request in flight (idle keep-alive, silent,
  or a head still arriving), else an idle keep-alive connection of the tenant holding the most among
  those that have one (closed between its requests: its client reconnects when it next needs one);
  else it is closed at once. The process never runs out of file descriptors for the requests that
  matter, and neither idle unauthenticated connections nor a tenant of busy long polls keep another
  client out.
* **Connections per tenant**: a connection counts against the tenant of its last authenticated
  request; at most ``per_tenant`` of them (0 = no limit). A request that would make it one more is
  refused (429, the connection closed), so one tenant cannot hold every slot with cheap keep-alive
  requests.
* **Unauthenticated connections per address**: a connection counts as unauthenticated until one of
  its requests authenticates (the :class:`~.middleware.Guard` says so through the
  :data:`~.middleware.AUTHENTICATED` scope key); at most ``unauth_per_address`` of them per client
  address (IPv6: per /64; 0 = no limit). Beyond that a new connection from the address closes the
  address's oldest idle unauthenticated connection, else it is closed at once: one address holds only a
  few of the ``max_connections`` slots however slowly it sends, and idle connections that others
  hold at a shared address do not keep a tenant from connecting.
* **No body off /v1**: body bytes of a request to another path are dropped as they arrive (the Guard
  refuses such requests), not buffered.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .middleware import AUTHENTICATED, address_key

__all__ = ["MAX_HEAD_BYTES", "MAX_HEADERS", "guarded_protocol"]

MAX_HEAD_BYTES = 16 * 1024  # a request head's bytes (request line and headers), as h11's and Node's default
MAX_HEADERS = 100  # a request head's headers, as Apache's LimitRequestFields


class _HeadTooLarge(Exception):
    """Raised from a parser callback: the head has more than ``max_headers`` headers."""


def guarded_protocol(header_timeout_s: float = 10.0, max_connections: int = 1000,
                     unauth_per_address: int = 16, per_tenant: int = 64, max_head_bytes: int = MAX_HEAD_BYTES,
                     max_headers: int = MAX_HEADERS) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.run(..., http=...)`` with these limits."""
    if not 1024 <= max_head_bytes <= 2**20 or not 8 <= max_headers <= 10_000:
        raise ValueError(f"max_head_bytes must be in [1024, 1048576] and max_headers in [8, 10000], but got "
                         f"{max_head_bytes=}, {max_headers=}.")
    unauthenticated: dict[str, int] = {}  # address key -> its open unauthenticated connections (event loop only)
    by_tenant: dict[str, int] = {}  # tenant -> the open connections counted against it (event loop only)
    # the reclaimable connections, oldest first (dicts keep insertion order; event loop only):
    idle_unauth: dict[GuardedHttpTools, None] = {}  # unauthenticated, no request in flight
    idle_unauth_at: dict[str, dict[GuardedHttpTools, None]] = {}  # the same, by address key
    idle_tenant: dict[str, dict[GuardedHttpTools, None]] = {}  # tenant -> its idle keep-alive connections

    def _take(counts: dict[str, int], key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    def _give(counts: dict[str, int], key: str) -> None:
        left = counts.get(key, 1) - 1
        if left > 0:
            counts[key] = left
        else:
            counts.pop(key, None)

    def _drop(groups: dict[str, dict], key: str | None, conn) -> None:
        group = groups.get(key)
        if group is not None:
            group.pop(conn, None)
            if not group:
                del groups[key]

    def _close_oldest(idle: dict) -> bool:
        """Close the oldest open connection of ``idle`` (dropping closed ones met on the way); whether one was."""
        while idle:
            other = next(iter(idle))
            del idle[other]
            other._forget()
            if not other.transport.is_closing():
                other.transport.close()
                return True
        return False

    class GuardedHttpTools(HttpToolsProtocol):
        _header_timer = None
        _address: str | None = None  # set while this connection counts as unauthenticated (per-address limit on)
        _key: str = "?"  # its client's address key
        _tenant: str | None = None  # the tenant this connection counts against
        _head_bytes = 0  # bytes of the request head fed to the parser so far
        _in_body = False  # between a head's end and its message's end
        _head_refused: str | None = None  # why the head is refused (431), once it is

        def connection_made(self, transport):  # type: ignore[override]
            super().connection_made(transport)
            self._key = address_key(self.client[0] if self.client else None)
            freed = False  # a slot, by closing one of the address's own idle connections
            if unauth_per_address and unauthenticated.get(self._key, 0) >= unauth_per_address:
                if not _close_oldest(idle_unauth_at.get(self._key, {})):
                    transport.close()
                    return
                freed = True
            if not freed and len(self.connections) > max_connections and not self._reclaim():
                transport.close()
                return
            if unauth_per_address:
                _take(unauthenticated, self._key)
                self._address = self._key
            self._idle()
            self._arm()

        def _idle(self) -> None:
            """No request in flight: reclaimable (the oldest first), as unauthenticated or as its tenant's."""
            if self._tenant is None:
                idle_unauth[self] = None
                idle_unauth_at.setdefault(self._key, {})[self] = None
            elif self.timeout_keep_alive_task is not None:  # a tenant's: only between requests, nothing sent
                idle_tenant.setdefault(self._tenant, {})[self] = None

        def _forget(self) -> None:
            """No longer reclaimable (a request began, or the connection is closed)."""
            idle_unauth.pop(self, None)
            _drop(idle_unauth_at, self._key, self)
            _drop(idle_tenant, self._tenant, self)

        def _reclaim(self) -> bool:
            """Close the oldest idle unauthenticated connection, else an idle keep-alive connection of the
            tenant holding the most among those that have one; whether one was."""
            if _close_oldest(idle_unauth):
                return True
            for tenant in sorted(idle_tenant, key=lambda t: by_tenant.get(t, 0), reverse=True):
                if _close_oldest(idle_tenant.get(tenant, {})):
                    return True
            return False

        def _authenticated(self, tenant: str | None = None) -> bool:
            """A request on this connection authenticated as ``tenant``: count the connection against
            it. False (and not counted) when the tenant holds ``per_tenant`` connections already."""
            key, self._address = self._address, None
            if key is not None:
                _give(unauthenticated, key)
            if tenant is None or tenant == self._tenant:
                return True
            if per_tenant and by_tenant.get(tenant, 0) >= per_tenant:
                return False
            if self._tenant is not None:
                _give(by_tenant, self._tenant)
            self._tenant = tenant
            _take(by_tenant, tenant)
            return True

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._head_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _head_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            # a head's bytes are counted before the parser sees (and buffers) them: at most the room left
            # is fed while a head is under way; a body's bytes are bounded by the Guard
            while data and not self.transport.is_closing():
                if self._in_body:
                    return super().data_received(data)
                room = max_head_bytes - self._head_bytes
                if room <= 0:
                    return self._refuse_head(f"the request head is over the {max_head_bytes // 1024} KiB limit")
                piece, data = data[:room], data[room:]
                self._head_bytes += len(piece)
                super().data_received(piece)

        def _refuse_head(self, detail: str) -> None:
            self._forget()
            body = json.dumps({"detail": detail}).encode()
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
            self.transport.close()

        def send_400_response(self, msg: str) -> None:  # the parser failed: a callback may have said why
            if self._head_refused is not None:
                return self._refuse_head(self._head_refused)
            super().send_400_response(msg)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            _drop(idle_tenant, self._tenant, self)  # a tenant's next request has begun
            self.scope[AUTHENTICATED] = self._authenticated  # type: ignore[literal-required]
            if self._header_timer is None:
                self._arm()

        def on_header(self, name: bytes, value: bytes) -> None:
            if len(self.headers) >= max_headers:
                self._head_refused = f"the request head has more than {max_headers} headers"
                raise _HeadTooLarge(self._head_refused)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            self._forget()  # a request in flight is never reclaimed
            self._head_bytes, self._in_body = 0, True
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            # a body off /v1 is refused unread by the Guard: never buffer what arrived with the head
            if self.scope.get("path", "").startswith("/v1/"):
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._in_body = False
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.timeout_keep_alive_task is not None:
                self._idle()  # idle keep-alive (not a pipelined request started)

        def connection_lost(self, exc):  # type: ignore[override]
            self._disarm()
            self._forget()
            self._authenticated()  # no longer counted as unauthenticated
            if self._tenant is not None:
                _give(by_tenant, self._tenant)
                self._tenant = None
            super().connection_lost(exc)

    return GuardedHttpTools

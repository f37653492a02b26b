"""The HTTP protocol of ``evalstop serve``: uvicorn's httptools protocol with connection guards.

* **Header timeout**: a connection that has not sent a complete request head within
  ``header_timeout_s`` of connecting (or of starting its next request) is closed, so idle or
  trickling connections cannot pile up (slowloris). Idle keep-alive connections between requests
  are closed by uvicorn's ``timeout_keep_alive``.
* **Connection limit**: beyond ``max_connections`` open connections, a new one first reclaims an
  idle keep-alive connection of the tenant that holds the most (closed between its requests: its
  client reconnects when it next needs one), else it is closed at once, so the process never runs
  out of file descriptors for the requests that matter and another tenant is still served.
* **Connections per tenant**: a connection counts against the tenant of its last authenticated
  request; at most ``per_tenant`` of them (0 = no limit). A request that would make it one more is
  refused (429, the connection closed), so one tenant cannot hold every slot with cheap keep-alive
  requests.
* **Unauthenticated connections per address**: a connection counts as unauthenticated until one of
  its requests authenticates (the :class:`~.middleware.Guard` says so through the
  :data:`~.middleware.AUTHENTICATED` scope key); at most ``unauth_per_address`` of them per client
  address (IPv6: per /64; 0 = no limit), beyond that a new connection from the address is closed at
  once. One address can then hold only a few of the ``max_connections`` slots, however slowly it sends.
* **No body off /v1**: body bytes of a request to another path are dropped as they arrive (the Guard
  refuses such requests), not buffered.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .middleware import AUTHENTICATED, address_key

__all__ = ["guarded_protocol"]


def guarded_protocol(header_timeout_s: float = 10.0, max_connections: int = 1000,
                     unauth_per_address: int = 16, per_tenant: int = 64) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.run(..., http=...)`` with these limits."""
    unauthenticated: dict[str, int] = {}  # address key -> its open unauthenticated connections (event loop only)
    by_tenant: dict[str, int] = {}  # tenant -> the open connections counted against it (event loop only)

    def _take(counts: dict[str, int], key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    def _give(counts: dict[str, int], key: str) -> None:
        left = counts.get(key, 1) - 1
        if left > 0:
            counts[key] = left
        else:
            counts.pop(key, None)

    class GuardedHttpTools(HttpToolsProtocol):
        _header_timer = None
        _address: str | None = None  # set while this connection counts as unauthenticated
        _tenant: str | None = None  # the tenant this connection counts against

        def connection_made(self, transport):  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections and not self._reclaim():
                transport.close()
                return
            if unauth_per_address:
                key = address_key(self.client[0] if self.client else None)
                if unauthenticated.get(key, 0) >= unauth_per_address:
                    transport.close()
                    return
                unauthenticated[key] = unauthenticated.get(key, 0) + 1
                self._address = key
            self._arm()

        def _reclaim(self) -> bool:
            """Close one idle keep-alive connection of the tenant holding the most; whether one was."""
            if not by_tenant:
                return False
            heaviest = max(by_tenant, key=by_tenant.__getitem__)
            for other in self.connections:
                if (other._tenant == heaviest and other.timeout_keep_alive_task is not None
                        and not other.transport.is_closing()):
                    other.transport.close()
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

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[AUTHENTICATED] = self._authenticated  # type: ignore[literal-required]
            if self._header_timer is None:
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            # a body off /v1 is refused unread by the Guard: never buffer what arrived with the head
            if self.scope.get("path", "").startswith("/v1/"):
                super().on_body(body)

        def connection_lost(self, exc):  # type: ignore[override]
            self._disarm()
            self._authenticated()  # no longer counted as unauthenticated
            if self._tenant is not None:
                _give(by_tenant, self._tenant)
                self._tenant = None
            super().connection_lost(exc)

    return GuardedHttpTools

"""The HTTP protocol of ``evalstop serve``: uvicorn's httptools protocol with connection guards.

* **Header timeout**: a connection that has not sent a complete request head within
  ``header_timeout_s`` of connecting (or of starting its next request) is closed, so idle or
  trickling connections cannot pile up (slowloris). Idle keep-alive connections between requests
  are closed by uvicorn's ``timeout_keep_alive``.
* **Connection limit**: beyond ``max_connections`` open connections, a new one is closed at once, so
  the process never runs out of file descriptors for the requests that matter.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["guarded_protocol"]


def guarded_protocol(header_timeout_s: float = 10.0, max_connections: int = 1000) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.run(..., http=...)`` with these limits."""

    class GuardedHttpTools(HttpToolsProtocol):
        _header_timer = None

        def connection_made(self, transport):  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()
                return
            self._arm()

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
            if self._header_timer is None:
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc):  # type: ignore[override]
            self._disarm()
            super().connection_lost(exc)

    return GuardedHttpTools

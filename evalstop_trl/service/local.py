"""An embedded ``evalstop serve`` in this process: a uvicorn server in a thread on a free loopback
port, over a SQLite file, with a ``local`` tenant whose token is rotated for this run. Used by
``evalstop run`` when no coordinator URL is given."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ..clients.local import free_loopback_port, wait_until_healthy
from ..core.coordinator import Coordinator
from ..core.errors import Conflict
from ..stores.sqlite import SQLiteStore

__all__ = ["EmbeddedServer"]


class EmbeddedServer:
    def __init__(self, db: str | Path, tenant: str = "local") -> None:
        self.db, self.tenant = Path(db), tenant
        self.url = ""
        self.token = ""
        self._server = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 30.0) -> EmbeddedServer:
        import uvicorn

        from .app import ServiceSettings, create_app
        from .protocol import guarded_protocol

        coordinator = Coordinator(SQLiteStore(self.db))
        try:
            self.token = coordinator.tenants.add(self.tenant)
        except Conflict:
            self.token = coordinator.tenants.rotate(self.tenant)
        port = free_loopback_port()
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(create_app(coordinator, ServiceSettings(run_webhooks=False)), host="127.0.0.1",
                                port=port, log_level="warning", access_log=False, http=guarded_protocol())
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="evalstop-embedded-server", daemon=True)
        self._thread.start()
        if not wait_until_healthy(self.url, timeout_s):
            self.stop()
            raise RuntimeError(f"the embedded coordinator over {self.db} did not start")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            deadline = time.monotonic() + 10
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))

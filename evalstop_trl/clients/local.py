"""Local-machine helpers: a free loopback port, waiting until a local ``evalstop serve`` is healthy,
and :class:`LocalServer` to start one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

__all__ = ["LocalServer", "free_loopback_port", "wait_until_healthy"]


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for starting a local `evalstop serve`)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_healthy(url: str, timeout_s: float = 30.0, process: Any = None) -> bool:
    """Poll ``url/healthz`` until it answers 200 (True) or ``timeout_s`` passes or ``process``, a
    ``subprocess.Popen`` of the server, exits (False)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return False
        try:
            if httpx.get(url.rstrip("/") + "/healthz", timeout=0.5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


class LocalServer:
    """``evalstop serve`` in a child process on a free loopback port, with tenants made for it (for
    scripts, demos and benchmarks). Use as a context manager; ``tokens`` maps tenant -> token.

    Example::

        with LocalServer(tmp / "coord.db", tenants=("acme",)) as srv:
            httpx.get(srv.url + "/v1/jobs", headers={"Authorization": f"Bearer {srv.tokens['acme']}"})
    """

    def __init__(self, db: str | Path, tenants: tuple[str, ...] = (), args: tuple[str, ...] = (),
                 log: str | Path | None = None, quotas: dict[str, dict[str, Any]] | None = None) -> None:
        self.db, self.args, self.log = str(db), tuple(args), log
        self.tenant_names = tenants
        self.quotas = quotas or {}  # tenant -> {quota: value}, set before the server starts
        self.tokens: dict[str, str] = {}
        self.port = free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Any = None

    def start(self, timeout_s: float = 30.0) -> LocalServer:
        import json
        import os
        import subprocess
        import sys

        for name in self.tenant_names:
            out = subprocess.run([sys.executable, "-m", "evalstop_trl", "tenants", "add", name, "--db", self.db,
                                  "--json"], check=True, capture_output=True, text=True).stdout
            self.tokens[name] = json.loads(out)["token"]
        for name, quotas in self.quotas.items():
            flags = [f"--{k.replace('_', '-')}={v}" for k, v in quotas.items()]
            subprocess.run([sys.executable, "-m", "evalstop_trl", "tenants", "quota", name, *flags, "--db", self.db],
                           check=True, capture_output=True, text=True)
        sink = open(self.log, "w") if self.log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "evalstop_trl", "serve", "--db", self.db, "--port", str(self.port),
             "--log-level", "warning", *self.args], stdout=sink, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if not wait_until_healthy(self.url, timeout_s, self.proc):
            self.stop()
            raise RuntimeError(f"evalstop serve over {self.db} did not start" + (f"; see {self.log}" if self.log else ""))
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

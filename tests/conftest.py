"""Shared fixtures: a real `evalstop serve` on a free loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# torch's default of one thread per core oversubscribes a busy 2-core machine by an order of magnitude
# (a tiny GRPO test: 7 s with one thread, 499 s without); subprocesses inherit it
os.environ.setdefault("OMP_NUM_THREADS", "1")

from evalstop_trl.clients.local import free_loopback_port as free_port
from evalstop_trl.clients.local import wait_until_healthy

# a script run by test_callback.py under torch.distributed.run, not a test module (it trains on import)
collect_ignore = ["dist_worker.py", "composition_job.py"]


class Server:
    """`evalstop serve` in a child process (loopback only)."""

    def __init__(self, db: Path, port: int | None = None) -> None:
        self.db, self.port = db, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def add_tenant(self, name: str) -> str:
        out = subprocess.run([sys.executable, "-m", "evalstop_trl", "tenants", "add", name, "--db", str(self.db),
                              "--json"], check=True, capture_output=True, text=True).stdout
        import json

        return json.loads(out)["token"]

    def start(self, timeout: float = 30.0, args: tuple[str, ...] = (), log_level: str = "warning") -> Server:
        self.log = open(str(self.db) + f".{self.port}.log", "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "evalstop_trl", "serve", "--db", str(self.db), "--port", str(self.port),
             "--log-level", log_level, *args], stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if wait_until_healthy(self.url, timeout, self.proc):
            return self
        raise RuntimeError(f"server did not start: {Path(self.log.name).read_text()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


@pytest.fixture
def server(tmp_path):
    srv = Server(tmp_path / "coord.db")
    yield srv
    srv.kill()


@pytest.fixture
def two(server):
    """The server (not started) with two tenants: ``server.alice`` and ``server.bob`` are their tokens."""
    server.alice, server.bob = server.add_tenant("alice"), server.add_tenant("bob")
    return server


@pytest.fixture(scope="session")
def postgres_cluster():
    """One PostgreSQL cluster for the whole session (each test gets a database of its own)."""
    from .postgres_server import PostgresCluster

    cluster = PostgresCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def pg_dsn(postgres_cluster, request):
    """A fresh, empty database on the session's PostgreSQL cluster."""
    import re
    import uuid

    # unique per call: the names of parametrized cases share their first 40 characters, and id(request)
    # (used before) repeats once a finished test's request object is freed (a DuplicateDatabase in CI)
    name = "t_" + re.sub(r"[^a-z0-9]", "_", request.node.name.lower())[:40] + f"_{uuid.uuid4().hex[:12]}"
    return postgres_cluster.create_database(name)

"""A throwaway PostgreSQL cluster for the tests: initdb into a temporary folder with the machine's
PostgreSQL binaries, started on a free loopback port, trust authentication, stopped at the end.

initdb refuses to run as root, so as root the cluster is made and run as the ``postgres`` user.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from evalstop_trl.clients.local import free_loopback_port


def find_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: apt-get install -y postgresql (make test does)")
    return found


class PostgresCluster:
    def __init__(self, fsync: bool = False) -> None:
        self.fsync = fsync  # off for tests (speed); on for benchmarks (honest durability)
        self.root = Path(tempfile.mkdtemp(prefix="evalstop-pg-"))
        self.data = self.root / "data"
        self.port = free_loopback_port()
        self.as_root = os.geteuid() == 0

    def _run(self, *cmd: str) -> subprocess.CompletedProcess:
        if self.as_root:
            cmd = ("runuser", "-u", "postgres", "--", *cmd)
        return subprocess.run(cmd, capture_output=True, text=True, check=True)

    def start(self) -> PostgresCluster:
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(find_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync={'on' if self.fsync else 'off'} "
                "-c max_connections=200 -c shared_buffers=64MB")
        self._run(find_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-o", opts, "-w", "start")
        return self

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def stop(self) -> None:
        try:
            self._run(find_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)

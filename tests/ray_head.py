"""A throwaway Ray head for the Ray Jobs tests: ``ray start --head --block`` on free loopback ports,
its own temporary folder and HOME, token authentication on with a token of its own (never the
user's ``~/.ray``), ended with its process group."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from evalstop_trl.clients.local import free_loopback_port
from tests.proc_helpers import kill_marked


class RayHead:
    def __init__(self, num_cpus: int = 2) -> None:
        # a short path: Ray's unix sockets live under it (at most 107 bytes)
        self.root = Path(tempfile.mkdtemp(prefix="esray-", dir="/tmp"))
        self.token = secrets.token_hex(32)
        self.num_cpus = num_cpus
        self.dashboard_port = free_loopback_port()
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self) -> dict[str, str]:
        """The environment of a process that talks to this head (and only this one)."""
        return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, "HOME": str(self.root),
                "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": self.address}

    def start(self, timeout: float = 60.0) -> RayHead:
        ray = Path(sys.executable).with_name("ray")
        ports = [free_loopback_port() for _ in range(4)]
        cmd = [str(ray), "start", "--head", "--block", f"--port={ports[0]}", "--dashboard-host=127.0.0.1",
               f"--dashboard-port={self.dashboard_port}", f"--ray-client-server-port={ports[1]}",
               f"--dashboard-agent-listen-port={ports[2]}", f"--dashboard-agent-grpc-port={ports[3]}",
               f"--num-cpus={self.num_cpus}", f"--temp-dir={self.root / 'r'}", "--disable-usage-stats",
               "--include-dashboard=true"]
        self.proc = subprocess.Popen(cmd, env=self.env(), start_new_session=True, stdout=open(self.root / "log", "w"),
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited {self.proc.returncode}: {(self.root / 'log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.address}/api/version", timeout=1)
                return self
            except urllib.error.HTTPError:  # 401/403: up, and asking for its token
                return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the Ray head did not answer within {timeout:g} s")

    def client(self):
        """A ``JobSubmissionClient`` of this head (the token passed in its headers)."""
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.address, headers={"Authorization": f"Bearer {self.token}"})

    def stop(self) -> None:
        """End the head and whatever it started (its process group, and any process naming its folder:
        workers that left the group); never another Ray instance on the machine (no ``ray stop``)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        kill_marked(str(self.root))  # what left the group or outlived the daemons
        shutil.rmtree(self.root, ignore_errors=True)

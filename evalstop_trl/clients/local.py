"""Local-machine helpers: a free loopback port, waiting until a local ``evalstop serve`` is healthy,
and a process's start time (to tell a pid from a reused one)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

__all__ = ["free_loopback_port", "process_start_time", "wait_until_healthy"]


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


def process_start_time(pid: int) -> float | None:
    """The start time of ``pid`` in clock ticks since boot (None if there is no such live process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may contain spaces
    if fields[0] in ("Z", "X"):  # zombie or dead: nothing to signal
        return None
    return float(fields[19])

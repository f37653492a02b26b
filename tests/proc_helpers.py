"""Small helpers shared by tests: /proc readers and the bearer header for the tests that attack a real
server, a local Ray instance, and loading a script of ``scripts/`` as a module."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any


def _status_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {name} in /proc/{pid}/status")


def rss_kib(pid: int) -> int:
    """The resident memory of process ``pid`` in KiB."""
    return _status_field(pid, "VmRSS")


def threads(pid: int) -> int:
    """The number of threads of process ``pid``."""
    return _status_field(pid, "Threads")


def until(check, timeout: float = 20.0, every: float = 0.05) -> bool:
    """Poll ``check`` until it is true or ``timeout`` seconds have passed; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return bool(check())


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped runs nothing; the state follows the name's last ")")."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def kill_marked(mark: str) -> None:
    """SIGKILL every process whose command line contains ``mark`` (a test daemon's folder: what it
    started and left behind, never anything else on the machine)."""
    needle = mark.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass


def bearer(token: str) -> dict[str, str]:
    """The Authorization header of a tenant's token."""
    return {"Authorization": f"Bearer {token}"}


@contextmanager
def local_ray(**env: str) -> Iterator[Any]:
    """A local Ray instance on 2 CPUs (no dashboard, no usage stats), shut down on exit; ``env`` are
    more variables set while it runs."""
    import ray

    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", **env}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as the module ``name`` (registered in ``sys.modules``: dataclasses look
    their module up)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod

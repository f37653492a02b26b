"""Small helpers shared by the tests that attack a real server or start a local Ray instance."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
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

"""Per-key token buckets: the rate limits of the coordinator (launcher events, snapshots and
registration amendments per tenant; audit lines and their bytes per tenant) and of the service's
guard (reports, listings, unauthenticated requests per address)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["TokenBuckets"]


class TokenBuckets:
    """Per-key token buckets (rate per second, burst); thread-safe, memory bounded by ``max_keys``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000) -> None:
        self.clock, self.max_keys = clock, max_keys
        self._state: dict[str, tuple[float, float]] = {}  # key -> (tokens, last time)
        self._lock = threading.Lock()

    def take(self, key: str, rate: float, burst: int, cost: float = 1.0) -> float:
        """Take ``cost`` tokens; returns 0 if granted, else the seconds until they are available."""
        now = self.clock()
        cost = min(cost, float(burst))
        with self._lock:
            tokens, last = self._state.get(key, (float(burst), now))
            tokens = min(float(burst), tokens + (now - last) * rate)
            if tokens >= cost:
                if key not in self._state and len(self._state) >= self.max_keys:
                    self._state.clear()  # tenants are few; never let this grow without bound
                self._state[key] = (tokens - cost, now)
                return 0.0
            self._state[key] = (tokens, now)
            return (cost - tokens) / rate

    def spend(self, key: str, rate: float, burst: int, cost: float) -> None:
        """Take ``cost`` tokens whether or not they are there: what must be written anyway (a line the
        coordinator writes on its own) still counts; the debt is at most ``burst``."""
        now = self.clock()
        with self._lock:
            tokens, last = self._state.get(key, (float(burst), now))
            tokens = min(float(burst), tokens + (now - last) * rate)
            if key not in self._state and len(self._state) >= self.max_keys:
                self._state.clear()
            self._state[key] = (max(-float(burst), tokens - cost), now)

    def give(self, key: str, burst: int, cost: float) -> None:
        """Put back ``cost`` tokens taken for a write that was then refused for another reason."""
        with self._lock:
            if key in self._state:
                tokens, last = self._state[key]
                self._state[key] = (min(float(burst), tokens + cost), last)

    def wait(self, key: str, rate: float, burst: int) -> float:
        """The seconds until one token is available (0 if one is), taking nothing."""
        with self._lock:
            tokens, last = self._state.get(key, (float(burst), self.clock()))
        tokens = min(float(burst), tokens + (self.clock() - last) * rate)
        return 0.0 if tokens >= 1 else (1 - tokens) / rate

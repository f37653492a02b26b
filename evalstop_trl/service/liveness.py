"""The lease sweeper: a background worker of the service that marks silent jobs LOST.

Every ``interval_s`` (a quarter of the lease, at most 30 s) it calls :meth:`Coordinator.sweep`, so a
job whose training process was killed (SIGKILL, OOM, a lost node) is LOST within about a lease and a
quarter, frees its tenant's quota and shows when it was last seen.
"""

from __future__ import annotations

import logging
import threading

from ..core.coordinator import Coordinator

__all__ = ["LeaseSweeper"]

log = logging.getLogger("evalstop")


class LeaseSweeper:
    """Sweeps ``coordinator`` for jobs silent past their lease (``coordinator.lease_s``)."""

    def __init__(self, coordinator: Coordinator, interval_s: float | None = None) -> None:
        if coordinator.lease_s is None:
            raise ValueError("LeaseSweeper needs a coordinator with lease_s set.")
        self.coordinator = coordinator
        self.interval_s = interval_s or min(coordinator.lease_s / 4, 30.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="evalstop-lease-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for tenant, job_id in self.coordinator.sweep():
                    log.warning("LOST %s/%s: no report or heartbeat within its lease of %g s", tenant, job_id,
                                self.coordinator.lease_s)
            except Exception:  # noqa: BLE001 - a store outage must not kill the sweeper; the next round retries
                log.exception("lease sweep failed")

"""Job leases: a pending or running job silent (no report, no heartbeat) for longer than the
coordinator's ``lease_s`` becomes LOST, frees its quota and says when it was last seen; a report or
heartbeat brings it back. The service sweeps periodically (:mod:`evalstop_trl.service.liveness`); an
embedded coordinator sweeps when it opens."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import EvalStopError, InvalidInput
from .job import Expire, Heartbeat, Step
from .records import JobView, check_text
from .store import StoreError

if TYPE_CHECKING:
    from .repository import JobCache

__all__ = ["JobLeases"]


class JobLeases:
    """Lease methods of :class:`~.coordinator.Coordinator`."""

    jobs: JobCache
    lease_s: float | None
    started_at: float
    clock: Callable[[], float]
    _command: Callable[[str, str, Any], Step]

    def heartbeat(self, tenant: str, job_id: str, actor: str = "job") -> JobView:
        """The job is alive: renews its lease (a LOST job is RUNNING again). Reports renew it too."""
        if not isinstance(actor, str) or not 0 < len(actor) <= 128:
            raise InvalidInput("actor must be a name of 1-128 characters.")
        check_text("actor", actor, 128)
        return self._command(tenant, job_id, Heartbeat(actor, self.clock())).state.view()

    def sweep(self) -> list[tuple[str, str]]:
        """Mark LOST every pending or running job silent for longer than ``lease_s`` (the service runs
        this periodically; an embedded coordinator when it opens). Returns the (tenant, job_id) marked."""
        if self.lease_s is None:
            return []
        now = self.clock()
        lease = self.lease_s
        marked = []
        for slot in self.jobs.live_slots():
            state = slot.head
            if not state.record.status.active or now - max(state.last_seen, self.started_at) <= lease:
                continue
            r = state.record
            try:
                out = self._command(r.tenant, r.job_id, Expire(lease + max(0.0, self.started_at - state.last_seen),
                                                               now))
            except (StoreError, EvalStopError):
                continue  # another replica changed it, or the store is down: the next sweep retries
            if out.commit is not None:
                marked.append((r.tenant, r.job_id))
        return marked


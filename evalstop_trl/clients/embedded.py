"""EmbeddedClient: the in-process transport of the client API (no HTTP, no outbox).

Each call runs the :class:`~evalstop_trl.core.coordinator.Coordinator` method of the route's name
with the route's path and query arguments by keyword and its request record itself, so
it returns the same records and raises the same errors as the HTTP client. The few routes whose
coordinator method differs (a registration also says whether it created the job, the long poll, the
run browser's query, the exports' text) are the table :data:`_IN_PROCESS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core.api import MAX_WAIT_S, Route
from ..core.browse import JobQuery
from ..core.coordinator import Coordinator
from ..core.records import JobView
from .api import EvalStopAPI

__all__ = ["EmbeddedClient"]


def _wait_decision(c: Coordinator, tenant: str, job_id: str, wait: float, stopped: bool) -> JobView:
    deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT_S)
    while True:
        view = c.status(tenant, job_id)
        if view.settled(stopped) or time.monotonic() >= deadline:
            return view
        time.sleep(0.05)


def _browse(c: Coordinator, tenant: str, **query: Any) -> Any:
    return c.browse(tenant, JobQuery.parse(**query))


def _export_jobs(c: Coordinator, tenant: str, format: str, **query: Any) -> str:  # noqa: A002 - the wire name
    return "".join(c.export_jobs(tenant, JobQuery.parse(**query), format))


def _export_reports(c: Coordinator, tenant: str, job_id: str, format: str) -> str:  # noqa: A002
    return "".join(c.export_reports(tenant, job_id, format))


#: routes whose in-process call is not the coordinator's method of the same name by keyword
_IN_PROCESS: dict[str, Callable[..., Any]] = {
    "register_job": lambda c, tenant, request: c.register_job(tenant, request)[0],
    "wait_decision": _wait_decision,
    "browse_jobs": _browse,
    "export_jobs": _export_jobs,
    "export_reports": _export_reports,
}


class EmbeddedClient(EvalStopAPI):
    """The client API of one tenant over an in-process :class:`Coordinator` (no HTTP, no outbox).

    Args:
        coordinator: the coordinator, in this process.
        tenant: whose jobs these are (every call is this tenant's), unless ``token`` is given: then
            the token's owner, checked at every call like the service's bearer token.

    Example::

        client = EmbeddedClient(Coordinator(SQLiteStore("runs/evalstop.db")))
        client.register_job("run-a", "grpo", planned_steps=500)
        decision = client.report("run-a", step=50, eval_score=0.71)
    """

    def __init__(self, coordinator: Coordinator, tenant: str = "local", *, token: str | None = None) -> None:
        self.coordinator, self._tenant, self.token = coordinator, tenant, token

    @property
    def tenant(self) -> str:
        """The tenant of the calls: ``tenant``, or with a ``token`` its owner, authenticated at every
        call as the service does (:class:`~evalstop_trl.core.errors.Unauthorized` once it is revoked)."""
        if self.token is None:
            return self._tenant
        hit = self.coordinator.tenants.cached(self.token)  # the service's cache: no store read per call
        return hit[0] if hit is not None else self.coordinator.tenants.authenticate(self.token)

    def _send(self, route: Route, args: dict[str, Any], request: Any, timeout: float | None) -> Any:
        tenant = self.tenant
        call = _IN_PROCESS.get(route.name)
        if request is not None:  # the record itself: every coordinator method of a route with a body takes it
            args["request"] = request
        if call is not None:
            return call(self.coordinator, tenant, **args)
        return getattr(self.coordinator, route.name)(tenant, **args)

    def close(self) -> None:
        self.coordinator.close()

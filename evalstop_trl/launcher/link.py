"""A launcher's side of one EvalStop job: its registration, the audit lines it writes, how it is settled.

Shared by the launcher of a local command (:mod:`.supervisor`) and the watchers of jobs that run
elsewhere (:mod:`.remote`: Ray Jobs, Slurm). Fail-open throughout, but for one thing: a registration
the coordinator *refuses* (409, 422, 401, ...) raises, and nothing is started.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from ..clients.api import EvalStopAPI
from ..core.errors import EvalStopError
from ..core.records import JobStatus, JobView
from .watch import checked_view, log_text

__all__ = ["JobLink"]

log = logging.getLogger("evalstop.launcher")


class JobLink:
    """One job as a launcher sees it.

    Args:
        client: the API.
        job_id: the job; after :meth:`register` attached to an ended job it is the next run's
            (``NAME-2``, ...).
        job_type, planned_steps, policy: the registration (None: unspecified; a callback in the job
            fills them in).
        who: the command named in log lines (``evalstop run``, ``evalstop ray submit``).
    """

    def __init__(self, client: EvalStopAPI, job_id: str, *, job_type: str | None = None,
                 planned_steps: int | None = None, policy: Mapping[str, Any] | None = None,
                 who: str = "evalstop run", next_run: bool = True) -> None:
        self.client, self.job_id, self.who, self.next_run = client, job_id, who, next_run
        self.job_type, self.planned_steps = job_type, planned_steps
        self.policy = dict(policy) if policy else None
        self.fresh = False  # the confirmed registration made the job (pending, no report yet), not an attach

    def register_once(self) -> object:
        """One registration (the coordinator's answer, or None while an earlier one waits in the
        client's outbox: never a second copy)."""
        if getattr(self.client, "pending", 0) and not self.client.flush():
            return None
        return self.client.register_job(self.job_id, self.job_type, planned_steps=self.planned_steps,
                                        policy=self.policy)

    def register_deferred(self) -> JobView | None:
        """One registration for the watch to retry after an outage: the view of the job this launch
        runs as (an ended job makes it the next run, as :meth:`register` does: its stop is never
        taken for this launch's), or None (unconfirmed: asked again)."""
        view = checked_view(self.register_once())
        if view is not None and self.next_run and JobStatus(view.status).terminal:
            return self._next_run(view)
        if view is not None:
            self.fresh = view.status == JobStatus.PENDING.value and not view.n_reports
        return view

    def register(self, tries: int = 4) -> bool:
        """Register the job; True once the coordinator confirmed it. A refusal raises; no answer (the
        client kept it in its outbox) or a malformed one is retried a few times, then left to the
        watch (:meth:`register_deferred`), and the job starts anyway (fail-open). With ``next_run``
        a job that has ended makes this launch its next run (``NAME-2``); without it (a watcher
        attaching to a job that runs already) the job stays itself, and a stop it has is delivered."""
        for attempt in range(tries):
            try:
                if self.register_deferred() is not None:
                    return True
                why = "no answer"
            except EvalStopError:
                raise  # a refusal: the caller says so and starts nothing
            except Exception as exc:  # noqa: BLE001 - a malformed answer
                why = f"{type(exc).__name__}: {log_text(exc, 300)}"
            if attempt + 1 < tries:
                time.sleep(0.25 * 2**attempt)
        log.warning("%s: could not register job %s (%s); running the job anyway and retrying", self.who,
                    log_text(self.job_id), why)
        return False

    def _next_run(self, ended: JobView, most: int = 1000) -> JobView | None:
        """The job this launch attached to has ended (a stop, an end, a failure): this launch is a new
        run, ``NAME-2`` (or the first free ``NAME-k``), as the callback names a rerun; its stop is
        never taken for the earlier run's. Its view, or None (unconfirmed)."""
        base = self.job_id
        for k in range(2, most + 2):
            self.job_id = f"{base}-{k}"
            view = checked_view(self.register_once())
            if view is None:
                return None  # unconfirmed: asked again, for this name
            if not JobStatus(view.status).terminal and not view.n_reports:
                log.warning("%s: job %s has ended (%s); this run is job %s", self.who, log_text(base),
                            log_text(ended.status), log_text(self.job_id))
                self.fresh = view.status == JobStatus.PENDING.value
                return view
        raise EvalStopError(f"job {base!r} has {most} ended runs; pass another --job-id")

    def status(self) -> JobView | None:
        """The job's view, or None (logged) when there is no usable answer."""
        try:
            return checked_view(self.client.status(self.job_id))
        except Exception as exc:  # noqa: BLE001 - fail-open
            log.warning("%s: could not read job %s's status: %s", self.who, log_text(self.job_id), log_text(exc, 300))
            return None

    def settle(self, status: int, reason: str) -> None:
        """Mark the job finished (status 0) or failed (any other status, with ``reason``)."""
        try:
            if status == 0:
                self.client.finish(self.job_id)
            else:
                self.client.fail(self.job_id, reason)
        except Exception as exc:  # noqa: BLE001 - fail-open
            log.warning("%s: could not mark job %s %s: %s", self.who, log_text(self.job_id),
                        "finished" if status == 0 else "failed", log_text(exc, 300))

    def event(self, kind: str, reason: str, exit_code: int | None = None, tries: int = 1) -> None:
        """Append ``launcher_sigterm``, ``launcher_sigkill`` or ``launcher_exit`` to the job's audit log
        (retried ``tries`` times; a failure is logged, never raised)."""
        for attempt in range(tries):
            try:
                self.client.record_event(self.job_id, kind, reason[:2000], exit_code)
                return
            except Exception as exc:  # noqa: BLE001 - fail-open
                if attempt + 1 == tries:
                    log.warning("%s: could not record %s for job %s: %s", self.who, kind, log_text(self.job_id),
                                log_text(exc, 300))
                else:
                    time.sleep(0.5 * 2**attempt)

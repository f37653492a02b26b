"""External evals: snapshots published by jobs, leased to ``evalstop evaluate`` workers, scored, and
fed to the job's detector in step order.

A snapshot's eval moves PENDING → LEASED → DONE | MISSING (see :class:`~.records.EvalState`).
Scores may come in any order; a job's detector gets them in step order as soon as every earlier
snapshot has one (a gap older than ``gap_timeout_s`` counts as a missing eval). Claims are
serialised per tenant and feeds per job: one tenant's evaluators never wait for another's; a shared
store leases in one statement, so two replicas never lease one snapshot twice. A catch-up feed
(many snapshots scored at once) queues all its reports and waits for them together: one fsync for
the batch, not one per snapshot. A job has at most ``max_snapshots_per_job`` snapshots (a quota).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence

from .detectors import Decision
from .errors import Conflict, InvalidInput, NotFound, QuotaExceeded
from .job import JobState
from .records import EvalState, EvalTask, Quotas, check_report, check_text
from .requests import EvalResult, ReportRequest, SnapshotRequest
from .store import Store, wait_durable

__all__ = ["ExternalEvals"]

_FEED_BATCH = 500  # snapshots read and fed at a time by a catch-up


class ExternalEvals:
    """The external-eval queue of one :class:`~.coordinator.Coordinator`, which hands it what it needs
    of the coordinator as plain functions (its ``publish_snapshot``, ``claim_eval`` and ``post_eval``
    call this).

    Args:
        store: where snapshots live. read: ``read(tenant, job_id)``, the job's committed state
            (:class:`NotFound` for another tenant's). quotas: ``quotas(tenant)``. clock: the time.
        feed: ``feed(tenant, job_id, tasks)`` reports scored snapshots in step order, durably.
        gap_timeout_s: a snapshot not scored this long after it was published counts as missing.
    """

    def __init__(self, store: Store, read: Callable[[str, str], JobState], quotas: Callable[[str], Quotas],
                 clock: Callable[[], float], feed: Callable[[str, str, Sequence[EvalTask]], None],
                 gap_timeout_s: float = 600.0) -> None:
        self.store, self._read, self._quotas, self._clock, self._feed_tasks = store, read, quotas, clock, feed
        self.gap_timeout_s = gap_timeout_s
        self._locks: defaultdict[tuple[str, ...], threading.Lock] = defaultdict(threading.Lock)
        self._locks_lock = threading.Lock()

    def _lock(self, *key: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks[key]

    def publish(self, tenant: str, job_id: str, request: SnapshotRequest) -> EvalTask:
        """A job saved a snapshot at ``step`` for an external evaluator to score. Publishing the same
        snapshot again is a no-op; a different path for a published step is a :class:`Conflict`."""
        step, path, train_loss, proxy_reward = request.step, request.path, request.train_loss, request.proxy_reward
        if not isinstance(path, str) or not path:
            raise InvalidInput("path must be the snapshot's folder, a non-empty string.")
        check_report(ReportRequest(step, None, train_loss, proxy_reward, path))
        state = self._read(tenant, job_id)
        with self._lock("job", tenant, job_id):
            existing = self.store.eval(tenant, job_id, step)
            if existing is not None:
                if existing.path != path:
                    raise Conflict(f"step {step} of job {job_id!r} already has a snapshot at {existing.path!r}")
                return existing
            limit = self._quotas(tenant).max_snapshots_per_job
            if self.store.count_evals(tenant, job_id) >= limit:
                raise QuotaExceeded(f"job {job_id!r} has {limit} snapshots, the most a job may have "
                                    f"(max_snapshots_per_job={limit}); start a new job")
            if state.last is not None and step <= state.last.step:
                raise Conflict(f"step {step} of job {job_id!r} is not after its last report (step {state.last.step})")
            task = EvalTask(tenant, job_id, step, path, self._clock(), train_loss, proxy_reward)
            ticket = self.store.put_eval(task)
        wait_durable(ticket)
        return task

    def claim(self, tenant: str, worker: str, lease_s: float) -> EvalTask | None:
        """Lease the tenant's oldest snapshot waiting for an eval (or one whose lease ran out: its
        worker died) to ``worker`` for ``lease_s`` seconds; None if there is none."""
        check_text("worker", worker, 128, min_len=1)
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not 1 <= lease_s <= 3600:
            raise InvalidInput(f"lease_s must be in [1, 3600] seconds, but got {lease_s!r}.")
        with self._lock("claim", tenant):  # a lease must be durable before the next claim reads
            return self.store.claim_eval(tenant, self._clock(), lease_s, worker)

    def post(self, tenant: str, job_id: str, step: int, request: EvalResult) -> Decision:
        """An evaluator's result for a snapshot: its score, or None (``error``: the eval failed, a
        missing eval), with its per-example evidence (``eval_n``, ``eval_noise``) if any. Returns the
        job's decision after every eval that could be fed was fed."""
        score, worker, error, eval_n, eval_noise = (request.score, request.worker, request.error, request.eval_n,
                                                    request.eval_noise)
        check_report(ReportRequest(step, score, eval_n=eval_n, eval_noise=eval_noise))
        check_text("worker", worker, 128)
        if error is not None:
            check_text("error", error, 2000, multiline=True)
        self._read(tenant, job_id)
        with self._lock("job", tenant, job_id):
            task = self.store.eval(tenant, job_id, step)
            if task is None:
                raise NotFound(f"no snapshot of step {step} for job {job_id!r}")
            if not task.state.terminal:
                state = EvalState.DONE if score is not None else EvalState.MISSING
                wait_durable(self.store.put_eval(dataclasses.replace(
                    task, state=task.state.to(state) if task.state is EvalState.LEASED else state, score=score,
                    worker=worker or task.worker, eval_n=eval_n, eval_noise=eval_noise)))
            self._feed(tenant, job_id)
        return self._read(tenant, job_id).current()

    def _feed(self, tenant: str, job_id: str) -> None:
        """Report every scored snapshot whose earlier snapshots are all scored, in step order: each
        batch's reports are queued together and waited for once, then marked fed together."""
        while True:
            batch = self._feedable(tenant, job_id)
            if not batch:
                return
            self._feed_tasks(tenant, job_id, batch)  # durable (or raises: nothing of the batch is marked fed)
            tickets = [self.store.put_eval(dataclasses.replace(t, fed=True)) for t in batch]
            for ticket in tickets:
                wait_durable(ticket)
            if len(batch) < _FEED_BATCH:
                return

    def _feedable(self, tenant: str, job_id: str) -> list[EvalTask]:
        """The next unfed snapshots that can be fed now (a complete prefix), at most a batch."""
        now = self._clock()
        out = []
        for task in self.store.unfed_evals(tenant, job_id, _FEED_BATCH):
            if not task.state.terminal:
                if now - task.created_at <= self.gap_timeout_s:
                    break  # the prefix is not complete yet
                task = dataclasses.replace(task, state=EvalState.MISSING)
            out.append(task)
        return out

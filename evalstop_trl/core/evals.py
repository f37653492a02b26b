"""External evals: snapshots published by jobs, leased to ``evalstop evaluate`` workers, scored, and
fed to the job's detector in step order.

A snapshot's eval moves PENDING → LEASED → DONE | MISSING (see :class:`~.records.EvalState`).
Scores may come in any order; a job's detector gets them in step order as soon as every earlier
snapshot has one (a gap older than ``gap_timeout_s`` counts as a missing eval). Claims are
serialised per tenant and feeds per job: one tenant's evaluators never wait for another's.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import defaultdict
from typing import TYPE_CHECKING

from .detectors import Decision
from .errors import Conflict, InvalidInput, NotFound
from .records import EvalState, EvalTask, check_checkpoint, check_report
from .store import wait_durable

if TYPE_CHECKING:
    from .coordinator import Coordinator

__all__ = ["ExternalEvals"]


class ExternalEvals:
    """The external-eval queue of one :class:`~.coordinator.Coordinator` (whose public methods
    ``publish_snapshot``, ``claim_eval`` and ``post_eval`` call this)."""

    def __init__(self, coordinator: Coordinator, gap_timeout_s: float = 600.0) -> None:
        self.coordinator = coordinator
        self.store = coordinator.store
        self.gap_timeout_s = gap_timeout_s
        self._locks: defaultdict[tuple[str, ...], threading.Lock] = defaultdict(threading.Lock)
        self._locks_lock = threading.Lock()

    def _lock(self, *key: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks[key]

    def publish(self, tenant: str, job_id: str, step: int, path: str, train_loss: float | None = None,
                proxy_reward: float | None = None) -> EvalTask:
        """A job saved a snapshot at ``step`` for an external evaluator to score. Publishing the same
        snapshot again is a no-op; a different path for a published step is a :class:`Conflict`."""
        check_report(step, None, train_loss, proxy_reward)
        if not isinstance(path, str) or not path:
            raise InvalidInput("path must be the snapshot's folder, a non-empty string.")
        check_checkpoint(path)
        state = self.coordinator.jobs.read(tenant, job_id)
        with self._lock("job", tenant, job_id):
            existing = self.store.eval(tenant, job_id, step)
            if existing is not None:
                if existing.path != path:
                    raise Conflict(f"step {step} of job {job_id!r} already has a snapshot at {existing.path!r}")
                return existing
            if state.last is not None and step <= state.last.step:
                raise Conflict(f"step {step} of job {job_id!r} is not after its last report (step {state.last.step})")
            task = EvalTask(tenant, job_id, step, path, self.coordinator.clock(), train_loss, proxy_reward)
            ticket = self.store.put_eval(task)
        wait_durable(ticket)
        return task

    def claim(self, tenant: str, worker: str, lease_s: float) -> EvalTask | None:
        """Lease the tenant's oldest snapshot waiting for an eval (or one whose lease ran out: its
        worker died) to ``worker`` for ``lease_s`` seconds; None if there is none."""
        if not isinstance(worker, str) or not 0 < len(worker) <= 128:
            raise InvalidInput("worker must be a name of 1-128 characters.")
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not 1 <= lease_s <= 3600:
            raise InvalidInput(f"lease_s must be in [1, 3600] seconds, but got {lease_s!r}.")
        with self._lock("claim", tenant):  # a lease must be durable before the next claim reads
            now = self.coordinator.clock()
            for task in self.store.claimable_evals(tenant, now, 1):
                claimed = dataclasses.replace(task, state=task.state.to(EvalState.LEASED), lease_until=now + lease_s,
                                              worker=worker)
                wait_durable(self.store.put_eval(claimed))
                return claimed
        return None

    def post(self, tenant: str, job_id: str, step: int, score: float | None, worker: str = "",
             error: str | None = None) -> Decision:
        """An evaluator's result for a snapshot: its score, or None (``error``: the eval failed, a
        missing eval). Returns the job's decision after every eval that could be fed was fed."""
        check_report(step, score, None, None)
        self.coordinator.jobs.read(tenant, job_id)
        with self._lock("job", tenant, job_id):
            task = self.store.eval(tenant, job_id, step)
            if task is None:
                raise NotFound(f"no snapshot of step {step} for job {job_id!r}")
            if not task.state.terminal:
                state = EvalState.DONE if score is not None else EvalState.MISSING
                wait_durable(self.store.put_eval(dataclasses.replace(
                    task, state=task.state.to(state) if task.state is EvalState.LEASED else state, score=score,
                    worker=worker or task.worker)))
            self._feed(tenant, job_id)
        return self.coordinator.jobs.read(tenant, job_id).current()

    def _feed(self, tenant: str, job_id: str) -> None:
        """Report every scored snapshot whose earlier snapshots are all scored, in step order."""
        now = self.coordinator.clock()
        for task in self.store.unfed_evals(tenant, job_id):
            if not task.state.terminal:
                if now - task.created_at <= self.gap_timeout_s:
                    break  # the prefix is not complete yet
                task = dataclasses.replace(task, state=EvalState.MISSING)
            done = task.state is EvalState.DONE
            try:
                self.coordinator.report(tenant, job_id, task.step, task.score if done else None, task.train_loss,
                                        task.proxy_reward, task.path if done else None)
            except Conflict:
                pass  # fed before a crash, or reported some other way: the stored report stands
            wait_durable(self.store.put_eval(dataclasses.replace(task, fed=True)))

"""Where the coordinator keeps its jobs' states: a cache for one process, or a replicated view.

* :class:`Slot` — one job in memory: ``committed`` (exactly what the store holds: readers see only
  this), ``head`` (``committed`` plus the writes queued but not yet durable: the next command is
  computed on it, so a job's writes stay in order without holding a lock across a disk wait) and a
  per-job lock held only while a command is computed and its write queued.
* :class:`JobCache` — the single-process repository (SQLite, memory): every job's record is loaded
  once at start and the store is only written. A job that is over (stopped, finished, failed) is
  loaded lazily: its record at start, its reports replayed on first access, so start-up does not
  grow with finished history. A new job's registration and a report's common case are one call each
  (:meth:`JobCache.register`, :meth:`JobCache.observe`); anything else returns None to the
  coordinator's general path.
* :class:`ReplicatedJobs` — several coordinators over one shared store (PostgreSQL): a job is
  re-read when another replica wrote it since (version check), listing and quotas ask the store. A
  new report reads nothing first: its write names the version it replaces, and the store refuses it
  if another replica wrote the job since (then the job is re-read and the report decided again).

Loading a job replays its stored reports through a fresh detector (:func:`~.job.replay`); a job
whose history cannot be replayed (a policy today's bounds refuse, a detector error) is loaded with
its counts only and marked failed with the reason, so one tenant's data never stops the service
from starting.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from .browse import RunRow
from .errors import NotFound, QuotaExceeded
from .job import Fail, JobState, Step, counted, observe, replay, step
from .records import JobRecord, JobStatus, Quotas, Registration, Report
from .requests import ReportRequest
from .store import DONE, JobLimits, LimitReached, Store, StoreError, wait_durable

if TYPE_CHECKING:
    from .detectors import Detector
    from .job import Commit

__all__ = ["JobCache", "ReplicatedJobs", "Slot", "load_state"]

log = logging.getLogger("evalstop.coordinator")


def load_state(store: Store, record: JobRecord, max_reports: int) -> tuple[JobState, str | None]:
    """A stored job's state, and the reason its history could not be replayed (None if it could)."""
    try:
        return replay(record, store.reports(record.tenant, record.job_id), max_reports), None
    except (ValueError, TypeError, ArithmeticError, KeyError) as exc:
        reason = (f"the stored history of job {record.job_id!r} cannot be replayed with its policy "
                  f"{record.policy.to_dict()!r} ({type(exc).__name__}: {exc}); marked failed at load")
        return counted(record, store.reports(record.tenant, record.job_id), max_reports), reason


class Slot:
    """One job in memory (see the module docstring). ``committed`` is None until the job's
    registration is durable (the job is not visible before)."""

    __slots__ = ("lock", "committed", "head", "ticket", "generation", "broken", "lazy", "events", "deleted",
                 "beat_at", "_on_status", "_swap")

    def __init__(self, state: JobState, committed: bool, on_status: Callable[[JobState, JobState], None]) -> None:
        self.lock = threading.RLock()  # the job lock: a command is computed and its write queued under it
        # guards the swap (committed, generation, broken) against the store's writer thread, which runs
        # _landed: held for a few assignments only, never while waiting, and never the job lock, so the
        # writer can never wait for a command (a command may wait for the writer, holding no lock)
        self._swap = threading.Lock()
        self.head = state
        self.committed: JobState | None = state if committed else None
        self.ticket: Future = DONE  # the job's latest queued write
        self.generation = 0  # bumped by a reload: writes queued before it no longer swap
        self.broken = False  # a write failed: reload before the next command
        self.lazy = False  # only the record is loaded (a finished job): replay on first access
        self.events: int | None = None  # the job's launcher events (read from the store when first needed)
        self.deleted = False  # the tenant deleted the job: a command still holding this slot is refused
        self.beat_at = 0.0  # the latest heartbeat this process answered without a write (see Coordinator.sweep)
        self._on_status = on_status

    def push(self, state: JobState, ticket: Future) -> None:
        """``state`` is the job's new head, durable when ``ticket`` is; swap it in then (under ``lock``)."""
        old = self.head
        self.head, self.ticket = state, ticket
        if old.record.status is not state.record.status:
            self._on_status(old, state)
        if ticket is DONE:
            self.committed = state
        else:
            ticket.add_done_callback(lambda f, s=state, g=self.generation: self._landed(s, g, f))

    def _landed(self, state: JobState, generation: int, ticket: Future) -> None:
        # runs on the store's writer thread (or at once, if the write is already done): no job lock
        with self._swap:
            if generation != self.generation:
                return
            if ticket.exception() is not None:
                self.broken = True
            elif self.committed is None or state.version > self.committed.version:
                self.committed = state

    def reset(self, state: JobState) -> None:
        """Memory := the store's state (after a failed write, or a newer write by another replica)."""
        old = self.head
        with self._swap:
            self.generation += 1
            self.head = state
            self.committed = state
            self.ticket = DONE
            self.broken = False
        self.lazy = False
        self.events = None
        if old.record.status is not state.record.status:
            self._on_status(old, state)

    @property
    def pending(self) -> bool:
        """Writes are queued that are not durable yet."""
        return self.committed is not self.head

    @property
    def landed(self) -> bool:
        """The job's latest queued write is durable (its head is what the store holds), so a command
        computed on the head cannot build on a write the store refused."""
        ticket = self.ticket
        return ticket.done() and ticket.exception() is None


class JobCache:
    """The jobs of a single-process coordinator, all in memory (see the module docstring)."""

    shared = False

    def __init__(self, store: Store, max_reports: Callable[[str], int], clock: Callable[[], float]) -> None:
        self.store = store
        self._max_reports = max_reports
        self._clock = clock
        self._lock = threading.Lock()  # guards the dicts; never held across a store call
        self.register_lock = threading.Lock()  # one registration at a time: find, quota, insert
        self._slots: dict[tuple[str, str], Slot] = {}
        self._by_tenant: dict[str, dict[str, Slot]] = {}  # registration order, for listing
        self._active: dict[str, int] = {}  # tenant -> jobs not yet stopped, finished or failed (heads)
        self._reports: dict[str, list[float]] = {}  # tenant -> [stored reports, when counted]
        # tenant -> max_reports_per_tenant, read at its latest registration (or at its first report since start)
        self.report_limits: dict[str, int] = {}
        self._load_all()

    # ------------------------------------------------------------------ loading
    def _load_all(self) -> None:
        """Every job's record; only the jobs still going replay their reports now (see :meth:`_ready`)."""
        for record in self.store.jobs():
            if record.status.terminal:
                self._insert_lazy(record)
            else:
                self.insert(self._load(record), committed=True)

    def _insert_lazy(self, record: JobRecord) -> None:
        # a stand-in state: its record only (no detector, no counts) until _ready() replays the job
        stub = JobState(record, None, None, max_reports=self._max_reports(record.tenant),  # type: ignore[arg-type]
                        version=record.version)
        self.insert(stub, committed=True).lazy = True

    def _ready(self, slot: Slot) -> Slot:
        """A lazily loaded job, replayed now. The store is read holding no lock (an ended job's loaded
        record does not change until it is replayed: every command replays it first); the first
        replay to finish is swapped in under the job's lock."""
        if slot.lazy:
            state, _ = load_state(self.store, slot.head.record, self._max_reports(slot.head.record.tenant))
            with slot.lock:
                if slot.lazy:
                    slot.head = slot.committed = state
                    slot.lazy = False
        return slot

    def _load(self, record: JobRecord) -> JobState:
        state, broken = load_state(self.store, record, self._max_reports(record.tenant))
        if broken is None:
            return state
        log.error("%s", broken)
        if state.record.status.terminal:
            return state
        out = step(state, Fail(broken, "coordinator", self._clock()))
        c = out.commit
        wait_durable(self.store.commit(c.job, None, c.audit, c.deliveries, expect=c.expect))
        return out.state

    def _status_changed(self, old: JobState, new: JobState) -> None:
        was, now = old.record.status.active, new.record.status.active
        if was != now:
            tenant = new.record.tenant
            with self._lock:
                self._active[tenant] = self._active.get(tenant, 0) + (1 if now else -1)

    def insert(self, state: JobState, committed: bool) -> Slot:
        slot = Slot(state, committed, self._status_changed)
        r = state.record
        with self._lock:
            self._slots[(r.tenant, r.job_id)] = slot
            self._by_tenant.setdefault(r.tenant, {})[r.job_id] = slot
            if r.status.active:
                self._active[r.tenant] = self._active.get(r.tenant, 0) + 1
        return slot

    def remove(self, slot: Slot) -> None:
        """Forget a job whose registration failed to commit."""
        r = slot.head.record
        with self._lock:
            if self._slots.get((r.tenant, r.job_id)) is slot:
                del self._slots[(r.tenant, r.job_id)]
                self._by_tenant.get(r.tenant, {}).pop(r.job_id, None)
                if r.status.active:
                    self._active[r.tenant] -= 1

    # ------------------------------------------------------------------ access
    def find(self, tenant: str, job_id: str) -> Slot | None:
        """The job's slot, or None (the caller holds :attr:`register_lock`)."""
        slot = self._slots.get((tenant, job_id))
        return None if slot is None else self._ready(slot)

    def get(self, tenant: str, job_id: str) -> Slot:
        """The job's slot for a command (reloaded first if a write of it failed)."""
        slot = self._slots.get((tenant, job_id))
        if slot is None or (slot.committed is None and not slot.pending):
            raise NotFound(f"no job {job_id!r:.140} for tenant {tenant!r}")
        if slot.broken:
            self.reload(slot)
        return self._ready(slot)

    def for_report(self, tenant: str, job_id: str, step: int) -> Slot:
        """The job's slot for a report of ``step`` (:meth:`get`; a shared store's may skip its read)."""
        return self.get(tenant, job_id)

    def read(self, tenant: str, job_id: str) -> JobState:
        """The job's committed state (what a restart would rebuild)."""
        slot = self.get(tenant, job_id)
        state = slot.committed
        if state is None:
            raise NotFound(f"no job {job_id!r:.140} for tenant {tenant!r}")
        return state

    #: a reload reads the store again at most this often when writes were queued while it read
    RELOAD_TRIES = 3

    def reload(self, slot: Slot) -> None:
        """Memory := the store, for one job (after a failed write, or a newer write by another replica).

        No lock is held while waiting: the job's queued writes are awaited and the store read first,
        then the state is swapped in under the job's lock, but only if no write was queued meanwhile
        (that write may have moved the store on): then it reads again, at most :attr:`RELOAD_TRIES`
        times, after which the job stays marked broken and the next command reloads it."""
        r = slot.head.record
        for _ in range(self.RELOAD_TRIES):
            ticket = slot.ticket
            ticket.exception()  # waits until the write is durable or failed (the failure is why we reload)
            record = self.store.job(r.tenant, r.job_id)
            state = None if record is None else load_state(self.store, record, self._max_reports(r.tenant))[0]
            with slot.lock:
                if slot.ticket is not ticket:
                    continue
                if state is None:
                    self.remove(slot)
                    slot.committed = None
                    return
                slot.reset(state)
                return
        slot.broken = True

    def refresh(self, tenant: str, job_id: str) -> None:
        """Reload the job after one of its writes failed (nothing if it is not in memory)."""
        slot = self._slots.get((tenant, job_id))
        if slot is not None:
            self.reload(slot)

    def settle(self, slot: Slot) -> None:
        """Wait (holding no lock) until the job's latest queued write is durable; reload the job if it
        failed. A shared store's commands are computed only on a landed head (see :attr:`Slot.landed`)."""
        if slot.ticket.exception() is not None:
            self.reload(slot)

    def active(self, tenant: str) -> int:
        return self._active.get(tenant, 0)

    def total(self, tenant: str) -> int:
        """All of the tenant's jobs (every status): the ``max_jobs`` quota."""
        return len(self._by_tenant.get(tenant, ()))

    def in_memory(self, tenant: str, job_id: str, step: int) -> bool:
        """A report of ``step`` to this job needs no store read: the job is loaded and sound, the
        tenant's reports counted, and the step not a late retry of an old one."""
        slot = self._slots.get((tenant, job_id))
        if slot is None or slot.lazy or slot.broken or slot.committed is None or tenant not in self._reports:
            return False
        last = slot.head.last
        return last is None or step >= last.step

    def reports(self, tenant: str) -> int:
        """The tenant's stored reports (counted once, then kept by :meth:`commit`: one process writes
        the store, so the count stays right)."""
        hit = self._reports.get(tenant)
        if hit is None:
            hit = self._reports[tenant] = [self.store.count_reports(tenant), 0.0]
        return int(hit[0])

    def live_slots(self) -> list[Slot]:
        """The jobs a lease sweep looks at (pending or running ones among them)."""
        return [s for s in list(self._slots.values()) if s.head.record.status.active]

    def page(self, tenant: str, status: JobStatus | None, limit: int | None, offset: int) -> tuple[list[JobState], int]:
        """One page of the tenant's committed jobs in registration order, and the total (only the
        page's lazily loaded jobs are replayed)."""
        slots = [s for s in list(self._by_tenant.get(tenant, {}).values()) if s.committed is not None]
        if status is not None:
            slots = [s for s in slots if s.committed.record.status is status]
        end = len(slots) if limit is None else offset + limit
        return [self._ready(s).committed for s in slots[offset:end]], len(slots)

    def forget(self, slot: Slot, reports: int) -> None:
        """The job was deleted from the store with its ``reports`` (the caller holds its lock)."""
        slot.deleted = True
        self.remove(slot)
        hit = self._reports.get(slot.head.record.tenant)
        if hit is not None:
            hit[0] = max(0, hit[0] - reports)

    def run_rows(self, tenant: str) -> list[RunRow]:
        """What the job list searches and sorts of each of the tenant's committed jobs."""
        return [RunRow.of(s.committed.record) for s in list(self._by_tenant.get(tenant, {}).values())
                if s.committed is not None]

    def observe(self, tenant: str, job_id: str, request: ReportRequest, now: float) -> tuple[Step, Future] | None:
        """A report on the common path, in one call: a new step of a running job in memory whose rule
        continues. The job is looked up, the tenant's stored reports counted against its
        ``max_reports_per_tenant`` (:attr:`report_limits`), the report built, the pure step computed
        under the job's lock, its write queued and swapped in when durable. None: not the common case
        (a first report, a retry, a stop, a lost, lazy or broken job, an unknown tenant count or
        limit); the coordinator's general path then decides it from the start (nothing here changed
        anything)."""
        slot = self._slots.get((tenant, job_id))
        count = self._reports.get(tenant)
        tenant_limit = self.report_limits.get(tenant)
        if slot is None or count is None or tenant_limit is None or count[0] >= tenant_limit or slot.lazy \
                or slot.broken:
            return None
        with slot.lock:
            state = slot.head
            last = state.last
            if slot.deleted or state.record.status is not JobStatus.RUNNING or (last is not None
                                                                                 and request.step <= last.step):
                return None
            out = observe(state, Report.of(request, now, state.record.planned_steps))
            c = out.commit
            if c.job is not None:  # a stop (its audit line, the tenant's audit budget): the general path
                return None
            count[0] += 1
            ticket = self.store.add_report(tenant, job_id, c.report, c.expect, c.created)
            slot.push(out.state, ticket)
        return out, ticket

    def register(self, tenant: str, reg: Registration, quotas: Quotas, detector: Detector | None) -> JobState | None:
        """A new job, in one call: under :attr:`register_lock` the id is looked up, the tenant's job
        quotas checked (:class:`QuotaExceeded`), the job's record and state built, its insert queued
        and the job put in memory (seen by readers once the insert is durable); then the insert is
        awaited holding no lock (a failed one forgets the job and is re-raised; a shared store's
        :class:`LimitReached` is the quota's :class:`QuotaExceeded`). ``detector``: the job's rule
        if it is the coordinator's shared default (else built from the policy). Returns the new job's
        state, or None when the id is taken (a re-registration, a retry: the caller attaches to it;
        nothing here changed anything). A store of one process registers a job in this one call; a
        shared store's caller retries it when another replica inserted the job first (StaleState)."""
        with self.register_lock:
            if self.find(tenant, reg.job_id) is not None:
                return None
            self.report_limits[tenant] = quotas.max_reports_per_tenant
            total = self.total(tenant)
            if total >= quotas.max_jobs:
                raise QuotaExceeded(f"tenant {tenant!r} has {total} jobs, the most allowed (max_jobs={quotas.max_jobs},"
                                    " finished ones included); prune old ones ('evalstop prune') or ask for more")
            active = self.active(tenant)
            if active >= quotas.max_active_jobs:
                raise QuotaExceeded(f"tenant {tenant!r} has {active} active jobs, the most allowed "
                                    f"(max_active_jobs={quotas.max_active_jobs}); finish or stop some first")
            record = JobRecord.new(tenant, reg, self._clock())
            state = JobState.new(record, quotas.max_reports_per_job, detector, version=1)
            # a shared store checks the quotas again inside the insert's transaction (replicas race)
            ticket = self.store.register(record, JobLimits(quotas.max_jobs, quotas.max_active_jobs))
            slot = self.insert(state, committed=False)
            slot.push(state, ticket)
        if ticket is not DONE:
            try:
                wait_durable(ticket)
            except StoreError as exc:
                self.remove(slot)
                if isinstance(exc, LimitReached):
                    raise QuotaExceeded(str(exc)) from None
                raise
        return state

    def commit(self, c: Commit, tenant: str, job_id: str, revive: JobLimits | None = None) -> Future:
        """Queue a step's rows (the caller holds the job's lock). ``revive``: a lost job runs again
        (a shared store checks the tenant's active jobs in the write's transaction)."""
        if c.report is not None:
            hit = self._reports.get(tenant)
            if hit is not None:
                hit[0] += 1
        if revive is not None:
            return self.store.revive(c.job, c.report, c.audit, c.deliveries, c.expect, revive)
        if c.job is None:
            return self.store.add_report(tenant, job_id, c.report, c.expect, c.created)
        return self.store.commit(c.job, c.report, c.audit, c.deliveries, expect=c.expect)


class ReplicatedJobs(JobCache):
    """The jobs of one of several coordinators sharing a store (replicas): a cache whose entries are
    re-read when the store's version of the job moved on, with listing and quotas from the store."""

    shared = True

    def __init__(self, store: Store, max_reports: Callable[[str], int], clock: Callable[[], float]) -> None:
        self.store = store
        self._max_reports = max_reports
        self._clock = clock
        self._lock = threading.Lock()
        # no process-wide lock around a registration's store reads: the store refuses a second
        # insert of the same job (StaleState: the client retries and finds the job)
        self.register_lock = contextlib.nullcontext()
        self._slots, self._by_tenant, self._active, self._reports, self.report_limits = {}, {}, {}, {}, {}
        self._load_all()

    _REPORTS_TTL_S = 5.0  # other replicas add reports too: count again this often

    def in_memory(self, tenant: str, job_id: str, step: int) -> bool:
        return False  # another replica may have written the job: its version is read first

    def observe(self, tenant: str, job_id: str, request: ReportRequest, now: float) -> None:
        return None  # a shared store: the general path (another replica may have written the job)

    def reports(self, tenant: str) -> int:
        hit = self._reports.get(tenant)
        now = self._clock()
        if hit is None or now - hit[1] > self._REPORTS_TTL_S:
            hit = self._reports[tenant] = [self.store.count_reports(tenant), now]
        return int(hit[0])

    def find(self, tenant: str, job_id: str) -> Slot | None:
        try:
            return self.get(tenant, job_id)
        except NotFound:
            return None

    def for_report(self, tenant: str, job_id: str, step: int) -> Slot:
        """The job's slot with no version read when ``step`` is new to it as this replica has it
        (after its head's last report): the report's write names the version it replaces, so if
        another replica wrote the job since (or deleted it), the store refuses the write
        (:class:`~.store.StaleState`), the job is reloaded and the report decided again on what the
        store holds. A retry of a step already reported reads the version first (:meth:`get`): it
        may be answered without a write."""
        slot = self._slots.get((tenant, job_id))
        if slot is not None and not slot.broken and not slot.lazy and slot.committed is not None:
            last = slot.head.last
            if last is None or step > last.step:
                return slot
        return self.get(tenant, job_id)

    def get(self, tenant: str, job_id: str) -> Slot:
        slot = self._slots.get((tenant, job_id))
        if slot is None:
            record = self.store.job(tenant, job_id)  # another replica's job
            if record is None:
                raise NotFound(f"no job {job_id!r:.140} for tenant {tenant!r}")
            return self.insert(self._load(record), committed=True)
        if slot.broken:
            self.reload(slot)
        elif not slot.pending and slot.committed is not None:
            self._ready(slot)
            stored = self.store.job_versions(tenant, [job_id]).get(job_id)
            committed = slot.committed
            if stored is None or stored[0] != committed.record.created_at or stored[1] > committed.version:
                self.reload(slot)  # deleted, registered again under its id, or written by another replica
        if slot.committed is None and not slot.pending:
            raise NotFound(f"no job {job_id!r:.140} for tenant {tenant!r}")
        return slot

    def active(self, tenant: str) -> int:
        return self.store.count_active(tenant)

    def total(self, tenant: str) -> int:
        return self.store.count_jobs(tenant)

    def live_slots(self) -> list[Slot]:
        """Every replica sweeps every active job in the store (a job's version check lets one win)."""
        slots = []
        for record in self.store.jobs():
            if record.status.active:
                try:
                    slots.append(self.get(record.tenant, record.job_id))
                except NotFound:
                    continue
        return slots

    def run_rows(self, tenant: str) -> list[RunRow]:
        """The tenant's jobs as the store has them (every replica's), a few columns each."""
        return self.store.run_rows(tenant)

    def page(self, tenant: str, status: JobStatus | None, limit: int | None, offset: int) -> tuple[list[JobState], int]:
        ids, total = self.store.job_page(tenant, None if status is None else status.value, limit, offset)
        states = []
        for job_id in ids:
            try:
                states.append(self.read(tenant, job_id))
            except NotFound:
                continue
        return states, total

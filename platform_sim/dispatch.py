"""Plan -> place -> apply: who holds the GPUs after each instant of a run.

The :class:`Dispatcher` owns the engine's planning state: the waiting and running jobs, the
:class:`~platform_sim.cluster.Cluster` (gang placement: all GPUs or none; :class:`~platform_sim.cluster.Pools`
on a mixed cluster) and, for schedulers with a
priority, the incremental planning structures of :mod:`platform_sim.planning` (the waiting line and
the running jobs' priority bounds). The event loop (:class:`~platform_sim.engine.Simulation`) tells
it when a job arrives or leaves and asks it to plan once per instant; it starts and preempts jobs
and queues each running job's next EVAL_DUE or FINISH.

Two ways to plan:

* a scheduler with a priority (:func:`~platform_sim.schedulers.uses_priority`): waiting jobs stay
  sorted in a :class:`~platform_sim.planning.WaitingLine`, and a preemptive plan re-evaluates only
  the running jobs whose priority could still matter (:meth:`Dispatcher._late_running`);
* any other scheduler (``line`` is None): its :meth:`~platform_sim.schedulers.Scheduler.order` gets
  snapshots of every job it plans for.
"""

from __future__ import annotations

from heapq import heapify
from heapq import heappop as _heappop
from heapq import heappush as _heappush

from .cluster import Cluster, Pools
from .config import ClusterConfig
from .events import Event, EventQueue
from .jobs import JobTable
from .planning import Entry, WaitingLine, greedy_cut
from .schedulers import Scheduler, assigns_pools, changes_while_running, uses_priority
from .views import JobSnapshot

__all__ = ["Dispatcher"]

_EVAL_DUE, _FINISH, _RESCHEDULE = Event.EVAL_DUE, Event.FINISH, Event.RESCHEDULE


class Dispatcher:
    """The waiting and running jobs of one run, and the plan that moves jobs between them.

    Attributes:
        table: the jobs' state (:class:`~platform_sim.jobs.JobTable`), read and updated by job id.
        waiting, running: job id -> its GPUs, in the order the jobs joined.
        line: the waiting line of a priority scheduler (None: plan from the scheduler's ``order``).
        bounds: running jobs' ``(-priority bound, job id, token)``, a heap (priority schedulers).
    """

    def __init__(self, table: JobTable, cluster: Cluster | Pools, scheduler: Scheduler, queue: EventQueue,
                 restart_s: float, cluster_cfg: ClusterConfig | None = None) -> None:
        self.table, self.cluster, self.scheduler, self.queue = table, cluster, scheduler, queue
        self.cluster_cfg = cluster_cfg  # what an assigning scheduler (Gavel) is told about the pools
        self.restart_s = restart_s
        self.waiting: dict[int, int] = {}
        self.running: dict[int, int] = {}
        self.line: WaitingLine | None = WaitingLine() if uses_priority(scheduler) else None
        self.bounds: list[tuple[float, int, int]] = []
        self.running_gpus = 0
        self._changes = changes_while_running(scheduler)
        self._assigns = assigns_pools(scheduler)
        if self._assigns and cluster_cfg is None:
            raise ValueError(f"scheduler {scheduler.name!r} assigns pools: the Dispatcher needs cluster_cfg")
        self.pooled = isinstance(cluster, Pools)  # a mixed cluster: jobs get their pool's speed
        self.pool_gpu_seconds = dict.fromkeys(cluster.names, 0.0) if self.pooled else {}

    # ------------------------------------------------------------------ jobs joining and leaving
    def wait(self, j: int) -> None:
        """Job ``j`` (arrived or preempted) waits for GPUs."""
        table = self.table
        self.waiting[j] = gpus = table.gpus[j]
        if self.line is not None:
            table.priority[j] = p = self.scheduler.priority(table.snapshot(j, self.queue.now))
            self.line.add(p, j, gpus)

    def leave(self, j: int) -> None:
        """Job ``j`` gives its GPUs back (it departs or is preempted)."""
        table = self.table
        gpus = self.running.pop(j)
        self.cluster.release(j, gpus)
        if self.pooled:
            self.pool_gpu_seconds[table.pool[j]] += gpus * (self.queue.now - table.started_at[j])
        self.running_gpus -= gpus
        table.token[j] += 1

    def schedule_next(self, j: int) -> None:
        """Queue the running job ``j``'s next event: its next eval, or the end of its work if sooner."""
        table = self.table
        self.queue_next(j, table.run_since[j], table.work[j], table.next_eval[j] * table.seg_len[j], table.end_work[j],
                        table.speed[j], table.version[j])

    def queue_next(self, j: int, since: float, work: float, eval_work: float, end_work: float, speed: float,
                   version: int) -> None:
        """:meth:`schedule_next` from the job's values (the engine has them at hand after an eval): the work
        of its next eval ``eval_work`` or ``end_work`` if sooner, at ``speed`` from ``work`` at ``since``."""
        if end_work < eval_work:
            self.queue.push(since + (end_work - work) / speed, _FINISH, j, version)
        else:
            self.queue.push(since + (eval_work - work) / speed, _EVAL_DUE, j, version)

    def _start(self, j: int, pool: str | None = None) -> bool:
        table = self.table
        gpus = table.gpus[j]
        if not self.cluster.place(j, gpus, table.job_type[j], pool):
            return False
        if self.pooled:
            table.pool[j], table.speed[j] = self.cluster.placed(j, table.job_type[j])
        del self.waiting[j]
        self.running[j] = gpus
        self.running_gpus += gpus
        if self.line is not None:
            priority = table.priority[j]
            self.line.remove(priority, j, gpus)
            if self.scheduler.preemptive:  # its waiting priority bounds its priority while it runs
                table.token[j] += 1
                _heappush(self.bounds, (-priority, j, table.token[j]))
        table.start(j, self.queue.now, self.restart_s)
        self.schedule_next(j)
        if self._changes:
            self.schedule_change(j)
        return True

    def schedule_change(self, j: int) -> None:
        """Queue the running job ``j``'s next change of place in line (:meth:`Scheduler.change_after_s`)."""
        now = self.queue.now
        after = self.scheduler.change_after_s(self.table.snapshot(j, now))
        if after is not None:
            self.queue.push(now + max(after, 0.0), _RESCHEDULE, j, self.table.version[j])

    def _preempt(self, j: int) -> None:
        self.leave(j)
        self.table.preempt(j, self.queue.now)
        self.wait(j)

    def snapshots(self, jobs) -> list[JobSnapshot]:
        """Snapshots of ``jobs`` (ids) now, in that order."""
        snapshot, now = self.table.snapshot, self.queue.now
        return [snapshot(j, now) for j in jobs]

    # ------------------------------------------------------------------ the plan
    def plan(self, allow_preempt: bool) -> None:
        """Start (and, for a preemptive scheduler when ``allow_preempt``, preempt) jobs now."""
        preempt = self.scheduler.preemptive and allow_preempt
        if self._assigns:
            self._plan_assign(preempt)
        elif self.line is None:
            self._plan_orders(preempt)
        elif preempt:
            self._plan_cut()
        else:
            self._plan_line()

    def _plan_orders(self, preempt: bool) -> None:
        """From the scheduler's order of snapshots (schedulers without a priority)."""
        sched, cluster, now = self.scheduler, self.cluster, self.queue.now
        if preempt:
            active = self.snapshots([*self.running, *self.waiting])
            free, chosen = cluster.total_gpus, []
            for v in sched.order(active, now):  # the GPUs go down the order by count; placement may still refuse one
                if v.gpus <= free:
                    chosen.append(v.job_id)
                    free -= v.gpus
            keep = set(chosen)
            for j in [j for j in self.running if j not in keep]:
                self._preempt(j)
            for j in chosen:
                if j in self.waiting:
                    self._start(j)
            return
        if not self.waiting or cluster.free == 0:
            return
        for v in sched.order(self.snapshots(self.waiting), now):
            if cluster.free == 0:
                break
            if not self._start(v.job_id) and not sched.backfill:
                break

    def _plan_assign(self, preempt: bool) -> None:
        """From the scheduler's assignment of jobs to pools (:meth:`Scheduler.assign`)."""
        if not self.waiting and (not preempt or not self.pooled):
            return  # nobody to start, and on one pool the running jobs all fit: each keeps its GPUs
        if not preempt and self.cluster.free == 0:
            return  # between rounds only waiting jobs start, and none could
        plan = self.scheduler.assign(self.snapshots([*self.running, *self.waiting]), self.queue.now, self.cluster_cfg)
        if preempt:
            where, placed = dict(plan), self.table.pool
            for j in [j for j in self.running if where.get(j) != placed[j]]:
                self._preempt(j)
        for j, pool in plan:
            if j in self.waiting:
                self._start(j, pool)

    def _plan_line(self) -> None:
        """Non-preemptive: start waiting jobs in priority order while GPUs are free."""
        line, cluster = self.line, self.cluster
        backfill = self.scheduler.backfill
        blocked: set[int] = set()  # sizes placement refused in this plan (packing): it refuses them all
        while cluster.free and line.n:
            entry = line.first_fitting(cluster.free, blocked) if backfill else line.first()
            if entry is None:
                break
            if not self._start(entry[1]):
                if not backfill:
                    break
                blocked.add(entry[2])

    def _plan_cut(self) -> None:
        """Preemptive: the plan a sort of every active job by priority gives, from the jobs that matter."""
        line, cluster = self.line, self.cluster
        if not line.n:
            return  # every running job keeps its GPUs
        if line.gpus <= cluster.free:  # every waiting job fits: nobody is preempted, all start in order
            for _, j, _ in line.in_order():
                self._start(j)
            return
        late = self._late_running(line.first())
        start, preempt = greedy_cut(cluster.total_gpus, self.running_gpus - sum(e[2] for e in late), late, line)
        for j in preempt:
            self._preempt(j)
        for j in start:
            self._start(j)

    def _late_running(self, first: Entry) -> list[Entry]:
        """Running jobs whose priority now is at or above the first waiting job's, sorted.

        Running priorities only fall, so each job's last computed priority bounds it from above; only
        jobs whose bound reaches ``first`` (less a margin for rounding) are re-evaluated."""
        bounds, table, now, priority = self.bounds, self.table, self.queue.now, self.scheduler.priority
        token, prio = table.token, table.priority
        threshold = first[0] - 1e-9 * (abs(first[0]) + 1.0)
        late, checked = [], []
        while bounds:
            neg, j, tok = bounds[0]
            if tok != token[j]:
                _heappop(bounds)  # the job left its GPUs or was re-evaluated since
                continue
            if -neg < threshold:
                break  # this job and all below it come before every waiting job
            _heappop(bounds)
            p = prio[j] = priority(table.snapshot(j, now))
            checked.append(j)
            entry = (p, j, table.gpus[j])
            if entry >= first:
                late.append(entry)
        for j in checked:
            token[j] += 1
            _heappush(bounds, (-prio[j], j, token[j]))
        if len(bounds) > 2 * len(self.running) + 64:  # drop stale entries now and then
            self.bounds = [(-prio[j], j, token[j]) for j in self.running]
            heapify(self.bounds)
        late.sort()
        return late

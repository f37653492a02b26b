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
from .jobs import SimJob
from .planning import Entry, WaitingLine, greedy_cut
from .schedulers import Scheduler, assigns_pools, changes_while_running, uses_priority

__all__ = ["Dispatcher"]

_EVAL_DUE, _FINISH, _RESCHEDULE = Event.EVAL_DUE, Event.FINISH, Event.RESCHEDULE


class Dispatcher:
    """The waiting and running jobs of one run, and the plan that moves jobs between them.

    Attributes:
        waiting, running: job id -> job, in the order the jobs joined.
        line: the waiting line of a priority scheduler (None: plan from the scheduler's ``order``).
        bounds: running jobs' ``(-priority bound, job id, token)``, a heap (priority schedulers).
    """

    def __init__(self, jobs: list[SimJob], cluster: Cluster | Pools, scheduler: Scheduler, queue: EventQueue,
                 restart_s: float, cluster_cfg: ClusterConfig | None = None) -> None:
        self.jobs, self.cluster, self.scheduler, self.queue = jobs, cluster, scheduler, queue
        self.cluster_cfg = cluster_cfg  # what an assigning scheduler (Gavel) is told about the pools
        self.restart_s = restart_s
        self.waiting: dict[int, SimJob] = {}
        self.running: dict[int, SimJob] = {}
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
    def wait(self, job: SimJob) -> None:
        """``job`` (arrived or preempted) waits for GPUs."""
        jid = job.spec.job_id
        self.waiting[jid] = job
        if self.line is not None:
            job.priority = p = self.scheduler.priority(job.snapshot(self.queue.now))
            self.line.add(p, jid, job.spec.gpus)

    def leave(self, job: SimJob) -> None:
        """``job`` gives its GPUs back (it departs or is preempted)."""
        jid, gpus = job.spec.job_id, job.spec.gpus
        self.cluster.release(jid, gpus)
        if self.pooled:
            self.pool_gpu_seconds[job.pool] += gpus * (self.queue.now - job.started_at)
        del self.running[jid]
        self.running_gpus -= gpus
        job.token += 1

    def schedule_next(self, job: SimJob) -> None:
        """Queue the running ``job``'s next event: its next eval, or the end of its work if sooner."""
        eval_work = job.next_eval * job.timing.seg_len
        if job.end_work < eval_work:
            self.queue.push(job.run_since + (job.end_work - job.work) / job.speed, _FINISH, job.spec.job_id, job.version)
        else:
            self.queue.push(job.run_since + (eval_work - job.work) / job.speed, _EVAL_DUE, job.spec.job_id, job.version)

    def _start(self, job: SimJob, pool: str | None = None) -> bool:
        jid, gpus = job.spec.job_id, job.spec.gpus
        if not self.cluster.place(jid, gpus, job.spec.job_type, pool):
            return False
        if self.pooled:
            job.pool, job.speed = self.cluster.placed(jid, job.spec.job_type)
        del self.waiting[jid]
        self.running[jid] = job
        self.running_gpus += gpus
        if self.line is not None:
            self.line.remove(job.priority, jid, gpus)
            if self.scheduler.preemptive:  # its waiting priority bounds its priority while it runs
                job.token += 1
                _heappush(self.bounds, (-job.priority, jid, job.token))
        job.start(self.queue.now, self.restart_s)
        self.schedule_next(job)
        if self._changes:
            self.schedule_change(job)
        return True

    def schedule_change(self, job: SimJob) -> None:
        """Queue the running ``job``'s next change of place in line (:meth:`Scheduler.change_after_s`)."""
        now = self.queue.now
        after = self.scheduler.change_after_s(job.snapshot(now))
        if after is not None:
            self.queue.push(now + max(after, 0.0), _RESCHEDULE, job.spec.job_id, job.version)

    def _preempt(self, job: SimJob) -> None:
        self.leave(job)
        job.preempt(self.queue.now)
        self.wait(job)

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
            active = [j.snapshot(now) for j in self.running.values()] + [j.snapshot(now) for j in self.waiting.values()]
            free, chosen = cluster.total_gpus, []
            for v in sched.order(active, now):  # the GPUs go down the order by count; placement may still refuse one
                if v.gpus <= free:
                    chosen.append(v.job_id)
                    free -= v.gpus
            keep = set(chosen)
            for jid in [jid for jid in self.running if jid not in keep]:
                self._preempt(self.running[jid])
            for jid in chosen:
                if jid in self.waiting:
                    self._start(self.jobs[jid])
            return
        if not self.waiting or cluster.free == 0:
            return
        for v in sched.order([j.snapshot(now) for j in self.waiting.values()], now):
            if cluster.free == 0:
                break
            if not self._start(self.jobs[v.job_id]) and not sched.backfill:
                break

    def _plan_assign(self, preempt: bool) -> None:
        """From the scheduler's assignment of jobs to pools (:meth:`Scheduler.assign`)."""
        if not self.waiting and (not preempt or not self.pooled):
            return  # nobody to start, and on one pool the running jobs all fit: each keeps its GPUs
        if not preempt and self.cluster.free == 0:
            return  # between rounds only waiting jobs start, and none could
        now = self.queue.now
        active = [j.snapshot(now) for j in self.running.values()] + [j.snapshot(now) for j in self.waiting.values()]
        plan = self.scheduler.assign(active, now, self.cluster_cfg)
        if preempt:
            where = dict(plan)
            for jid in [jid for jid, j in self.running.items() if where.get(jid) != j.pool]:
                self._preempt(self.running[jid])
        for jid, pool in plan:
            if jid in self.waiting:
                self._start(self.jobs[jid], pool)

    def _plan_line(self) -> None:
        """Non-preemptive: start waiting jobs in priority order while GPUs are free."""
        line, cluster, jobs = self.line, self.cluster, self.jobs
        backfill = self.scheduler.backfill
        blocked: set[int] = set()  # sizes placement refused in this plan (packing): it refuses them all
        while cluster.free and line.n:
            entry = line.first_fitting(cluster.free, blocked) if backfill else line.first()
            if entry is None:
                break
            if not self._start(jobs[entry[1]]):
                if not backfill:
                    break
                blocked.add(entry[2])

    def _plan_cut(self) -> None:
        """Preemptive: the plan a sort of every active job by priority gives, from the jobs that matter."""
        line, cluster, jobs = self.line, self.cluster, self.jobs
        if not line.n:
            return  # every running job keeps its GPUs
        if line.gpus <= cluster.free:  # every waiting job fits: nobody is preempted, all start in order
            for _, jid, _ in line.in_order():
                self._start(jobs[jid])
            return
        late = self._late_running(line.first())
        start, preempt = greedy_cut(cluster.total_gpus, self.running_gpus - sum(e[2] for e in late), late, line)
        for jid in preempt:
            self._preempt(jobs[jid])
        for jid in start:
            self._start(jobs[jid])

    def _late_running(self, first: Entry) -> list[Entry]:
        """Running jobs whose priority now is at or above the first waiting job's, sorted.

        Running priorities only fall, so each job's last computed priority bounds it from above; only
        jobs whose bound reaches ``first`` (less a margin for rounding) are re-evaluated."""
        bounds, jobs, now, priority = self.bounds, self.jobs, self.queue.now, self.scheduler.priority
        threshold = first[0] - 1e-9 * (abs(first[0]) + 1.0)
        late, checked = [], []
        while bounds:
            neg, jid, token = bounds[0]
            job = jobs[jid]
            if token != job.token:
                _heappop(bounds)  # the job left its GPUs or was re-evaluated since
                continue
            if -neg < threshold:
                break  # this job and all below it come before every waiting job
            _heappop(bounds)
            p = job.priority = priority(job.snapshot(now))
            checked.append(job)
            entry = (p, jid, job.spec.gpus)
            if entry >= first:
                late.append(entry)
        for job in checked:
            job.token += 1
            _heappush(bounds, (-job.priority, job.spec.job_id, job.token))
        if len(bounds) > 2 * len(self.running) + 64:  # drop stale entries now and then
            self.bounds = [(-j.priority, jid, j.token) for jid, j in self.running.items()]
            heapify(self.bounds)
        late.sort()
        return late

"""Incremental planning gives the plan a full sort gives, and its work grows linearly with the jobs.

The reference is the engine's general path (``Simulation`` with no waiting line): at every planning
point it sorts snapshots of every active job by ``(priority, job id)`` — the algorithm before the
waiting line and the running jobs' priority bounds existed.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from platform_sim.config import load_config
from platform_sim.engine import Simulation
from platform_sim.planning import WaitingLine, greedy_cut
from platform_sim.policies import build_overlay, build_scheduler
from platform_sim.schedulers import SRTFEst
from platform_sim.workload import generate_workload


class FullSort(Simulation):
    """The reference: every plan sorts all active jobs (no waiting line, no bounds)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dispatch.line = None


def run(cls, cfg, wl, scheduler, overlay):
    return cls(wl, cfg, build_scheduler(cfg, scheduler), build_overlay(cfg, wl, overlay)).run()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), scheduler=st.sampled_from(["fifo", "sjf_est", "srtf_est"]),
       overlay=st.sampled_from(["none", "evalstop", "oracle"]), pack=st.booleans(),
       load=st.sampled_from([0.5, 0.9, 1.5]), backfill=st.booleans(), restart=st.sampled_from([0.0, 600.0]),
       nodes=st.sampled_from([2, 8]))
def test_incremental_planning_equals_a_full_sort(seed, scheduler, overlay, pack, load, backfill, restart, nodes):
    cfg = load_config().replace(**{
        "workload.n_jobs": 60, "cluster.pack_small_jobs": pack, "workload.load": load, "cluster.nodes": nodes,
        "scheduler.fifo.backfill": backfill, "workload.restart_overhead_s": restart,
        "workload.types.rlhf_ppo.gpus": {8: 0.6, 16: 0.4}, "workload.types.rlhf_grpo.gpus": {4: 0.2, 8: 0.6, 16: 0.2},
    })
    wl = generate_workload(cfg, seed)
    assert run(Simulation, cfg, wl, scheduler, overlay) == run(FullSort, cfg, wl, scheduler, overlay)


def brute_cut(total, running, waiting):
    """The greedy by count over every active job, sorted: (start order, preempted ids)."""
    free, kept = total, []
    for entry in sorted(running + waiting):
        if entry[2] <= free:
            kept.append(entry[1])
            free -= entry[2]
    keep = set(kept)
    waiting_ids = {e[1] for e in waiting}
    return [j for j in kept if j in waiting_ids], sorted(e[1] for e in running if e[1] not in keep)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_greedy_cut_equals_the_full_greedy(seed):
    rng = random.Random(seed)
    total = rng.choice([8, 16, 64])
    sizes = [1, 2, 4, 8, 16]
    running, used, jid = [], 0, 0
    for _ in range(rng.randint(0, 12)):
        g = rng.choice(sizes)
        if used + g <= total:
            running.append((rng.choice([rng.random(), 0.5]) * 10, jid, g))
            used += g
            jid += 1
    waiting = []
    for _ in range(rng.randint(1, 12)):
        waiting.append((rng.choice([rng.random(), 0.5]) * 10, jid, rng.choice(sizes)))
        jid += 1
    line = WaitingLine()
    for p, j, g in waiting:
        line.add(p, j, g)
    first = line.first()
    late = sorted(e for e in running if e >= first)
    early = sum(e[2] for e in running if e < first)
    start, preempt = greedy_cut(total, early, late, line)
    assert (start, sorted(preempt)) == brute_cut(total, running, waiting)


class CountingSRTF(SRTFEst):
    def __init__(self):
        self.calls = 0

    def priority(self, job):
        self.calls += 1
        return super().priority(job)


def test_planning_work_per_job_does_not_grow_with_the_cluster():
    """Priority evaluations per job stay flat from 1,000 to 10,000 jobs (GPUs scaled alike); a full
    sort would evaluate every active job at every planning point (hundreds per job at 10,000)."""
    per_job = {}
    for n in (1_000, 10_000):
        cfg = load_config().replace(**{"workload.n_jobs": n, "cluster.nodes": 8 * n // 200})
        wl = generate_workload(cfg, 0)
        sched = CountingSRTF()
        sim = Simulation(wl, cfg, sched, build_overlay(cfg, wl, "none"))
        sim.run()
        per_job[n] = sched.calls / n
        assert len(sim.dispatch.bounds) <= 2 * sim.table.n + 64
    assert per_job[10_000] <= 1.5 * per_job[1_000] and per_job[10_000] < 5, per_job


def test_the_overlay_coordinator_takes_more_jobs_than_a_service_tenant_may():
    """A service tenant may hold 100,000 jobs; the simulated platform holds a whole workload, so
    EvalStop's coordinator must accept the 100,001st job (and its reports) of a large run."""
    from evalstop_trl.core.records import Quotas
    from platform_sim.overlays import create_overlay
    from platform_sim.views import JobSnapshot, VirtualClock

    n = Quotas().max_jobs + 1
    overlay = create_overlay("evalstop", None, job_types="all")
    overlay.attach(VirtualClock(), 10)
    for jid in range(n):
        overlay.on_arrival(JobSnapshot(jid, "rlhf_grpo", True, 1, 0.0, 1.0, 0.0, False, 0.0, 0, (), (), 0.0))
    assert overlay.on_eval_id(n - 1, 1, 0.5, 1.0, 0.1) is False  # registered, and its report taken
    assert overlay.on_eval_id(0, 1, 0.5, 1.0, 0.1) is False

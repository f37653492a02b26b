"""Engine invariants (properties), scheduler order on hand-made workloads, views, overlays, the job
lifecycle, the event queue and the cluster, and results pinned to a recorded golden."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platform_sim.config import DEFAULT_CONFIG, load_config
from platform_sim.curves import CurveKind
from platform_sim.engine import Simulation
from platform_sim.experiments import simulate
from platform_sim.jobs import Phase, Timing
from platform_sim.overlays import DetectorOverlay, Overlay
from platform_sim.policies import build_overlay, build_scheduler
from platform_sim.schedulers import SCHEDULERS
from platform_sim.views import VISIBLE_FIELDS, InformationBoundaryError, JobSnapshot
from platform_sim.workload import generate_workload
from tests.sim_helpers import job, small_config, workload


class CheckedSimulation(Simulation):
    """Checks the GPU invariant after every planning step."""

    max_in_use = 0

    def _plan(self, allow_preempt):
        super()._plan(allow_preempt)
        table = self.table
        in_use = sum(table.gpus[j] for j in self.running)
        assert in_use == sum(self.running.values())
        c = self.cluster
        assert 0 <= c.free == c.total_gpus - in_use
        assert sum(c.node_free) == c.free and min(c.node_free) >= 0
        assert all(table.state(j).phase is Phase.RUNNING for j in self.running)
        assert not any(table.running(j) for j in self.waiting)
        self.max_in_use = max(self.max_in_use, in_use)


def run(wl, cfg, scheduler, overlay="none", cls=Simulation):
    sim = cls(wl, cfg, build_scheduler(cfg, scheduler), build_overlay(cfg, wl, overlay))
    return sim, sim.run()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), scheduler=st.sampled_from(sorted(SCHEDULERS)),
       overlay=st.sampled_from(["none", "evalstop", "stop_at", "loss_plateau", "oracle"]),
       pack=st.booleans(), load=st.sampled_from([0.5, 1.2]))
def test_engine_invariants(seed, scheduler, overlay, pack, load):
    cfg = load_config().replace(**{"workload.n_jobs": 40, "cluster.pack_small_jobs": pack, "workload.load": load})
    wl = generate_workload(cfg, seed)
    sim, res = run(wl, cfg, scheduler, overlay, CheckedSimulation)
    assert sim.max_in_use <= 64
    assert len(res.outcomes) == 40 and sim.departed == 40
    for o, spec, truth in zip(res.outcomes, wl.jobs, wl.truths, strict=False):
        assert o.completed != o.stopped  # departed exactly once, one way
        assert o.departure_s >= o.first_start_s >= o.arrival_s
        if o.completed:
            assert o.jct_s >= truth.duration_s  # JCT >= exclusive duration
            assert o.evals_done == wl.n_evals
        assert o.gpu_seconds <= spec.gpus * (o.departure_s - o.first_start_s) + 1e-6
        assert o.gpu_seconds >= spec.gpus * (o.work_done - 1e-6)
    # same seed, same result
    assert run(wl, cfg, scheduler, overlay)[1] == res


def test_timing_layout():
    cfg = load_config()
    t = Timing.of(36000.0, cfg, 10)
    assert t.seg_train == 3600.0 and t.seg_eval == pytest.approx(0.02 * 3600 + 60)
    assert t.progress_of(t.work_at(0.35)) == pytest.approx(0.35)
    assert t.work_at(1.0) == t.total_work and t.progress_of(t.total_work) == 1.0
    assert t.progress_of(t.seg_train + 10) == pytest.approx(0.1)  # no progress during an eval


def test_fifo_vs_sjf_order():
    cfg = small_config()
    # a long 8-GPU job occupies the node; then a long and a short job queue behind it
    wl = workload(job(0, 8, 0, 10), job(1, 8, 1, 20, est_h=20), job(2, 8, 2, 1, est_h=1))
    _, fifo = run(wl, cfg, "fifo")
    _, sjf = run(wl, cfg, "sjf_est")
    assert fifo.outcomes[1].first_start_s == 10 * 3600 and fifo.outcomes[2].first_start_s == 30 * 3600
    assert sjf.outcomes[2].first_start_s == 10 * 3600 and sjf.outcomes[1].first_start_s == 11 * 3600


def test_strict_fifo_blocks_and_backfill_does_not():
    cfg = small_config()
    wl = workload(job(0, 6, 0, 10), job(1, 8, 1, 1), job(2, 2, 2, 1))
    _, back = run(wl, cfg.replace(**{"scheduler.fifo.backfill": True}), "fifo")
    _, strict = run(wl, cfg.replace(**{"scheduler.fifo.backfill": False}), "fifo")
    assert back.outcomes[2].first_start_s == 2 * 3600  # fills the 2 free GPUs
    assert strict.outcomes[2].first_start_s == 11 * 3600  # waits behind job 1


def test_srtf_preempts_with_restart_overhead():
    cfg = small_config(**{"workload.restart_overhead_s": 600.0})
    wl = workload(job(0, 8, 0, 10), job(1, 8, 1, 1))
    _, res = run(wl, cfg, "srtf_est")
    long, short = res.outcomes
    assert short.first_start_s == 3600 and short.departure_s == 2 * 3600
    assert long.restarts == 1
    assert long.departure_s == pytest.approx(11 * 3600 + 600)  # 1 h waiting + 10 min restart


def test_loss_aware_runs_new_jobs_first_and_promotes_starved_ones():
    cfg = small_config(**{"scheduler.loss_aware.promote_h": 1.0})
    wl = workload(job(0, 8, 0, 4), job(1, 8, 0.5, 4))
    _, res = run(wl, cfg, "loss_aware")
    assert all(o.completed for o in res.outcomes)
    assert res.outcomes[1].first_start_s < res.outcomes[0].departure_s  # the newcomer got GPUs


def test_evalstop_overlay_stops_through_the_coordinator():
    cfg = small_config()
    hacked = job(0, 8, 0, 5, scores=(0.5, 0.9, 0.7, 0.6, 0.5), kind=CurveKind.HACKED, hacked=True, peak=0.4)
    wl = workload(hacked, job(1, 8, 0, 5, scores=(0.1, 0.2, 0.3, 0.35, 0.3)))
    sim, res = run(wl, cfg, "fifo", "evalstop")
    stopped, healthy = res.outcomes
    assert stopped.stopped and stopped.evals_done == 4 and stopped.departure_s == 4 * 3600
    assert stopped.best_eval == 2 and stopped.delivered_progress == pytest.approx(0.4)
    assert healthy.completed  # a single decline at the very end does not stop it
    assert healthy.first_start_s == 4 * 3600  # it got the GPUs the moment the hacked job was stopped
    audit = sim.overlay.coordinator.audit("platform")
    assert [a.job_id for a in audit] == ["0"] and "2 consecutive declines" in audit[0].reason


class _EvalLog(Overlay):
    """Stops job 0 at its third eval, through one of the two eval hooks; logs what it received."""

    def __init__(self) -> None:
        self.got: list = []


class _BySnapshot(_EvalLog):
    def on_eval(self, job, step, score, loss, proxy):
        self.got.append((job, step))
        return job.job_id == 0 and step == 3


class _ById(_EvalLog):
    def on_eval_id(self, job_id, step, score, loss, proxy):
        self.got.append((job_id, step))
        return job_id == 0 and step == 3


def test_the_two_eval_hooks_decide_alike_and_only_on_eval_gets_snapshots():
    cfg = small_config()
    wl = workload(job(0, 8, 0, 5), job(1, 8, 0, 5))
    results, logs = [], []
    for overlay in (_BySnapshot(), _ById()):
        results.append(Simulation(wl, cfg, build_scheduler(cfg, "fifo"), overlay).run().outcomes)
        logs.append(overlay.got)
    assert results[0] == results[1] and results[0][0].stopped and results[0][0].evals_done == 3
    snapshots, ids = logs
    assert all(isinstance(j, JobSnapshot) for j, _ in snapshots)
    assert [(j.job_id, s) for j, s in snapshots] == ids and all(type(j) is int for j, _ in ids)
    assert snapshots[2][0].evals_done == 3  # the snapshot is taken after the eval


def test_the_eval_hook_defined_lowest_in_the_class_hierarchy_is_called():
    cfg = small_config()
    hacked = job(0, 8, 0, 5, scores=(0.5, 0.9, 0.7, 0.6, 0.5), kind=CurveKind.HACKED, hacked=True, peak=0.4)
    wl = workload(hacked)

    class Both(_BySnapshot, _ById):  # on_eval comes first in its hierarchy
        pass

    class Watching(DetectorOverlay):  # an on_eval_id overlay whose subclass overrides on_eval
        def __init__(self) -> None:
            # the paper's rule, as the simulator's config pins it (noise: none): built here without the config
            super().__init__("decline", {"k": 2, "noise": "none"}, "all", name="evalstop")
            self.seen: list = []

        def on_eval(self, job, step, score, loss, proxy):
            self.seen.append(job)
            return super().on_eval(job, step, score, loss, proxy)  # reaches the Coordinator

    both, watching = Both(), Watching()
    Simulation(wl, cfg, build_scheduler(cfg, "fifo"), both).run()
    assert both.got and all(isinstance(j, JobSnapshot) for j, _ in both.got)
    res = Simulation(wl, cfg, build_scheduler(cfg, "fifo"), watching).run()
    assert [v.evals_done for v in watching.seen] == [1, 2, 3, 4]
    assert res.outcomes[0].stopped and res.outcomes[0].evals_done == 4  # the decline rule stopped it


def test_oracle_stops_at_the_true_peak_and_is_marked():
    cfg = small_config()
    hacked = job(0, 8, 0, 4, scores=(0.5, 0.9, 0.7, 0.6), kind=CurveKind.HACKED, hacked=True, peak=0.3)
    _, res = run(workload(hacked), cfg, "fifo", "oracle")
    assert res.is_oracle and res.outcomes[0].stopped
    assert res.outcomes[0].delivered_progress == pytest.approx(0.3)
    assert res.outcomes[0].departure_s == pytest.approx(0.3 * 4 * 3600)


def test_snapshots_enforce_the_information_boundary():
    cfg = small_config()
    wl = workload(job(0, 8, 0, 4))
    sim = Simulation(wl, cfg, build_scheduler(cfg, "fifo"), build_overlay(cfg, wl, "none"))
    view = sim.table.snapshot(0, 0.0)
    assert view.gpus == 8 and view.est_duration_s == 4 * 3600 and view.progress == 0.0
    assert view._fields == VISIBLE_FIELDS
    for hidden in ("duration_s", "truth", "hacked", "scores", "peak_progress", "spec"):
        with pytest.raises(InformationBoundaryError, match="not visible"):
            getattr(view, hidden)
    with pytest.raises(InformationBoundaryError, match="read-only"):
        view.gpus = 1


def test_a_default_run_is_deterministic_and_fast_enough_to_test():
    cfg = load_config()
    a = simulate(cfg, 11, overlay="evalstop")
    b = simulate(cfg, 11, overlay="evalstop")
    assert a == b and a.events > 1000


def _digest(res) -> str:
    """sha256 of every outcome field (floats to 10 significant digits), the makespan and the event count.

    Not to the last bit: numpy's vectorised exp/log may differ in the last place between CPUs (the
    digests recorded with floats rounded to 9 decimals, 15-16 digits of a time in seconds, differed
    on another machine with the same event counts)."""
    import hashlib
    from dataclasses import astuple

    def r(v):
        return f"{v:.10g}" if isinstance(v, float) else v

    # the fields recorded then (ref_gpu_seconds came with mixed clusters; on a uniform one it is gpu_seconds)
    rows = [tuple(r(v) for v in astuple(o)[:13]) for o in res.outcomes]
    return hashlib.sha256(repr((rows, r(res.makespan_s), res.events)).encode()).hexdigest()


# Recorded on the default config, seed 0, with the engine of commit 1a1b8e6 (before the plan/place/apply
# half moved into dispatch.py), Python 3.11.7, numpy 2.4.6. (The earlier digests, floats at 9 decimals,
# recorded before the engine was split into event queue / cluster / jobs, did not reproduce on this
# machine even from the commit that recorded them.) A refactor must reproduce these exactly; a
# deliberate behaviour change updates them in its own commit.
GOLDEN = [
    ("fifo", "none", 2200, "518425a806aad9116c95912fff36bc29bca4effc16e5cc6c3908720b0845aff5"),
    ("srtf_est", "evalstop", 1904, "dc2783f35f674efc6efd5ea2c1441eb71a874f0ec6f11647ea1e6276426248ec"),
    ("sjf_est", "stop_at", 1711, "bd02f5b19f0c1a0bc2173ea61deea75e4439d7032d1c781e685a9d984e45dd09"),
    ("loss_aware", "loss_plateau", 5640, "a95e5abbdf7bd21740c28eb6404c0dbd51566943347a907a3a91dd82b77ee61b"),
    ("srtf_est", "oracle", 1819, "e717af66df5f3e3b81bffa702f5faefb3c723e969e83497a5e88b45ff6ea1ee2"),
]


@pytest.mark.parametrize("scheduler, overlay, events, sha", GOLDEN)
def test_results_identical_to_recorded_golden(scheduler, overlay, events, sha):
    res = simulate(load_config(), 0, scheduler, overlay)
    assert res.events == events
    assert _digest(res) == sha
    assert all(o.ref_gpu_seconds == pytest.approx(o.gpu_seconds, rel=1e-12) for o in res.outcomes)


class Timeline(Simulation):
    """Records which jobs hold GPUs after every plan: ``[(time, (job ids...)), ...]`` at each change."""

    def __init__(self, *args):
        super().__init__(*args)
        self.timeline = []

    def _plan(self, allow_preempt):
        super()._plan(allow_preempt)
        held = tuple(sorted(self.running))
        if not self.timeline or self.timeline[-1][1] != held:
            self.timeline.append((self.now, held))


def test_tiresias_demotes_at_each_threshold_and_runs_fifo_within_a_queue():
    """Worked by hand: two 8-GPU jobs of 4000 s on 8 GPUs, B arriving at 100 s; queue limits 3250,
    7200, 18000 GPU-seconds = 406.25, 900 and 2250 s of running at 8 GPUs."""
    cfg = small_config()
    wl = workload(job(0, 8, 0, 4000 / 3600), job(1, 8, 100 / 3600, 4000 / 3600))
    sim, res = run(wl, cfg, "tiresias", cls=Timeline)
    a, b = res.outcomes
    expected = [
        (0.0, (0,)),
        (406.25, (1,)),  # A passes 3250: queue 1; B (queue 0) takes the GPUs (at its arrival A was in queue 0 first)
        (812.5, (0,)),  # B passes 3250 too: both in queue 1, FIFO by arrival: A
        (1306.25, (1,)),  # A passes 7200 (493.75 s more): queue 2
        (1800.0, (0,)),  # B passes 7200
        (3150.0, (1,)),  # A passes 18000 (1350 s more): the last queue
        (4500.0, (0,)),  # B too: FIFO in the last queue, A runs to its end
        (6250.0, (1,)),
        (8000.0, ()),
    ]
    assert [held for _, held in sim.timeline] == [held for _, held in expected]
    assert [t for t, _ in sim.timeline] == pytest.approx([t for t, _ in expected])
    assert a.departure_s == pytest.approx(6250.0) and b.departure_s == pytest.approx(8000.0)
    assert a.restarts == b.restarts == 3 and a.completed and b.completed
    assert sim.events > 0 and res.events == sim.events


def test_tiresias_new_arrivals_take_gpus_from_demoted_jobs_at_once():
    cfg = small_config(**{"workload.restart_overhead_s": 600.0})
    wl = workload(job(0, 8, 0, 10), job(1, 8, 1, 0.5))
    _, res = run(wl, cfg, "tiresias")
    long, short = res.outcomes
    # the long job is in the last queue after its first 2250 s; the short one (queue 0) preempts it on
    # arrival, is demoted to queues 1 and 2 after 406.25 s and 900 s, stays ahead and runs to its end
    assert short.first_start_s == 3600.0 and short.departure_s == pytest.approx(1.5 * 3600)
    assert long.restarts == 1 and long.departure_s == pytest.approx(10.5 * 3600 + 600)  # + its restart


def test_tiresias_promote_knob_returns_a_starved_job_to_queue_zero():
    """A long job in the last queue, then five 0.1 h jobs arriving at 1 h (run back to back): without the knob it
    waits until they are done (1.5 h); with promote_knob 0.1 it has waited 0.1 x its 1 h of running by
    1.1 h, goes back to queue 0 first by arrival, and runs from the planning point at 1.1 h."""
    cfg = small_config()
    jobs = [job(0, 8, 0, 3)] + [job(i, 8, 1, 0.1) for i in range(1, 6)]
    plain, _ = run(workload(*jobs), cfg, "tiresias", cls=Timeline)
    knob, _ = run(workload(*jobs), cfg.replace(**{"scheduler.tiresias.promote_knob": 0.1}), "tiresias", cls=Timeline)
    resumed = lambda sim: [t for t, held in sim.timeline if held == (0,) and t > 0][0]  # noqa: E731
    assert resumed(plain) == pytest.approx(1.5 * 3600)
    assert resumed(knob) == pytest.approx(1.1 * 3600)


@pytest.mark.parametrize("params, message", [
    ({"thresholds": []}, "non-empty list"), ({"thresholds": [10, 5]}, "positive and increasing"),
    ({"thresholds": "3250"}, "non-empty list"), ({"promote_knob": 0}, "promote_knob must be > 0"),
    ({"thresholds": [1, float("nan")]}, "every threshold must be a finite number")])
def test_tiresias_refuses_bad_parameters(params, message):
    with pytest.raises(ValueError, match=message):
        SCHEDULERS.create("tiresias", **params)


def _mixed(**overrides):
    return small_config(**{"cluster.pools": {"fast": {"nodes": 1, "gpus_per_node": 4},
                                             "slow": {"nodes": 1, "gpus_per_node": 4}},
                           "cluster.speeds": {"fast": 1.0, "slow": 0.5}, **overrides})


def test_a_job_on_a_slower_pool_takes_longer_and_its_evals_too():
    cfg = _mixed(**{"workload.checkpoint_s": 60.0})
    wl = workload(job(0, 4, 0, 1), job(1, 4, 0, 1))
    sim, res = run(wl, cfg, "fifo")
    fast, slow = res.outcomes
    work = 3600 + 4 * 60  # training, then 4 evals of a 60 s checkpoint, on the reference GPU
    assert fast.departure_s == pytest.approx(work) and slow.departure_s == pytest.approx(2 * work)
    assert slow.gpu_seconds == pytest.approx(4 * 2 * work) and slow.ref_gpu_seconds == pytest.approx(4 * work)
    assert slow.overhead_gpu_seconds == pytest.approx(4 * 4 * 120)  # each eval took 120 s on 4 slow GPUs
    assert dict(res.pool_gpu_seconds) == pytest.approx({"fast": 4 * work, "slow": 8 * work})
    assert res.total_gpus == 8
    seen = sim.table.snapshot(1, 0.0)  # what a policy sees: the pool and its speed, and still no truth
    assert (seen.pool, seen.speed) == ("slow", 0.5) and set(VISIBLE_FIELDS) >= {"pool", "speed"}
    with pytest.raises(InformationBoundaryError):
        _ = seen.duration_s


def test_a_preempted_job_resumes_where_it_left_off_at_its_new_pools_speed():
    wl = workload(job(0, 4, 0, 10), job(1, 4, 0, 10), job(2, 4, 1, 1))
    _, res = run(wl, _mixed(), "srtf_est")
    first, second, short = res.outcomes
    assert first.departure_s == pytest.approx(10 * 3600)  # fast pool, never preempted
    assert short.first_start_s == 3600 and short.departure_s == pytest.approx(3 * 3600)  # took slow's GPUs at 0.5
    assert second.restarts == 1  # 0.5 h of work done by 1 h, the rest (9.5 h) at 0.5 from 3 h
    assert second.departure_s == pytest.approx(22 * 3600)


def test_a_mixed_cluster_runs_every_scheduler_and_overlay_and_accounts_each_pool():
    cfg = load_config(DEFAULT_CONFIG.parent / "sia_3type.yaml")
    wl = generate_workload(cfg, 3)
    for scheduler in sorted(SCHEDULERS):
        _, res = run(wl, cfg, scheduler, "evalstop", cls=CheckedPools)
        held = sum(o.gpu_seconds for o in res.outcomes)
        assert sum(s for _, s in res.pool_gpu_seconds) == pytest.approx(held, rel=1e-9)
        assert {name for name, s in res.pool_gpu_seconds if s > 0} == {"t4", "a100", "rtx"}
        assert all(o.completed or o.stopped for o in res.outcomes)


class CheckedPools(Simulation):
    """Checks each pool's GPU invariant after every planning step."""

    def _plan(self, allow_preempt):
        super()._plan(allow_preempt)
        pools = self.cluster
        for name, c in zip(pools.names, pools.pools, strict=True):
            in_use = sum(g for j, g in self.running.items() if self.table.pool[j] == name)
            assert 0 <= c.free == c.total_gpus - in_use and sum(c.node_free) == c.free
        assert pools.free == sum(c.free for c in pools.pools)


def test_gavel_time_shares_one_gpu_between_two_jobs_round_by_round():
    """Max-min fairness on one pool: X = 1/2 each; priorities X / f alternate the GPU every 360 s round."""
    cfg = small_config(**{"cluster.gpus_per_node": 1})
    wl = workload(job(0, 1, 0, 1), job(1, 1, 0, 1))
    _, res = run(wl, cfg, "gavel")
    first, second = res.outcomes
    # job 0 (tie: lower id) runs rounds 0, 2, ..., 18, job 1 rounds 1, 3, ..., 19: 10 rounds of 360 s each
    assert first.departure_s == pytest.approx(19 * 360) and second.departure_s == pytest.approx(20 * 360)
    assert first.restarts == 9 and second.restarts == 9
    assert first.gpu_seconds == pytest.approx(3600) and second.first_start_s == 360


def test_gavel_keeps_jobs_in_place_when_the_allocation_gives_each_its_own_pool():
    # two pools of one GPU; each job is fastest on a different pool: the LP gives each job its pool
    cfg = _mixed(**{"cluster.pools": {"fast": {"nodes": 1, "gpus_per_node": 1}, "slow": {"nodes": 1, "gpus_per_node": 1}},
                    "cluster.type_speeds": {"lora_sft": {"fast": 0.1, "slow": 1.0}}})
    wl = workload(job(0, 1, 0, 1), job(1, 1, 0, 1, rlhf=False))
    _, res = run(wl, cfg, "gavel")
    rlhf, sft = res.outcomes
    assert rlhf.restarts == sft.restarts == 0
    assert rlhf.departure_s == pytest.approx(3600) and sft.departure_s == pytest.approx(3600)  # both at speed 1
    assert dict(res.pool_gpu_seconds) == pytest.approx({"fast": 3600, "slow": 3600})
    _, fifo = run(wl, cfg, "fifo")  # fastest-first placement: the same here
    assert [o.departure_s for o in fifo.outcomes] == pytest.approx([3600, 3600])


def test_gavel_shares_the_fast_pool_with_the_job_that_needs_it_most():
    # lora_sft runs 10x slower on slow, rlhf_grpo only 10% slower: greedy fastest-first placement (FIFO)
    # leaves the lora job on slow for 10 h; Gavel's LP splits both pools between them (t = 1 at X = 1/2)
    cfg = _mixed(**{"cluster.pools": {"fast": {"nodes": 1, "gpus_per_node": 1}, "slow": {"nodes": 1, "gpus_per_node": 1}},
                    "cluster.type_speeds": {"lora_sft": {"fast": 1.0, "slow": 0.1}, "rlhf_grpo": {"fast": 1.0, "slow": 0.9}}})
    wl = workload(job(0, 1, 0, 1), job(1, 1, 0, 1, rlhf=False))
    _, fifo = run(wl, cfg, "fifo")
    assert [o.departure_s for o in fifo.outcomes] == pytest.approx([3600, 36000])
    _, gavel = run(wl, cfg, "gavel")
    rlhf, sft = gavel.outcomes
    assert sft.departure_s < 0.3 * 36000 and rlhf.departure_s > 3600  # the lora job gains far more than rlhf loses
    assert sum(o.jct_s for o in gavel.outcomes) < 0.5 * sum(o.jct_s for o in fifo.outcomes)


def test_rounds_no_longer_than_a_restart_are_refused_not_run_forever():
    cfg = small_config(**{"workload.restart_overhead_s": 600.0})
    wl = workload(job(0, 1, 0, 1), job(1, 1, 0, 1))
    with pytest.raises(ValueError, match=r"round_s \(360 s\) must be longer than workload.restart_overhead_s \(600 s\)"):
        run(wl, cfg, "gavel")


def test_the_collector_is_paused_for_the_run_and_its_result_then_restored():
    import gc

    cfg = small_config()
    wl = generate_workload(cfg, 0)
    seen = []

    class Spy(Simulation):
        def _result(self):
            seen.append(gc.isenabled())  # the result's records are built with the collector paused too
            return super()._result()

    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            Spy(wl, cfg, build_scheduler(cfg, "fifo"), build_overlay(cfg, wl, "evalstop")).run()
            assert gc.isenabled() is enabled  # restored as it was
        finally:
            gc.enable()
    assert seen == [False, False]

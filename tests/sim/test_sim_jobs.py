"""The simulated job's lifecycle (table-driven over every pair of phases), its accounting in the job
table, and the columnar work layout against the per-job one."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from evalstop_trl.core.lifecycle import IllegalTransition
from platform_sim.config import load_config
from platform_sim.jobs import JobTable, Phase, Timing, layout
from platform_sim.workload import generate_workload
from tests.sim_helpers import job, small_config, workload

# The contract, written out independently of platform_sim.jobs.PHASE_MOVES.
LEGAL = {
    (Phase.UPCOMING, Phase.PENDING),
    (Phase.PENDING, Phase.RUNNING),
    (Phase.RUNNING, Phase.PREEMPTED),
    (Phase.RUNNING, Phase.COMPLETED),
    (Phase.RUNNING, Phase.STOPPED),
    (Phase.PREEMPTED, Phase.RUNNING),
}


@pytest.mark.parametrize("old, new", list(itertools.product(Phase, Phase)), ids=lambda p: p.value)
def test_phase_transitions_match_the_table(old, new):
    legal = old is new or (old, new) in LEGAL  # staying put is always allowed (the Lifecycle pattern)
    assert old.can(new) is legal
    if legal:
        assert old.to(new) is new
    else:
        with pytest.raises(IllegalTransition, match=f"Phase is {old.value}: it cannot become {new.value}"):
            old.to(new)


def test_terminal_phases():
    assert {p for p in Phase if p.terminal} == {Phase.COMPLETED, Phase.STOPPED}


def _table():
    """A table of one 2-GPU job (job 0)."""
    return JobTable(workload(job(0, 2, 0, 4)), small_config())


def test_a_preempted_job_resumes_after_the_restart_overhead_and_is_accounted():
    t = _table()
    assert t.state(0).phase is Phase.UPCOMING and not t.running(0)
    t.arrive(0)
    t.start(0, 100.0, restart_s=600.0)
    s = t.state(0)
    assert s.phase is Phase.PENDING.to(Phase.RUNNING) and s.first_start == 100.0 and s.run_since == 100.0
    assert t.work_at(0, 400.0) == 300.0 and t.gpu_seconds_at(0, 400.0) == 600.0
    t.preempt(0, 400.0)
    s = t.state(0)
    assert s.phase is Phase.PREEMPTED and s.work == 300.0 and s.gpu_seconds == 600.0 and s.version == 1
    assert s.waiting_since == 400.0 and s.restarts == 1 and t.work_at(0, 1000.0) == 300.0
    t.start(0, 1000.0, restart_s=600.0)
    s = t.state(0)
    assert s.first_start == 100.0 and s.run_since == 1600.0  # no progress while restarting
    assert t.work_at(0, 1300.0) == 300.0 and t.work_at(0, 1700.0) == 400.0
    t.depart(0, 1700.0, stopped=True)
    s = t.state(0)
    assert s.phase is Phase.STOPPED and s.departure == 1700.0
    assert s.gpu_seconds == 2 * (300 + 700) and s.ovh_seconds == 2 * 600  # the restart is overhead


@pytest.mark.parametrize("moves, illegal", [
    (["start"], "Phase is upcoming: it cannot become running"),
    (["arrive", "depart"], "Phase is pending: it cannot become completed"),
    (["arrive", "preempt"], "Phase is pending: it cannot become preempted"),
    (["arrive", "start", "depart", "start"], "Phase is completed: it cannot become running"),
    (["arrive", "start", "preempt", "depart"], "Phase is preempted: it cannot become completed"),
])
def test_illegal_moves_raise(moves, illegal):
    t = _table()
    calls = {"arrive": lambda: t.arrive(0), "start": lambda: t.start(0, 0.0, 0.0), "preempt": lambda: t.preempt(0, 0.0),
             "depart": lambda: t.depart(0, 0.0, stopped=False)}
    with pytest.raises(IllegalTransition, match=illegal):
        for m in moves:
            calls[m]()


def test_a_new_job_has_not_started():
    s = _table().state(0)
    assert math.isnan(s.first_start) and math.isnan(s.departure) and s.best_eval == 0 and s.best_score == -math.inf
    assert s.evals_done == 0 and s.end_work == _table().total_work[0] and (s.pool, s.speed) == ("", 1.0)


@pytest.mark.parametrize("config", ["rlhf_heavy.yaml", "trace_philly.yaml"])
def test_the_columnar_layout_is_each_jobs_timing_bit_for_bit(config):
    """The engine's layout (numpy, every job at once) equals the per-job :class:`Timing` (the metrics'),
    a trace's whole runs included, and so do the work and progress it derives from it."""
    from platform_sim.config import DEFAULT_CONFIG

    cfg = load_config(DEFAULT_CONFIG.parent / config).replace(**{"workload.n_jobs": 150})
    wl = generate_workload(cfg, 4)
    columns = layout(wl.duration_s, wl.whole_run, cfg, wl.n_evals)
    table = JobTable(wl, cfg)
    for j, truth in enumerate(wl.truths):
        timing = Timing.of_truth(truth, cfg, wl.n_evals)
        assert (timing.duration_s, timing.seg_train, timing.seg_eval, timing.seg_len, timing.total_work) == tuple(
            float(c[j]) for c in columns)
        for p in (0.0, 0.137, 0.5, truth.peak_progress, 1.0):
            assert table.work_at_progress(j, p) == timing.work_at(p)
            assert table.progress_of(j, timing.work_at(p)) == timing.progress_of(timing.work_at(p))
    assert np.any(wl.whole_run) == (config == "trace_philly.yaml")

"""The simulated job's lifecycle (table-driven over every pair of phases) and its accounting."""

from __future__ import annotations

import itertools
import math

import pytest

from evalstop_trl.core.lifecycle import IllegalTransition
from platform_sim.jobs import Phase, SimJob, Timing
from tests.sim_helpers import job, small_config

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


def _job(restart_s=0.0):
    cfg = small_config(**{"workload.restart_overhead_s": restart_s})
    spec, truth = job(0, 2, 0, 4)
    return SimJob(spec, truth, Timing.of(truth.duration_s, cfg, 4))


def test_a_preempted_job_resumes_after_the_restart_overhead_and_is_accounted():
    j = _job()
    assert j.phase is Phase.UPCOMING and not j.running
    j.arrive()
    j.start(100.0, restart_s=600.0)
    assert j.phase is Phase.PENDING.to(Phase.RUNNING) and j.first_start == 100.0 and j.run_since == 100.0
    assert j.work_at(400.0) == 300.0 and j.gpu_seconds_at(400.0) == 600.0
    j.preempt(400.0)
    assert j.phase is Phase.PREEMPTED and j.work == 300.0 and j.gpu_seconds == 600.0 and j.version == 1
    assert j.waiting_since == 400.0 and j.restarts == 1 and j.work_at(1000.0) == 300.0
    j.start(1000.0, restart_s=600.0)
    assert j.first_start == 100.0 and j.run_since == 1600.0  # no progress while restarting
    assert j.work_at(1300.0) == 300.0 and j.work_at(1700.0) == 400.0
    j.depart(1700.0, stopped=True)
    assert j.stopped and not j.completed and j.departure == 1700.0
    assert j.gpu_seconds == 2 * (300 + 700) and j.ovh_seconds == 2 * 600  # the restart is overhead


@pytest.mark.parametrize("moves, illegal", [
    (["start"], "Phase is upcoming: it cannot become running"),
    (["arrive", "depart"], "Phase is pending: it cannot become completed"),
    (["arrive", "preempt"], "Phase is pending: it cannot become preempted"),
    (["arrive", "start", "depart", "start"], "Phase is completed: it cannot become running"),
    (["arrive", "start", "preempt", "depart"], "Phase is preempted: it cannot become completed"),
])
def test_illegal_moves_raise(moves, illegal):
    j = _job()
    calls = {"arrive": j.arrive, "start": lambda: j.start(0.0, 0.0), "preempt": lambda: j.preempt(0.0),
             "depart": lambda: j.depart(0.0, stopped=False)}
    with pytest.raises(IllegalTransition, match=illegal):
        for m in moves:
            calls[m]()


def test_a_new_job_has_not_started():
    j = _job()
    assert math.isnan(j.first_start) and math.isnan(j.departure) and j.best_eval == 0

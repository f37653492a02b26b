"""The pure job core: step(state, command) never changes its input, returns effects as data, and
replay() rebuilds from the stored reports the state the steps built."""

from __future__ import annotations

import random

import pytest

from evalstop_trl.core.detectors import DETECTORS
from evalstop_trl.core.errors import Conflict, QuotaExceeded
from evalstop_trl.core.job import Ack, Event, Fail, Finish, JobState, Observe, Stop, replay, step
from evalstop_trl.core.records import AuditKind, JobRecord, JobStatus, Policy, Registration, Report


def _state(policy=None, webhook=None, max_reports=10**9) -> JobState:
    reg = Registration.parse("run-1", "grpo", 100, policy, webhook)
    return JobState.new(JobRecord.new("acme", reg, 0.0), max_reports)._replace(version=1)


def _feed(state: JobState, scores, start=10) -> tuple[JobState, list]:
    outs = []
    for i, s in enumerate(scores):
        out = step(state, Observe(Report(start + 10 * i, eval_score=s, received_at=float(i))))
        outs.append(out)
        state = out.state
    return state, outs


def test_a_step_never_changes_its_input_state():
    state, _ = _feed(_state(), [0.2, 0.5])
    before = (state.detector.best_step, state.detector.best_score, state.n_reports, state.last)
    for command in (Observe(Report(30, eval_score=0.4)), Stop("why", "tenant:acme", 1.0), Finish(1.0),
                    Fail("x", "job:run-1", 1.0), Event(AuditKind.LAUNCHER_EXIT, "exit", {}, "launcher", 1.0)):
        step(state, command)
        assert (state.detector.best_step, state.detector.best_score, state.n_reports, state.last) == before
        assert state.record.status is JobStatus.RUNNING


@pytest.mark.parametrize(("scores", "stop_at", "statuses"), [
    ([0.2, 0.5, 0.4, 0.1], 3, ["running", "running", "running", "stopped"]),  # a fall beyond the run's noise
    ([0.2, 0.5, 0.6, 0.7], None, ["running"] * 4),
    ([0.2, None, 0.1, None, 0.05], 4, ["running", "running", "running", "running", "stopped"]),
])
def test_reports_move_the_job_and_write_one_row_each(scores, stop_at, statuses):
    state, outs = _feed(_state(), scores)
    assert [o.state.record.status.value for o in outs] == statuses
    for i, out in enumerate(outs):
        c = out.commit
        assert c.report.step == 10 + 10 * i and c.expect == out.state.version - 1
        assert out.stopped == (i == stop_at)
        # the record is written only when it changes: the first report (running) and the stop
        assert (c.job is not None) == (i == 0 or i == stop_at)
        if i == stop_at:
            assert [a.kind for a in c.audit] == [AuditKind.STOP]


def test_stop_with_a_webhook_queues_one_delivery():
    state, outs = _feed(_state(webhook="https://hooks.example.com/x"), [0.5, 0.4, 0.3])
    assert [len(o.commit.deliveries) for o in outs] == [0, 0, 1]
    assert step(state, Stop("again", "tenant:acme", 9.0)).commit is None  # already stopped: nothing to write


@pytest.mark.parametrize(("command", "error"), [
    (Observe(Report(5, eval_score=0.1)), "step order"),  # before the last step, no stored report given
    (Observe(Report(20, eval_score=0.9)), "already has a different report"),
    (Ack(None, None, 1.0), "no stop to acknowledge"),
])
def test_refused_commands_raise_and_change_nothing(command, error):
    state, _ = _feed(_state(), [0.2, 0.5])
    with pytest.raises(Conflict, match=error):
        step(state, command)


def test_an_identical_retry_writes_nothing_and_a_late_one_compares_with_the_stored_report():
    state, _ = _feed(_state(), [0.2, 0.5, 0.6])
    assert step(state, Observe(Report(30, eval_score=0.6, received_at=99.0))).commit is None
    stored = Report(10, eval_score=0.2)
    assert step(state, Observe(Report(10, eval_score=0.2), stored=stored)).commit is None
    with pytest.raises(Conflict):
        step(state, Observe(Report(10, eval_score=0.3), stored=stored))


def test_the_report_quota_is_checked_before_deciding():
    state, _ = _feed(_state(max_reports=2), [0.2, 0.5])
    with pytest.raises(QuotaExceeded, match="max_reports_per_job=2"):
        step(state, Observe(Report(40, eval_score=0.1)))


def test_terminal_jobs_record_reports_without_changing():
    state, _ = _feed(_state(), [0.2])
    state = step(state, Finish(1.0)).state
    out = step(state, Observe(Report(50, eval_score=0.0)))
    assert out.commit.job is None and out.commit.report.step == 50
    assert out.state.record.status is JobStatus.FINISHED and out.state.n_reports == 2


def test_unknown_commands_are_a_type_error():
    with pytest.raises(TypeError, match="step\\(\\) takes one of"):
        step(_state(), "report")


@pytest.mark.parametrize("name", sorted(DETECTORS.names()))
def test_replay_rebuilds_what_the_steps_built(name):
    rng = random.Random(name)
    state = _state(Policy.from_dict({"detector": name}))
    reports = []
    for i in range(40):
        score = None if rng.random() < 0.1 else rng.gauss(0.5, 0.2)
        rep = Report(10 * (i + 1), eval_score=score, train_loss=rng.random(), checkpoint=f"ckpt-{i}")
        state = step(state, Observe(rep)).state
        reports.append(rep)
    rebuilt = replay(state.record, reports)
    assert rebuilt.view() == state.view()
    assert rebuilt.current() == state.current()

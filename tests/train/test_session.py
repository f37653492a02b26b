"""EvalStopSession without a trainer: an embedded client over an in-memory Coordinator (no torch)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalstop_trl.clients.embedded import EmbeddedClient
from evalstop_trl.core.coordinator import Coordinator
from evalstop_trl.core.detectors import Action, Decision
from evalstop_trl.core.errors import EvalStopError, Unauthorized
from evalstop_trl.core.requests import ReasonRequest
from evalstop_trl.train.external import DecisionWatcher, prune_snapshots
from evalstop_trl.train.ranks import RankMessage, share
from evalstop_trl.train.session import EvalFailures, EvalStopSession, SessionConfig, infer_direction

ROOT = Path(__file__).resolve().parents[2]
HACKED = [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.4), (50, 0.35)]  # k=2 declines at 40, 0.3 in all: beyond the noise


def _session(coord: Coordinator | None = None, job_id: str = "j", step: int = 0, **config) -> EvalStopSession:
    session = EvalStopSession(SessionConfig.build(**config))
    session.attach(EmbeddedClient(coord or Coordinator()), job_id, step=step)
    return session


def _run(session: EvalStopSession, history) -> int | None:
    """Report ``history`` until a stop; the step it stopped at."""
    for step, score in history:
        if session.report(step, score):
            session.stop_here(step)
            return step
    return None


class Refusing:
    """A client whose coordinator answers every call with an error (a broken or misconfigured service)."""

    unreachable = False

    def __init__(self, inner: EmbeddedClient) -> None:
        self.inner = inner

    def register_job(self, *args, **kwargs):
        return self.inner.register_job(*args, **kwargs)

    def status(self, job_id):
        return self.inner.status(job_id)

    def reports(self, job_id, after_step=None, limit=None):
        return self.inner.reports(job_id)

    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            raise EvalStopError(f"{name}: 500 internal error")

        return refuse


class Unreachable(Refusing):
    """The HTTP client while the service is down: fail-open CONTINUE answers, ``unreachable`` set."""

    unreachable = True

    def report(self, job_id, step, eval_score=None, train_loss=None, proxy_reward=None, checkpoint=None):
        return Decision(Action.CONTINUE, "coordinator unreachable: report kept in the outbox (fail-open)")


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kwargs, params, direction",
    [
        ({}, {"k": 2, "min_delta": 0.0}, "max"),
        ({"k": 3, "direction": "min"}, {"k": 3, "min_delta": 0.0, "direction": "min"}, "min"),
        ({"detector": "stop_at", "fraction": 0.5, "k": 4}, {"fraction": 0.5}, "max"),  # stop_at takes no k
        ({"detector": "never", "direction": "min"}, {"direction": "min"}, "min"),
    ],
)
def test_config_passes_the_conveniences_to_detectors_that_take_them(kwargs, params, direction):
    config = SessionConfig.build(**kwargs)
    assert dict(config.params) == params and config.direction == direction
    assert config.policy == {"detector": config.detector, **params}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"detector": "nope"}, "valid detectors are"),
        ({"k": 0}, r"k must be an integer in \[1, 1000\]"),
        ({"bogus": 1}, "bogus"),
        ({"on_eval_error": "ignore"}, "on_eval_error must be one of skip, stop, raise, but got 'ignore'"),
        ({"fail_mode": "closed"}, "fail_mode must be one of local, open, but got 'closed'"),
        ({"max_eval_failures": 0}, "max_eval_failures must be an integer >= 1, got 0"),
        ({"max_eval_failures": True}, "max_eval_failures must be an integer >= 1, got True"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SessionConfig.build(**kwargs)


def test_infer_direction():
    assert [infer_direction(m) for m in ("eval_loss", "perplexity", "eval_wer", "eval_reward", "accuracy")] == \
        ["min", "min", "min", "max", "max"]


# ---------------------------------------------------------------------------------------------- deciding
def test_a_decline_stops_and_the_best_is_kept():
    coord = Coordinator()
    session = _session(coord, "hacked")
    assert session.attempt == 1
    assert _run(session, HACKED) == 40
    assert session.decision.stop and "consecutive declines" in session.decision.reason
    assert (session.best_step, session.best_score, session.stopped_at) == (20, 0.7, 40)
    assert [h["step"] for h in session.history] == [10, 20, 30, 40]
    job = coord.status("local", "hacked")
    assert job.status == "stopped" and job.acked and job.best_step == 20


def test_the_report_carries_the_latest_loss_and_reward_and_the_checkpoint_of_a_new_best():
    coord = Coordinator()
    session = _session(coord)
    session.observe_logs({"loss": 1.5, "reward": 0.25, "learning_rate": 1e-3})
    session.observe_logs({"objective/scores": float("nan")})  # not a number: the last reward stands
    assert session.improves(0.5)
    session.report(10, 0.5, checkpoint="/ckpt/10")
    assert session.history == [{"step": 10, "eval_score": 0.5, "train_loss": 1.5, "proxy_reward": 0.25,
                                "checkpoint": "/ckpt/10"}]
    assert session.best_checkpoint == "/ckpt/10" and not session.improves(0.4) and session.improves(0.6)
    (report,) = coord.reports("local", "j")
    assert (report.train_loss, report.proxy_reward, report.checkpoint) == (1.5, 0.25, "/ckpt/10")


def test_the_report_carries_the_trainers_kl_and_a_gated_policy_reads_it():
    """TRL logs the policy's KL (``objective/kl``, GRPO's ``kl``): the session reports the latest with
    each eval, and a ``gate: kl_past_peak`` policy holds a fall before the KL clock's forecast peak."""
    coord = Coordinator()
    session = _session(coord, k=1, gate="kl_past_peak", noise="none")  # the bare rule stops at every fall
    assert coord.status("local", "j").policy["gate"] == "kl_past_peak"
    session.observe_logs({"loss": 1.0, "kl": float("nan")})  # not a number: ignored
    assert session.kl is None
    evals = [(0.5, 0.93), (1.0, 1.1), (2.0, 1.05), (3.0, 1.356), (5.0, 1.436), (8.0, 1.458), (12.0, 1.412)]
    stops = []
    for i, (kl, score) in enumerate(evals, start=1):
        session.observe_logs({"objective/kl" if i % 2 else "kl": kl})
        stops.append(session.report(10 * i, score))
    assert [r.kl for r in coord.reports("local", "j")] == [kl for kl, _ in evals]
    assert stops == [False] * 6 + [True], [h for h in session.history]
    assert "past the forecast peak" in session.decision.reason and session.decision.evidence["kl"] == 12.0


def test_the_report_carries_the_trainers_completion_length_and_a_stop_says_its_change():
    """TRL's GRPO logs ``completions/mean_length`` with each training step (older TRL
    ``completion_length``): the session sends the latest with each eval, exactly as the KL; a stop says
    how it changed since the best eval. A log without one sends none (the report as before)."""
    coord = Coordinator()
    session = _session(coord, k=2, noise="none")
    session.observe_logs({"loss": 0.1, "reward": 0.2, "completions/mean_length": float("nan"),
                          "completion_length": -3.0})  # neither a length: ignored
    assert session.length is None
    session.report(10, 0.5)
    logs = [{"loss": 0.1, "reward": 0.2, "kl": 0.01, "completions/mean_length": 150.0, "completions/max_length": 512},
            {"loss": 0.1, "completions/mean_length": 200.0},
            {"loss": 0.1, "completion_length": 240.0},  # older TRL's key
            {"loss": 0.1, "completions/mean_length": 255.0}, {"loss": 0.1, "completions/mean_length": 270.0}]
    stops = []
    for step, (log_, score) in zip((20, 30, 40), ((logs[:2], 0.7), (logs[2:3], 0.6), (logs[3:], 0.5)), strict=True):
        for entry in log_:
            session.observe_logs(entry)
        stops.append(session.report(step, score))
    assert [r.length for r in coord.reports("local", "j")] == [None, 200.0, 240.0, 270.0]  # the latest logged
    assert stops == [False, False, True]
    assert session.decision.reason.endswith("; length +35% since the best eval")
    assert session.decision.evidence["length_since_best"] == pytest.approx(0.35)
    plain = _session(coord, "p", k=2, noise="none")
    assert [plain.report(10 * i, s) for i, s in enumerate((0.5, 0.7, 0.6, 0.5), start=1)] == [False] * 3 + [True]
    assert all("length" not in h for h in plain.history) and coord.reports("local", "p")[-1].length is None
    assert "length" not in plain.decision.reason


def test_lower_is_better_with_direction_min():
    session = _session(direction="min")
    assert _run(session, [(10, 2.0), (20, 1.0), (30, 1.5), (40, 2.5)]) == 40  # rises of 1.5 in all: beyond the noise
    assert (session.best_step, session.best_score) == (20, 1.0)
    # issue 20.8: a minimised metric that goes up "rose"; the evidence keys stay the same
    assert session.decision.reason.startswith("2 consecutive rises: 1 → 1.5 → 2.5 at step 40: ")
    assert session.decision.reason.endswith(" 3.3 in all (needed 2; noise 0.3253, the run's eval-to-eval)")
    assert session.decision.evidence["declines"] == 2 and session.history[-1]["eval_score"] == 2.5
    half = _session(direction="min", job_id="half")
    _run(half, [(10, 1.0), (20, 1.5)])
    assert half.decision.reason == "1 consecutive rise(s) of 2"


def test_eval_metrics_for_the_trainers_logs():
    session = _session()
    session.report(10, 0.5)
    session.report(20, 0.4)
    assert session.eval_metrics(0.4, False) == {"evalstop/score": 0.4, "evalstop/best_score": 0.5,
                                                "evalstop/declines": 1, "evalstop/stop": 0,
                                                "evalstop/eval_failures": 0}
    session.evals.accept(30, float("nan"))  # issue 20.8: a failed eval is counted where the trainer logs
    assert session.eval_metrics(None, True) == {"evalstop/best_score": 0.5, "evalstop/declines": 1,
                                                "evalstop/stop": 1, "evalstop/eval_failures": 1}


def test_a_per_example_evals_evidence_is_logged_under_the_names_the_readers_look_for():
    """evalstop calibrate / replay read evalstop/eval_n and evalstop/eval_noise back from the trainer's
    logs (one home for the names: core.examples.evidence_keys)."""
    from evalstop_trl.core.examples import evidence_keys

    session = _session()
    session.report(10, 0.5, eval_n=250)
    n_key, noise_key = evidence_keys("evalstop/score")
    logged = session.eval_metrics(0.5, False, 250, 0.012)
    assert (logged[n_key], logged[noise_key]) == (250, 0.012) and n_key == "evalstop/eval_n"
    assert noise_key not in session.eval_metrics(0.5, False, 250, None)  # the first eval has no pair
    assert n_key not in session.eval_metrics(None, False, 250, 0.01)  # a failed eval logs no evidence


def test_finish_marks_the_job_finished_unless_it_was_stopped():
    coord = Coordinator()
    session = _session(coord, "ok")
    session.report(10, 0.5)
    session.finish()
    assert coord.status("local", "ok").status == "finished" and session.ended
    stopped = _session(coord, "stopped")
    _run(stopped, HACKED)
    stopped.finish()
    assert coord.status("local", "stopped").status == "stopped"


def test_a_process_exiting_unfinished_marks_its_job_failed():
    coord = Coordinator()
    session = _session(coord, "crashed")
    session.report(10, 0.5)
    session.fail_unfinished("exited before the end of training")
    assert coord.status("local", "crashed").status == "failed"
    done = _session(coord, "done")
    done.finish()
    done.fail_unfinished("too late")
    assert coord.status("local", "done").status == "finished"


# ---------------------------------------------------------------------------------------------- one job, many processes
def test_a_run_starting_at_step_0_on_a_job_with_reports_is_a_new_run(caplog):
    coord = Coordinator()
    _run(_session(coord, "run"), HACKED[:2])
    with caplog.at_level(logging.WARNING, "evalstop.callback"):
        again = _session(coord, "run")
    assert again.job_id == "run-2" and again.attempt == 1 and "is a new run" in caplog.text
    assert sorted(v.job_id for v in coord.list_jobs("local")) == ["run", "run-2"]


def test_a_resumed_process_keeps_the_stored_decline_count():
    coord = Coordinator()
    first = _session(coord, "resumed")
    assert _run(first, HACKED[:3]) is None  # one decline so far; the process dies here
    second = _session(coord, "resumed", step=30)
    assert second.attempt == 2 and (second.best_step, second.best_score) == (20, 0.7)
    assert _run(second, HACKED[3:]) == 40  # the second decline, counted across the restart


def test_a_resumed_process_reevaluating_a_stored_step_keeps_the_stored_report(caplog):
    coord = Coordinator()
    _run(_session(coord, "r"), HACKED[:2])
    again = _session(coord, "r", step=20)
    with caplog.at_level(logging.WARNING, "evalstop.callback"):
        assert again.report(20, 0.65) is False  # the stored 0.7 stands
    assert "keeping the stored report for step 20" in caplog.text
    assert [r.eval_score for r in coord.reports("local", "r")] == [0.5, 0.7]


def test_a_restored_history_is_reported_again_to_a_coordinator_that_lacks_it():
    session = EvalStopSession(SessionConfig.build())
    session.history = [{"step": 10, "eval_score": 0.5, "train_loss": None, "proxy_reward": None}]
    coord = Coordinator()
    session.attach(EmbeddedClient(coord), "lost", step=10)
    assert [r.step for r in coord.reports("local", "lost")] == [10]


def test_another_registration_under_the_same_id_is_a_clear_error():
    coord = Coordinator()
    first = _session(coord, "x", k=2, job_type="grpo")
    first.report(10, 0.5)  # decided with k=2: another policy cannot take over the job now
    with pytest.raises(ValueError, match="job 'x' is another job .*reports decided under policy"):
        _session(coord, "x", step=10, k=3, job_type="grpo")
    with pytest.raises(ValueError, match="job 'x' is another job .*grpo job, not dpo"):
        _session(coord, "x", step=10, job_type="dpo", k=2)


def test_the_callback_adopts_the_launchers_job_and_fills_in_its_plan():
    """Issue 20.1: ``evalstop run`` registers the job first, without planned steps or a type."""
    coord = Coordinator()
    client = EmbeddedClient(coord)
    client.register_job("launched")  # what the launcher does before starting the command
    session = EvalStopSession(SessionConfig.build(k=3))
    session.attach(client, "launched", planned_steps=100, job_type="grpo")
    job = client.status("launched")
    assert session.job_id == "launched" and session.attempt == 1  # adopted: no "-2", no 409
    assert (job.job_type, job.planned_steps, job.policy["k"]) == ("grpo", 100, 3)
    assert [a.kind.value for a in client.audit("launched")] == ["amended"]


def test_a_resume_with_a_changed_max_steps_extends_the_plan():
    """Issue 20.5: a resumed run with another max_steps is an extended plan, audited, never a crash."""
    coord = Coordinator()
    first = _session(coord, "grow", job_type="grpo")
    first.attach(first.client, "grow", planned_steps=100)
    _run(first, HACKED[:2])
    resumed = EvalStopSession(SessionConfig.build(job_type="grpo"))
    resumed.attach(EmbeddedClient(coord), "grow", step=20, planned_steps=300)
    assert resumed.job_id == "grow" and resumed.attempt == 2 and resumed.best_step == 20
    assert coord.status("local", "grow").planned_steps == 300
    amended = [a for a in coord.audit("local", "grow") if a.kind.value == "amended"]
    assert amended and "planned_steps 100 -> 300" in amended[-1].reason


def test_a_rerun_with_a_changed_max_steps_is_a_new_run_and_leaves_the_old_job_alone():
    coord = Coordinator()
    old = _session(coord, "again", job_type="grpo")
    old.attach(old.client, "again", planned_steps=100)
    _run(old, HACKED[:2])
    rerun = EvalStopSession(SessionConfig.build(job_type="grpo", k=3))  # another max_steps and policy
    rerun.attach(EmbeddedClient(coord), "again", step=0, planned_steps=300)
    assert rerun.job_id == "again-2" and rerun.attempt == 1
    assert coord.status("local", "again").planned_steps == 100  # only read, never amended
    assert coord.status("local", "again-2").planned_steps == 300
    assert not [a for a in coord.audit("local", "again") if a.kind.value == "amended"][1:]


def test_a_job_type_inferred_from_the_trainer_yields_to_the_jobs_own():
    """Issue 20.10: the type a trainer's class says fills in a generic job; a given one must agree."""
    coord = Coordinator()
    client = EmbeddedClient(coord)
    client.register_job("typed", "dpo")
    session = EvalStopSession(SessionConfig.build())  # job_type None: inferred
    session.attach(client, "typed", job_type="grpo")
    assert client.status("typed").job_type == "dpo"
    session.attach(client, "fresh", job_type="online_dpo")
    assert client.status("fresh").job_type == "online_dpo"
    with pytest.raises(ValueError, match="dpo job, not grpo"):
        EvalStopSession(SessionConfig.build(job_type="grpo")).attach(client, "typed", step=10)


def test_attach_needs_a_job_id():
    with pytest.raises(ValueError, match="needs a job_id"):
        EvalStopSession(SessionConfig()).attach(EmbeddedClient(Coordinator()))


# ---------------------------------------------------------------------------------------------- liveness
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("heartbeat_s, lost", [(75.0, False), (None, True)])
def test_heartbeats_keep_a_job_with_long_gaps_between_evals_alive(heartbeat_s, lost):
    """Issue 20 liveness: an eval every 20 minutes, a lease of 5: the steps in between send heartbeats,
    at most one per heartbeat_s however many steps there are."""
    clock = Clock()
    coord = Coordinator(clock=clock, lease_s=300)
    session = EvalStopSession(SessionConfig.build(), heartbeat_s=heartbeat_s, clock=clock)
    session.attach(EmbeddedClient(coord), "slow")
    session.report(10, 0.5)
    statuses = set()
    for _ in range(20 * 60):  # a step a second
        clock.now += 1
        session.beat()
        coord.sweep()
        statuses.add(coord.status("local", "slow").status)
    assert ("lost" in statuses) is lost
    if not lost:
        assert statuses == {"running"} and session.heartbeat.sent == 16  # every 75 s of 1200
        assert session.report(20, 0.6) is False
    session.report(30, 0.7)  # a report brings a lost job back
    assert coord.status("local", "slow").status == "running"
    session.finish()
    sent = session.heartbeat.sent
    clock.now += 1000
    session.beat()
    assert session.heartbeat.sent == sent  # nothing after the end


def test_a_heartbeat_that_fails_is_logged_once_and_never_raised(caplog):
    clock = Clock()
    session = EvalStopSession(SessionConfig.build(), heartbeat_s=10, clock=clock)
    session.attach(Refusing(EmbeddedClient(Coordinator())), "quiet")
    with caplog.at_level(logging.WARNING, "evalstop.callback"):
        for _ in range(5):
            clock.now += 11
            session.beat()
    assert sum("could not send a heartbeat" in r.message for r in caplog.records) == 1
    down = EvalStopSession(SessionConfig.build(), heartbeat_s=10, clock=clock)
    down.attach(Unreachable(EmbeddedClient(Coordinator())), "down")
    clock.now += 11
    down.beat()  # in an outage: nothing sent, nothing waited for
    assert down.heartbeat.sent == 0
    with pytest.raises(ValueError, match="heartbeat_s must be None or a number of seconds >= 0"):
        EvalStopSession(SessionConfig(), heartbeat_s=-1)


# ---------------------------------------------------------------------------------------------- fail-open
@pytest.mark.parametrize("client_cls", [Refusing, Unreachable])
@pytest.mark.parametrize("fail_mode, stops_at", [("local", 40), ("open", None)])
def test_a_coordinator_that_errors_or_is_away_never_crashes_training(client_cls, fail_mode, stops_at, caplog):
    session = EvalStopSession(SessionConfig.build(fail_mode=fail_mode))
    session.attach(client_cls(EmbeddedClient(Coordinator())), "down")
    with caplog.at_level(logging.WARNING, "evalstop.callback"):
        assert _run(session, HACKED) == stops_at  # the local detector, same policy, or never
        session.publish_snapshot(50, "/snap/50")
        session.finish()
        session.fail_unfinished("bye")
    assert session.best_step == 20 and len(session.history) == (4 if stops_at else 5)
    if client_cls is Refusing:
        assert "refused the report" in caplog.text


def test_a_registration_the_coordinator_refuses_raises_at_the_start():
    class WrongToken(Refusing):
        def register_job(self, *args, **kwargs):
            raise Unauthorized("unknown token")

    with pytest.raises(Unauthorized):
        EvalStopSession(SessionConfig()).attach(WrongToken(EmbeddedClient(Coordinator())), "j")


# ---------------------------------------------------------------------------------------------- failed evals
@pytest.mark.parametrize(
    "on_error, values, exhausted",
    [
        ("skip", [None, None, None], False),
        ("stop", [None, float("nan"), "oops"], True),
        ("stop", [None, 0.5, None, None], False),  # a good eval resets the count
    ],
)
def test_eval_failures(on_error, values, exhausted):
    evals = EvalFailures(limit=3, on_error=on_error)
    for step, value in enumerate(values):
        evals.accept(step, value)
    assert evals.exhausted is exhausted


def test_eval_failures_raise_and_each_is_logged(caplog):
    evals = EvalFailures(limit=3, on_error="raise")
    with caplog.at_level(logging.WARNING, "evalstop.callback"):
        evals.failed(1, "TimeoutError: the judge timed out", TimeoutError("the judge timed out"))
        evals.accept(2, float("nan"))  # issue 20.8: the NaN after an exception is logged too
        with pytest.raises(RuntimeError, match="3 evals in a row failed.*judge timed out"):
            evals.failed(3, "TimeoutError: the judge timed out")
    lines = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(lines) == 3 and "score is nan" in lines[1].getMessage()
    assert [r.exc_info is not None for r in lines] == [True, False, False]  # the traceback once per run
    assert evals.total == 3


def test_scores_from_numpy_and_torch_like_scalars():
    class Scalar:
        def item(self):
            return 0.25

    assert EvalFailures().accept(1, Scalar()) == 0.25 and isinstance(EvalFailures().accept(1, 1), float)


def test_failed_evals_with_on_eval_error_stop_stop_the_job():
    coord = Coordinator()
    session = _session(coord, "judge-down", max_eval_failures=2, on_eval_error="stop")
    session.report(10, 0.5)
    assert session.report(20, session.evals.accept(20, None)) is False
    assert session.report(30, session.evals.accept(30, None)) is True
    session.stop_here(30)
    assert "2 evals in a row failed" in session.decision.reason and session.best_step == 10
    job = coord.status("local", "judge-down")
    assert job.status == "stopped" and "2 evals in a row failed" in job.decision.reason


# ---------------------------------------------------------------------------------------------- between ranks
def test_rank_message_wire_round_trip_and_one_process_share():
    session = _session()
    for step, score in HACKED[:4]:
        stop = session.report(step, score)
    message = session.message(stop)
    wire = message.to_wire()
    assert wire["decision"]["action"] == "stop" and wire["best_step"] == 20 and wire["job_id"] == "j"
    assert RankMessage.from_wire(wire) == message == share(message)
    assert share(None) is None
    other_rank = EvalStopSession(SessionConfig.build())  # no client: it only applies rank 0's message
    other_rank.adopt(message)
    assert (other_rank.decision, other_rank.best_step, other_rank.best_score, other_rank.job_id) == \
        (session.decision, 20, 0.7, "j")
    other_rank.stop_here(40)  # no client: remembers the step, acknowledges nothing
    assert other_rank.stopped_at == 40


# ---------------------------------------------------------------------------------------------- external evals
def test_external_evals_a_watcher_sees_the_stop_and_the_stop_lag_is_recorded(tmp_path):
    coord = Coordinator()
    session = _session(coord, "ext")
    for step in (10, 20, 30, 40):
        (tmp_path / f"checkpoint-{step}").mkdir()
        session.publish_snapshot(step, str(tmp_path / f"checkpoint-{step}"))
    watcher = DecisionWatcher(session.client, "ext", poll_s=0.2)
    try:
        for step, score in HACKED[:4]:
            session.client.post_eval("ext", step, score)
        deadline = time.monotonic() + 10
        while watcher.stopped is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watcher.close()
    assert watcher.stopped is not None and watcher.stopped.best_step == 20
    session.adopt(RankMessage.from_view(watcher.stopped, stop=True))
    session.stop_after_external_eval(47, decided_at=40)
    assert session.stop_lag == 7 and session.best_step == 20
    acks = [e for e in coord.audit("local", "ext") if e.kind.value == "ack"]
    assert acks and acks[0].evidence["stop_lag"] == 7
    steps = [10, 20, 30, 40]
    prune_snapshots(session.client, "ext", tmp_path, steps, final=True)
    assert steps == [20] and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-20"]


def test_the_session_module_loads_no_training_stack():
    code = ("import sys, evalstop_trl.train.session, evalstop_trl.train.ranks, evalstop_trl.train.external;"
            "print(','.join(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_the_eval_line_names_the_noise_threshold_and_every_line_spells_a_missing_value_none(caplog):
    coord = Coordinator()
    session = _session(coord, "noisy")
    with caplog.at_level(logging.INFO, "evalstop.callback"):
        for step, score in ((10, 0.7), (20, 0.68)):
            session.report(step, score, eval_n=32, eval_noise=0.05)
            session.log_eval(step, score)
        session.report(30, None)
        session.log_eval(30, None)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("EvalStop step")]
    assert lines[1] == ("EvalStop step 20: score 0.68, best 0.7 (step 10), declines 1, 1 consecutive decline(s) "
                        "of 2 (the declines must add up to more than 0.1414 = noise_z 2 × √2 × noise 0.05, paired "
                        "per-example)")
    assert lines[2].startswith("EvalStop step 30: score failed, best 0.7 (step 10), declines 1, ")

    early = _session(coord, "early")  # stopped by hand before any eval: nothing known, one spelling
    caplog.clear()
    with caplog.at_level(logging.INFO, "evalstop.callback"):
        early.decision = coord.stop("local", "early", ReasonRequest("by hand")).decision
        early.log_eval(5, None)
        early.stop_here(5)
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == "EvalStop step 5: score failed, best none (step none), declines none, manual stop by " \
                      "tenant:local: by hand"
    assert said[-1] == "EvalStop: stopping at step 5: manual stop by tenant:local: by hand; best step none (score " \
                       "none), checkpoint none"
    assert "None" not in caplog.text


def test_the_stop_is_acknowledged_with_the_step_training_stopped_at():
    coord = Coordinator()
    session = _session(coord, "acked")
    assert _run(session, HACKED) == 40
    ack = [a for a in coord.audit("local", "acked") if a.kind.value == "ack"]
    assert len(ack) == 1 and ack[0].evidence["step"] == 40 and ack[0].evidence["stop_lag"] == 0


def test_the_callbacks_policy_carries_stop_on_and_its_local_detector_stops_plateaus():
    """``EvalStopCallback(..., stop_on=["hacked", "converged"])``: registered with the job's policy, and the
    local detector (fail_mode="local") decides the same; a bad value is refused at construction."""
    from evalstop_trl.core.detectors import Observation
    from evalstop_trl.core.detectors.converged import ConvergedOr
    from evalstop_trl.train.session import SessionConfig

    config = SessionConfig.build("decline", stop_on=["hacked", "converged"])
    assert config.policy["stop_on"] == ["hacked", "converged"] and "stop_on" not in SessionConfig.build().policy
    det = config.new_detector()
    assert isinstance(det, ConvergedOr)
    plateau = [0.3, 0.5, 0.6, 0.61, 0.6, 0.61, 0.6, 0.61]
    decisions = [det.observe(Observation("j", 10 * (i + 1), s, progress=(i + 1) / 8, eval_noise=0.02, eval_n=64))
                 for i, s in enumerate(plateau)]
    assert decisions[-1].stop and decisions[-1].reason.startswith("converged")
    with pytest.raises(ValueError, match="EvalStopCallback: policy stop_on must include hacked"):
        SessionConfig.build("decline", stop_on=["converged"])

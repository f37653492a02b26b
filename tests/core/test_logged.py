"""Issue 44: a run's completion length as evidence. A report may carry ``length`` (the mean completion
length of the latest training step's rollouts, tokens); a detector's stop then says how it changed
since the best eval (``length_since_best``, a reason suffix). Evidence only: never required, never
changes a decision."""

from __future__ import annotations

import math
import uuid

import pytest

from evalstop_trl import Coordinator, SQLiteStore
from evalstop_trl.clients.embedded import EmbeddedClient
from evalstop_trl.core.errors import InvalidInput
from evalstop_trl.core.logged import LENGTH_KEYS, describe, since_best
from evalstop_trl.core.records import AuditKind, Report, check_report
from evalstop_trl.core.requests import JobRequest, ReportRequest

#: the paper's rule, k=2: these scores stop at step 40 (0.7 -> 0.6 -> 0.5), the best eval is step 20
POLICY = {"detector": "decline", "k": 2, "noise": "none"}
SCORES = [0.5, 0.7, 0.6, 0.5]
LENGTHS = [180.0, 200.0, 240.0, 270.0]  # +35% from the best eval's 200 to the stopping eval's 270


@pytest.mark.parametrize("length", [0.0, 0, 312.5, 4096])
def test_a_length_is_any_finite_number_at_least_0(length):
    check_report(ReportRequest(10, 0.5, length=length))
    check_report(Report(10, 0.5, length=length))  # a stored report read back is checked the same


@pytest.mark.parametrize(("length", "message"), [
    (-1.0, "length must be >= 0 (a mean completion length in tokens), but got -1.0"),
    (-3, "length must be >= 0"),
    (math.nan, "length must be finite, but got nan; report None for a missing value"),
    (math.inf, "length must be finite"),
    ("200", "length must be a number or None, but got '200'"),
    (True, "length must be a number or None"),
])
def test_a_bad_length_is_refused_with_a_clear_message(length, message):
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_report(ReportRequest(10, 0.5, length=length))
    c = Coordinator()
    c.register_job("a", JobRequest("j", "grpo"))
    with pytest.raises(InvalidInput, match="length must be"):
        c.report("a", "j", ReportRequest(10, 0.5, length=length))
    assert c.reports("a", "j") == []


def test_since_best_is_the_relative_change_and_unknown_without_both():
    assert since_best(200.0, 270.0) == pytest.approx(0.35) and since_best(200.0, 150.0) == pytest.approx(-0.25)
    assert since_best(None, 270.0) is None and since_best(200.0, None) is None
    assert since_best(0.0, 10.0) is None  # no relative change from nothing
    assert describe(0.35) == "length +35% since the best eval" and describe(-0.25) == "length -25% since the best eval"
    assert LENGTH_KEYS[:2] == ("completions/mean_length", "completion_length")  # TRL's, then older TRL's
    assert {"response_length/mean", "response_length"} <= set(LENGTH_KEYS)  # verl's, OpenRLHF's


def _run(client, job_id: str, lengths=None, proxies=None):
    client.register_job(job_id, "grpo", policy=POLICY)
    decision = None
    for i, score in enumerate(SCORES):
        extra = {}
        if lengths is not None and lengths[i] is not None:
            extra["length"] = lengths[i]
        if proxies is not None:
            extra["proxy_reward"] = proxies[i]
        decision = client.report(job_id, 10 * (i + 1), eval_score=score, **extra)
    return decision


def test_a_stop_says_how_the_length_changed_since_the_best_eval():
    """Through the embedded client: the stop's reason ends with the length's change, its evidence
    carries ``length_since_best``, and so does its audit line."""
    coord = Coordinator()
    client = EmbeddedClient(coord)
    decision = _run(client, "long", LENGTHS)
    assert decision.stop and decision.best_step == 20
    assert decision.evidence["length_since_best"] == pytest.approx(0.35)
    assert decision.reason.endswith("; length +35% since the best eval")
    (stop,) = [a for a in coord.audit("local", "long") if a.kind is AuditKind.STOP]
    assert stop.evidence["length_since_best"] == pytest.approx(0.35) and stop.reason == decision.reason
    assert client.status("long").decision.evidence["length_since_best"] == pytest.approx(0.35)
    assert [r.length for r in client.reports("long")] == LENGTHS


def test_the_length_is_evidence_only_it_never_changes_a_decision():
    """The same evals with and without a length decide the same (action, step, best, the rule's
    evidence); a run that logs no length reads exactly as before."""
    client = EmbeddedClient(Coordinator())
    plain = _run(client, "plain")
    assert plain.stop and "length_since_best" not in plain.evidence and "length" not in plain.reason
    for job_id, lengths in (("long", LENGTHS), ("short", [400.0, 300.0, 200.0, 150.0])):
        with_length = _run(client, job_id, lengths)
        assert (with_length.action, with_length.best_step, with_length.best_score) == (
            plain.action, plain.best_step, plain.best_score)
        assert with_length.reason.startswith(plain.reason + "; length ")
        assert {k: v for k, v in with_length.evidence.items() if k != "length_since_best"} == dict(plain.evidence)
    assert _run(client, "short2", [400.0, 300.0, 200.0, 150.0]).reason.endswith("; length -50% since the best eval")


def test_without_the_best_evals_length_or_the_last_ones_the_stop_says_nothing_of_it():
    client = EmbeddedClient(Coordinator())
    plain = _run(client, "plain")
    no_best = _run(client, "no-best", [180.0, None, 240.0, 270.0])  # the best eval (step 20) logged none
    no_last = _run(client, "no-last", [180.0, 200.0, 240.0, None])
    zero = _run(client, "zero", [180.0, 0.0, 240.0, 270.0])  # no relative change from 0
    for d in (no_best, no_last, zero):
        assert d.stop and d.reason == plain.reason and "length_since_best" not in d.evidence


def test_the_proxy_and_the_length_both_said_proxy_first():
    decision = _run(EmbeddedClient(Coordinator()), "both", LENGTHS, proxies=[0.1, 0.2, 0.45, 0.5])
    assert decision.reason.endswith("; proxy +0.3 since the best eval; length +35% since the best eval")
    assert decision.evidence["proxy_since_best"] == pytest.approx(0.3)
    assert decision.evidence["length_since_best"] == pytest.approx(0.35)


def test_a_restarted_coordinator_keeps_the_best_evals_length(tmp_path):
    """JobState's best length is rebuilt from the stored reports (replayed like the best checkpoint):
    a stop after a restart says the same."""
    path = tmp_path / "c.db"
    coord = Coordinator(SQLiteStore(path))
    coord.register_job("local", JobRequest("j", "grpo", policy=POLICY))
    for i in range(3):  # the best eval (step 20) and one decline, then a restart
        coord.report("local", "j", ReportRequest(10 * (i + 1), SCORES[i], length=LENGTHS[i]))
    coord.close()
    coord = Coordinator(SQLiteStore(path))
    decision = coord.report("local", "j", ReportRequest(40, SCORES[3], length=LENGTHS[3]))
    assert decision.stop and decision.evidence["length_since_best"] == pytest.approx(0.35)
    assert decision.reason.endswith("; length +35% since the best eval")
    coord.close()


def test_a_stop_over_http_says_the_length_change(server):
    """A real ``evalstop serve`` on loopback: the report's ``length`` crosses the wire, is stored, and
    the stop's reason and evidence say its change since the best eval."""
    from evalstop_trl.clients.http import EvalStopClient

    token = server.add_tenant("alice")
    server.start()
    with EvalStopClient(server.url, token) as client:
        decision = _run(client, "long", LENGTHS)
        assert decision.stop and decision.evidence["length_since_best"] == pytest.approx(0.35)
        assert decision.reason.endswith("; length +35% since the best eval")
        assert [r.length for r in client.reports("long")] == LENGTHS
        view = client.status("long")
        assert view.decision.evidence["length_since_best"] == pytest.approx(0.35)
        plain = _run(client, "plain")
        assert plain.stop and "length_since_best" not in plain.evidence
        assert plain.reason + "; length +35% since the best eval" == decision.reason


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_extreme_proxies_and_lengths_never_break_a_stop_over_http(store, tmp_path, request):
    """An attack on the evidence: finite reports whose change since the best overflows (a proxy from
    -1e308 to 1e308, a length from 1e-300 to 1e308). A real service on loopback, both stores: the stop
    is answered, stored and read back as JSON, and says nothing of a change it cannot give as a number."""
    from evalstop_trl.clients.http import EvalStopClient
    from evalstop_trl.clients.local import LocalServer

    db = tmp_path / "c.db" if store == "sqlite" else request.getfixturevalue("postgres_cluster").create_database(
        "extreme_" + uuid.uuid4().hex[:8])
    with LocalServer(db, tenants=("alice",), log=tmp_path / "s.log") as srv, \
            EvalStopClient(srv.url, srv.tokens["alice"], retries=0) as client:
        client.register_job("x", "grpo")
        reports = [(0.2, -1e308, 1e-300), (0.5, -1e308, 1e-300), (0.45, 0.0, 1.0), (0.1, 1e308, 1e308)]
        for i, (score, proxy, length) in enumerate(reports, start=1):
            decision = client.report("x", 10 * i, eval_score=score, proxy_reward=proxy, length=length)
        assert decision.stop and "since the best eval" not in decision.reason
        assert not {"proxy_since_best", "length_since_best"} & set(decision.evidence)
        assert client.status("x").decision == decision
        assert [r.length for r in client.reports("x")] == [length for _, _, length in reports]


@pytest.mark.parametrize(("log", "reward"), [
    ({"reward": 0.4, "loss": 1.0}, 0.4),  # TRL GRPO / RLOO, OpenRLHF
    ({"objective/scores": 0.3}, 0.3),  # TRL's online trainers
    ({"critic/score/mean": 0.004, "critic/rewards/mean": 0.0038, "critic/kl": 0.0002}, 0.004),  # verl: before its KL
    ({"critic/rewards/mean": 0.0038}, None),  # verl's reward net of the KL penalty is not the proxy
    ({"train/reward": 0.4, "train/global_step": 10}, 0.4),  # transformers' W&B and TensorBoard callbacks
    ({"reward": 0.2, "train/reward": 0.4}, 0.2),  # the name as the trainer logs it first
])
def test_the_proxy_reward_each_stack_logs_is_read(log, reward):
    from evalstop_trl.core.logged import REWARD_KEYS, first_logged

    assert first_logged(log, REWARD_KEYS) == reward

"""Shadow mode: decide and record "would stop", never stop; per job or the tenant's default; the
`evalstop status` / `evalstop shadow-report` views; the same on the embedded client, on a restarted
SQLite coordinator and over HTTP against a real `evalstop serve`."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import replace

import pytest

from evalstop_trl import Coordinator, SQLiteStore
from evalstop_trl.analysis.shadow import Verdict, shadow_outcome
from evalstop_trl.clients.embedded import EmbeddedClient
from evalstop_trl.clients.http import EvalStopClient
from evalstop_trl.core.errors import Conflict, InvalidInput
from evalstop_trl.core.records import AuditKind, Policy, PolicyMode, Report
from evalstop_trl.core.requests import JobRequest, ReportRequest
from evalstop_trl.train.session import EvalStopSession, SessionConfig

# the default decline (k=2) fires at 40: the run of declines 0.5 → 0.45 → 0.2 falls beyond the run's own noise
HACKED = [(10, 0.2), (20, 0.5), (30, 0.45), (40, 0.2), (50, 0.15), (60, 0.1)]
HEALTHY = [(10, 0.2), (20, 0.3), (30, 0.35), (40, 0.5), (50, 0.55), (60, 0.6)]
DIP = [(10, 0.2), (20, 0.5), (30, 0.45), (40, 0.2), (50, 0.7), (60, 0.8)]  # fires at 40, then the run recovers
SLOW = [(10, 0.2), (20, 0.6), (30, 0.61), (40, 0.3), (50, 0.62), (60, 0.2)]  # declines, never 2 in a row

SHADOW = {"detector": "decline", "k": 2, "mode": "shadow"}


def _evalstop(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "evalstop_trl", *args], capture_output=True, text=True, timeout=60)
    assert (out.returncode == 0) == ok, out.stderr
    return out


def _feed(c, tenant, job_id, curve):
    return [c.report(tenant, job_id, ReportRequest(s, eval_score=v)) for s, v in curve]


def test_a_would_stop_carries_the_proxy_and_length_evidence_an_enforced_stop_carries(tmp_path):
    """The same reports (proxy rising and answers growing while the eval falls) to an enforced and a shadow
    job: the would-stop says what the stop says, "proxy +0.2 since the best eval; length +67% ...", in
    its reason, evidence and audit line."""
    c = Coordinator(SQLiteStore(tmp_path / "c.db"))
    c.register_job("acme", JobRequest("enforced", "grpo", 60))
    c.register_job("acme", JobRequest("shadow", "grpo", 60, policy=SHADOW))
    for job in ("enforced", "shadow"):
        for i, (step, score) in enumerate(HACKED[:4]):
            c.report("acme", job, ReportRequest(step, eval_score=score, proxy_reward=0.1 * i + 0.1,
                                                length=10.0 + 5.0 * i))
    stop, would = c.status("acme", "enforced").decision, c.status("acme", "shadow").would_stop
    assert "proxy +0.2 since the best eval; length +67% since the best eval" in stop.reason, stop.reason
    assert would.reason == stop.reason and would.evidence == stop.evidence
    line = next(a for a in c.audit("acme", "shadow") if a.kind is AuditKind.WOULD_STOP)
    assert line.reason == stop.reason and line.evidence["proxy_since_best"] == pytest.approx(0.2)
    c.close()


def test_a_shadow_job_decides_like_an_enforced_one_records_the_first_would_stop_and_never_stops(tmp_path):
    c = Coordinator(SQLiteStore(tmp_path / "c.db"))
    c.register_job("acme", JobRequest("enforced", "grpo", 60))
    c.register_job("acme", JobRequest("shadow", "grpo", 60, policy=SHADOW))
    enforced = _feed(c, "acme", "enforced", HACKED[:4])
    shadow = _feed(c, "acme", "shadow", HACKED)
    assert enforced[-1].stop and c.status("acme", "enforced").status == "stopped"
    assert not any(d.stop for d in shadow)
    assert shadow[3].reason.startswith("shadow mode, not stopped: would stop: 2 consecutive declines")
    assert shadow[3].evidence["would_stop"] == 40 and shadow[5].evidence["would_stop"] == 40  # the first one
    view = c.status("acme", "shadow")
    assert (view.status, view.would_stop_step, view.policy["mode"]) == ("running", 40, "shadow")
    assert view.would_stop.stop and view.would_stop.reason == enforced[-1].reason
    assert "mode" not in c.status("acme", "enforced").policy and c.status("acme", "enforced").would_stop is None
    c.register_job("acme", JobRequest("dip", "grpo", 60, policy=SHADOW))
    _feed(c, "acme", "dip", DIP)
    dip = c.status("acme", "dip")  # after the would-stop the job trains on: its best follows its evals
    assert (dip.would_stop_step, dip.best_step, dip.best_score) == (40, 60, 0.8)
    kinds = [a.kind for a in c.audit("acme", "shadow")]
    assert kinds == [AuditKind.WOULD_STOP]
    c.finish("acme", "shadow")
    before = c.status("acme", "shadow")
    c.close()
    again = Coordinator(SQLiteStore(tmp_path / "c.db"))  # replayed from the stored reports
    after = again.status("acme", "shadow")
    assert after == before and after.status == "finished"
    again.close()


def test_a_bad_mode_is_refused_with_the_valid_ones():
    with pytest.raises(InvalidInput, match="policy mode must be one of enforce, shadow, but got 'sahdow'"):
        Policy.from_dict({"detector": "decline", "mode": "sahdow"})
    assert Policy.from_dict(SHADOW).mode is PolicyMode.SHADOW and Policy.from_dict(SHADOW).to_dict() == SHADOW | {
        "min_delta": 0.0, "noise": "run", "noise_z": 2.0, "direction": "max"}


def test_the_tenant_default_mode_applies_to_jobs_that_do_not_name_one(tmp_path):
    c = Coordinator(SQLiteStore(tmp_path / "c.db"))
    tenants = c.tenants
    tenants.add("acme")
    tenants.set_quotas("acme", {"default_mode": "shadow"})
    c.register_job("acme", JobRequest("a", "grpo", 60))
    c.register_job("acme", JobRequest("b", "grpo", 60, policy={"detector": "decline", "mode": "enforce"}))
    c.register_job("acme", JobRequest("c", "grpo", 60, policy={"detector": "decline", "k": 2}))
    assert [c.status("acme", j).policy.get("mode", "enforce") for j in "abc"] == ["shadow", "enforce", "shadow"]
    assert not any(d.stop for d in _feed(c, "acme", "a", HACKED))
    assert _feed(c, "acme", "b", HACKED[:4])[-1].stop
    # the operator switches the tenant to enforce: a job re-registered without a mode keeps its own
    tenants.set_quotas("acme", {"default_mode": "enforce"})
    tenants._quota_cache.clear()
    view, created = c.register_job("acme", JobRequest("a", "grpo", 60, policy={"detector": "decline", "k": 2}))
    assert not created and view.policy["mode"] == "shadow"
    with pytest.raises(Conflict, match="new policy needs a new job_id"):
        c.register_job("acme", JobRequest("a", "grpo", 60, policy={"detector": "decline", "k": 2, "mode": "enforce"}))
    c.register_job("acme", JobRequest("d", "grpo", 60))
    assert "mode" not in c.status("acme", "d").policy
    with pytest.raises(InvalidInput, match="policy mode must be one of"):
        tenants.set_quotas("acme", {"default_mode": "off"})
    c.close()


def test_the_session_goes_on_in_shadow_mode_and_says_so_once(tmp_path, caplog):
    c = Coordinator(SQLiteStore(tmp_path / "c.db"))
    session = EvalStopSession(SessionConfig.build("decline", k=2, shadow=True), "run", heartbeat_s=None)
    session.attach(EmbeddedClient(c, tenant="local"), planned_steps=60)
    with caplog.at_level(logging.WARNING, logger="evalstop.callback"):
        stops = [session.report(s, v) for s, v in HACKED]
    assert stops == [False] * 6 and session.shadow.step == 40
    said = [r.getMessage() for r in caplog.records if "would stop at step 40" in r.getMessage()]
    assert len(said) == 1 and "would stop at step 40: 2 consecutive declines: 0.5 → 0.45 → 0.2 at step 40: falls of " \
        in said[0], said
    assert session.eval_metrics(0.25, False)["evalstop/would_stop"] == 1
    # the evals after it decline again: the decision still says why the run would have stopped, at 40
    assert session.decision.reason.startswith("shadow mode, not stopped: would stop: 2 consecutive declines: 0.5 → "
                                              "0.45 → 0.2 at step 40: falls of ")
    assert session.decision.evidence["would_stop"] == 40
    resumed = EvalStopSession(SessionConfig.build("decline", k=2, shadow=True), "run", heartbeat_s=None)
    resumed.attach(EmbeddedClient(c, tenant="local"), step=60, planned_steps=60)
    assert resumed.shadow.reason == session.decision.reason  # a resumed process knows it from the job
    assert c.status("local", "run").policy["mode"] == "shadow"
    c.close()
    # with the coordinator away, the local detector decides in shadow mode too
    alone = EvalStopSession(SessionConfig.build("decline", k=2, shadow=True), "solo", heartbeat_s=None)
    assert [alone.report(s, v) for s, v in HACKED] == [False] * 6 and alone.shadow.step == 40
    assert "would stop: 2 consecutive declines" in alone.decision.reason and "at step 40" in alone.decision.reason
    enforced = EvalStopSession(SessionConfig.build("decline", k=2), "solo2", heartbeat_s=None)
    assert [enforced.report(s, v) for s, v in HACKED][3] is True


def test_a_session_adopts_shadow_mode_from_the_tenant_default(tmp_path):
    c = Coordinator(SQLiteStore(tmp_path / "c.db"))
    c.tenants.add("local")
    c.tenants.set_quotas("local", {"default_mode": "shadow"})
    session = EvalStopSession(SessionConfig.build("decline", k=2), "run", heartbeat_s=None)
    session.attach(EmbeddedClient(c, tenant="local"), planned_steps=60)
    assert session.shadow.on and not any(session.report(s, v) for s, v in HACKED)
    c.close()


@pytest.mark.parametrize("curve, verdict, saved, gap", [
    (HACKED, Verdict.RIGHT, 20, 0.0),
    (DIP, Verdict.EARLY, 20, 0.5),
    (SLOW, Verdict.MISSED, None, None),
    (HEALTHY, Verdict.QUIET, None, None),
])
def test_shadow_outcomes_are_judged_on_the_run_s_own_range(curve, verdict, saved, gap):
    from evalstop_trl.core.detectors import Observation, create_detector

    det = create_detector("decline", k=2)
    would = next((s for s, v in curve if det.observe(Observation("j", s, v)).stop), None)
    reports = [Report(s, v) for s, v in curve]
    out = shadow_outcome("j", "finished", would, reports)
    assert (out.verdict, out.steps_saved) == (verdict, saved)
    assert out.gap == pytest.approx(gap) if gap is not None else out.gap is None
    # units do not matter: the same curve as a loss in other units gives the same verdict
    scaled = [Report(s, 7.0 - 30.0 * v) for s, v in curve]
    assert shadow_outcome("j", "finished", would, scaled, direction="min").verdict is verdict
    assert shadow_outcome("j", "running", would, reports).verdict is Verdict.RUNNING
    with pytest.raises(ValueError, match="margin is a share of each run's range"):
        shadow_outcome("j", "finished", would, reports, margin=5)


def _shadow_jobs(c, tenant):
    for name, curve in (("hacked", HACKED), ("dip", DIP), ("slow", SLOW), ("healthy", HEALTHY)):
        c.register_job(tenant, JobRequest(name, "grpo", 60, policy=SHADOW))
        _feed(c, tenant, name, curve)
        c.finish(tenant, name)
    c.register_job(tenant, JobRequest("live", "grpo", 60, policy=SHADOW))
    _feed(c, tenant, "live", HACKED[:4])
    c.register_job(tenant, JobRequest("enforced", "grpo", 60))
    _feed(c, tenant, "enforced", HACKED[:4])


def test_status_and_shadow_report_read_an_embedded_database(tmp_path):
    db = tmp_path / "evalstop.db"
    c = Coordinator(SQLiteStore(db))
    _shadow_jobs(c, "local")
    c.close()
    status = _evalstop("status", "--db", str(db)).stdout
    line = next(ln for ln in status.splitlines() if ln.startswith("hacked"))
    assert "[shadow] would stop at step 40: 2 consecutive declines" in line and "finished" in line
    assert "[shadow] continue: job is finished" in next(ln for ln in status.splitlines() if ln.startswith("healthy"))
    report = json.loads(_evalstop("shadow-report", "--db", str(db), "--json").stdout)
    verdicts = {j["job_id"]: j["verdict"] for j in report["jobs"]}
    assert verdicts == {"hacked": "right", "dip": "early", "slow": "missed", "healthy": "quiet", "live": "running"}
    assert report["summary"]["counts"] == {"right": 1, "early": 1, "missed": 1, "quiet": 1, "running": 1}
    assert report["summary"]["steps_saved_right"] == 20 and report["summary"]["steps_saved_all"] == 40
    table = _evalstop("shadow-report", "--db", str(db)).stdout
    assert "5 job(s): 1 right, 1 early, 1 missed, 1 quiet, 1 running" in table
    assert "margin is a share" in _evalstop("shadow-report", "--db", str(db), "--margin", "3", ok=False).stderr
    empty = tmp_path / "empty.db"
    Coordinator(SQLiteStore(empty)).close()
    assert "no shadow-mode jobs" in _evalstop("shadow-report", "--db", str(empty)).stdout


def test_shadow_mode_over_http_against_a_real_server_equals_the_embedded_client(server, tmp_path):
    token = server.add_tenant("alice")
    bob = server.add_tenant("bob")
    _evalstop("tenants", "quota", "bob", "--db", str(server.db), "--default-mode", "shadow")
    server.start()
    local = Coordinator(SQLiteStore(tmp_path / "local.db"))
    embedded = EmbeddedClient(local, tenant="alice")
    with EvalStopClient(server.url, token) as http, EvalStopClient(server.url, bob) as bob_http:
        for client in (http, embedded):
            client.register_job("s", "grpo", 60, policy=SHADOW)
            decisions = [client.report("s", st, eval_score=v) for st, v in HACKED]
            assert not any(d.stop for d in decisions) and decisions[3].evidence["would_stop"] == 40
        times = {"created_at": 0.0, "last_seen": None}
        assert replace(http.status("s"), **times) == replace(embedded.status("s"), **times)
        assert [a.kind for a in http.audit("s")] == [a.kind for a in embedded.audit("s")] == [AuditKind.WOULD_STOP]
        with pytest.raises(InvalidInput, match="policy mode must be one of enforce, shadow"):
            http.register_job("bad", "grpo", 60, policy={"detector": "decline", "mode": "dry-run"})
        bob_http.register_job("b", "grpo", 60)  # bob's default: shadow; alice's jobs are not his
        assert not any(bob_http.report("b", st, eval_score=v).stop for st, v in HACKED)
        assert bob_http.status("b").would_stop_step == 40 and http.list_jobs()[0].job_id == "s"
    out = _evalstop("shadow-report", "--url", server.url, "--token", bob, "--json").stdout
    assert [j["job_id"] for j in json.loads(out)["jobs"]] == ["b"]
    local.close()


def test_tenants_quota_sets_and_lists_the_default_mode(tmp_path):
    db = tmp_path / "c.db"
    _evalstop("tenants", "add", "acme", "--db", str(db))
    out = _evalstop("tenants", "quota", "acme", "--db", str(db), "--default-mode", "shadow").stdout
    assert "default_mode=shadow" in out
    assert json.loads(_evalstop("tenants", "list", "--db", str(db), "--json").stdout)[0]["quotas"][
        "default_mode"] == "shadow"
    assert "invalid choice: 'off'" in _evalstop("tenants", "quota", "acme", "--db", str(db), "--default-mode", "off",
                                                ok=False).stderr


def test_serve_default_mode_shadow_applies_to_every_tenant_without_its_own(server):
    alice, bob = server.add_tenant("alice"), server.add_tenant("bob")
    _evalstop("tenants", "quota", "bob", "--db", str(server.db), "--default-mode", "enforce")
    server.start(args=("--default-mode", "shadow"))
    with EvalStopClient(server.url, alice) as a, EvalStopClient(server.url, bob) as b:
        a.register_job("j", "grpo", 60)
        b.register_job("j", "grpo", 60)
        assert not any(a.report("j", s, eval_score=v).stop for s, v in HACKED)
        assert [b.report("j", s, eval_score=v).stop for s, v in HACKED[:4]][-1]
        assert (a.status("j").status, a.status("j").would_stop_step) == ("running", 40)
        assert b.status("j").status == "stopped"

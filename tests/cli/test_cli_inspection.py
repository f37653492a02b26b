"""Inspecting the embedded default from the command line: `evalstop audit --db`, `evalstop replay
PATH/evalstop.db` (real subprocesses over a real SQLite file an embedded coordinator wrote)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from evalstop_trl import Coordinator, SQLiteStore
from evalstop_trl.core.requests import AckRequest, JobRequest, ReportRequest

HACKED = [(10, 0.2), (20, 0.5), (30, 0.45), (40, 0.2), (50, 0.3)]  # the default decline k=2 stops at 40, best 20


def _evalstop(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "evalstop_trl", *args], capture_output=True, text=True, timeout=60)
    assert (out.returncode == 0) == ok, out.stderr
    return out


@pytest.fixture
def db(tmp_path):
    """What an EvalStopCallback leaves in its output folder: an evalstop.db of tenant 'local'."""
    path = tmp_path / "evalstop.db"
    c = Coordinator(SQLiteStore(path))
    c.register_job("local", JobRequest("run-a", "grpo", 100))
    for step, score in HACKED:
        c.report("local", "run-a", ReportRequest(step, eval_score=score, train_loss=1.0 / step))
    c.ack("local", "run-a", AckRequest("out/checkpoint-20", step=45))
    c.close()
    return path


def test_audit_reads_an_embedded_database(db):
    table = _evalstop("audit", "--db", str(db)).stdout
    assert "run-a" in table and "stop" in table and "2 consecutive declines" in table and "ack" in table
    records = json.loads(_evalstop("audit", "run-a", "--db", str(db), "--json").stdout)
    assert [r["kind"] for r in records] == ["stop", "ack"] and records[1]["evidence"]["stop_lag"] == 5
    assert "no database at" in _evalstop("audit", "--db", str(db) + ".missing", ok=False).stderr


def test_replay_reads_a_job_of_an_embedded_database(db):
    result = json.loads(_evalstop("replay", str(db), "--json").stdout)
    assert (result["stopped"], result["stop_step"], result["best_step"]) == (True, 40, 20)
    patience = json.loads(_evalstop("replay", str(db), "--detector", "patience", "--k", "4", "--json").stdout)
    assert patience["stopped"] is False
    c = Coordinator(SQLiteStore(db))
    c.register_job("local", JobRequest("run-b", "dpo", 10))
    c.close()
    err = _evalstop("replay", str(db), ok=False).stderr
    assert "2 jobs of tenant 'local' (run-a, run-b): pick one with --job" in err
    assert "has no report with an eval score" in _evalstop("replay", str(db), "--job", "run-b", ok=False).stderr


def test_status_reads_an_embedded_database_and_a_killed_job_shows_lost(db):
    out = _evalstop("status", "--db", str(db)).stdout
    assert "run-a" in out and "stopped" in out and "last seen" in out and "stop lag" not in out
    assert "stop lag: 5 step(s)" in _evalstop("status", "run-a", "--db", str(db)).stdout
    c = Coordinator(SQLiteStore(db), clock=lambda: 1000.0)  # a job whose process was killed long ago
    c.register_job("local", JobRequest("killed", "grpo", 100))
    c.report("local", "killed", ReportRequest(10, eval_score=0.5))
    c.close()
    jobs = {j["job_id"]: j for j in json.loads(_evalstop("status", "--db", str(db), "--json").stdout)}
    assert jobs["killed"]["status"] == "lost" and jobs["killed"]["last_seen"] == 1000.0
    assert [r["kind"] for r in json.loads(_evalstop("audit", "killed", "--db", str(db), "--json").stdout)] == ["lost"]


def test_an_operator_marks_a_dead_job_failed(db):
    c = Coordinator(SQLiteStore(db))
    c.register_job("local", JobRequest("dead", "grpo", 100))
    c.close()
    assert "dead: failed" in _evalstop("fail", "dead", "--db", str(db), "--reason", "node gone").stdout
    records = json.loads(_evalstop("audit", "dead", "--db", str(db), "--json").stdout)
    assert [(r["kind"], r["reason"]) for r in records] == [("failed", "node gone")]
    assert "no job 'nope'" in _evalstop("fail", "nope", "--db", str(db), ok=False).stderr


def test_an_operator_stops_a_job_by_hand(db):
    c = Coordinator(SQLiteStore(db))
    c.register_job("local", JobRequest("live", "grpo", 100))
    c.close()
    assert "live: stopped" in _evalstop("stop", "live", "--db", str(db), "--reason", "looks hacked").stdout
    records = json.loads(_evalstop("audit", "live", "--db", str(db), "--json").stdout)
    assert [r["kind"] for r in records] == ["manual_stop"] and records[0]["reason"].endswith("looks hacked")
    assert "no job 'nope'" in _evalstop("stop", "nope", "--db", str(db), ok=False).stderr


def test_serve_says_it_cannot_listen_before_any_banner(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _evalstop("serve", "--db", str(tmp_path / "c.db"), "--port", str(port), ok=False)
    assert "cannot listen on 127.0.0.1:" in out.stderr and "serving" not in out.stdout
    assert "postgresql://" in _evalstop("tenants", "add", "--help").stdout


def _bare_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("EVALSTOP_URL", "EVALSTOP_TOKEN")}


@pytest.mark.parametrize("where", [".", "out"])
def test_status_and_audit_next_to_an_embedded_database_read_it_and_say_so(db, tmp_path, where):
    """No --db, no URL, no token: the evalstop.db here (or in the one output folder here) is read."""
    home = tmp_path / "home"
    (home / where).mkdir(parents=True, exist_ok=True)
    db.rename(home / where / "evalstop.db")
    for command in ("status", "audit"):
        out = subprocess.run([sys.executable, "-m", "evalstop_trl", command], cwd=home, capture_output=True,
                             text=True, timeout=60, env=_bare_env())
        assert out.returncode == 0 and "run-a" in out.stdout, out.stderr
        assert "reading the embedded coordinator's" in out.stderr and "evalstop.db" in out.stderr


def test_status_with_nothing_to_read_suggests_db(tmp_path):
    out = subprocess.run([sys.executable, "-m", "evalstop_trl", "status"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env=_bare_env())
    assert out.returncode == 2 and "--db PATH/evalstop.db" in out.stderr, out.stderr


def test_db_of_a_service_says_which_tenant_it_reads(tmp_path):
    path = tmp_path / "coord.db"
    c = Coordinator(SQLiteStore(path))
    c.tenants.add("acme")
    c.register_job("acme", JobRequest("run-a", "grpo", 100))
    c.close()
    default = _evalstop("shadow-report", "--db", str(path))
    assert "reading tenant 'local'" in default.stderr and "acme" in default.stderr and "--tenant NAME" in default.stderr
    assert "reading tenant" not in _evalstop("status", "--db", str(path), "--tenant", "acme").stderr


def test_every_quota_has_its_flag_and_env_variable():
    """Every field of Quotas can be set by `evalstop serve` / `tenants quota` (a new quota without a flag
    was unreachable from the command line)."""
    import argparse
    from dataclasses import fields

    from evalstop_trl.cli.service import _QUOTA_FLAGS, _add_quota_flags
    from evalstop_trl.core.records import Quotas

    assert set(_QUOTA_FLAGS) == {f.name for f in fields(Quotas)}
    p = argparse.ArgumentParser()
    _add_quota_flags(p, "test")
    dests = {a.dest for a in p._actions}
    assert set(_QUOTA_FLAGS) <= dests
    helps = " ".join(a.help or "" for a in p._actions)
    assert all(f"EVALSTOP_{name.upper()}" in helps for name in _QUOTA_FLAGS)

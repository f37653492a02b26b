"""Stores: schema, WAL, append-only audit, durability under SIGKILL."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from evalstop_trl import Coordinator, SQLiteStore
from evalstop_trl.core.requests import JobRequest, ReasonRequest
from evalstop_trl.stores.sqlite import SCHEMA_VERSION


def test_wal_and_schema_version(tmp_path):
    path = tmp_path / "s.db"
    SQLiteStore(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "s.db"
    SQLiteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(ValueError, match="schema version 99"):
        SQLiteStore(path)


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        SQLiteStore(tmp_path / "nope" / "s.db")


def test_audit_log_is_append_only(tmp_path):
    path = tmp_path / "s.db"
    c = Coordinator(SQLiteStore(path))
    c.register_job("a", JobRequest("j", "grpo"))
    c.stop("a", "j", ReasonRequest("x"))
    c.close()
    db = sqlite3.connect(path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("DELETE FROM audit")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("UPDATE audit SET reason = 'edited'")


CHILD = textwrap.dedent(
    """
    import sys
    from evalstop_trl import Coordinator, SQLiteStore
    from evalstop_trl.core.requests import JobRequest, ReportRequest
    c = Coordinator(SQLiteStore(sys.argv[1]))
    c.register_job("a", JobRequest("j", "grpo", policy={"detector": "never"}))
    step = 0
    while True:
        c.report("a", "j", ReportRequest(step, eval_score=step * 0.001, train_loss=1.0))
        print(step, flush=True)   # acknowledged: report() returned
        step += 1
    """
)


def test_sigkill_loses_no_acknowledged_report(tmp_path):
    path = tmp_path / "kill.db"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    acked = []
    deadline = time.monotonic() + 60
    while len(acked) < 40 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        acked.append(int(line))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # anything still in the pipe was acknowledged too
    acked += [int(x) for x in proc.stdout.read().split()]
    assert len(acked) >= 40
    stored = [r.step for r in SQLiteStore(path).reports("a", "j")]
    assert set(acked) <= set(stored)
    assert stored == list(range(len(stored)))

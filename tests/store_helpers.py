"""The stores the store-contract and coordinator tests run on (SQLite alone, and shared by processes), and
a restart check on a SQLite file (a stored job decides the same after its coordinator reopens the file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalstop_trl import MemoryStore, SQLiteStore
from evalstop_trl.core.store import Store

STORE_KINDS = ("memory", "sqlite", "sqlite-shared", "postgres")


def open_store(kind: str, path: Path, request: pytest.FixtureRequest) -> Store:
    """A store of ``kind``: a fresh MemoryStore, or the SQLite file at ``path``, or the test's own
    database on the session's PostgreSQL cluster (opening either again reopens the same data)."""
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SQLiteStore(path)
    if kind == "sqlite-shared":  # the embedded default: a file other processes (evaluators) write too
        return SQLiteStore(path, shared=True)
    from evalstop_trl.stores.postgres import PostgresStore

    return PostgresStore(request.getfixturevalue("pg_dsn"))


def restart_decides_the_same(path: Path, policy: dict, requests: list, cut: int):
    """Feed ``requests`` (``ReportRequest`` s of one job under ``policy``) to a coordinator on a SQLite
    file until ``cut``, close it, reopen the file and feed the rest, beside a coordinator that never
    stopped: every answer after the restart equals the uninterrupted one's. Returns the last answer
    (the first STOP, or the last report's)."""
    from evalstop_trl import Coordinator, SQLiteStore
    from evalstop_trl.core.detectors import Action
    from evalstop_trl.core.requests import JobRequest

    c = Coordinator(SQLiteStore(path))
    c.register_job("t", JobRequest("j", "grpo", policy=policy))
    for request in requests[:cut]:
        c.report("t", "j", request)
    c.close()
    reopened, uninterrupted = Coordinator(SQLiteStore(path)), Coordinator()
    uninterrupted.register_job("t", JobRequest("j", "grpo", policy=policy))
    try:
        for i, request in enumerate(requests):
            want = uninterrupted.report("t", "j", request)
            if i >= cut:
                assert reopened.report("t", "j", request) == want, request
            if want.action is Action.STOP:
                break
        return want
    finally:
        reopened.close()

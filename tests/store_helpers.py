"""The stores the store-contract and coordinator tests run on (SQLite alone, and shared by processes)."""

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

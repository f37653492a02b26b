"""Fixtures the service's attack tests share."""

from __future__ import annotations

import pytest

#: every attack on a store runs on both (SQLite, PostgreSQL)
STORES = ("sqlite", "postgres")


@pytest.fixture(params=STORES)
def db(request, tmp_path) -> str:
    """A coordinator database: a SQLite file, or a fresh PostgreSQL database (``pg_dsn``)."""
    if request.param == "sqlite":
        return str(tmp_path / "coord.db")
    return request.getfixturevalue("pg_dsn")

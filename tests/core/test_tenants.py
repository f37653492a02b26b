"""Tenants and tokens: creation, authentication, revocation, names, hashing (both stores)."""

from __future__ import annotations

import pytest

from evalstop_trl import Conflict, InvalidInput, MemoryStore, NotFound, SQLiteStore
from evalstop_trl.core.errors import Unauthorized
from evalstop_trl.core.tenants import Tenants, hash_token


@pytest.fixture(params=["memory", "sqlite"])
def tenants(request, tmp_path):
    store = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "t.db")
    yield Tenants(store, clock=lambda: 1000.0)
    store.close()


def test_tokens(tenants):
    token = tenants.add("acme")
    assert tenants.authenticate(token) == "acme"
    with pytest.raises(Unauthorized):
        tenants.authenticate("es_wrong")
    with pytest.raises(Unauthorized):
        tenants.authenticate(None)
    with pytest.raises(Conflict):
        tenants.add("acme")
    tenants.revoke("acme")
    with pytest.raises(Unauthorized, match="revoked"):
        tenants.authenticate(token)
    assert [(t.name, t.revoked, t.created_at) for t in tenants.list()] == [("acme", True, 1000.0)]


def test_only_the_hash_is_stored(tenants):
    token = tenants.add("acme")
    (record,) = tenants.list()
    assert record.token_hash == hash_token(token) and token not in record.token_hash


def test_revoking_an_unknown_tenant_is_not_found(tenants):
    with pytest.raises(NotFound, match="no tenant named 'ghost'"):
        tenants.revoke("ghost")


@pytest.mark.parametrize("name", ["", "evil\n", "-x", "a b", "x" * 129, None, 7])
def test_bad_names(tenants, name):
    with pytest.raises(InvalidInput, match="tenant name must be"):
        tenants.add(name)


def test_a_token_is_trusted_from_memory_briefly_and_a_revocation_in_process_ends_it_at_once():
    from evalstop_trl import Coordinator
    from evalstop_trl.core import tenants as module

    c = Coordinator()
    token = c.tenants.add("acme")
    assert c.tenants.cached(token) is None  # never seen: the store is read first
    assert c.tenants.authenticate(token) == "acme"
    c.tenants.quotas("acme")
    assert c.tenants.cached(token)[0] == "acme"  # the event loop's fast path: no store read
    c.tenants.revoke("acme")
    assert c.tenants.cached(token) is None
    with pytest.raises(Unauthorized, match="revoked"):
        c.tenants.authenticate(token)
    assert module.AUTH_TTL_S <= 1.0  # another process's revocation takes effect within a second

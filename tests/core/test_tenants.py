"""Tenants and tokens: creation, authentication, revocation, names, hashing (both stores)."""

from __future__ import annotations

import dataclasses

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


def _count_reads(store, method: str) -> list:
    """The arguments of every call of ``store.<method>`` from now on (the store still answers)."""
    reads, real = [], getattr(store, method)
    setattr(store, method, lambda key: reads.append(key) or real(key))
    return reads


def test_a_due_token_is_read_again_by_one_caller_while_the_others_take_the_cached_answer(monkeypatch):
    """The service's in-flight requests must not all read the store once a token's second is up:
    the first caller past the due time reads, the others take the cached answer until that read
    lands (for at most REFRESH_GRACE_S), and a revocation by another process still ends the token."""
    from evalstop_trl.core import tenants as module

    now = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    store = MemoryStore()
    reads = _count_reads(store, "tenant_by_hash")
    t = module.Tenants(store, clock=lambda: now[0])
    token = t.add("acme")
    assert t.authenticate(token) == "acme" and len(reads) == 1
    t.quotas("acme")
    now[0] += module.AUTH_TTL_S  # due
    assert t.cached(token) is None  # this caller reads the store ...
    assert [t.cached(token)[0] for _ in range(50)] == ["acme"] * 50  # ... the others do not meanwhile
    assert len(reads) == 1
    now[0] += module.REFRESH_GRACE_S  # the read never landed: no answer is trusted past the grace
    assert t.cached(token) is None
    assert t.authenticate(token) == "acme" and len(reads) == 2  # it lands: fresh again, nobody waits
    assert t.cached(token)[0] == "acme"
    # another process revokes the token: refused once it is due and read again
    store.update_tenant(dataclasses.replace(store.tenant("acme"), revoked=True))
    assert t.cached(token)[0] == "acme"  # within AUTH_TTL_S the memory still trusts it
    now[0] += module.AUTH_TTL_S
    assert t.cached(token) is None
    with pytest.raises(Unauthorized, match="revoked"):
        t.authenticate(token)
    assert t.cached(token) is None and t.cached(token) is None  # and it stays refused: no stale answer


def test_due_quotas_are_read_again_by_one_caller():
    from evalstop_trl.core import tenants as module

    now = [0.0]
    store = MemoryStore()
    reads = _count_reads(store, "tenant")
    t = module.Tenants(store, clock=lambda: now[0])
    token = t.add("acme")
    t.authenticate(token)
    t.quotas("acme")
    n = len(reads)
    now[0] += module._QUOTA_TTL_S
    assert t.cached(token) is None  # due: this caller reads the quotas
    assert t.cached(token) is not None and len(reads) == n  # the others take the cached ones meanwhile
    t.quotas("acme")
    assert len(reads) == n + 1


def test_a_read_that_began_before_a_refusal_does_not_put_the_token_back():
    """Two requests of one token: the first's store read is slow and answers as before a revocation
    by another process; the second's read sees the revocation and refuses. The first read landing
    afterwards must not make the memory trust the token again."""
    import threading

    from evalstop_trl.core import tenants as module

    store = MemoryStore()
    t = module.Tenants(store)
    token = t.add("acme")
    assert t.authenticate(token) == "acme"
    t.quotas("acme")  # cached too: only the token decides what cached() answers
    before = store.tenant("acme")  # what the slow read will answer
    store.update_tenant(dataclasses.replace(before, revoked=True))  # another process revokes
    release, started = threading.Event(), threading.Event()
    real = store.tenant_by_hash

    def slow_then_real(h):
        if not started.is_set():
            started.set()
            release.wait(5)
            return before
        return real(h)

    store.tenant_by_hash = slow_then_real
    slow = threading.Thread(target=t.authenticate, args=(token,))
    slow.start()
    started.wait(5)
    with pytest.raises(Unauthorized, match="revoked"):
        t.authenticate(token)
    release.set()
    slow.join(5)
    assert t.cached(token) is None and t.cached(token) is None
    with pytest.raises(Unauthorized, match="revoked"):
        t.authenticate(token)


"""Tenants and their tokens: who may call the coordinator, and how much.

A token is shown once when a tenant is created (or rotated); only its SHA-256 is stored. The
service turns a bearer token into a tenant name with :meth:`Tenants.authenticate`; everything after
that is namespaced by that name. A 401 never says which tenant a token belonged to.

Each tenant also has a webhook secret (HMAC-SHA256 key for its webhook payloads) and optional
quota overrides of the server's defaults (:class:`~evalstop_trl.core.records.Quotas`).

Example::

    >>> from evalstop_trl.stores.memory import MemoryStore
    >>> tenants = Tenants(MemoryStore())
    >>> token = tenants.add("acme")
    >>> tenants.authenticate(token)
    'acme'
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import secrets
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import NotFound, Unauthorized
from .records import Quotas, TenantRecord, check_name

if TYPE_CHECKING:
    from .store import Store

__all__ = ["AUTH_TTL_S", "LIVE_TOKENS_TTL_S", "REFRESH_GRACE_S", "Tenants", "hash_token", "new_token"]

_QUOTA_TTL_S = 5.0  # how long a tenant's quotas are cached (another process may change them)
#: how long a token that authenticated is trusted without reading the store again: a revocation or
#: rotation by another process (`evalstop tenants revoke`) takes effect within this; in process, at once
AUTH_TTL_S = 1.0
#: Once a cached token (or a tenant's quotas) is due for a store read, one caller reads; the others,
#: for at most this long past the due time, take the cached answer meanwhile (the service's in-flight
#: requests would otherwise all read the store at the same moment, once a second)
REFRESH_GRACE_S = 1.0
#: the live tokens' hashes (:meth:`Tenants.known`) are read again at most this often: a token added or
#: rotated by another process is known within this (plus one read) even while junk floods its address
LIVE_TOKENS_TTL_S = 1.0


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "es_" + secrets.token_urlsafe(32)


class Tenants:
    """Create, authenticate, rotate, revoke and limit tenants over a store.

    Args:
        store: where tenants are kept.
        clock: wall clock (creation times, quota cache).
        default_quotas: the server's quotas; a tenant's overrides apply on top.
    """

    def __init__(self, store: Store, clock: Callable[[], float] = time.time,
                 default_quotas: Quotas | None = None) -> None:
        self.store, self.clock = store, clock
        self.default_quotas = default_quotas or Quotas()
        self._quota_cache: dict[str, tuple[float, Quotas]] = {}
        self._auth_cache: dict[str, tuple[float, str]] = {}  # token hash -> (checked at, tenant); valid tokens only
        self._refreshing: set[tuple[str, str]] = set()  # ("token", hash) or ("quotas", tenant): a read under way
        self._refused: dict[str, float] = {}  # hash of a once-valid token -> when it was last refused
        self._cleared_at = -math.inf  # when this process last revoked or rotated a token (monotonic)
        self._live: set[str] = set()  # hashes of the tokens not revoked, as of the last read_live_tokens
        self._live_at = -math.inf  # when that read began (monotonic)
        self._live_reading = False

    def add(self, name: str) -> str:
        """Create a tenant and return its new token (shown once; only its hash is stored)."""
        check_name("tenant name", name)
        token = new_token()
        self.store.add_tenant(TenantRecord(name, hash_token(token), self.clock(),
                                           webhook_secret=secrets.token_urlsafe(32)))
        return token

    def authenticate(self, token: str | None) -> str:
        """Return the tenant owning ``token`` or raise :class:`Unauthorized` (naming no tenant)."""
        if not token:
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        token_hash = hash_token(token)
        started = time.monotonic()  # the answer is as fresh as the read's start
        try:
            t = self.store.tenant_by_hash(token_hash)
        finally:
            self._refreshing.discard(("token", token_hash))
        if t is None or t.revoked:  # refused: no cached answer of it may outlive this read
            self._live.discard(token_hash)
            if self._auth_cache.pop(token_hash, None) is not None:  # only tokens once valid: bounded
                self._refused[token_hash] = time.monotonic()
        if t is None:
            raise Unauthorized("unknown token: create one with 'evalstop tenants add NAME'")
        if t.revoked:
            raise Unauthorized("this token was revoked; ask the operator for a new one ('evalstop tenants rotate')")
        if max(self._refused.get(token_hash, -math.inf), self._cleared_at) < started:  # not a read that began before a refusal (or a revocation here) and ended after
            self._auth_cache[t.token_hash] = (started, t.name)
        return t.name

    def cached(self, token: str | None) -> tuple[str, Quotas] | None:
        """``(tenant, quotas)`` of a token that authenticated less than :data:`AUTH_TTL_S` ago with its
        quotas cached too, else None: then the caller reads the store (:meth:`authenticate`, then
        :meth:`quotas`). No store read, so the service may call this on its event loop.

        Past its time a cached answer is refreshed by one caller: the first to ask gets None, and
        until its read lands (for at most :data:`REFRESH_GRACE_S` more) the others get the cached
        answer. A revocation by another process thus takes effect within ``AUTH_TTL_S`` plus one
        store read."""
        if not token:
            return None
        token_hash = hash_token(token)
        hit = self._auth_cache.get(token_hash)
        if hit is None or not self._fresh(("token", token_hash), time.monotonic() - hit[0], AUTH_TTL_S):
            return None
        quotas = self._quota_cache.get(hit[1])
        if quotas is None or not self._fresh(("quotas", hit[1]), self.clock() - quotas[0], _QUOTA_TTL_S):
            return None
        return hit[1], quotas[1]

    def known(self, token: str | None) -> bool:
        """Whether ``token`` is live as far as this process knows without a store read: it authenticated
        here and was not refused since, or it was live at the last :meth:`read_live_tokens`. The
        service asks this (on its event loop) before it looks up a token from an address whose budget
        of failed authentications is spent: a known token is looked up, junk is refused unread."""
        if not token:
            return False
        token_hash = hash_token(token)
        return token_hash in self._auth_cache or token_hash in self._live

    def live_tokens_due(self) -> bool:
        """Whether the caller should now call :meth:`read_live_tokens` (the last read is
        :data:`LIVE_TOKENS_TTL_S` old and none is under way): True to one caller at a time, at most once
        per :data:`LIVE_TOKENS_TTL_S` whatever the number of unknown tokens asked about."""
        if self._live_reading or time.monotonic() - self._live_at < LIVE_TOKENS_TTL_S:
            return False
        self._live_reading = True
        return True

    def read_live_tokens(self) -> None:
        """Read the hashes of every tenant's live token from the store (one read, as many rows as
        tenants) for :meth:`known`."""
        started = time.monotonic()
        try:
            self._live = {t.token_hash for t in self.store.list_tenants() if not t.revoked}
        finally:  # a failed read is not retried sooner either
            self._live_at, self._live_reading = started, False

    def _fresh(self, key: tuple[str, str], age: float, ttl: float) -> bool:
        """Whether a cached answer of this ``age`` may be used; False makes the caller the one to read
        the store (:meth:`authenticate` and :meth:`quotas` clear the mark once they have read). Past
        ``ttl + REFRESH_GRACE_S`` an answer is never used, whatever the marks say."""
        if age < ttl:
            return True
        if key in self._refreshing:
            return age < ttl + REFRESH_GRACE_S  # another caller's read is under way
        self._refreshing.add(key)
        return False

    def get(self, name: str) -> TenantRecord:
        t = self.store.tenant(name)
        if t is None:
            raise NotFound(f"no tenant named {name!r} (create it first: evalstop tenants add {name} --db ...; an "
                           "embedded evalstop.db of a callback has no tenants: use EvalStopCallback(shadow=True) there)")
        return t

    def list(self) -> list[TenantRecord]:
        return self.store.list_tenants()

    def _update(self, name: str, **changes: Any) -> TenantRecord:
        new = dataclasses.replace(self.get(name), **changes)
        if not self.store.update_tenant(new):
            raise NotFound(f"no tenant named {name!r}")
        self._quota_cache.pop(name, None)
        self._auth_cache.clear()  # a revoked or rotated token is refused at once in this process
        self._live, self._live_at = set(), -math.inf
        self._cleared_at = time.monotonic()
        return new

    def revoke(self, name: str) -> None:
        """Revoke ``name``'s token (raises :class:`NotFound` for an unknown tenant)."""
        self._update(name, revoked=True)

    def rotate(self, name: str) -> str:
        """Give ``name`` a new token (the old one stops working at once) and re-enable it."""
        token = new_token()
        self._update(name, token_hash=hash_token(token), revoked=False)
        return token

    def webhook_secret(self, name: str) -> str:
        return self.get(name).webhook_secret

    def set_quotas(self, name: str, overrides: Mapping[str, Any]) -> Quotas:
        """Override some of the server's quotas for ``name`` (validated); returns its quotas now."""
        current = dict(self.get(name).quotas)
        current.update(overrides)
        quotas = self.default_quotas.with_overrides(current)  # validates
        self._update(name, quotas=current)
        return quotas

    def quotas(self, name: str) -> Quotas:
        """The tenant's quotas: its overrides over the server's defaults (cached a few seconds)."""
        now = self.clock()
        hit = self._quota_cache.get(name)
        if hit is not None and now - hit[0] < _QUOTA_TTL_S:
            return hit[1]
        try:
            t = self.store.tenant(name)
        finally:
            self._refreshing.discard(("quotas", name))
        quotas = self.default_quotas.with_overrides(t.quotas if t is not None else None)
        self._quota_cache[name] = (now, quotas)
        return quotas

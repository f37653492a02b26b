"""Tenants and their tokens: who may call the coordinator.

A token is shown once when a tenant is created; only its SHA-256 is stored. The service turns a
bearer token into a tenant name with :meth:`Tenants.authenticate`; everything after that is
namespaced by that name.

Example::

    >>> from evalstop_trl.stores.memory import MemoryStore
    >>> tenants = Tenants(MemoryStore())
    >>> token = tenants.add("acme")
    >>> tenants.authenticate(token)
    'acme'
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import NotFound, Unauthorized
from .records import TenantRecord, check_name

if TYPE_CHECKING:
    from .store import Store

__all__ = ["Tenants", "hash_token"]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Tenants:
    """Create, authenticate, list and revoke tenants over a store."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store, self.clock = store, clock

    def add(self, name: str) -> str:
        """Create a tenant and return its new token (shown once; only its hash is stored)."""
        check_name("tenant name", name)
        token = "es_" + secrets.token_urlsafe(32)
        self.store.add_tenant(TenantRecord(name, hash_token(token), self.clock()))
        return token

    def authenticate(self, token: str | None) -> str:
        """Return the tenant owning ``token`` or raise :class:`Unauthorized`."""
        if not token:
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        t = self.store.tenant_by_hash(hash_token(token))
        if t is None:
            raise Unauthorized("unknown token: create one with 'evalstop tenants add NAME'")
        if t.revoked:
            raise Unauthorized(f"the token of tenant {t.name!r} was revoked")
        return t.name

    def list(self) -> list[TenantRecord]:
        return self.store.list_tenants()

    def revoke(self, name: str) -> None:
        """Revoke ``name``'s token (raises :class:`NotFound` for an unknown tenant)."""
        if not self.store.revoke_tenant(name):
            raise NotFound(f"no tenant named {name!r}")


"""Store implementations: :class:`MemoryStore` (tests, simulator), :class:`SQLiteStore` (embedded
default) and :class:`~evalstop_trl.stores.postgres.PostgresStore` (several replicas). The interface
they share is :class:`evalstop_trl.core.store.Store`; :func:`open_store` picks one from a location."""

from ..core.store import DONE, Store, StoreError
from .memory import MemoryStore
from .sqlite import SCHEMA_VERSION, SQLiteStore

__all__ = ["DONE", "MemoryStore", "SCHEMA_VERSION", "SQLiteStore", "Store", "StoreError", "open_store"]


def open_store(location: str) -> Store:
    """``postgresql://...`` (or ``postgres://``): a PostgresStore; anything else: a SQLite file path.

    Raises:
        ValueError: the database cannot be opened (the message says why).
    """
    if location.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStore

        return PostgresStore(location)
    return SQLiteStore(location)

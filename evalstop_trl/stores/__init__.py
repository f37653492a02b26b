"""Store implementations: :class:`MemoryStore` (tests, simulator) and :class:`SQLiteStore` (embedded
default). The interface they share is :class:`evalstop_trl.core.store.Store`."""

from ..core.store import DONE, Store, StoreError
from .memory import MemoryStore
from .sqlite import SCHEMA_VERSION, SQLiteStore

__all__ = ["DONE", "MemoryStore", "SCHEMA_VERSION", "SQLiteStore", "Store", "StoreError"]

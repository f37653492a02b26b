"""MemoryStore: the store interface in dicts (it lives in the core, which needs no I/O for it: the
coordinator's default store and the simulator's); re-exported here beside the other stores."""

from ..core.memory_store import MemoryStore

__all__ = ["MemoryStore"]

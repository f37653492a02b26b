"""The durable stores' writer: one thread applies whatever is queued as one batch (group commit), so
many concurrent reports share one fsync, and each caller's ticket resolves once its write is on disk."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..core.store import StoreError, Ticket

__all__ = ["Batch", "WriteQueue"]

#: queued writes: (the operation on the store's connection, its caller's ticket)
Batch = list[tuple[Callable[[Any], None], Future]]


class WriteQueue:
    """A queue of write operations drained by one thread: ``apply(batch)`` commits a batch and
    resolves every ticket in it (a store decides how one bad write is kept from sinking the others).

    Args:
        name: the thread's name; what: the store, for the error after :meth:`close`.
    """

    def __init__(self, apply: Callable[[Batch], None], name: str, what: str) -> None:
        self._apply, self._what = apply, what
        self._cv = threading.Condition()
        self._queue: Batch = []
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, op: Callable[[Any], None]) -> Ticket:
        """Queue ``op``; the ticket resolves when it is durable (or fails with StoreError)."""
        ticket: Future = Future()
        with self._cv:
            if self._closing:
                raise StoreError(f"{self._what} is closed")
            self._queue.append((op, ticket))
            self._cv.notify()
        return ticket

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                batch, self._queue = self._queue, []
                if not batch and self._closing:
                    return
            self._apply(batch)

    def close(self) -> bool:
        """Finish the queued writes and stop the thread; False if it was closed already."""
        with self._cv:
            if self._closing:
                return False
            self._closing = True
            self._cv.notify()
        self._thread.join()
        return True


def store_error(exc: BaseException) -> StoreError:
    """The error a caller's ticket gets for a write that failed with ``exc``."""
    error = StoreError(f"write not stored: {exc}")
    error.__cause__ = exc
    return error

"""The simulator's clock and event queue: one ``now``, one heap, deterministic ties.

Modelled on SimPy's ``Environment``: the queue owns the only clock. An event is the tuple
``(time, kind, seq, job_id, version)``, ordered by time, then by kind (an :class:`Event` value is its
priority at equal times), then by ``seq``, a counter that grows with every push, so two runs of the
same workload pop events in exactly the same order. ``version`` is the job's version when the event
was pushed; the engine bumps a job's version whenever it leaves the GPUs, which makes its queued
events *stale* (they are popped and skipped, never searched for and removed).

Example::

    >>> q = EventQueue()
    >>> q.push(5.0, Event.ARRIVAL, job_id=1)
    >>> q.push(5.0, Event.EVAL_DUE, job_id=0, version=2)
    >>> q.push(1.0, Event.ARRIVAL, job_id=0)
    >>> q.peek(), len(q)
    (1.0, 3)
    >>> [q.pop()[:2] for _ in range(3)]  # EVAL_DUE before ARRIVAL at equal times
    [(1.0, <Event.ARRIVAL: 3>), (5.0, <Event.EVAL_DUE: 0>), (5.0, <Event.ARRIVAL: 3>)]
    >>> q.now
    5.0

The engine handles one instant at a time: :meth:`EventQueue.pop_due` yields every event of the next
instant (then the engine plans once)::

    >>> q.push(7.0, Event.FINISH, job_id=0, version=2)
    >>> q.push(7.0, Event.ARRIVAL, job_id=2)
    >>> [(kind.name, job) for _, kind, _, job, _ in q.pop_due()], q.now
    ([('FINISH', 0), ('ARRIVAL', 2)], 7.0)
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from enum import IntEnum

__all__ = ["Event", "EventQueue", "QueuedEvent"]

QueuedEvent = tuple[float, "Event", int, int, int]  # (time, kind, seq, job_id, version)

_heappush, _heappop = heapq.heappush, heapq.heappop


class Event(IntEnum):
    """Event kinds; the value is the priority at equal times (lower first).

    There is no RESTART_DONE event: a resumed job's restart overhead is folded into the time of its
    next EVAL_DUE or FINISH (work accrues only from ``run_since``), which saves one event per resume."""

    EVAL_DUE = 0
    FINISH = 1
    RESCHEDULE = 2  # a running job's place in line changes now by itself (a Tiresias demotion): plan again
    ARRIVAL = 3
    SCHED_ROUND = 4


class EventQueue:
    """A min-heap of events and the simulation clock ``now`` (advanced only by popping).

    ``heap`` is the heap itself, for reading (the engine runs while it is not empty); events go in
    through :meth:`push`, which numbers them, and come out through :meth:`pop` or :meth:`pop_due`."""

    __slots__ = ("now", "heap", "_seq")

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.heap: list[QueuedEvent] = []
        self._seq = itertools.count(1)

    def push(self, time: float, kind: Event, job_id: int = -1, version: int = 0) -> None:
        """Queue an event of ``kind`` at ``time`` (never before ``now``) for ``job_id`` (-1: none)."""
        _heappush(self.heap, (time, kind, next(self._seq), job_id, version))

    def peek(self) -> float:
        """Time of the next event (infinity when the queue is empty)."""
        return self.heap[0][0] if self.heap else math.inf

    def pop(self) -> QueuedEvent:
        """Remove the next event, advance ``now`` to its time and return it."""
        event = _heappop(self.heap)
        self.now = event[0]
        return event

    def pop_due(self) -> Iterator[QueuedEvent]:
        """Advance ``now`` to the next event's time and pop every event due then, in order, including
        events pushed for that same time while the caller handles the earlier ones."""
        heap = self.heap
        t = self.now = heap[0][0]
        while heap and heap[0][0] == t:
            yield _heappop(heap)

    def __len__(self) -> int:
        return len(self.heap)

    def __bool__(self) -> bool:
        return bool(self.heap)

    def __repr__(self) -> str:
        return f"EventQueue(now={self.now!r}, queued={len(self.heap)})"

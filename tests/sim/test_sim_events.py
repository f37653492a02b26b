"""The event queue: time order, priority at equal times, deterministic ties, one clock."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from platform_sim.events import Event, EventQueue


def test_equal_times_pop_by_priority_then_push_order():
    q = EventQueue()
    for job_id, kind in enumerate([Event.SCHED_ROUND, Event.ARRIVAL, Event.FINISH, Event.EVAL_DUE, Event.ARRIVAL]):
        q.push(10.0, kind, job_id)
    assert [(e[1], e[3]) for e in q.pop_due()] == [
        (Event.EVAL_DUE, 3), (Event.FINISH, 2), (Event.ARRIVAL, 1), (Event.ARRIVAL, 4), (Event.SCHED_ROUND, 0)]
    assert q.now == 10.0 and not q and q.peek() == math.inf


def test_pop_due_includes_events_pushed_for_the_same_instant():
    q = EventQueue()
    q.push(1.0, Event.ARRIVAL, 0)
    q.push(2.0, Event.ARRIVAL, 1)
    seen = []
    for e in q.pop_due():
        seen.append(e[3])
        if e[3] == 0:
            q.push(1.0, Event.FINISH, 9)
    assert seen == [0, 9] and q.now == 1.0 and len(q) == 1


@given(st.lists(st.tuples(st.integers(0, 5).map(float), st.sampled_from(list(Event))), max_size=40))
def test_pops_are_sorted_and_the_clock_never_goes_back(items):
    q = EventQueue()
    for i, (t, kind) in enumerate(items):
        q.push(t, kind, i)
    popped = [q.pop() for _ in range(len(q))]
    assert popped == sorted(popped)  # (time, priority, seq): a total order, so ties are deterministic
    assert [e[0] for e in popped] == sorted(t for t, _ in items)
    assert q.now == (popped[-1][0] if popped else 0.0)

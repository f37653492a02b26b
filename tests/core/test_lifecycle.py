"""Every lifecycle Enum, checked over all (from, to) pairs against its table written out here."""

from __future__ import annotations

import itertools
from enum import Enum

import pytest

from evalstop_trl.core.errors import Conflict
from evalstop_trl.core.lifecycle import IllegalTransition, Lifecycle, transitions
from evalstop_trl.core.records import Escalation, JobStatus

# the legal moves, written independently of the code's tables (staying put is always legal)
EXPECTED = {
    JobStatus: {
        ("pending", "running"), ("pending", "stopped"), ("pending", "finished"), ("pending", "failed"),
        ("running", "stopped"), ("running", "finished"), ("running", "failed"),
        ("pending", "lost"), ("running", "lost"),  # silent past the lease
        ("lost", "running"), ("lost", "stopped"), ("lost", "finished"), ("lost", "failed"),  # seen again
    },
    Escalation: {
        ("grace", "sigterm"), ("grace", "done"), ("sigterm", "sigkill"), ("sigterm", "done"), ("sigkill", "done"),
    },
}
TERMINAL = {JobStatus: {"stopped", "finished", "failed"}, Escalation: {"done"}}

PAIRS = [(cls, a, b) for cls in EXPECTED for a, b in itertools.product(cls, cls)]


@pytest.mark.parametrize("cls, old, new", PAIRS, ids=[f"{c.__name__}:{a.value}->{b.value}" for c, a, b in PAIRS])
def test_every_pair(cls, old, new):
    legal = old is new or (old.value, new.value) in EXPECTED[cls]
    assert old.can(new) is legal
    if legal:
        assert old.to(new) is new
    else:
        with pytest.raises(IllegalTransition) as exc:
            old.to(new)
        assert isinstance(exc.value, Conflict)  # the service answers 409
        assert f"is {old.value}: it cannot become {new.value}" in str(exc.value)


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_terminal_states_come_from_the_table(cls):
    assert {s.value for s in cls if s.terminal} == TERMINAL[cls]


def test_a_table_must_name_every_state_and_only_known_states():
    with pytest.raises(ValueError, match=r"missing \['B'\]"):
        @transitions({"A": set()})
        class Missing(Lifecycle, str, Enum):
            A = "a"
            B = "b"
    with pytest.raises(ValueError, match=r"unknown state\(s\) \['C'\]"):
        @transitions({"A": {"C"}, "B": set()})
        class Unknown(Lifecycle, str, Enum):
            A = "a"
            B = "b"

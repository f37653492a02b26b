"""Public records: frozen, read-only inside, picklable (ranks broadcast them), round-trip through dicts."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from evalstop_trl.core.codec import from_wire, to_wire
from evalstop_trl.core.detectors import Action, Decision, Observation
from evalstop_trl.core.records import AuditKind, AuditRecord, JobRecord, JobType, JobView, Policy, Report
from evalstop_trl.core.requests import ReportRequest

DECISION = Decision(Action.STOP, "2 consecutive declines", 20, 0.7, {"declines": 2, "steps": [20, 30, 40]})
RECORDS = [
    DECISION,
    Policy("decline", {"k": 3}),
    AuditRecord("acme", "j", 1.0, AuditKind.STOP, "detector:decline", "why", {"step": 40}),
    JobView("j", "grpo", "stopped", {"detector": "decline", "k": 2}, DECISION, 20, 0.7, None, 4, 40, 100, True),
    Report(10, 0.5, 0.1, 1.2, None, received_at=3.0),
    JobRecord("acme", "j", JobType.GRPO, 100, Policy(), last_seen=4.0),
    Observation("j", 10, 0.5),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_frozen_and_picklable(record):
    assert pickle.loads(pickle.dumps(record)) == record
    if isinstance(record, tuple):  # the hot-path records are NamedTuples
        field, error = record._fields[0], AttributeError
    else:
        field, error = dataclasses.fields(record)[0].name, dataclasses.FrozenInstanceError
    with pytest.raises(error):
        setattr(record, field, None)


@pytest.mark.parametrize("mapping", [DECISION.evidence, Policy("decline").params, RECORDS[2].evidence,
                                     RECORDS[3].policy])
def test_mappings_inside_are_read_only(mapping):
    with pytest.raises(TypeError):
        mapping["x"] = 1  # type: ignore[index]


def test_round_trips():
    assert from_wire(Decision, to_wire(DECISION)) == DECISION
    assert from_wire(JobView, to_wire(RECORDS[3])) == RECORDS[3]
    assert Policy.from_dict(RECORDS[1].to_dict()) == RECORDS[1]
    assert RECORDS[4].request() == ReportRequest(10, 0.5, 0.1, 1.2)  # what idempotency compares: not the arrival time


def test_a_stored_report_is_the_request_and_what_the_coordinator_adds():
    """A report field is declared once, on the request record: the stored Report carries every field
    of it by name (and only ``received_at`` and ``planned_steps`` besides), and is built from it by name."""
    from evalstop_trl.core.requests import field_names

    assert Report._fields == (*field_names(ReportRequest), "received_at", "planned_steps")
    request = ReportRequest(7, 0.25, 1.5, 0.75, "ckpt-7", 64, 0.01, 0.125, 312.5)
    report = Report.of(request, 12.5, 100)
    assert report.request() == request and (report.received_at, report.planned_steps) == (12.5, 100)

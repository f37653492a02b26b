"""The trusted constructors of frozen, slotted records: same values as the dataclass, no validation."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from evalstop_trl.core.detectors import Action, Decision, Observation
from evalstop_trl.core.frozen import evolver, trusted_init
from evalstop_trl.core.records import JobRecord, JobStatus, JobType, Policy, Registration, Report


@dataclasses.dataclass(frozen=True, slots=True)
class _Point:
    x: int
    y: int = 0

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("x must be >= 0")


@dataclasses.dataclass(frozen=True)
class _Unslotted:
    x: int


def test_trusted_init_equals_the_dataclass_and_skips_post_init():
    make = trusted_init(_Point)
    assert make(1, 2) == _Point(1, 2)
    assert make(-1, 0).x == -1  # no validation: the caller's values are trusted
    with pytest.raises(TypeError):
        make(1)  # every field, positionally
    with pytest.raises(dataclasses.FrozenInstanceError):
        make(1, 2).x = 3


def test_evolver_is_replace_without_post_init():
    move = evolver(_Point)
    p = _Point(1, 2)
    assert move(p, y=5) == dataclasses.replace(p, y=5)
    assert move(p) == p and move(p) is not p
    with pytest.raises(TypeError):
        move(p, z=1)


def test_an_unslotted_class_is_refused():
    with pytest.raises(ValueError, match="slotted"):
        trusted_init(_Unslotted)


@pytest.mark.parametrize("cls, values", [
    (Observation, ("j", 3, 0.5, 1.0, None, "grpo", 0.3)),
    (Report, (3, 0.5, None, 0.2, "ckpt", 12.5)),
    (Decision, (Action.STOP, "why", 2, 0.9, {"k": 2})),
])
def test_the_records_trusted_constructors_match_their_dataclasses(cls, values):
    make = cls.trusted if hasattr(cls, "trusted") else trusted_init(cls)
    built = make(*values)
    assert built == cls(*values)
    assert pickle.loads(pickle.dumps(built)) == built


def test_job_record_new_and_evolve_match_the_dataclass():
    reg = Registration.parse("j", "grpo", 10, {"detector": "decline", "k": 3})
    rec = JobRecord.new("t", reg, 5.0)
    assert rec == JobRecord("t", "j", JobType.GRPO, 10, Policy("decline", {"k": 3}), None,
                            JobStatus.PENDING, 5.0, 5.0)
    moved = rec.evolve(status=JobStatus.RUNNING, updated_at=6.0)
    assert moved == dataclasses.replace(rec, status=JobStatus.RUNNING, updated_at=6.0)
    assert rec.status is JobStatus.PENDING


def test_built_records_behave_as_ordinary_instances():
    import copy

    make = trusted_init(_Point)
    p = make(1, 2)
    assert type(p) is _Point and hash(p) == hash(_Point(1, 2))
    assert copy.copy(p) == p and copy.deepcopy(p) == p
    assert pickle.loads(pickle.dumps(Report.trusted(3, 0.5, None, 0.2, "c", 1.0))) == Report(3, 0.5, None, 0.2, "c", 1.0)
    assert dataclasses.replace(p, y=7) == _Point(1, 7)
    with pytest.raises(ValueError, match="x must be >= 0"):
        dataclasses.replace(p, x=-1)  # the class's own validation still runs on its own paths
    assert not hasattr(p, "__dict__")  # still slotted: the mutable twin left nothing behind


def test_a_field_named_like_the_generated_code_is_refused():
    @dataclasses.dataclass(frozen=True, slots=True)
    class Clash:
        obj: int

    with pytest.raises(ValueError, match="obj, names the generated code uses"):
        trusted_init(Clash)

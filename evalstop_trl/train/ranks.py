"""What rank 0 tells every rank at a decision point, as one typed record.

In multi-process training only rank 0 talks to the coordinator. At each decision point (the start of
training, each eval, each step of an externally evaluated run) it broadcasts a :class:`RankMessage`;
every rank applies the same message at the same point, so all ranks stop at the same step and know
the same best.

    >>> from evalstop_trl.core.detectors import Action, Decision
    >>> m = RankMessage(stop=True, decision=Decision(Action.STOP, "2 declines"), best_step=10, best_score=0.5)
    >>> RankMessage.from_wire(m.to_wire()) == m
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.codec import from_wire, to_wire
from ..core.detectors import Decision
from .distributed import broadcast_object

__all__ = ["RankMessage", "share"]


@dataclass(frozen=True)
class RankMessage:
    """Rank 0's decision and best, as every rank must know them.

    Attributes:
        stop: every rank sets ``control.should_training_stop`` at this point.
        decision: the decision that stands (None before the first report).
        best_step, best_score, best_checkpoint: the best eval so far and where its model is.
        job_id: the job's id (rank 0 may rename a rerun to ``NAME-2``).
    """

    stop: bool = False
    decision: Decision | None = None
    best_step: int | None = None
    best_score: float | None = None
    best_checkpoint: str | None = None
    job_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """Plain Python values (picklable, JSON-able): what ``broadcast_object`` sends."""
        return {"stop": self.stop, "decision": None if self.decision is None else to_wire(self.decision),
                "best_step": self.best_step, "best_score": self.best_score,
                "best_checkpoint": self.best_checkpoint, "job_id": self.job_id}

    @classmethod
    def from_view(cls, view: Any, *, stop: bool) -> RankMessage:
        """The message for a job's view (e.g. the job external evaluators' scores stopped)."""
        return cls(stop, view.decision, view.best_step, view.best_score, view.best_checkpoint, view.job_id)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> RankMessage:
        """The message :meth:`to_wire` wrote."""
        decision = wire.get("decision")
        return cls(stop=bool(wire.get("stop", False)),
                   decision=None if decision is None else from_wire(Decision, decision),
                   best_step=wire.get("best_step"), best_score=wire.get("best_score"),
                   best_checkpoint=wire.get("best_checkpoint"), job_id=wire.get("job_id"))


def share(message: RankMessage | None) -> RankMessage | None:
    """Rank 0's ``message`` on every rank, at the same point (the other ranks pass None).

    Without ``torch.distributed`` (one process) the message makes the same round trip through its wire
    form, so single-process runs exercise the path multi-process ones take. None from rank 0 (nothing
    to say this step) is None everywhere.
    """
    wire = broadcast_object(None if message is None else message.to_wire())
    return None if wire is None else RankMessage.from_wire(wire)

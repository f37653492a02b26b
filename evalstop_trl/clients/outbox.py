"""The HTTP client's durable outbox: operations kept while the coordinator is unreachable.

A JSONL file (one operation a line, fsync'd on append) or memory only. Replay order is
registrations first, then each job's operations in order: reports by step, then ack, finish, fail.
A torn last line (a crash mid-write) is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["OP_ORDER", "Operation", "Outbox"]

log = logging.getLogger("evalstop.client")

#: fail-open operations, in the order they replay within one job
OP_ORDER = {"register": 0, "report": 1, "ack": 2, "finish": 3, "fail": 4}


@dataclass(frozen=True, slots=True)
class Operation:
    """One queued request: which fail-open operation, for which job, to which path, with which body."""

    op: str
    job_id: str
    path: str
    body: dict[str, Any] | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "job_id": self.job_id, "path": self.path, "body": self.body}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Operation:
        return cls(d["op"], d["job_id"], d["path"], d.get("body"))


class Outbox:
    """Queued operations, in memory and (when ``path`` is set) in a JSONL file."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path else None
        self._ops: list[Operation] = self._load()

    def __len__(self) -> int:
        return len(self._ops)

    def __bool__(self) -> bool:
        return bool(self._ops)

    def _load(self) -> list[Operation]:
        if not self.path or not self.path.exists():
            return []
        ops = []
        for line in self.path.read_text().splitlines():
            try:
                ops.append(Operation.from_dict(json.loads(line)))
            except json.JSONDecodeError:
                log.warning("skipping a torn line in outbox %s", self.path)  # a crash mid-write
        return ops

    def append(self, op: Operation) -> None:
        self._ops.append(op)
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as fh:
                fh.write(json.dumps(op.to_dict()) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def in_replay_order(self) -> None:
        """Sort for replay: registrations first, then each job's operations (reports by step)."""
        first_seen: dict[str, int] = {}
        for e in self._ops:
            first_seen.setdefault(e.job_id, len(first_seen))
        self._ops.sort(key=lambda e: (-1 if e.op == "register" else first_seen[e.job_id], OP_ORDER[e.op],
                                      (e.body or {}).get("step", 0)))

    def peek(self) -> Operation:
        return self._ops[0]

    def pop(self) -> Operation:
        return self._ops.pop(0)

    def save(self) -> None:
        """Rewrite the file from memory (atomically; removed when empty)."""
        if not self.path:
            return
        if not self._ops:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write("".join(json.dumps(e.to_dict()) + "\n" for e in self._ops))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

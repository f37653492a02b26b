"""The HTTP client's durable outbox: operations kept while the coordinator is unreachable.

A JSONL file (one operation a line, fsync'd on append) or memory only. Replay order is
registrations first, then each job's operations in order: reports by step, then ack, finish, fail.
A torn last line (a crash mid-write) is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.records import NAME_PATTERN

__all__ = ["OP_ORDER", "Operation", "Outbox"]

log = logging.getLogger("evalstop.client")

_NAME = re.compile(NAME_PATTERN)

#: fail-open operations, in the order they replay within one job
OP_ORDER = {"register": 0, "report": 1, "snapshot": 1, "ack": 2, "finish": 3, "fail": 4}


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
    def from_dict(cls, d: Any) -> Operation:
        """Parse one outbox line's object; ValueError if it is not a valid operation."""
        if not isinstance(d, dict):
            raise ValueError(f"an operation must be an object, got {type(d).__name__}")
        op, job_id, path, body = d.get("op"), d.get("job_id"), d.get("path"), d.get("body")
        if op not in OP_ORDER:
            raise ValueError(f"unknown op {op!r}")
        if not isinstance(job_id, str) or not _NAME.fullmatch(job_id):
            raise ValueError(f"bad job_id {job_id!r}")
        if not isinstance(path, str) or not path.startswith("/v1/jobs") or len(path) > 300:
            raise ValueError(f"bad path {path!r}")
        if body is not None and not isinstance(body, dict):
            raise ValueError("body must be an object or null")
        if op == "report" and (body is None or not isinstance(body.get("step"), int)):
            raise ValueError("a report needs an integer step")
        return cls(op, job_id, path, body)


class Outbox:
    """Queued operations, in memory and (when ``path`` is set) in a JSONL file."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path else None
        try:
            self._ops: list[Operation] = self._load()
        except OSError as exc:
            self._to_memory(exc)
            self._ops = []

    def __len__(self) -> int:
        return len(self._ops)

    def __bool__(self) -> bool:
        return bool(self._ops)

    def _to_memory(self, exc: OSError) -> None:
        log.warning("EvalStop outbox %s cannot be used (%s); keeping queued operations in memory only",
                    self.path, exc.strerror or exc)
        self.path = None

    def _load(self) -> list[Operation]:
        if not self.path or not self.path.exists():
            return []
        ops, bad = [], []
        for raw in self.path.read_bytes().splitlines():
            try:
                ops.append(Operation.from_dict(json.loads(raw.decode("utf-8"))))
            except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
                bad.append((raw, exc))
        if bad:
            quarantine = self.path.with_name(self.path.name + ".bad")
            with open(quarantine, "ab") as fh:
                fh.write(b"".join(raw + b"\n" for raw, _ in bad))
            log.warning("EvalStop outbox %s: %d invalid line(s) moved to %s (first: %s)", self.path, len(bad),
                        quarantine, bad[0][1])
            self._ops = ops
            self.save()
        return ops

    def append(self, op: Operation) -> None:
        self._ops.append(op)
        if self.path:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a") as fh:
                    fh.write(json.dumps(op.to_dict()) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError as exc:
                self._to_memory(exc)

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
        try:
            if not self._ops:
                self.path.unlink(missing_ok=True)
                return
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "w") as fh:
                fh.write("".join(json.dumps(e.to_dict()) + "\n" for e in self._ops))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            self._to_memory(exc)

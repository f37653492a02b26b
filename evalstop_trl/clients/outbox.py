"""The HTTP client's durable outbox: operations kept while the coordinator is unreachable.

A JSONL file (one operation a line, fsync'd on append) or memory only. Replay order is
registrations first, then each job's operations in order: reports by step, then ack, finish, fail.

A line that is not a valid operation (a torn last line after a crash, bytes that are not UTF-8, JSON
nested too deep to parse, a NaN or a string where a step goes, an unknown operation) never blocks
the replay nor crashes the training process that opens the outbox: it is moved to
``<outbox>.quarantine`` (one JSON object a line: ``{"reason": ..., "line": ...}``), one warning is
logged, and the other lines replay.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.records import MAX_STEP, NAME_PATTERN

__all__ = ["MAX_LINE", "OP_ORDER", "Operation", "Outbox"]

log = logging.getLogger("evalstop.client")

_NAME = re.compile(NAME_PATTERN)

#: fail-open operations, in the order they replay within one job
OP_ORDER = {"register": 0, "report": 1, "snapshot": 1, "ack": 2, "finish": 3, "fail": 4}
MAX_LINE = 1 << 20  # bytes of one outbox line (a request body is far smaller)
_MAX_DEPTH = 16  # nesting of one line's JSON (a policy is two levels deep)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")


def _depth(raw: bytes) -> int:
    """How deep the brackets of a JSON text nest (an upper bound: brackets in strings count too),
    measured before parsing, so a line of a million '[' is refused without a RecursionError."""
    depth = deepest = 0
    for byte in raw:
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


def _parse(raw: bytes) -> Operation:
    """One outbox line -> its Operation; ValueError with the reason otherwise."""
    if len(raw) > MAX_LINE:
        raise ValueError(f"the line is longer than {MAX_LINE} bytes")
    if _depth(raw) > _MAX_DEPTH:
        raise ValueError(f"the line nests deeper than {_MAX_DEPTH} levels")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise ValueError("the line is not UTF-8") from None
    except RecursionError:
        raise ValueError("the line nests too deep") from None
    return Operation.from_dict(data)


def _check_step(op: str, step: Any, required: bool) -> None:
    if step is None and not required:
        return
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise ValueError(f"a {op}'s step must be an integer in [0, {MAX_STEP}], but got {step!r:.40}")


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
        if (body is not None and "step" in body) or op in ("report", "snapshot"):
            _check_step(op, (body or {}).get("step"), required=op in ("report", "snapshot"))
        try:
            json.dumps(body, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"the body is not strict JSON ({exc})") from None
        return cls(op, job_id, path, body)

    def checked(self) -> Operation:
        """This operation if an outbox line of it would load again (ValueError otherwise): what is
        queued must be able to replay."""
        return Operation.from_dict(self.to_dict())


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
        ops: list[Operation] = []
        bad: list[tuple[bytes, str]] = []
        for raw in self.path.read_bytes().splitlines():
            if not raw.strip():
                continue
            try:
                ops.append(_parse(raw))
            except ValueError as exc:  # JSONDecodeError is a ValueError
                bad.append((raw, str(exc)))
        if bad:
            self._quarantine(bad)
            self._ops = ops
            self.save()
        return ops

    def _quarantine(self, bad: list[tuple[bytes, str]]) -> None:
        """Move invalid lines to ``<outbox>.quarantine`` with the reason; one warning for all of them."""
        quarantine = self.path.with_name(self.path.name + ".quarantine")
        lines = "".join(json.dumps({"reason": reason, "line": raw[:MAX_LINE].decode("utf-8", "backslashreplace")})
                        + "\n" for raw, reason in bad)
        with open(quarantine, "a") as fh:
            fh.write(lines)
            fh.flush()
            os.fsync(fh.fileno())
        log.warning("EvalStop outbox %s: %d invalid line(s) moved to %s (first: %s)", self.path, len(bad),
                    quarantine, bad[0][1])

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
                                      (e.body or {}).get("step") or 0))

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

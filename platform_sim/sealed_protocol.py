"""The sealed overlay's wire format: length-prefixed JSON frames over a pipe, read with limits.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. JSON both ways:
nothing is unpickled on either side. The engine's side (:mod:`platform_sim.sealed`) trusts nothing
the overlay's process sends: a frame longer than its limit, a reply of the wrong shape, a silence
longer than the timeout or an exit is a :class:`SealedOverlayError` naming what went wrong.

Messages, parent (engine) to child (overlay):

* hello ``{"overlay": NAME or "module:Class", "params": {...}, "n_evals": N, "path": [...]}``;
* event batches ``[[kind, t, ...], ...]``: ``"a"`` an arrival, followed by the job's visible fields
  (:data:`~platform_sim.views.VISIBLE_FIELDS`, in order); ``"e"`` an eval: job id, eval index,
  score, loss, proxy reward, progress, waiting since, GPU-hours, GPU-hours of the loss record, pool,
  speed. A
  batch that ends with ``"?"`` asks for a reply.

Child to parent: ``{"name": ..., "eval": bool, "cut": bool, "hardened": bool}`` once (ready), then one reply per
batch that asked: a list with, in order, a cut (a number in [0, 1] or null) for each arrival when
the overlay plans cuts, and a stop decision (true/false) for each eval; or ``{"error": TEXT}``.

Example::

    >>> frame = encode({"stop": [True, False]})
    >>> frame[:4], decode(frame[4:], 64)
    (b'\\x00\\x00\\x00\\x15', {'stop': [True, False]})
    >>> decode(b'[NaN]', 64)
    Traceback (most recent call last):
    ...
    platform_sim.sealed_protocol.SealedOverlayError: the sealed overlay sent a frame that is not strict JSON (NaN)
"""

from __future__ import annotations

import json
import math
import os
import select
import struct
import time
from typing import Any

__all__ = ["ARRIVAL", "ASK", "EVAL", "HEADER", "SealedOverlayError", "FrameReader", "decode", "encode",
           "read_frame_blocking", "send_frame", "check_name"]

HEADER = struct.Struct(">I")
ARRIVAL, EVAL, ASK = "a", "e", "?"
_DUMPS = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


class SealedOverlayError(RuntimeError):
    """The sealed overlay's process failed, was too slow, or broke the protocol."""


def encode(obj: Any) -> bytes:
    """``obj`` as one frame (header + compact JSON; NaN and infinities are refused)."""
    body = _DUMPS(obj).encode()
    return HEADER.pack(len(body)) + body


def _no_constant(name: str) -> Any:
    raise SealedOverlayError(f"the sealed overlay sent a frame that is not strict JSON ({name})")


def decode(body: bytes, limit: int) -> Any:
    """The JSON value of one frame's body (at most ``limit`` bytes).

    Raises:
        SealedOverlayError: too long, not UTF-8, not strict JSON, or nested too deeply."""
    if len(body) > limit:
        raise SealedOverlayError(f"the sealed overlay sent a frame of {len(body)} bytes; the limit is {limit}")
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, SealedOverlayError):
            raise
        raise SealedOverlayError(f"the sealed overlay sent a frame that is not JSON ({type(exc).__name__})") from None


def check_name(value: Any) -> str:
    """An overlay name from the child: a short printable string."""
    if not isinstance(value, str) or not 0 < len(value) <= 64 or not value.isprintable():
        raise SealedOverlayError(f"the sealed overlay sent a bad name {str(value)[:80]!r}")
    return value


def send_frame(fd: int, data: bytes, timeout_s: float) -> None:
    """Write ``data`` to the non-blocking ``fd`` within ``timeout_s`` (a child that stops reading
    cannot block the engine)."""
    view, deadline = memoryview(data), time.monotonic() + timeout_s
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            n = 0
        except (BrokenPipeError, ConnectionResetError):
            raise SealedOverlayError("the sealed overlay's process closed its input (it exited)") from None
        view = view[n:]
        if view:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise SealedOverlayError(f"the sealed overlay did not read its input for {timeout_s:g} s")


class FrameReader:
    """Reads frames from the child's output ``fd`` with a timeout and a size limit."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def _fill(self, need: int, deadline: float, timeout_s: float) -> None:
        while len(self.buf) < need:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise SealedOverlayError(f"the sealed overlay did not answer within {timeout_s:g} s")
            chunk = os.read(self.fd, max(65536, need - len(self.buf)))
            if not chunk:
                raise SealedOverlayError("the sealed overlay's process closed its output (it exited)")
            self.buf += chunk

    def read(self, timeout_s: float, limit: int) -> Any:
        """The next frame's JSON value.

        Raises:
            SealedOverlayError: no complete frame within ``timeout_s``, the process exited, or the
                frame is over ``limit`` bytes or not strict JSON."""
        deadline = time.monotonic() + timeout_s
        self._fill(HEADER.size, deadline, timeout_s)
        (size,) = HEADER.unpack_from(self.buf)
        if size > limit:
            raise SealedOverlayError(f"the sealed overlay announced a frame of {size} bytes; the limit is {limit}")
        self._fill(HEADER.size + size, deadline, timeout_s)
        body = bytes(self.buf[HEADER.size:HEADER.size + size])
        del self.buf[:HEADER.size + size]
        return decode(body, limit)


def read_frame_blocking(fd: int) -> Any:
    """The next frame from the trusted parent (the child's side; None at end of input)."""
    head = _read_exactly(fd, HEADER.size)
    if head is None:
        return None
    body = _read_exactly(fd, HEADER.unpack(head)[0])
    if body is None:
        return None
    return json.loads(body)


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def finite_unit(value: Any) -> bool:
    """A cut: a finite number in [0, 1] (bools are not numbers here)."""
    return type(value) in (int, float) and math.isfinite(value) and 0.0 <= value <= 1.0

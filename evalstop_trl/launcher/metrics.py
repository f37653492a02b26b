"""World feedback read from the logs a command writes, for trainers that cannot take a callback.

``evalstop run --metric-from jsonl:PATH --metric KEY -- CMD`` (or ``tensorboard:DIR --metric TAG``):
the launcher follows what the command writes and reports each new value of the metric as the job's
eval at its step; the coordinator decides as for any job, and the launcher delivers a stop as it
always does (SIGTERM after ``--grace-s``, then SIGKILL).

* ``jsonl``: one JSON object per line, either verl's file logger (``trainer.logger=[..., 'file']``,
  ``verl/utils/tracking.py``: ``{"step": N, "elapsed_seconds": ..., "data": {KEY: value, ...}}`` at
  ``$VERL_FILE_LOGGER_PATH``; its validation metrics are ``val-core/<source>/<metric>/...``) or plain
  ``{"step": N, KEY: value}``. Lines without the key are skipped; a partial last line waits for its
  end; a line over :data:`MAX_LINE` bytes is skipped; a file replaced or truncated (rotation) is read
  again from its start, steps already reported skipped.
* ``tensorboard``: the event files under DIR (any writer: torch's ``SummaryWriter``, TF2, OpenRLHF's
  and torchtune's TensorBoard loggers), new files and new events as they appear; the scalar of TAG.

Steps must increase: a step at or before the last one reported is skipped (a resumed run rewrites
some). Memory stays bounded: one read of at most :data:`READ_CHUNK` bytes per poll, the position in
each file, no history.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..clients.api import EvalStopAPI
from ..core.browse import finite_float
from .watch import log_text

__all__ = ["KINDS", "MAX_LINE", "READ_CHUNK", "JsonlTail", "MetricFrom", "MetricReporter", "TensorBoardTail"]

log = logging.getLogger("evalstop.launcher")

MAX_LINE = 1 << 20  # bytes: a longer line is not a metrics record
READ_CHUNK = 4 << 20  # bytes read at most per poll
MAX_EVENT_FILES = 1000
Point = tuple[int, "float | None"]


@dataclass(frozen=True)
class MetricFrom:
    """Where the metric comes from: ``kind`` (``jsonl`` or ``tensorboard``), ``path`` and the ``key``
    (a JSON key, or a TensorBoard tag)."""

    kind: str
    path: Path
    key: str

    @classmethod
    def parse(cls, spec: str, key: str | None) -> MetricFrom:
        """``jsonl:PATH`` or ``tensorboard:DIR`` with ``--metric KEY``.

        Raises:
            ValueError: an unknown kind, no path or no key (the message shows the form).
        """
        kind, sep, path = spec.partition(":")
        if not sep or kind not in KINDS or not path:
            raise ValueError(f"--metric-from must be jsonl:PATH or tensorboard:DIR, but got {spec!r}")
        if not key:
            raise ValueError("--metric-from needs --metric KEY: the JSON key (e.g. verl's "
                             "val-core/openai/gsm8k/reward/mean@1) or the TensorBoard tag to read")
        return cls(kind, Path(path), key)

    def open(self) -> JsonlTail | TensorBoardTail:
        """A follower of this source."""
        return KINDS[self.kind](self.path, self.key)


class JsonlTail:
    """Follows a JSONL file: :meth:`poll` returns the (step, value) points of the lines written since."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = Path(path), key
        self._file: Any = None
        self._inode: tuple[int, int] | None = None
        self._partial = b""
        self._skipping = False  # inside a line over MAX_LINE: drop up to its end
        self.exists = False

    def poll(self) -> list[Point]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []
        self.exists = True
        inode = (st.st_dev, st.st_ino)
        if self._file is None or inode != self._inode or st.st_size < self._file.tell():  # new, replaced, truncated
            self.close()
            self._file, self._inode = open(self.path, "rb"), inode  # noqa: SIM115 - kept open between polls
            self._partial, self._skipping = b"", False
        chunk = self._file.read(READ_CHUNK)
        if not chunk:
            return []
        *lines, rest = (self._partial + chunk).split(b"\n")
        if self._skipping and lines:
            lines, self._skipping = lines[1:], False
        if len(rest) > MAX_LINE:
            log.warning("evalstop run: a line of %s is over %d bytes: skipped", log_text(str(self.path)), MAX_LINE)
            rest, self._skipping = b"", True
        self._partial = b"" if self._skipping else rest
        return [p for p in map(self._point, lines) if p is not None]

    def _point(self, line: bytes) -> Point | None:
        if len(line) > MAX_LINE or not line.strip():
            return None
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict):
            return None
        record = obj["data"] if isinstance(obj.get("data"), dict) else obj  # verl's file logger, or plain
        step = obj.get("step")
        if self.key not in record or isinstance(step, bool) or not isinstance(step, int) or step < 0:
            return None
        return step, finite_float(record[self.key])  # NaN, inf, a string: a failed eval (missing)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardTail:
    """Follows the TensorBoard event files under a folder: :meth:`poll` returns the new scalars of ``tag``."""

    def __init__(self, path: Path, tag: str) -> None:
        self.path, self.key = Path(path), tag
        self._loaders: dict[Path, Any] = {}
        self.exists = False

    def poll(self) -> list[Point]:
        try:
            from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
            from tensorboard.util import tensor_util

            from ..analysis.histories import tb_scalar
        except ImportError as exc:
            raise RuntimeError("--metric-from tensorboard needs the tensorboard package; run: "
                               "pip install 'evalstop[calibrate]'") from exc
        if not self.path.is_dir():
            return []
        self.exists = True
        for file in sorted(p for p in self.path.rglob("*") if ".tfevents." in p.name and p.is_file()
                           and not p.is_symlink())[:MAX_EVENT_FILES]:
            if file not in self._loaders:
                self._loaders[file] = EventFileLoader(str(file))
        points: list[Point] = []
        for file, loader in self._loaders.items():
            try:
                for event in loader.Load():  # the events written since the last call
                    for value in event.summary.value:
                        if value.tag == self.key:
                            scalar = tb_scalar(value, tensor_util)
                            points.append((int(event.step), None if scalar is None or not math.isfinite(scalar)
                                           else scalar))
            except Exception as exc:  # noqa: BLE001 - a file being written, or not an event file
                log.debug("evalstop run: %s: %s", file, exc)
        return sorted(points)

    def close(self) -> None:
        self._loaders.clear()


KINDS: dict[str, Callable[[Path, str], JsonlTail | TensorBoardTail]] = {"jsonl": JsonlTail,
                                                                        "tensorboard": TensorBoardTail}


class MetricReporter:
    """A daemon thread that polls a source every ``poll_s`` and reports each new point as the job's
    eval (fail-open: an error is logged, the command is never touched). A source that does not
    exist after ``missing_warn_s`` is said once at WARNING, with what to check."""

    def __init__(self, source: MetricFrom, client: EvalStopAPI, job_id: str, *, poll_s: float = 1.0,
                 missing_warn_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.client, self.job_id = source, client, job_id
        self.poll_s, self.missing_warn_s, self.clock = poll_s, missing_warn_s, clock
        self.last_step: int | None = None
        self.reported = 0
        self._tail = source.open()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="evalstop-metrics", daemon=True)

    def start(self) -> MetricReporter:
        self._thread.start()
        return self

    def poll_once(self) -> int:
        """Read and report what is new; returns how many points were reported."""
        n = 0
        for step, value in self._tail.poll():
            if self.last_step is not None and step <= self.last_step:
                continue
            self.last_step = step
            try:
                self.client.report(self.job_id, step, eval_score=value)
            except Exception as exc:  # noqa: BLE001 - the command goes on; the outbox keeps what it can
                log.warning("evalstop run: could not report step %d of %s: %s", step, log_text(self.job_id),
                            log_text(exc, 300))
                continue
            n += 1
        self.reported += n
        return n

    def _loop(self) -> None:
        started, warned = self.clock(), False
        while not self._done.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as exc:  # noqa: BLE001 - e.g. tensorboard missing: say it, keep the command
                log.warning("evalstop run: reading %s:%s failed: %s", self.source.kind,
                            log_text(str(self.source.path)), log_text(exc, 300))
                return
            if not warned and not self._tail.exists and self.clock() - started > self.missing_warn_s:
                warned = True
                log.warning("evalstop run: %s %s does not exist after %.0f s: is the command writing there "
                            "(verl: trainer.logger=[...,'file'] and VERL_FILE_LOGGER_PATH; TensorBoard: its "
                            "log dir)?", self.source.kind, log_text(str(self.source.path)), self.missing_warn_s)

    def close(self) -> None:
        """Stop polling, after one last read (what the command wrote before it ended)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.poll_s + 5)
        try:
            self.poll_once()
        except Exception:  # noqa: BLE001 - closing: nothing more to say
            pass
        self._tail.close()

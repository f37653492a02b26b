"""World feedback read from the logs a command writes, for trainers that cannot take a callback.

``evalstop run --metric-from KIND:PATH --metric KEY -- CMD``: the launcher follows what the command
writes and reports each new value of the metric as the job's eval at its step; the coordinator
decides as for any job, and the launcher delivers a stop as it always does (SIGTERM after
``--grace-s``, then SIGKILL). The records are parsed by the same code as ``evalstop replay`` and
``evalstop calibrate`` (:mod:`evalstop_trl.analysis.logs`).

* ``jsonl``: one JSON object per line, either verl's file logger (``trainer.logger=[..., 'file']``,
  ``verl/utils/tracking.py``: ``{"step": N, "elapsed_seconds": ..., "data": {KEY: value, ...}}`` at
  ``$VERL_FILE_LOGGER_PATH``; its validation metrics are ``val-core/<source>/<metric>/...``), W&B's
  ``wandb-history.jsonl`` (``_step``), or plain ``{"step": N, KEY: value}``.
* ``verl_console``: verl's console output redirected to a file (``step:N - key:value - ...``).
* ``tensorboard``: the event files under DIR (any writer: torch's ``SummaryWriter``, TF2, OpenRLHF's
  and torchtune's TensorBoard loggers), new files and new events as they appear; the scalar of TAG.

Lines without the key are skipped; a partial last line waits for its end; a line over
:data:`MAX_LINE` bytes is skipped; a file replaced or truncated (rotation) is read again from its
start, steps already reported skipped; a path that is not a regular file (a named pipe) is never
opened (it would block the launcher), and said once. Steps must increase: a step at or before the
last one reported is skipped (a resumed run rewrites some); a step outside 0..``MAX_STEP`` is said
and skipped, never taken as the last one. A report the coordinator cannot take now (unreachable, a
429) is tried again at the next poll, in order; one it refuses for good (an invalid value) is said
and dropped. A metric the log does not have is said early with the keys it has, and ``evalstop run``
exits non-zero when the metric never appeared. Memory stays bounded: one read of at most
:data:`READ_CHUNK` bytes per poll, the position in each file, at most :data:`MAX_KEYS` key names.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.logs import LogError, console_record, json_record, step_of
from ..clients.api import EvalStopAPI
from ..core.browse import finite_float
from ..core.detectors import MAX_STEP
from ..core.errors import Conflict, InvalidInput, NotFound, QuotaExceeded, Unauthorized
from ..core.logged import read_logged
from .watch import log_text

__all__ = ["KINDS", "MAX_KEYS", "MAX_LINE", "MAX_PENDING", "READ_CHUNK", "ConsoleTail", "JsonlTail", "MetricFrom",
           "MetricReporter", "TensorBoardTail"]

log = logging.getLogger("evalstop.launcher")

MAX_LINE = 1 << 20  # bytes: a longer line is not a metrics record
READ_CHUNK = 4 << 20  # bytes read at most per poll
MAX_EVENT_FILES = 1000
MAX_KEYS = 200  # key names remembered for the "metric not found" message
MAX_PENDING = 10_000  # points waiting for the coordinator; the oldest are dropped beyond (said)
#: records seen without the metric before the launcher says, once, which keys the log has
MISSING_AFTER = 3
#: step, the metric's value, then what each eval carries beside it (:data:`EVIDENCE`, in its order)
Point = tuple[int, "float | None", "float | None", "float | None", "float | None"]

#: what an eval is reported with, each the latest its log gave at or before the eval (the report's
#: fields, read as core/logged.py's LOGGED says): the KL (what a gate: kl_past_peak policy reads), the
#: mean completion length and the proxy reward (what a gate: proxy_diverges policy reads)
EVIDENCE = ("kl", "length", "proxy_reward")


def _evidence(values: Mapping[str, Any]) -> dict[str, float]:
    """What of :data:`EVIDENCE` a log record gives."""
    return {k: v for k, v in read_logged(values).items() if k in EVIDENCE}


@dataclass(frozen=True)
class MetricFrom:
    """Where the metric comes from: ``kind`` (a name of :data:`KINDS`), ``path`` and the ``key`` (a
    JSON key, a console key, or a TensorBoard tag)."""

    kind: str
    path: Path
    key: str

    @classmethod
    def parse(cls, spec: str, key: str | None) -> MetricFrom:
        """``jsonl:PATH``, ``verl_console:PATH`` or ``tensorboard:DIR`` with ``--metric KEY``.

        Raises:
            ValueError: an unknown kind, no path or no key (the message shows the form).
        """
        kind, sep, path = spec.partition(":")
        if not sep or kind not in KINDS or not path:
            raise ValueError(f"--metric-from must be {', '.join(k + ':PATH' for k in KINDS)}, but got {spec!r}")
        if not key:
            raise ValueError("--metric-from needs --metric KEY: the JSON key (e.g. verl's "
                             "val-core/openai/gsm8k/reward/mean@1) or the TensorBoard tag to read")
        return cls(kind, Path(path), key)

    def open(self) -> LineTail | TensorBoardTail:
        """A follower of this source."""
        return KINDS[self.kind](self.path, self.key)


class _Keys:
    """What a follower saw: records with a step, and (a bounded set of) their key names."""

    def __init__(self) -> None:
        self.records, self.names = 0, set()

    def saw(self, keys: Any) -> None:
        self.records += 1
        for k in keys:
            if len(self.names) >= MAX_KEYS:
                break
            self.names.add(str(k))


class LineTail:
    """Follows a text file of one record per line: :meth:`poll` returns the (step, value, KL, length,
    proxy) points of the lines written since (KL: the latest of :data:`~evalstop_trl.core.klclock.KL_KEYS`
    read at or before the point, None if none; length: the same of
    :data:`~evalstop_trl.core.logged.LENGTH_KEYS`, a mean completion length >= 0; proxy: the same of
    :data:`~evalstop_trl.core.logged.REWARD_KEYS`, verl's ``critic/score/mean``, OpenRLHF's ``reward``).
    ``record(line)`` parses one line (``(raw step, values)`` or None)."""

    kind = ""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = Path(path), key
        self._file: Any = None
        self._inode: tuple[int, int] | None = None
        self._partial = b""
        self._skipping = False  # inside a line over MAX_LINE: drop up to its end
        self._said_irregular = False
        self.exists = False
        self.seen = _Keys()
        self.latest: dict[str, float | None] = dict.fromkeys(EVIDENCE)  # the latest of each the log gave
        # a file already there is an earlier run's log: read what is appended from now on (its old evals
        # would be reported as this job's, and this run's lower steps then skipped as "not increasing")
        try:
            st = os.stat(self.path)
            self._before: tuple[tuple[int, int], int] | None = ((st.st_dev, st.st_ino), st.st_size)
        except OSError:
            self._before = None

    def record(self, line: bytes) -> tuple[Any, dict[str, Any]] | None:
        raise NotImplementedError

    def poll(self) -> list[Point]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []
        if not stat.S_ISREG(st.st_mode):  # a named pipe would block open() until a writer came, forever
            if not self._said_irregular:
                self._said_irregular = True
                log.warning("evalstop run: %s is not a regular file (a named pipe or a device): not read; log to "
                            "a file", log_text(str(self.path)))
            return []
        self.exists = True
        inode = (st.st_dev, st.st_ino)
        if self._file is None or inode != self._inode or st.st_size < self._file.tell():  # new, replaced, truncated
            self.close()
            try:
                self._file, self._inode = open(self.path, "rb"), inode  # noqa: SIM115 - kept open between polls
            except OSError:  # rotated away between stat and open, or unreadable now: the next poll tries again
                return []
            self._partial, self._skipping = b"", False
            if self._before is not None and self._before[0] == inode and st.st_size >= self._before[1]:
                log.warning("evalstop run: %s was there before this run (%d bytes): only what is written from now "
                            "on is read", log_text(str(self.path)), self._before[1])
                size = self._before[1]
                self._file.seek(max(size - 1, 0))
                ended = size == 0 or self._file.read(1) == b"\n"  # the old last line complete, or cut mid-way
                self._partial, self._skipping = b"", not ended
            self._before = None
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
            rec = self.record(line)
        except (ValueError, RecursionError):  # one unreadable line: skipped, never the lines after it
            return None
        if rec is None:
            return None
        raw, values = rec
        self.seen.saw(values)
        self.latest.update(_evidence(values))
        if self.key not in values:
            return None
        try:
            step = step_of(str(self.path), {"step": raw})  # the offline readers' check: integers 0..MAX_STEP
        except LogError as exc:
            log.warning("evalstop run: %s (for %s): skipped", log_text(str(exc), 300), log_text(self.key))
            return None
        # NaN, inf, text: a failed eval (missing)
        return step, finite_float(values[self.key]), *self.latest.values()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class JsonlTail(LineTail):
    """Follows a JSONL file (verl's file logger, W&B's history, plain ``{step, KEY}`` lines)."""

    kind = "jsonl"

    def record(self, line: bytes) -> tuple[Any, dict[str, Any]] | None:
        try:
            return json_record(json.loads(line))
        except (ValueError, RecursionError):
            return None


class ConsoleTail(LineTail):
    """Follows verl's console output written to a file (``step:N - key:value - ...`` lines)."""

    kind = "verl_console"

    def record(self, line: bytes) -> tuple[Any, dict[str, Any]] | None:
        return console_record(line.decode("utf-8", "replace"))


class TensorBoardTail:
    """Follows the TensorBoard event files under a folder: :meth:`poll` returns the new scalars of
    ``tag``, each with the latest of :data:`EVIDENCE` logged at or before its step (transformers'
    TensorBoard callback writes ``train/reward``, ``train/objective/kl``: read under the prefix)."""

    def __init__(self, path: Path, tag: str) -> None:
        self.path, self.key = Path(path), tag
        self._loaders: dict[Path, Any] = {}
        self.exists = False
        self.seen = _Keys()
        self.latest: dict[str, float | None] = dict.fromkeys(EVIDENCE)

    def poll(self) -> list[Point]:
        try:
            from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
            from tensorboard.util import tensor_util

            from ..analysis.logs import tb_scalar
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
        # (step, 0 for evidence / 1 for the metric, the tag's scalars): evidence at an eval's step comes first
        read: list[tuple[int, int, dict[str, float | None]]] = []
        for file, loader in self._loaders.items():
            try:
                for event in loader.Load():  # the events written since the last call
                    if event.summary.value:
                        self.seen.saw(v.tag for v in event.summary.value)
                    for value in event.summary.value:
                        if not 0 <= event.step <= MAX_STEP:
                            if value.tag == self.key:
                                log.warning("evalstop run: %s: step %d of %s is outside 0..%d: skipped",
                                            log_text(str(file)), event.step, log_text(self.key), MAX_STEP)
                            continue
                        scalars = {value.tag: tb_scalar(value, tensor_util)}
                        if value.tag == self.key:
                            read.append((int(event.step), 1, scalars))
                        elif _evidence(scalars):
                            read.append((int(event.step), 0, scalars))
            except Exception as exc:  # noqa: BLE001 - a file being written, or not an event file
                log.debug("evalstop run: %s: %s", file, exc)
        points: list[Point] = []
        for step, is_metric, values in sorted(read, key=lambda r: (r[0], r[1])):
            if not is_metric:
                self.latest.update(_evidence(values))
                continue
            scalar = values[self.key]
            points.append((step, None if scalar is None or not math.isfinite(scalar) else scalar,
                           *self.latest.values()))
        return points

    def close(self) -> None:
        self._loaders.clear()


KINDS: dict[str, Callable[[Path, str], LineTail | TensorBoardTail]] = {
    "jsonl": JsonlTail, "verl_console": ConsoleTail, "tensorboard": TensorBoardTail}


class MetricReporter:
    """A daemon thread that polls a source every ``poll_s`` and reports each new point as the job's
    eval (fail-open: an error is logged, the command is never touched). A source that does not
    exist after ``missing_warn_s`` is said once at WARNING, with what to check; so is a metric the
    log does not have, with the keys it has (:attr:`missing_metric` tells the CLI at the end)."""

    def __init__(self, source: MetricFrom, client: EvalStopAPI, job_id: str, *, poll_s: float = 1.0,
                 missing_warn_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.client, self.job_id = source, client, job_id
        self.poll_s, self.missing_warn_s, self.clock = poll_s, missing_warn_s, clock
        self.last_step: int | None = None
        self.reported = 0
        self.pending: list[Point] = []  # read, not yet taken by the coordinator (in step order)
        self._said_missing = False
        self._said_errors: set[str] = set()  # poll errors already said (once per kind)
        self._tail = source.open()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="evalstop-metrics", daemon=True)

    def start(self) -> MetricReporter:
        self._thread.start()
        return self

    @property
    def missing_metric(self) -> str | None:
        """When the log had records but not yet the metric: a message naming the keys it has; else None."""
        return self._missing(final=False)

    def _missing(self, final: bool) -> str | None:
        seen = self._tail.seen
        if self.reported or self.pending or self.last_step is not None or seen.records == 0:
            return None
        keys = ", ".join(sorted(seen.names)[:40]) + (", ..." if len(seen.names) > 40 else "")
        where = f"{self.source.kind}:{self.source.path} ({seen.records} records read)"
        if final:
            return f"--metric {self.source.key!r} never appeared in {where}; its keys: {keys}"
        return (f"--metric {self.source.key!r} not seen yet in {where}; a validation metric may come only every "
                f"few steps; its keys so far: {keys}")

    @property
    def never_reported(self) -> str | None:
        """When no eval of the metric was ever read: why (the keys the log has, or no record read); else None."""
        if self.reported or self.pending or self.last_step is not None:
            return None
        if self._tail.seen.records:
            return self._missing(final=True)
        return (f"no record was read from {self.source.kind}:{self.source.path} (does the command write there, "
                "in that format?)")

    def poll_once(self) -> int:
        """Read what is new and report what is pending, in order; returns how many points were taken.
        One poller at a time: the thread's, then close()'s last one once the thread has ended."""
        newest_before = self.pending[-1][0] if self.pending else self.last_step
        skipped = 0
        for point in self._tail.poll():
            newest = self.pending[-1][0] if self.pending else self.last_step
            if newest is not None and point[0] <= newest:
                skipped += 1
                continue
            self.pending.append(point)
        if skipped and "skipped" not in self._said_errors:
            self._said_errors.add("skipped")
            log.warning("evalstop run: %d eval(s) of %s at or before step %s were skipped: a job's steps must "
                        "increase (a log rewritten from an earlier step, or a run restarted into the same file)",
                        skipped, log_text(str(self.source.path)), newest_before)
        if len(self.pending) > MAX_PENDING:
            log.warning("evalstop run: %d evals wait for the coordinator; the oldest %d are dropped", len(self.pending),
                        len(self.pending) - MAX_PENDING)
            del self.pending[:-MAX_PENDING]
        n = 0
        while self.pending:
            step, value, *carried = self.pending[0]
            try:
                self.client.report(self.job_id, step, eval_score=value, **dict(zip(EVIDENCE, carried, strict=True)))
            except (InvalidInput, NotFound, Unauthorized, Conflict) as exc:  # refused for good: say it, go on
                log.warning("evalstop run: the coordinator refused step %d of %s: %s", step, log_text(self.job_id),
                            log_text(exc, 300))
            except QuotaExceeded as exc:  # a rate (Retry-After): later; a cap (none): for good
                if exc.retry_after is not None:
                    log.warning("evalstop run: step %d of %s waits for the tenant's rate (retry in %.1f s)", step,
                                log_text(self.job_id), exc.retry_after)
                    break
                log.warning("evalstop run: the coordinator refused step %d of %s: %s", step, log_text(self.job_id),
                            log_text(exc, 300))
            except Exception as exc:  # noqa: BLE001 - unreachable or busy: kept, tried again at the next poll
                log.warning("evalstop run: could not report step %d of %s (tried again at the next poll): %s", step,
                            log_text(self.job_id), log_text(exc, 300))
                break
            else:
                n += 1
            self.pending.pop(0)
            self.last_step = step
        self.reported += n
        self._say_missing()
        return n

    def _say_missing(self) -> None:
        if self._said_missing or self._tail.seen.records < MISSING_AFTER:
            return
        message = self.missing_metric
        if message:
            self._said_missing = True
            log.warning("evalstop run: %s", log_text(message, 2000))

    def _loop(self) -> None:
        started, warned = self.clock(), False
        while not self._done.wait(self.poll_s):
            try:
                self.poll_once()
            except RuntimeError as exc:  # a missing package (tensorboard): nothing to read, ever
                log.warning("evalstop run: reading %s:%s failed: %s", self.source.kind,
                            log_text(str(self.source.path)), log_text(exc, 300))
                return
            except Exception as exc:  # noqa: BLE001 - a file mid-rotation, a bad line: said once, polled on
                kind = type(exc).__name__
                if kind not in self._said_errors:
                    self._said_errors.add(kind)
                    log.warning("evalstop run: reading %s:%s failed (%s), polling on: %s", self.source.kind,
                                log_text(str(self.source.path)), kind, log_text(exc, 300))
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
        if self._thread.is_alive():  # stuck in a report to a hanging coordinator: no second poller beside it
            return
        try:
            self.poll_once()
        except Exception:  # noqa: BLE001 - closing: nothing more to say
            pass
        self._tail.close()

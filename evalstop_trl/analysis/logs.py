"""The logs real training stacks write: one parser per format, shared by ``evalstop replay``,
``evalstop calibrate`` and ``evalstop run --metric-from``.

Formats (:data:`FORMATS`, by name; detected from the file, or named with ``--format``):

* ``trainer_state``: a transformers/TRL ``trainer_state.json`` (``log_history``; ``max_steps`` gives
  the planned steps).
* ``jsonl``: one JSON object per line: verl's file logger (``verl/utils/tracking.py``, backend
  ``file``: ``{"step": N, "data": {KEY: value, ...}}``), W&B's ``wandb-history.jsonl`` (``_step``),
  or plain ``{"step": N, KEY: value}``.
* ``verl_console``: verl's console logger (``trainer.logger=['console']``, ``LocalLogger``):
  ``step:N - key:value - key:value`` lines (values printed by ``pprint``, so ``np.float64(0.5)`` too),
  possibly behind a prefix (a Ray worker's ``(TaskRunner pid=...)``, a logging format). Other lines
  are skipped.
* ``csv``: a CSV/TSV with a step column (``step``, ``_step``, ``Step``, ``global_step``), e.g. W&B's
  exported run history or panel export (``Step,<run> - <metric>,<run> - <metric>__MIN,...``: the
  ``<run> - `` prefix is dropped when one run is in the file, ``__MIN`` / ``__MAX`` columns skipped).
* ``wandb_json``: a JSON list of history rows (``run.history().to_json(orient='records')`` or
  ``[row for row in run.scan_history()]``), steps in ``_step`` (or ``step``).
* ``tensorboard``: TensorBoard event files (TRL, OpenRLHF); read by ``analysis.histories``.

Reading is bounded and streaming: a file that is not a regular file (a named pipe, a device) is
refused before it is opened, a file over :data:`MAX_FILE_BYTES` is refused, lines are read one at a
time (a line over :data:`MAX_LINE` is an error), and steps are checked as integers from 0 to
``MAX_STEP`` before any float conversion (``10**400`` is an error, not an OverflowError).
"""

from __future__ import annotations

import csv
import json
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.detectors import MAX_STEP

__all__ = ["FORMATS", "LogError", "LogFormat", "MAX_FILE_BYTES", "MAX_LINE", "STEP_KEYS", "check_regular",
           "console_record", "detect", "json_record", "read_rows"]

MAX_FILE_BYTES = 64 << 20  # a run's eval curve is kilobytes (a 430-step verl console log: 0.6 MB)
MAX_LINE = 1 << 20  # bytes: a longer line is not a metrics record
#: Where each stack puts the step of a history row (the first present wins): the trainer's own step before
#: W&B's ``_step`` (one per log call), as transformers logs it to W&B (``train/global_step``).
STEP_KEYS = ("step", "train/global_step", "global_step", "Step", "_step")
_WANDB_SUFFIXES = ("__MIN", "__MAX")
#: bookkeeping columns, not metrics: W&B's (``_runtime``, ``_timestamp``, ``_wandb``), verl's file logger's
#: ``elapsed_seconds`` and pandas' unnamed index column of ``run.history().to_csv()``
_SYSTEM_KEYS = frozenset({"_runtime", "_timestamp", "_wandb", "elapsed_seconds", "", "Unnamed: 0"})
_WRAPPER_KEYS = frozenset({*STEP_KEYS, "data", "elapsed_seconds", "timestamp"})  # verl's file logger's line
_CONSOLE = re.compile(r"(?:^|\s)step:(\d+)((?: - [^\s:][^:]*:[^ ]+)*)")
_CONSOLE_VALUE = re.compile(r"^(?:np\.)?(?:float\d*|int\d*)?\(?([-+0-9.eEinfa]+)\)?$")


class LogError(ValueError):
    """A log that cannot be read; the message names the file and says what is wrong."""


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters; an integer too long to print described by its size."""
    if isinstance(value, int) and abs(value) >= 10 ** 30:
        return f"an integer of about {int(abs(value).bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def check_regular(path: Path, limit: int = MAX_FILE_BYTES) -> int:
    """The size of ``path`` if it is a regular file within ``limit`` bytes, else a LogError (a named
    pipe or a device would block or never end; it is refused before it is opened)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise LogError(f"{path}: no such file") from None
    except OSError as exc:
        raise LogError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise LogError(f"{path}: a folder; pass a log file (or a folder to evalstop calibrate)")
    if not stat.S_ISREG(st.st_mode):
        raise LogError(f"{path}: not a regular file (a named pipe or a device); copy the log to a file first")
    if st.st_size > limit:
        raise LogError(f"{path}: {st.st_size} bytes, over the {limit >> 20} MiB read in a log file")
    return st.st_size


def _lines(path: Path, limit: int = MAX_FILE_BYTES, skip_long: bool = False) -> Iterator[tuple[int, str]]:
    """(line number, text) of a regular UTF-8 file (a leading BOM dropped), one line at a time; a line
    over :data:`MAX_LINE` bytes is an error, or skipped with ``skip_long`` (a console log's progress bars)."""
    check_regular(path, limit)
    try:
        with open(path, "rb") as f:
            lineno = 0
            while raw := f.readline(MAX_LINE + 1):
                lineno += 1
                if len(raw) > MAX_LINE:
                    if not skip_long:
                        raise LogError(f"{path}:{lineno}: a line over {MAX_LINE} bytes is not a log record")
                    while raw and not raw.endswith(b"\n"):
                        raw = f.readline(MAX_LINE + 1)
                    continue
                if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # Excel's "CSV UTF-8" writes a BOM
                    raw = raw[3:]
                try:
                    yield lineno, raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise LogError(f"{path}:{lineno}: not UTF-8 text") from None
    except OSError as exc:
        raise LogError(f"{path}: cannot read ({exc.strerror or exc})") from None


def step_of(where: str, row: Mapping[str, Any]) -> int | None:
    """The row's step (the first of :data:`STEP_KEYS` present), checked; None when it has none."""
    for key in STEP_KEYS:
        if key in row and row[key] is not None:
            step = row[key]
            if isinstance(step, float) and step.is_integer():
                step = int(step)
            if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
                raise LogError(f"{where}: step {short(step)}; steps must be integers from 0 to {MAX_STEP}")
            return step
    return None


# ----------------------------------------------------------------------------- records
def json_record(obj: Any) -> tuple[Any, dict[str, Any]] | None:
    """(raw step, metrics) of one JSON log object: verl's ``{"step", "data": {...}}``, W&B's ``_step``
    rows, or plain ``{"step", KEY: ...}``; None for anything else. The step is not checked here."""
    if not isinstance(obj, dict):
        return None
    # verl's wrapper only: a row that merely has a "data" field (a W&B table) keeps its own metrics
    data = obj["data"] if isinstance(obj.get("data"), dict) and set(obj) <= _WRAPPER_KEYS else obj
    step = next((obj[k] for k in STEP_KEYS if obj.get(k) is not None), None)
    if step is None:
        return None
    return step, {k: v for k, v in data.items() if k not in STEP_KEYS and k not in _SYSTEM_KEYS}


def console_record(line: str) -> tuple[int, dict[str, Any]] | None:
    """(step, metrics) of one verl console line (``step:N - key:value - ...``), else None.

    >>> console_record("(TaskRunner pid=9) step:140 - val-core/gsm8k/reward/mean@1:0.531 - actor/kl:np.float64(0.02)")
    (140, {'val-core/gsm8k/reward/mean@1': 0.531, 'actor/kl': 0.02})
    """
    m = _CONSOLE.search(line)
    if m is None:
        return None
    values: dict[str, Any] = {}
    for part in m.group(2).split(" - ")[1:]:
        key, _, text = part.rpartition(":")
        v = _CONSOLE_VALUE.match(text.strip())
        try:
            values[key] = float(v.group(1)) if v else text
        except ValueError:
            values[key] = text
    digits = m.group(1)
    # a step of thousands of digits is no step (and int() refuses past 4,300): out of range, said as such
    return (int(digits) if len(digits) <= 30 else MAX_STEP + 1), values


# ----------------------------------------------------------------------------- formats
@dataclass(frozen=True)
class LogFormat:
    """One format: its name, what it is, how to recognise it, how to read its rows.

    ``rows(path)`` yields ``{"step": int, KEY: value, ...}`` dicts one at a time; ``planned(path)``
    gives the planned steps where the format records them."""

    name: str
    description: str
    suffixes: tuple[str, ...]
    sniff: Callable[[str], bool]  # the file's first non-empty line
    rows: Callable[[Path], Iterator[dict[str, Any]]]


def _row(where: str, raw_step: Any, values: dict[str, Any]) -> dict[str, Any]:
    step = step_of(where, {"step": raw_step})
    return {**values, "step": step}


def _no_step(path: Path, objects: int) -> LogError:
    return LogError(f"{path}: {objects} record(s), none with a step ({', '.join(STEP_KEYS)}); a training log names "
                    "each record's step")


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    objects = stepped = 0
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        obj = _parse_json(f"{path}:{lineno}", lambda line=line: json.loads(line))
        if not isinstance(obj, dict):
            raise LogError(f"{path}:{lineno}: expected a JSON object with 'step', got {type(obj).__name__}")
        objects += 1
        rec = json_record(obj)
        if rec is not None:
            stepped += 1
            yield _row(f"{path}:{lineno}", *rec)
    if objects and not stepped:
        raise _no_step(path, objects)


def _console_rows(path: Path) -> Iterator[dict[str, Any]]:
    for lineno, line in _lines(path, skip_long=True):
        rec = console_record(line)
        if rec is not None:
            yield _row(f"{path}:{lineno}", *rec)


def _csv_value(v: str) -> Any:
    try:
        return float(v) if any(c in v.lower() for c in ".en") else int(v)
    except ValueError:
        return v


def _csv_rows(path: Path) -> Iterator[dict[str, Any]]:
    dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
    lines = (line for _, line in _lines(path))
    try:
        reader = csv.DictReader(lines, dialect=dialect)
        if not reader.fieldnames:
            raise LogError(f"{path}: empty CSV file")
        fields = [f.strip() for f in reader.fieldnames]
        step_key = next((k for k in STEP_KEYS if k in fields), None)
        if step_key is None:
            raise LogError(f"{path}: the CSV has no step column ({' or '.join(STEP_KEYS)}); columns: {', '.join(fields)}")
        names = _wandb_names([f for f in fields if f not in STEP_KEYS])
        for row in reader:
            clean: dict[str, Any] = {}
            for k, v in row.items():
                if k is None:
                    raise LogError(f"{path}:{reader.line_num}: more values than columns")
                k = k.strip()
                v = (v or "").strip()
                if v == "" or (k != step_key and k not in names):
                    continue
                clean["step" if k == step_key else names[k]] = _csv_value(v)
            if clean.get("step") is not None:
                yield _row(f"{path}:{reader.line_num}", clean.pop("step"), clean)
    except csv.Error as exc:  # e.g. a field over csv's size limit: not a log of numbers
        raise LogError(f"{path}: not a readable CSV file ({exc})") from None


def _wandb_names(columns: list[str]) -> dict[str, str]:
    """Column -> metric: W&B's ``<run> - <metric>`` prefix dropped when every column has the same one,
    its ``__MIN`` / ``__MAX`` band columns left out."""
    kept = [c for c in columns if not c.endswith(_WANDB_SUFFIXES) and c not in _SYSTEM_KEYS]
    prefixes = {c.split(" - ", 1)[0] for c in kept if " - " in c}
    if len(prefixes) == 1 and all(" - " in c for c in kept):
        return {c: c.split(" - ", 1)[1] for c in kept}
    return {c: c for c in kept}


def _parse_json(where: str, load: Callable[[], Any]) -> Any:
    """``load()``, its failures as a LogError naming ``where`` (a file, or a file and line)."""
    try:
        return load()
    except UnicodeDecodeError:
        raise LogError(f"{where}: not a UTF-8 text file") from None
    except json.JSONDecodeError as exc:
        raise LogError(f"{where}: invalid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise LogError(f"{where}: JSON nested too deeply to be a training log") from None
    except ValueError as exc:  # an integer literal over Python's digit limit
        raise LogError(f"{where}: a number too long to read ({exc})") from None


def _json_document(path: Path) -> Any:
    check_regular(path)

    def load() -> Any:
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    return _parse_json(str(path), load)


def trainer_state(path: Path, data: Any = None) -> tuple[list[dict[str, Any]], int | None]:
    """The rows of a trainer_state.json's ``log_history`` (entries without a step skipped) and its
    ``max_steps`` (``data``: the file's JSON document, when the caller has read it already)."""
    data = _json_document(path) if data is None else data
    if not (isinstance(data, dict) and isinstance(data.get("log_history"), list)):
        raise LogError(f"{path}: a trainer_state.json must be an object with a 'log_history' list")
    planned = data.get("max_steps")
    planned = planned if isinstance(planned, int) and not isinstance(planned, bool) and 0 < planned <= MAX_STEP else None
    return _json_rows(path, data["log_history"], "log_history"), planned


def _json_rows(path: Path, items: list[Any], what: str) -> list[dict[str, Any]]:
    rows = []
    for i, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise LogError(f"{path}: entry {i} of the {what} is {type(item).__name__}, expected an object")
        rec = json_record(item)
        if rec is not None:
            rows.append(_row(f"{path}: entry {i}", *rec))
    if items and not rows and what != "log_history":
        raise _no_step(path, len(items))
    return rows


def _ts_rows(path: Path) -> Iterator[dict[str, Any]]:
    yield from trainer_state(path)[0]


def _wandb_json_rows(path: Path) -> Iterator[dict[str, Any]]:
    data = _json_document(path)
    if not isinstance(data, list):
        raise LogError(f"{path}: W&B's exported history is a JSON list of rows (with _step)")
    yield from _json_rows(path, data, "history")


def _sniff_json(first: str) -> bool:
    return first.lstrip().startswith("{")


FORMATS: Mapping[str, LogFormat] = {f.name: f for f in (
    LogFormat("trainer_state", "trainer_state.json (transformers/TRL log_history)", (".json",),
              lambda first: first.lstrip().startswith("{") and "log_history" in first or first.strip() == "{",
              _ts_rows),
    LogFormat("wandb_json", "a JSON list of W&B history rows (_step)", (".json",),
              lambda first: first.lstrip().startswith("["), _wandb_json_rows),
    LogFormat("jsonl", "*.jsonl / *.ndjson: verl's file logger {step, data}, W&B's wandb-history.jsonl, "
              "or {step, KEY: value} lines", (".jsonl", ".ndjson"), _sniff_json, _jsonl_rows),
    LogFormat("csv", "*.csv / *.tsv with a step column (W&B's export too)", (".csv", ".tsv"),
              lambda first: any(k in first for k in STEP_KEYS) and "," in first, _csv_rows),
    LogFormat("verl_console", "verl's console log (step:N - key:value - ...)", (".log", ".txt", ".out"),
              lambda first: _CONSOLE.search(first) is not None, _console_rows),
)}


# ----------------------------------------------------------------------------- TensorBoard
TENSORBOARD_PIP = "pip install 'evalstop[calibrate]'  (or: pip install 'tensorboard>=2.14')"


def tensorboard_series(files: tuple[Path, ...] | list[Path]) -> dict[str, dict[int, float]]:
    """Every scalar of the event files of one run, ``series[tag][step] = value``, read with the
    ``tensorboard`` package's ``EventFileLoader`` (no TensorFlow); scalars stored as ``simple_value``
    (torch's SummaryWriter) or as a one-element tensor (TF2, ``tensorboard.summary.Writer``)."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util
    except ImportError:
        raise LogError(f"reading TensorBoard event files needs the tensorboard package; run: {TENSORBOARD_PIP}") from None
    series: dict[str, dict[int, float]] = {}
    for path in files:
        check_regular(Path(path))
        events = 0
        try:
            for event in EventFileLoader(str(path)).Load():
                events += 1
                for value in event.summary.value:
                    scalar = tb_scalar(value, tensor_util)
                    if scalar is not None and 0 <= event.step <= MAX_STEP:
                        series.setdefault(value.tag, {})[int(event.step)] = scalar
        except OSError as exc:
            raise LogError(f"{path}: cannot read ({exc.strerror or exc})") from None
        except Exception as exc:  # the loader's protobuf and data-loss errors
            raise LogError(f"{path}: not a readable TensorBoard event file ({type(exc).__name__}: {exc})") from None
        if events == 0:
            raise LogError(f"{path}: no TensorBoard event could be read (empty, corrupt or not an event file)")
    return series


def tb_scalar(value: Any, tensor_util: Any) -> float | None:
    """A scalar summary value (``simple_value``, or a one-element numeric tensor), else None."""
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind != "tensor" or value.metadata.plugin_data.plugin_name not in ("scalars", ""):
        return None
    try:
        array = tensor_util.make_ndarray(value.tensor)
    except Exception:  # strings, unsupported dtypes: not a scalar
        return None
    if array.size != 1 or array.dtype.kind not in "fiub":
        return None
    return float(array.reshape(-1)[0])


def _first_lines(path: Path, n: int = 20, budget: int = 4 << 20) -> list[str]:
    """The first ``n`` non-blank lines, whole (a verl file-logger line is 5-10 KB), at most ``budget`` bytes."""
    check_regular(path)
    out: list[str] = []
    read = 0
    with open(path, "rb") as f:
        while len(out) < n and read < budget and (raw := f.readline(min(MAX_LINE, budget - read))):
            read += len(raw)
            if not out and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if raw.strip():
                out.append(raw.decode("utf-8", "replace"))
    return out


def _first_object(line: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


#: how far into a file detection looks for a verl console line (a run prints its whole config, model
#: cards and warnings first: the verl maintainers' example logs have their first step past 100 KB)
SNIFF_BYTES = 8 << 20


def has_console_line(path: Path) -> bool:
    """Whether a verl console line (``step:N - key:value``) is among the first :data:`SNIFF_BYTES` of ``path``."""
    check_regular(path)
    read = 0
    with open(path, "rb") as f:
        for raw in iter(lambda: f.readline(MAX_LINE), b""):
            read += len(raw)
            if b"step:" in raw and console_record(raw.decode("utf-8", "replace")):
                return True
            if read > SNIFF_BYTES:
                break
    return False


def detect(path: Path) -> LogFormat:
    """The format of ``path``: a JSON list (W&B's history), a trainer_state.json (an object with
    ``log_history``, or a pretty-printed ``.json`` document), JSONL (its first line a whole object with a
    step), else by suffix, else by its lines (a verl console log may start with its config dump)."""
    first = _first_lines(path)
    if not first:
        raise LogError(f"{path}: empty; a training log has at least one record")
    suffix = path.suffix.lower()
    head = first[0].lstrip()[:1]
    obj = _first_object(first[0])
    if head == "[" and suffix not in (".jsonl", ".ndjson", ".csv", ".tsv"):
        return FORMATS["wandb_json"]
    if obj is not None and "log_history" in obj:
        return FORMATS["trainer_state"]
    if obj is not None and json_record(obj) is not None:
        return FORMATS["jsonl"]
    if head == "{" and suffix == ".json":
        return FORMATS["trainer_state"]
    for fmt in FORMATS.values():
        if suffix in fmt.suffixes and fmt.name in ("jsonl", "csv"):
            return fmt
    if any(_CONSOLE.search(line) for line in first) or (suffix in FORMATS["verl_console"].suffixes
                                                         and has_console_line(path)):
        return FORMATS["verl_console"]
    if obj is not None:
        return FORMATS["jsonl"]
    if FORMATS["csv"].sniff(first[0]):
        return FORMATS["csv"]
    raise LogError(f"{path}: unknown format; readable formats: "
                   + "; ".join(f.description for f in FORMATS.values()) + " (name one with --format)")


def read_rows(path: str | Path, fmt: str | None = None) -> tuple[Iterator[dict[str, Any]], str, int | None]:
    """(rows one at a time, the format's name, the planned steps if recorded) of one log file.

    Raises:
        LogError: an unknown ``fmt``, or a file that cannot be read (the message names it)."""
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise LogError(f"unknown --format {fmt!r}; formats: {', '.join(FORMATS)}")
    chosen = FORMATS[fmt] if fmt else detect(path)
    if chosen.name == "trainer_state":
        rows, planned = trainer_state(path)
        return iter(rows), chosen.name, planned
    return chosen.rows(path), chosen.name, None

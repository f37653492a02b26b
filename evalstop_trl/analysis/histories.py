"""Read a team's finished runs for ``evalstop calibrate``: one eval curve per run, from five formats.

Readers (``READERS``, keyed by format name; each recognises its files and reads one run):

* ``trainer_state``: a transformers ``trainer_state.json`` (``log_history``; ``max_steps`` gives the
  planned steps). In a folder, ``checkpoint-N/trainer_state.json`` files of one run count once: the
  highest N (its log holds the whole history).
* ``jsonl``: ``*.jsonl`` / ``*.ndjson``, one object per line with ``step`` and the metrics.
* ``csv``: ``*.csv`` / ``*.tsv`` with a ``step`` column and one column per metric.
* ``tensorboard``: event files (``*tfevents*``), read with the ``tensorboard`` package's
  ``EventFileLoader`` (no TensorFlow; ``pip install 'evalstop[calibrate]'``). The event files of one
  folder are one run (a resumed run writes several); scalars by tag, stored as ``simple_value``
  (torch's ``SummaryWriter``) or as a one-element tensor (TF2, ``tensorboard.summary.Writer``).
* ``mlflow``: a run folder of MLflow's local file store, ``mlruns/<experiment_id>/<run_id>/`` with
  ``meta.yaml`` (the run's name; deleted runs skipped) and ``metrics/<key>`` files of lines
  ``<timestamp_ms> <value> <step>`` (keys with ``/`` are sub-folders). No mlflow import.

A path may be a file, a folder (searched recursively for all of the above) or a glob. In a folder,
the TensorBoard logs a transformers run writes beside its checkpoints (``<run>/runs/<date>/``) are
the same run as its trainer_state.json and are not read again, and files inside an MLflow run
folder (its artifacts) are not runs. A step logged
twice keeps the value written last (a resumed run rewrites the steps after its checkpoint). The
train loss (``train_loss``, ``loss``, ``train/loss``), when a run has one, goes with each eval (the
last loss at or before its step) for ``loss_plateau``. Planned steps: ``max_steps`` of a
trainer_state.json, else the run's last logged step (the runs are finished).

**What a run says about its configuration** (``RunHistory.meta``, for ``evalstop calibrate --group-by``;
only what the files hold, flattened to ``parent.child`` keys, values as text; nothing when a format keeps
none): a trainer_state.json's own values besides ``log_history`` (``train_batch_size``, ``max_steps``,
``trial_name``, ``trial_params.<name>`` of a hyper-parameter search, ...); a JSONL's first line when it
is an object without a step (a header: ``scripts/real_corpus.py`` writes ``{"config": {...}, "seed": ...}``);
the ``config.yaml`` beside a JSONL or W&B JSON history (a W&B run's ``files/`` folder: each key's
``value``, ``_wandb`` left out); an MLflow run's ``params/<key>`` files. CSV, verl's console log and
TensorBoard files give none here. ``RunHistory.folder`` is the folder that holds the run: a log file's
folder; for a run that is a folder itself (a transformers output folder, with its ``checkpoint-N/`` and
``runs/<date>/``; a TensorBoard event folder; an MLflow run) the folder above it.

Every problem raises :class:`HistoryError` (a ValueError) naming the file and what is wrong; a
missing metric lists the metrics the file has.
"""

from __future__ import annotations

import glob
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from ..core.detectors import MAX_STEP
from ..core.logged import REWARD_KEYS, logged_names
from . import logs
from .replay import _NOT_METRICS, _NOT_SCORES, Curve, _short, evidence_keys, evidence_of, is_evidence

__all__ = ["READERS", "HistoryError", "RawHistory", "Reader", "RunHistory", "Series",
           "choose_metric", "find_runs", "load_histories", "read_run", "select"]

_LOSS_SERIES = ("train_loss", "loss", "train/loss")
_GLOB_CHARS = re.compile(r"[*?\[]")


class HistoryError(ValueError):
    """A run that cannot be read; the message names the file and says what is wrong."""


@dataclass(frozen=True)
class RawHistory:
    """Every numeric series of one run as read: ``series[name][step] = value``."""

    name: str
    source: str
    format: str
    series: Mapping[str, Mapping[int, float]]
    planned_steps: int | None = None
    #: keys that held something other than a number (the first such value and its step), for messages
    not_numbers: Mapping[str, str] = field(default_factory=dict)
    #: what the run's files say about its configuration (see the module docstring)
    meta: Mapping[str, str] = field(default_factory=dict)

    def metrics(self) -> list[str]:
        return sorted(self.series)


@dataclass(frozen=True)
class Series:
    """One metric of one run, in step order."""

    metric: str
    steps: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class RunHistory:
    """One run ready for calibration: the detector's series, the label's series (None: the same),
    the train loss at each eval, the planned steps."""

    name: str
    source: str
    format: str
    scores: Series
    label: Series | None
    losses: tuple[float | None, ...]
    planned_steps: int
    note: str = ""  # what the reader chose about this run (said in calibrate's notes)
    evidence: tuple[tuple[int | None, float | None], ...] = ()  # per eval (n, paired noise), if logged
    meta: Mapping[str, str] = field(default_factory=dict)  # its configuration as its files record it
    folder: str = ""  # the folder that holds the run (module docstring)
    proxies: tuple[float | None, ...] = ()  # per eval the latest proxy reward logged (core/logged.py), if any

    def curve(self) -> Curve:
        """The detector's input, as ``evalstop replay`` builds it."""
        return Curve(self.scores.metric, self.scores.steps, self.scores.values, self.losses, self.planned_steps,
                     f"{self.format} {self.source}", self.evidence, proxies=self.proxies)


@dataclass(frozen=True)
class Found:
    """A run located on disk: its reader, the path that names it, the files to read."""

    reader: str
    path: Path
    files: tuple[Path, ...]
    note: str = ""  # e.g. the other logs of the same run that are not read


@dataclass(frozen=True)
class Reader:
    """One format: ``accepts`` an explicit file (or run folder), ``find`` searches a folder, ``read``
    reads one located run."""

    name: str
    description: str
    accepts: Callable[[Path], bool]
    find: Callable[[Path], list[Found]]
    read: Callable[[Found], RawHistory | None]  # None: a run to leave out (a deleted MLflow run)


# ----------------------------------------------------------------------------- shared helpers
#: The largest log file calibrate reads (a run's eval curve is kilobytes; a bigger file is not a log).
MAX_FILE_BYTES = 256 << 20
#: The largest MLflow ``meta.yaml``.
MAX_META_BYTES = 1 << 20


def _plain(path: Path) -> Path:
    """``path``, a regular file that is not a symbolic link (calibrate reads untrusted folders, and a
    link may point anywhere), else a HistoryError."""
    if path.is_symlink():
        raise HistoryError(f"{path}: a symbolic link; calibrate reads only the files themselves (copy it in)")
    return path


def _text(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """A small regular file's text (meta.yaml, a tag); a named pipe, a device or a file over ``limit``
    is refused before it is opened."""
    try:
        logs.check_regular(_plain(path), limit)
        return path.read_text(encoding="utf-8")
    except logs.LogError as exc:
        raise HistoryError(str(exc)) from None
    except UnicodeDecodeError:
        raise HistoryError(f"{path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise HistoryError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _step_ok(step: Any) -> bool:
    """A non-negative integer step up to ``MAX_STEP`` (compared before any float conversion: 10**400
    overflows a float)."""
    return _is_number(step) and 0 <= step <= MAX_STEP and float(step).is_integer()


def _as_float(value: Any) -> float | None:
    """A number as a float (an integer too large for a float is not a score: None)."""
    try:
        return float(value)
    except OverflowError:
        return None


def _from_rows(path: Path, rows: Iterable[Mapping[str, Any]]) -> tuple[dict[str, dict[int, float]], dict[str, str]]:
    """Series from rows of ``{step, metric: value, ...}`` (rows without a usable step are skipped), and
    the keys whose values were not numbers (the first one, for messages)."""
    series: dict[str, dict[int, float]] = {}
    not_numbers: dict[str, str] = {}
    for i, row in enumerate(rows):
        step = row.get("step")
        if not _step_ok(step):
            if step is not None:
                raise HistoryError(f"{path}: entry {i + 1} has step {_short(step)}; steps must be integers "
                                   f"from 0 to {MAX_STEP}")
            continue
        for key, value in row.items():
            if key in _NOT_METRICS:
                continue
            number = _as_float(value) if _is_number(value) else None
            if number is not None:
                series.setdefault(str(key), {})[int(step)] = number
            elif value is not None:
                not_numbers.setdefault(str(key), f"{_short(value)} at step {int(step)}")
    return series, not_numbers


def _under(folder: Path, pattern: Callable[[Path], bool]) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and pattern(p))


def _flat(values: Mapping[Any, Any], prefix: str = "", depth: int = 0) -> dict[str, str]:
    """The scalar values of a (nested) mapping as text, nested keys joined with dots (4 levels at
    most); lists and nulls left out. JSON spelling for non-strings (``true``, ``0.0005``)."""
    out: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if depth < 4:
                out.update(_flat(value, name + ".", depth + 1))
        elif isinstance(value, str):
            out[name] = value
        elif isinstance(value, (bool, int, float)):
            out[name] = json.dumps(value)
    return out


def _log_meta(path: Path, fmt: str) -> dict[str, str]:
    """A JSONL's header line (its first line, an object without a step) and a W&B ``config.yaml``
    beside a JSONL or W&B JSON history; {} when there is none or it cannot be read (metadata is never
    required: ``--group-by`` says which run lacks the key asked for)."""
    meta: dict[str, str] = {}
    if fmt == "jsonl":
        try:
            first = logs._first_lines(path, 1)
        except (OSError, logs.LogError):
            first = []
        head = logs._first_object(first[0]) if first else None
        if head is not None and logs.json_record(head) is None:
            meta.update(_flat(head))
    if fmt in ("jsonl", "wandb_json"):
        meta.update(_wandb_config(path.parent / "config.yaml"))
    return meta


def _wandb_config(path: Path) -> dict[str, str]:
    """W&B's run ``config.yaml`` (``key: {value: ..., desc: ...}``; ``wandb_version`` and ``_wandb`` left
    out), flattened; {} for a file that is absent, unreadable or not in that form."""
    if not path.is_file():
        return {}
    try:
        doc = yaml.load(_text(path, MAX_META_BYTES), Loader=_NoAliases)
    except (HistoryError, yaml.YAMLError, RecursionError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return _flat({k: v["value"] for k, v in doc.items()
                  if not str(k).startswith("_") and isinstance(v, dict) and "value" in v})


def _series_of(path: Path, rows: Iterable[Mapping[str, Any]], planned: int | None
               ) -> tuple[dict[str, dict[int, float]], int | None, Mapping[str, str]]:
    series, not_numbers = _from_rows(path, rows)
    return series, planned, MappingProxyType(not_numbers)


# ----------------------------------------------------------------------------- trainer_state.json
def _ts_accepts(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".json" and not _is_wandb_json(path)


def _head(path: Path) -> str:
    """The first non-blank line of a regular file (at most 4 KiB), '' for anything else."""
    try:
        logs.check_regular(path)
        with open(path, "rb") as f:
            for raw in iter(lambda: f.readline(4096), b""):
                if raw.strip():
                    return raw.decode("utf-8", "replace")
    except (OSError, logs.LogError):
        pass
    return ""


def _is_wandb_json(path: Path) -> bool:
    """A .json file holding a JSON list (W&B's exported history), not an object (a trainer_state.json)."""
    return path.is_file() and path.suffix.lower() == ".json" and _head(path).lstrip().startswith("[")


def _is_console_log(path: Path) -> bool:
    """A .log / .txt / .out file with verl console lines among its first lines."""
    if not (path.is_file() and path.suffix.lower() in logs.FORMATS["verl_console"].suffixes):
        return False
    try:
        return logs.has_console_line(path)
    except (OSError, logs.LogError):
        return False


def _ts_find(folder: Path) -> list[Found]:
    """trainer_state.json files; of ``run/checkpoint-N/trainer_state.json`` only the highest N per run."""
    return _latest_states([Found("trainer_state", p, (p,))
                           for p in _under(folder, lambda p: p.name == "trainer_state.json")])


def _latest_states(found: list[Found]) -> list[Found]:
    """Of the trainer_state.json files of one run (its own, its ``checkpoint-N/`` copies), only the
    latest: the run's own, else the highest N. Other runs' entries are kept as they are."""
    best: dict[Path, tuple[int, Found]] = {}
    for f in found:
        if f.reader == "trainer_state":
            m = re.fullmatch(r"checkpoint-(\d+)", f.path.parent.name)
            run_dir, rank = (f.path.parent.parent, int(m.group(1))) if m else (f.path.parent, 1 << 62)
            if run_dir not in best or rank > best[run_dir][0]:
                best[run_dir] = (rank, f)
    kept = {id(f) for _, f in best.values()}
    return [f for f in found if f.reader != "trainer_state" or id(f) in kept]


def _ts_read(found: Found) -> RawHistory:
    path = _plain(found.files[0])
    try:
        data = logs._json_document(path)
        rows, planned = logs.trainer_state(path, data)
        meta = _flat({k: v for k, v in data.items() if k != "log_history"})
        return RawHistory(_run_name(found), str(path), "trainer_state", *_series_of(path, rows, planned), meta)
    except logs.LogError as exc:  # the shared parser's messages name the file already
        raise HistoryError(str(exc)) from None


# ----------------------------------------------------------------------------- JSONL and CSV
def _suffix_in(*suffixes: str) -> Callable[[Path], bool]:
    return lambda p: p.is_file() and p.suffix.lower() in suffixes


def _rows_reader(name: str) -> Callable[[Found], RawHistory]:
    """A reader of the shared parser ``logs.FORMATS[name]``: rows streamed into series, one at a time."""

    def read(found: Found) -> RawHistory:
        path = _plain(found.files[0])
        try:
            series, not_numbers = _from_rows(path, logs.FORMATS[name].rows(path))
        except logs.LogError as exc:
            raise HistoryError(str(exc)) from None
        return RawHistory(_run_name(found), str(path), name, series, None, MappingProxyType(not_numbers),
                          MappingProxyType(_log_meta(path, name)))

    return read


def _files_finder(reader: str, accepts: Callable[[Path], bool]) -> Callable[[Path], list[Found]]:
    return lambda folder: [Found(reader, p, (p,)) for p in _under(folder, accepts)]


# ----------------------------------------------------------------------------- TensorBoard
def _is_event_file(path: Path) -> bool:
    return path.is_file() and ".tfevents." in path.name


def _tb_find(folder: Path) -> list[Found]:
    by_dir: dict[Path, list[Path]] = {}
    for p in _under(folder, _is_event_file):
        by_dir.setdefault(p.parent, []).append(p)
    return [Found("tensorboard", d, tuple(files)) for d, files in sorted(by_dir.items())]


def _tb_read(found: Found) -> RawHistory:
    for path in found.files:
        _plain(path)
    try:
        series = logs.tensorboard_series(found.files)
    except logs.LogError as exc:
        raise HistoryError(str(exc)) from None
    return RawHistory(_run_name(found), str(found.path), "tensorboard", series)


# ----------------------------------------------------------------------------- MLflow file store
def _is_mlflow_run(path: Path) -> bool:
    return path.is_dir() and (path / "meta.yaml").is_file() and (path / "metrics").is_dir()


def _mlflow_find(folder: Path) -> list[Found]:
    runs = [folder] if _is_mlflow_run(folder) else []
    runs += sorted(p for p in folder.rglob("*") if _is_mlflow_run(p) and ".trash" not in p.parts)
    return [Found("mlflow", p, (p / "meta.yaml",)) for p in runs]


class _NoAliases(yaml.SafeLoader):
    """YAML without aliases: MLflow never writes them, and nested ones expand exponentially (a few
    hundred bytes become gigabytes when the value is read)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed here",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)


def _mlflow_read(found: Found) -> RawHistory | None:
    meta_path = found.path / "meta.yaml"
    try:
        meta = yaml.load(_text(meta_path, MAX_META_BYTES), Loader=_NoAliases) or {}
    except yaml.YAMLError as exc:
        raise HistoryError(f"{meta_path}: invalid YAML ({exc})") from None
    except RecursionError:  # a few KB of nested brackets: not MLflow's meta.yaml
        raise HistoryError(f"{meta_path}: YAML nested too deeply to be MLflow's run meta.yaml") from None
    if not isinstance(meta, dict):
        raise HistoryError(f"{meta_path}: expected a mapping (MLflow's run meta.yaml)")
    if meta.get("lifecycle_stage") == "deleted":
        return None
    tag = found.path / "tags" / "mlflow.runName"  # where older MLflow versions keep the name
    name = str(meta.get("run_name") or (_text(tag).strip() if tag.is_file() else "") or meta.get("run_id")
               or found.path.name)
    series: dict[str, dict[int, float]] = {}
    metrics_dir = found.path / "metrics"
    for file in _under(metrics_dir, lambda p: True):
        key = file.relative_to(metrics_dir).as_posix()
        points = series.setdefault(key, {})
        try:
            lines = list(logs._lines(_plain(file)))
        except logs.LogError as exc:
            raise HistoryError(str(exc)) from None
        for lineno, line in lines:
            parts = line.split()
            if not parts:
                continue
            try:
                if len(parts) not in (2, 3):
                    raise ValueError
                value = float(parts[1])
                step = int(parts[2]) if len(parts) == 3 else 0  # MLflow's own default for old 2-field lines
            except ValueError:
                raise HistoryError(f"{file}:{lineno}: expected '<timestamp_ms> <value> <step>', got {line.strip()!r}"
                                   ) from None
            if not 0 <= step <= MAX_STEP:
                raise HistoryError(f"{file}:{lineno}: step {_short(step)} is not from 0 to {MAX_STEP}")
            points[step] = value
    params: dict[str, str] = {}
    params_dir = found.path / "params"  # MLflow's file store: one file per parameter, its value as text
    for file in _under(params_dir, lambda p: True) if params_dir.is_dir() else []:
        try:
            params[file.relative_to(params_dir).as_posix()] = _text(file, MAX_META_BYTES).strip()
        except HistoryError:  # a link, a pipe, not text: not a parameter MLflow wrote
            continue
    return RawHistory(f"{found.path.parent.name}/{name}", str(found.path), "mlflow", series,
                      meta=MappingProxyType(params))


READERS: Mapping[str, Reader] = MappingProxyType({r.name: r for r in (
    Reader("trainer_state", "trainer_state.json (transformers log_history)", _ts_accepts, _ts_find, _ts_read),
    Reader("jsonl", logs.FORMATS["jsonl"].description, _suffix_in(".jsonl", ".ndjson"),
           _files_finder("jsonl", _suffix_in(".jsonl", ".ndjson")), _rows_reader("jsonl")),
    Reader("csv", logs.FORMATS["csv"].description, _suffix_in(".csv", ".tsv"),
           _files_finder("csv", _suffix_in(".csv", ".tsv")), _rows_reader("csv")),
    Reader("wandb_json", logs.FORMATS["wandb_json"].description, _is_wandb_json,
           _files_finder("wandb_json", lambda p: p.name != "trainer_state.json" and _is_wandb_json(p)),
           _rows_reader("wandb_json")),
    Reader("verl_console", logs.FORMATS["verl_console"].description, _is_console_log,
           _files_finder("verl_console", _is_console_log), _rows_reader("verl_console")),
    Reader("tensorboard", "TensorBoard event files (*tfevents*)", _is_event_file, _tb_find, _tb_read),
    Reader("mlflow", "MLflow run folders (mlruns/<experiment>/<run>/ with meta.yaml and metrics/)",
           _is_mlflow_run, _mlflow_find, _mlflow_read),
)})


def _run_folder(trainer_state: Path) -> Path:
    """The run's output folder: the parent of ``checkpoint-N/`` or of the trainer_state.json itself."""
    parent = trainer_state.parent
    return parent.parent if re.fullmatch(r"checkpoint-\d+", parent.name) else parent


def _home(found: Found) -> Path:
    """The folder that holds the run (``RunHistory.folder``): a log file's folder; the folder above a
    run that is a folder itself (a transformers output folder, a TensorBoard event folder, an MLflow run)."""
    path = found.path
    if found.reader == "trainer_state" and path.name == "trainer_state.json":
        return _run_folder(path).parent
    if found.reader == "tensorboard":
        folder = path.parent if path.is_file() else path
        return folder.parent.parent.parent if folder.parent.name == "runs" else folder.parent  # <output>/runs/<date>
    return path.parent


def _run_name(found: Found) -> str:
    path = found.path
    if found.reader == "trainer_state" and path.name == "trainer_state.json":
        return _run_folder(path).name
    if found.reader == "tensorboard":
        folder = path.parent if path.is_file() else path  # the event files of one folder are one run
        # transformers logs to <output_dir>/runs/<date>_<host>/: the output folder names the run, not the time
        return f"{folder.parent.parent.name}/{folder.name}" if folder.parent.name == "runs" else folder.name
    return path.stem if path.is_file() else path.name


def _formats() -> str:
    return "; ".join(r.description for r in READERS.values())


# ----------------------------------------------------------------------------- discovery
def find_runs(paths: Sequence[str | Path], fmt: str | None = None) -> list[Found]:
    """Every run under ``paths`` (files, folders searched recursively, globs), each once, in order;
    ``fmt``: only runs of that reader (a name of :data:`READERS`)."""
    if not paths:
        raise HistoryError("no path given")
    if fmt is not None and fmt not in READERS:
        raise HistoryError(f"unknown --format {fmt!r}; formats: {', '.join(READERS)}")
    found: list[Found] = []
    for raw in paths:
        text = str(raw)
        matches = sorted(glob.glob(text, recursive=True)) if _GLOB_CHARS.search(text) else [text]
        if not matches:
            raise HistoryError(f"{text}: the pattern matches no file or folder")
        for match in matches:
            found += _find_one(Path(match), fmt)
    unique = list({(f.reader, f.path): f for f in found}.values())
    return _latest_states(unique)  # checkpoint copies named one by one (a glob) count once too


def _find_one(path: Path, fmt: str | None = None) -> list[Found]:
    if not path.exists():
        raise HistoryError(f"{path}: no such file or folder")
    if fmt is not None:
        reader = READERS[fmt]
        runs = [Found(fmt, path, (path,))] if path.is_file() else reader.find(path)
        if not runs:
            raise HistoryError(f"{path}: no {reader.description} found here")
        return runs
    if not path.is_dir() and not path.is_file():
        raise HistoryError(f"{path}: not a regular file (a named pipe or a device); copy the log to a file first")
    if path.is_file():
        reader = next((r for r in READERS.values() if r.accepts(path)), None)
        if reader is None:
            raise HistoryError(f"{path}: unknown format; calibrate reads: {_formats()}")
        if reader.name == "tensorboard":  # the folder is the run; this one file was asked for
            return [Found("tensorboard", path, (path,))]
        return [Found(reader.name, path, (path,))]
    if _is_mlflow_run(path):
        return _mlflow_find(path)
    runs = [f for r in READERS.values() for f in r.find(path)]
    # a transformers output folder logs to TensorBoard too (<run>/runs/<date>/): one run, read from trainer_state;
    # anything inside an MLflow run folder besides its metrics is an artifact
    hf_runs = [_run_folder(f.path) for f in runs if f.reader == "trainer_state"]
    ml_runs = [f.path for f in runs if f.reader == "mlflow"]
    beside = {d: [f.path for f in runs if f.reader == "tensorboard" and d in f.path.parents] for d in hf_runs}
    runs = [f for f in runs if not (f.reader == "tensorboard" and any(d in f.path.parents for d in hf_runs))
            and not (f.reader != "mlflow" and any(d in f.path.parents for d in ml_runs))]
    runs = [_say_beside(f, beside[_run_folder(f.path)]) if f.reader == "trainer_state" and beside.get(
        _run_folder(f.path)) else f for f in runs]
    if not runs:
        raise HistoryError(f"{path}: no run found in this folder; calibrate reads: {_formats()}")
    return runs


def _say_beside(found: Found, logs: list[Path]) -> Found:
    """``found`` (a trainer_state.json) with a note naming the TensorBoard logs of the same run it stands for."""
    where = ", ".join(str(p.relative_to(_run_folder(found.path))) for p in logs)
    return replace(found, note=f"{_run_folder(found.path)}: read from trainer_state.json; the TensorBoard logs of "
                               f"the same run ({where}) are not read again (pass their folder to read them instead)")


def read_run(found: Found) -> RawHistory | None:
    """Read one located run with its format's reader (None: a run to leave out, e.g. a deleted MLflow run)."""
    return READERS[found.reader].read(found)


# ----------------------------------------------------------------------------- metric selection
def choose_metric(raw: RawHistory) -> str:
    """The default metric: the only series, else ``evalstop/score`` (``train/evalstop/score`` in a
    TensorBoard log, where transformers prefixes the training logs), else the only eval metric
    (``eval_*`` or ``eval/*``, throughput keys excluded); else a HistoryError listing them."""
    watchable = [n for n in raw.metrics() if not is_evidence(n)]
    names = [n for n in watchable if n not in _LOSS_SERIES] or watchable
    if len(names) == 1:
        return names[0]
    for own in ("evalstop/score", "train/evalstop/score"):  # what EvalStopCallback saw
        if own in names:
            return own
    evals = [n for n in names if n.startswith(("eval_", "eval/"))
             and n.replace("eval/", "eval_") not in _NOT_SCORES and not n.startswith("evalstop/")]
    if len(evals) == 1:
        return evals[0]
    if not names:
        raise HistoryError(f"{raw.source}: no numeric metric found")
    raise HistoryError(f"{raw.source}: several candidate metrics ({', '.join(evals or names)}); choose one with "
                       "--metric (a loss wants --direction min)")


def _series(raw: RawHistory, metric: str, flag: str) -> Series:
    points = raw.series.get(metric)
    if not points and metric in raw.not_numbers:
        raise HistoryError(f"{raw.source}: {flag} {metric!r} holds no number: {raw.not_numbers[metric]}")
    if metric in raw.not_numbers:  # not dropped silently: the curve would lose an eval nobody sees
        raise HistoryError(f"{raw.source}: {flag} {metric!r} has a value that is not a number: "
                           f"{raw.not_numbers[metric]} (fix the log, leave the cell empty for a failed eval, "
                           "or leave this run out)")
    if not points:
        raise HistoryError(f"{raw.source}: {flag} {metric!r} not found; metrics in this run: "
                           f"{', '.join(raw.metrics()) or '(none)'}")
    steps = tuple(sorted(points))
    for s in steps:
        if not math.isfinite(points[s]):
            raise HistoryError(f"{raw.source}: {metric} at step {s} is {points[s]!r}; scores must be finite "
                               "(leave this run out, or fix its log)")
    return Series(metric, steps, tuple(points[s] for s in steps))


def _latest_at(raw: RawHistory, keys: Sequence[str], steps: tuple[int, ...]) -> tuple[float | None, ...] | None:
    """At each of ``steps``, the latest value logged at or before it of the first of ``keys`` the run
    logs (None before its first); None when it logs none of them."""
    key = next((k for k in keys if raw.series.get(k)), None)
    if key is None:
        return None
    values = {s: v for s, v in raw.series[key].items() if math.isfinite(v)}
    logged = sorted(values)
    out: list[float | None] = []
    j, last = 0, None
    for s in steps:
        while j < len(logged) and logged[j] <= s:
            last = values[logged[j]]
            j += 1
        out.append(last)
    return tuple(out)


def _evidence_at(raw: RawHistory, series: Series) -> tuple[tuple[int | None, float | None], ...]:
    """Each eval's logged (n, paired noise) (:func:`~.replay.evidence_keys`); () when none is logged."""
    keys = evidence_keys(series.metric)
    if keys is None:
        return ()
    for key in keys:
        if key in raw.not_numbers:  # as a metric's: not dropped silently (the eval would lose its evidence)
            raise HistoryError(f"{raw.source}: {key} has a value that is not a number: {raw.not_numbers[key]}")
    ns, noises = raw.series.get(keys[0]) or {}, raw.series.get(keys[1]) or {}
    if not ns and not noises:
        return ()
    try:
        return tuple(evidence_of(raw.source, s, ns.get(s), noises.get(s)) for s in series.steps)
    except ValueError as exc:  # the run is refused like any unreadable run: one line, the others read
        raise HistoryError(str(exc)) from None


def select(raw: RawHistory, metric: str | None = None, label_metric: str | None = None) -> RunHistory:
    """The run's detector series (``metric``, or :func:`choose_metric`) and label series (``label_metric``)."""
    scores = _series(raw, metric or choose_metric(raw), "metric")
    label = _series(raw, label_metric, "label metric") if label_metric else None
    last = max(max(points) for points in raw.series.values() if points)
    planned = raw.planned_steps or max(last, 1)
    losses = _latest_at(raw, _LOSS_SERIES, scores.steps) or (None,) * len(scores.steps)
    return RunHistory(raw.name, raw.source, raw.format, scores, label, losses, planned,
                      evidence=_evidence_at(raw, scores), meta=raw.meta,
                      proxies=_latest_at(raw, logged_names(REWARD_KEYS), scores.steps) or ())


def load_histories(paths: Sequence[str | Path], metric: str | None = None, label_metric: str | None = None,
                   progress: Callable[[list[Found]], Iterable[Found]] = iter,
                   on_error: Callable[[HistoryError], None] | None = None, fmt: str | None = None) -> list[RunHistory]:
    """Find, read and select every run under ``paths``. Without ``metric`` every run must default to
    the same one. Deleted MLflow runs are left out.

    ``on_error``: given each file that cannot be read (a HistoryError naming it), and the other runs are
    still read; None: the first one raises. Either way, no run read at all raises.
    """
    runs, errors = [], []
    for found in progress(find_runs(paths, fmt)):
        try:
            raw = read_run(found)
            if raw is None:
                continue
            run = select(raw, metric, label_metric)
        except HistoryError as exc:
            if on_error is None:
                raise
            errors.append(exc)
            on_error(exc)
            continue
        runs.append(replace(run, note=found.note, folder=str(_home(found))))
    if not runs and errors:
        raise HistoryError(f"no run could be read ({len(errors)} file(s) refused; the first: {errors[0]})")
    if not runs:
        raise HistoryError(f"no run to calibrate on under {', '.join(map(str, paths))}")
    chosen = {r.scores.metric for r in runs}
    if metric is None and len(chosen) > 1:
        examples = ", ".join(f"{r.source}: {r.scores.metric}" for r in
                             {r.scores.metric: r for r in runs}.values())
        raise HistoryError(f"the runs default to different metrics ({examples}); choose one with --metric")
    return runs

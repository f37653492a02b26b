"""Getting data out: a run's reports and a list of runs as CSV or JSON, written page by page.

:data:`FORMATS` maps a format name to its :class:`Format`: the media type, the file suffix, and how
to write rows of reports or job views as text chunks. The writers take iterables of pages and
yield chunks of about :data:`CHUNK` characters, so an export holds one page of records and one chunk
of text in memory whatever its size (the service streams the chunks, the next one only once the last
is sent: a reader that stops reading holds a chunk, not a page of text; the clients join them).

CSV cells that a spreadsheet would read as a formula (starting with ``= + - @``, a tab or a carriage
return) are prefixed with ``'``; numbers are written as numbers.

Example::

    >>> from evalstop_trl.core.records import Report
    >>> "".join(FORMATS["csv"].reports([[Report(10, 0.5)]]))
    'step,eval_score,train_loss,proxy_reward,checkpoint,eval_n,eval_noise,kl,length,received_at,planned_steps\\r\\n10,0.5,,,,,,,,0.0,\\r\\n'
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .codec import json_safe, to_wire
from .errors import InvalidInput
from .records import JobView, Report

__all__ = ["CHUNK", "FORMATS", "JOB_COLUMNS", "REPORT_COLUMNS", "Format", "export_format", "job_row"]

#: characters of text per chunk: a reader that stops reading holds about one chunk in the server (the
#: next is written only once it is sent), not a page of a thousand jobs with their tags and hparams
CHUNK = 256 * 1024
REPORT_COLUMNS = Report._fields  # a report's columns are its record's fields
JOB_COLUMNS = ("job_id", "job_type", "status", "detector", "policy", "tags", "hparams", "created_at", "last_seen",
               "ended_at", "duration_s", "n_reports", "last_step", "planned_steps", "best_step", "best_score",
               "best_checkpoint", "acked", "reason", "would_stop_step")


def job_row(v: JobView) -> dict[str, Any]:
    """One job as a flat row (the list export's columns)."""
    end = v.ended_at
    duration = None if end is None else max(0.0, end - v.created_at)
    return {
        "job_id": v.job_id, "job_type": v.job_type, "status": v.status, "detector": v.policy.get("detector"),
        "policy": json.dumps(json_safe(dict(v.policy)), sort_keys=True),
        "tags": json.dumps(json_safe(dict(getattr(v, "tags", None) or {})), sort_keys=True),
        "hparams": json.dumps(json_safe(dict(getattr(v, "hparams", None) or {})), sort_keys=True),
        "created_at": v.created_at, "last_seen": v.last_seen, "ended_at": end, "duration_s": duration,
        "n_reports": v.n_reports, "last_step": v.last_step, "planned_steps": v.planned_steps,
        "best_step": v.best_step, "best_score": v.best_score, "best_checkpoint": v.best_checkpoint,
        "acked": v.acked, "reason": v.decision.reason if v.decision is not None else None,
        "would_stop_step": getattr(v, "would_stop_step", None),
    }


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    if isinstance(value, float):
        value = json_safe(value)
        return "" if value is None else repr(value)
    return value


def _csv(columns: tuple[str, ...], pages: Iterable[Iterable[Mapping[str, Any]]]) -> Iterator[str]:
    buf = io.StringIO()
    out = csv.writer(buf)
    out.writerow(columns)
    for page in pages:
        for row in page:
            out.writerow([_cell(row.get(c)) for c in columns])
            if buf.tell() >= CHUNK:
                yield buf.getvalue()
                buf.seek(0)
                buf.truncate()
    rest = buf.getvalue()
    if rest:
        yield rest


def _json(pages: Iterable[Iterable[Any]], encode: Callable[[Any], Any]) -> Iterator[str]:
    first = True
    yield "["
    parts: list[str] = []
    size = 0
    for page in pages:
        for item in page:
            parts.append(("\n" if first else ",\n") + json.dumps(encode(item), allow_nan=False))
            size += len(parts[-1])
            first = False
            if size >= CHUNK:
                yield "".join(parts)
                parts, size = [], 0
    yield "".join(parts) + "\n]\n"


@dataclass(frozen=True, slots=True)
class Format:
    """One export format: its media type, file suffix and writers (pages in, text chunks out)."""

    name: str
    media_type: str
    suffix: str
    reports: Callable[[Iterable[Iterable[Report]]], Iterator[str]]
    jobs: Callable[[Iterable[Iterable[JobView]]], Iterator[str]]


FORMATS: Mapping[str, Format] = {f.name: f for f in (
    Format("csv", "text/csv; charset=utf-8", "csv",
           lambda pages: _csv(REPORT_COLUMNS, ((r._asdict() for r in p) for p in pages)),
           lambda pages: _csv(JOB_COLUMNS, ((job_row(v) for v in p) for p in pages))),
    Format("json", "application/json", "json",
           lambda pages: _json(pages, to_wire),
           lambda pages: _json(pages, to_wire)),
)}


def export_format(name: Any) -> Format:
    """The :class:`Format` called ``name``; InvalidInput listing the formats otherwise."""
    fmt = FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise InvalidInput(f"format must be one of {', '.join(FORMATS)}, but got {name!r}.")
    return fmt

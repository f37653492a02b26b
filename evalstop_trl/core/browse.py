"""Finding runs: the job list's search, filters, sort and keyset paging, over job records.

A :class:`JobQuery` is what a caller asks (``GET /v1/runs``): a search text, filters (status, job
type, detector, a tag), a sort key from :data:`SORTS`, an order, a page size and the cursor of the
previous page (``after``). :func:`select` answers it over a tenant's jobs (:class:`RunRow`: a few
columns of each record) — the same code for every store, so every backend orders and pages alike —
with a :class:`JobPage` of job ids: the
coordinator turns those (a page: at most :data:`MAX_PAGE`) into views.

Every sort key is read from the job's record (no report is replayed to sort or filter), and ties
are broken by the job id, so a cursor ``(key, job_id)`` names one place in the order: the next page
starts after it even while jobs are added (keyset paging, never an offset). The work is one pass
over the tenant's records (at most its ``max_jobs`` quota), whatever the caller sends.

Example::

    >>> q = JobQuery.parse(q="grpo", status="stopped", sort="started", order="desc", limit=50)
    >>> q.sort, q.descending, q.limit
    ('started', True, 50)
"""

from __future__ import annotations

import base64
import heapq
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import InvalidInput
from .records import JobRecord, JobStatus, JobType, check_text

__all__ = ["MAX_PAGE", "MAX_QUERY", "SORTS", "JobPage", "JobQuery", "RunRow", "encode_cursor", "finite_float", "select", "sort_key"]

MAX_PAGE = 1000  # jobs per page
MAX_QUERY = 128  # characters of a search text or a filter value
_MAX_CURSOR = 512


class RunRow(NamedTuple):
    """What the job list searches, filters and sorts of one job: a few columns of its record (a
    shared store reads just these, not whole records)."""

    job_id: str
    job_type: JobType
    status: JobStatus
    detector: str
    mode: str
    created_at: float
    updated_at: float
    stopped_at: float | None
    finished_at: float | None
    tags: Mapping[str, Any]

    @classmethod
    def of(cls, r: JobRecord) -> RunRow:
        mode = getattr(r.policy, "mode", "enforce")
        return cls(r.job_id, r.job_type, r.status, r.policy.detector, getattr(mode, "value", mode), r.created_at,
                   r.updated_at, r.stopped_at, r.finished_at, r.tags)


def _ended(r: RunRow) -> float | None:
    return r.stopped_at if r.stopped_at is not None else r.finished_at


def _duration(r: RunRow, now: float) -> float:
    end = _ended(r)
    return max(0.0, (now if end is None else end) - r.created_at)


#: sort name -> (label, key of a record at time ``now``); every key is a float or a str, never None
SORTS: Mapping[str, tuple[str, Callable[[RunRow, float], Any]]] = {
    "started": ("start time", lambda r, now: r.created_at),
    "job_id": ("job id", lambda r, now: r.job_id),
    "status": ("status", lambda r, now: r.status.value),
    "type": ("job type", lambda r, now: r.job_type.value),
    "detector": ("detector", lambda r, now: r.detector),
    "updated": ("last update", lambda r, now: r.updated_at),
    "ended": ("end time (a job still going ends after every ended one)",
              lambda r, now: _ended(r) if _ended(r) is not None else math.inf),
    "duration": ("duration", _duration),
}


def sort_key(name: str, record: RunRow, now: float) -> tuple[Any, str]:
    """The position of ``record`` in the ``name`` order: ``(key, job_id)``."""
    return SORTS[name][1](record, now), record.job_id


@dataclass(frozen=True, slots=True)
class JobQuery:
    """One page of a tenant's runs: what to match, in which order, after which cursor.

    Build it with :meth:`parse` (the one validation: an :class:`InvalidInput` names the field and
    what it takes). ``tag`` is ``"key"`` (the job has that tag) or ``"key=value"``."""

    q: str = ""
    status: JobStatus | None = None
    job_type: JobType | None = None
    detector: str | None = None
    tag: tuple[str, str | None] | None = None
    sort: str = "started"
    descending: bool = True
    limit: int = 50
    after: tuple[Any, str] | None = None
    at: float | None = None  # the time the first page was read at (from the cursor): durations as then

    @classmethod
    def parse(cls, q: Any = None, status: Any = None, job_type: Any = None, detector: Any = None, tag: Any = None,
              sort: Any = None, order: Any = None, limit: Any = None, after: Any = None) -> JobQuery:
        text = _text("q", q).casefold()
        st = None
        if status not in (None, ""):
            try:
                st = JobStatus(status)
            except ValueError:
                raise InvalidInput(f"Unknown status {status!r}; valid statuses are: "
                                   f"{', '.join(s.value for s in JobStatus)}.") from None
        jt = None if job_type in (None, "") else JobType.parse(job_type)
        det = _text("detector", detector) or None
        sort = sort or "started"
        if sort not in SORTS:
            raise InvalidInput(f"Unknown sort {sort!r}; valid sorts are: {', '.join(SORTS)}.")
        if order not in (None, "", "asc", "desc"):
            raise InvalidInput(f"order must be 'asc' or 'desc', but got {order!r}.")
        if limit is None:
            limit = 50
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise InvalidInput(f"limit must be an integer in [1, {MAX_PAGE}], but got {limit!r}.")
        position, at = _decode_cursor(after, sort)
        return cls(text, st, jt, det, _tag(tag), sort, order != "asc", limit, position, at)

    def matches(self, r: RunRow) -> bool:
        """Whether the job is one of the runs asked for (search: the job id or a tag's key or value)."""
        if self.status is not None and r.status is not self.status:
            return False
        if self.job_type is not None and r.job_type is not self.job_type:
            return False
        if self.detector is not None and r.detector != self.detector:
            return False
        tags = r.tags
        if self.tag is not None:
            key, value = self.tag
            if key not in tags or (value is not None and str(tags[key]) != value):
                return False
        if self.q and self.q not in r.job_id.casefold() and not any(
                self.q in str(k).casefold() or self.q in str(v).casefold() for k, v in tags.items()):
            return False
        return True


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of runs: their ids in order, how many match in all, and the cursor of the next page
    (None on the last one). The API's answer carries the views instead of the ids."""

    jobs: tuple[Any, ...]
    total: int
    next: str | None = None


def _text(name: str, value: Any) -> str:
    if value is None:
        return ""
    return check_text(name, value, MAX_QUERY).strip()


def _tag(value: Any) -> tuple[str, str | None] | None:
    text = _text("tag", value)
    if not text:
        return None
    key, eq, wanted = text.partition("=")
    if not key.strip():
        raise InvalidInput(f"tag must be 'key' or 'key=value', but got {value!r}.")
    return key.strip(), (wanted.strip() if eq else None)


def encode_cursor(sort: str, position: tuple[Any, str], at: float) -> str:
    """The opaque ``after`` of the page that follows ``position`` in the ``sort`` order; ``at``: the
    time the first page was read at (a running job's duration is counted up to it on every page, so
    the order does not move under the cursor)."""
    key, job_id = position
    key = None if isinstance(key, float) and math.isinf(key) else key
    raw = json.dumps([sort, key, job_id, at], separators=(",", ":"), allow_nan=False)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(value: Any, sort: str) -> tuple[tuple[Any, str] | None, float | None]:
    if value in (None, ""):
        return None, None
    bad = InvalidInput("after must be the 'next' cursor of the previous page of the same sort (or left out for "
                       "the first page).")
    if not isinstance(value, str) or len(value) > _MAX_CURSOR:
        raise bad
    try:
        data = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (ValueError, TypeError):
        raise bad from None
    if not (isinstance(data, list) and len(data) == 4 and data[0] == sort and isinstance(data[2], str)):
        raise bad
    key, at = data[1], finite_float(data[3])
    if key is None:
        key = math.inf  # "ended" of a running job
    elif not isinstance(key, str):
        key = finite_float(key)  # NaN, an infinity or an integer too big for a float is no position
    if key is None or at is None:
        raise bad
    return (key, data[2]), at


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float; None for anything else (text, a bool, NaN, an infinity, an
    integer beyond a float's range: float() of one would raise OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def select(records: Iterable[RunRow], query: JobQuery, now: float) -> JobPage:
    """The page of ``records`` that ``query`` asks for (ids in order), its total and next cursor.

    One pass: the matches are counted and the ``limit + 1`` first after the cursor kept in a bounded
    heap (memory of a page, whatever the tenant's number of jobs). ``now`` is the time of a first
    page; the next pages keep the one their cursor carries."""
    name, desc, after = query.sort, query.descending, query.after
    now = now if query.at is None else query.at
    total = 0

    def candidates():
        nonlocal total
        for r in records:
            if query.matches(r):
                total += 1
                pos = sort_key(name, r, now)
                if after is None or not _not_after(pos, after, desc):
                    yield pos

    want = query.limit + 1
    top = heapq.nlargest(want, candidates()) if desc else heapq.nsmallest(want, candidates())
    more = len(top) > query.limit
    top = top[:query.limit]
    nxt = encode_cursor(name, top[-1], now) if more and top else None
    return JobPage(tuple(job_id for _, job_id in top), total, nxt)


def _not_after(pos: tuple[Any, str], after: tuple[Any, str], desc: bool) -> bool:
    try:
        return pos >= after if desc else pos <= after
    except TypeError:
        raise InvalidInput("after must be the 'next' cursor of the previous page of the same sort.") from None

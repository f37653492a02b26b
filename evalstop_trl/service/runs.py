"""The service's side of the run browser: the query strings of ``/v1/runs`` and the exports, and
the streamed answer of an export.

The query models only bound what travels (lengths, the page size); :meth:`JobQuery.parse
<evalstop_trl.core.browse.JobQuery.parse>` is the one validation of their meaning, shared with the
embedded client. An export's handler returns a :class:`Stream`: its chunks are read from the store
a page at a time while they are sent (in the thread pool), so an export's memory is one page.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from pydantic import BaseModel, Field
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..core.browse import MAX_PAGE, MAX_QUERY, JobQuery
from ..core.export import FORMATS
from .schemas import Line

__all__ = ["ExportQuery", "RunsExportQuery", "RunsQuery", "Stream", "StreamAnswer", "job_query"]

_FORMATS = "|".join(FORMATS)


class _Filters(BaseModel):
    q: Line | None = Field(None, max_length=MAX_QUERY, description="search: part of the job id, a tag key or value")
    status: Line | None = Field(None, max_length=32, description="only jobs with this status")
    job_type: Line | None = Field(None, max_length=32, description="only jobs of this type")
    detector: Line | None = Field(None, max_length=MAX_QUERY, description="only jobs watched by this detector")
    tag: Line | None = Field(None, max_length=MAX_QUERY, description="only jobs with this tag: key or key=value")
    sort: Line | None = Field(None, max_length=32, description="started (default), job_id, status, type, detector, "
                              "updated, ended, duration")
    order: Line | None = Field(None, max_length=32, description="desc (default) or asc")


class RunsQuery(_Filters):
    limit: int = Field(50, ge=1, le=MAX_PAGE)
    after: Line | None = Field(None, max_length=512, description="keyset paging: the 'next' of the previous page")


class RunsExportQuery(_Filters):
    format: Line = Field("csv", max_length=8, pattern=f"^({_FORMATS})$")


class ExportQuery(BaseModel):
    format: Line = Field("csv", max_length=8, pattern=f"^({_FORMATS})$")


def job_query(**values: Any) -> JobQuery:
    """The :class:`JobQuery` of a request's query values (unknown keys such as ``format`` ignored)."""
    names = ("q", "status", "job_type", "detector", "tag", "sort", "order", "limit", "after")
    return JobQuery.parse(**{k: values[k] for k in names if k in values})


class Stream(NamedTuple):
    """A streamed answer: text chunks, their media type and the file name a browser saves them as.
    ``close`` runs once the last chunk is sent (or the client went away)."""

    chunks: Iterator[str]
    media_type: str
    filename: str
    close: Callable[[], None] | None = None

    def body(self) -> Iterator[bytes]:
        """The encoded chunks. ``close`` runs when they are all sent, when the client goes away
        mid-stream, and also when the body is dropped before its first chunk (a client that went away
        before the answer started): a finalizer on the generator, so a tenant's read slot is never lost."""
        gen = self._encoded()
        if self.close is not None:
            weakref.finalize(gen, self.close)
        return gen

    def _encoded(self) -> Iterator[bytes]:
        try:
            for chunk in self.chunks:
                yield chunk.encode()
        finally:
            if self.close is not None:
                self.close()


class StreamAnswer(StreamingResponse):
    """The HTTP answer of a :class:`Stream`: its ``close`` runs when the answer is over, however it
    ends (sent, the client gone before or during it, cancelled) — not left to the garbage collector,
    so the tenant's read slot the export holds is free again at once."""

    def __init__(self, stream: Stream) -> None:
        super().__init__(stream.body(), media_type=stream.media_type, headers={
            "Content-Disposition": f'attachment; filename="{stream.filename}"', "Cache-Control": "no-store"})
        self._close = stream.close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._close is not None:
                self._close()

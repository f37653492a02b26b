"""The service's query-string models (pydantic): the one validation of a listing's paging values.

A route's JSON body has no model here: it is derived from the route's request record
(:mod:`evalstop_trl.core.requests`, ``service/routes.py: body_model``) and its values are the
coordinator's to check. Query text holds no control character (``check_text``: PostgreSQL cannot
store a NUL). Answers are encoded by the route's codec (:mod:`evalstop_trl.core.codec`), never here.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field

from ..core.api import MAX_PAGE, MAX_WAIT_S
from ..core.errors import InvalidInput
from ..core.records import MAX_STEP, check_text

__all__ = ["AuditQuery", "JobsQuery", "Line", "ReportsQuery", "WaitQuery"]


def _text(multiline: bool) -> AfterValidator:
    def check(v: Any) -> Any:
        if v is None:
            return v
        try:
            return check_text("the text", v, len(v), multiline=multiline)
        except InvalidInput as exc:
            raise ValueError(str(exc).replace("the text must", "must")) from None

    return AfterValidator(check)


Line = Annotated[str, _text(multiline=False)]  # a name, a filter: no control character at all


class JobsQuery(BaseModel):
    status: Line | None = Field(None, max_length=32, description="only jobs with this status")
    limit: int = Field(MAX_PAGE, ge=1, le=MAX_PAGE)
    offset: int = Field(0, ge=0, le=10**9)


class ReportsQuery(BaseModel):
    after_step: int | None = Field(None, ge=-1, le=MAX_STEP, description="only reports after this step")
    limit: int = Field(MAX_PAGE, ge=1, le=MAX_PAGE)


class AuditQuery(BaseModel):
    job_id: Line | None = Field(None, max_length=128, description="only this job's records")
    limit: int = Field(MAX_PAGE, ge=1, le=MAX_PAGE)
    offset: int = Field(0, ge=0, le=10**9)


class WaitQuery(BaseModel):
    wait: float = Field(0.0, ge=0, le=MAX_WAIT_S, description="long poll: seconds to wait for the job to settle")
    stopped: bool = Field(False, description="wait until the job is stopped (not only no longer running)")

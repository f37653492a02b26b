"""The service's request schemas (pydantic): one model per route's body or query string.

Names use the one rule of :mod:`evalstop_trl.core.records` (``NAME_PATTERN``); numbers are checked
to be finite here, so a NaN never reaches the coordinator; strings hold no NUL (PostgreSQL cannot
store one: it would be a 503 for ever, and a fail-open outbox would never drain) and no other control
character, except tabs and line breaks in free text (reasons, errors) (``check_text``). Answers are encoded by the route's codec
(:mod:`evalstop_trl.core.codec`), never here.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from ..core.api import MAX_PAGE, MAX_WAIT_S
from ..core.errors import InvalidInput
from ..core.records import MAX_PATH, MAX_STEP, NAME_PATTERN, check_text

__all__ = ["AckIn", "AuditQuery", "ClaimIn", "EvalResultIn", "EventIn", "FailIn", "JobIn", "JobsQuery", "ReportIn",
           "ReportsQuery", "SnapshotIn", "StopIn", "WaitQuery"]

_ID_PATTERN = rf"^{NAME_PATTERN}$"  # pydantic's (Rust) regex: $ is the very end of the text


def _number(v: Any) -> Any:
    if v is None:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"must be a number, got {type(v).__name__}")
    try:
        finite = math.isfinite(v)
    except OverflowError:  # an integer too large for a float, e.g. 10**400
        finite = False
    if not finite or abs(v) > 1e300:
        raise ValueError("must be a finite number of reasonable size (NaN, infinity and huge values are not allowed; "
                         "send null for a missing value)")
    return float(v) if isinstance(v, int) else v


def _integer(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"must be an integer, got {v!r}")
    return v


def _text(multiline: bool) -> AfterValidator:
    def check(v: Any) -> Any:
        if v is None:
            return v
        try:
            return check_text("the text", v, len(v), multiline=multiline)
        except InvalidInput as exc:
            raise ValueError(str(exc).replace("the text must", "must")) from None

    return AfterValidator(check)


Num = Annotated[float | None, BeforeValidator(_number)]
Int = Annotated[int, BeforeValidator(_integer)]
Line = Annotated[str, _text(multiline=False)]  # a path, a name: no control character at all
Text = Annotated[str, _text(multiline=True)]  # free text: tabs and line breaks allowed, no NUL


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobIn(_In):
    job_id: str = Field(pattern=_ID_PATTERN, description="unique per tenant; letters, digits and _ . : @ -")
    job_type: Line | None = Field(None, max_length=32, description="rlhf when the job is created without one")
    planned_steps: Annotated[int | None, BeforeValidator(lambda v: v if v is None else _integer(v))] = Field(
        None, gt=0, le=MAX_STEP)
    policy: dict[str, Any] | None = Field(
        None, description='e.g. {"detector": "decline", "k": 2, "min_delta": 0}; every parameter is bounded '
                          '(k and window in [1, 1000], min_delta in [0, 1e6])')
    webhook: Line | None = Field(None, max_length=2048, description="http(s) URL notified on stop (signed; the "
                                "operator's allowlist decides where webhooks may go)")
    tags: dict[str, Any] | None = Field(None, description="user tags: at most 32, keys <= 64 characters, text values "
                                        "<= 256 characters (evalstop_trl.core.labels)")
    hparams: dict[str, Any] | None = Field(None, description="hyperparameters: at most 32, keys <= 64 characters, "
                                           "finite numbers, booleans or text <= 256 characters")


class ReportIn(_In):
    step: Int = Field(ge=0, le=MAX_STEP)
    eval_score: Num = None
    train_loss: Num = None
    proxy_reward: Num = None
    checkpoint: Line | None = Field(None, max_length=MAX_PATH)


class StopIn(_In):
    reason: Text = Field("", max_length=2000)


class FailIn(_In):
    reason: Text = Field("", max_length=2000)


class HeartbeatIn(_In):
    actor: Line = Field("job", min_length=1, max_length=128, description="who says the job is alive")


class EventIn(_In):
    kind: Line = Field(description='"launcher_sigterm", "launcher_sigkill" or "launcher_exit"')
    reason: Text = Field("", max_length=2000)
    exit_code: Annotated[int | None, BeforeValidator(lambda v: v if v is None else _integer(v))] = Field(
        None, ge=-255, le=255)


class AckIn(_In):
    checkpoint: Line | None = Field(None, max_length=MAX_PATH)
    step: Annotated[int | None, BeforeValidator(lambda v: v if v is None else _integer(v))] = Field(
        None, ge=0, le=MAX_STEP, description="the step the job stopped at (gives the stop lag)")


class SnapshotIn(_In):
    step: Int = Field(ge=0, le=MAX_STEP)
    path: Line = Field(min_length=1, max_length=MAX_PATH, description="the snapshot's folder, as evaluators see it")
    train_loss: Num = None
    proxy_reward: Num = None


class ClaimIn(_In):
    worker: Line = Field(min_length=1, max_length=128)
    lease_s: float = Field(300.0, ge=1, le=3600)


class EvalResultIn(_In):
    score: Num = None
    error: Text | None = Field(None, max_length=2000, description="why the eval failed (then score is null)")
    worker: Line = Field("", max_length=128)


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

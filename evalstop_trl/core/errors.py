"""One exception hierarchy for the whole package.

Every error the coordinator raises for something a caller did wrong derives from
:class:`EvalStopError`; the HTTP service maps each class to one status code (see ``status_code``).

* :class:`InvalidInput` (422, also a ``ValueError``): a value is wrong; the message says which and why.
* :class:`Unauthorized` (401): missing, unknown or revoked token.
* :class:`NotFound` (404): no such job for this tenant (also answered for other tenants' jobs).
* :class:`Conflict` (409): the request contradicts stored state (a different payload for a stored
  step, a different registration for an existing job id, ...).
* :class:`QuotaExceeded` (429): a tenant's quota (active jobs, reports per job, report rate) is used
  up; ``retry_after`` says when to try again, if waiting helps.
"""

from __future__ import annotations


class EvalStopError(Exception):
    """Base class of all errors raised on purpose by evalstop."""

    status_code = 400


class InvalidInput(EvalStopError, ValueError):
    status_code = 422


class Unauthorized(EvalStopError):
    status_code = 401


class NotFound(EvalStopError, LookupError):
    status_code = 404


class Conflict(EvalStopError):
    status_code = 409


class QuotaExceeded(EvalStopError):
    status_code = 429

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after

"""The HTTP transport of :class:`~evalstop_trl.clients.http.EvalStopClient`: requests with timeouts,
retries with exponential backoff, and an outage state that probes the coordinator at most every
``probe_interval_s`` (so a training step never waits on timeouts again and again).

4xx answers raise a :class:`ClientError` subclass that is also the core's error class for that
status (401 :class:`Unauthorized`, 404 :class:`NotFound`, 409 :class:`Conflict`, 422
:class:`InvalidInput`, 429 :class:`QuotaExceeded` with the answer's ``Retry-After`` as its
``retry_after``), so ``except Conflict`` works the same against the embedded coordinator and the
service. A refusal is never retried and never an outage: a 429 says the coordinator is up and
counting. Only connection errors, timeouts, 502/503/504 and 2xx answers that are not JSON, after
the retries, raise :class:`Unreachable` (the fail-open path); so does an answer that is not what
the route returns (``call(decode=...)``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..core.errors import Conflict, EvalStopError, InvalidInput, NotFound, QuotaExceeded, Unauthorized

__all__ = ["ClientError", "ConflictError", "InvalidInputError", "NotFoundError", "QuotaExceededError", "Transport",
           "Unreachable", "UnauthorizedError"]

log = logging.getLogger("evalstop.client")


class ClientError(EvalStopError):
    """The coordinator refused a request (4xx)."""

    def __init__(self, method: str, url: str, status: int, detail: str) -> None:
        super().__init__(f"{method} {url} -> {status}: {detail}")
        self.method, self.url, self.status_code, self.detail = method, url, status, detail

    @staticmethod
    def of(method: str, url: str, status: int, detail: str, retry_after: float | None = None) -> ClientError:
        """The ClientError subclass for ``status`` (also the core's error class for it)."""
        error = _BY_STATUS.get(status, ClientError)(method, url, status, detail)
        if isinstance(error, QuotaExceeded):
            error.retry_after = retry_after
        return error


class UnauthorizedError(ClientError, Unauthorized):
    """401 from the service."""


class NotFoundError(ClientError, NotFound):
    """404 from the service."""


class ConflictError(ClientError, Conflict):
    """409 from the service."""


class InvalidInputError(ClientError, InvalidInput):
    """422 from the service."""


class QuotaExceededError(ClientError, QuotaExceeded):
    """429 from the service (``retry_after``: its ``Retry-After`` in seconds, if it sent one)."""


_BY_STATUS: dict[int, type[ClientError]] = {401: UnauthorizedError, 404: NotFoundError, 409: ConflictError,
                                            422: InvalidInputError, 429: QuotaExceededError}
#: the answers that mean the coordinator is away (a gateway without it, or it says it cannot serve now)
_OUTAGE = frozenset({500, 502, 503, 504})


def _retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (None if absent or not a number of seconds)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds <= 86400 else None


def _excerpt(text: str, n: int = 200) -> str:
    """The start of a text someone else wrote, on one line (control characters escaped)."""
    text = text[:n]
    return text.encode("unicode_escape", "backslashreplace").decode("ascii") if not text.isprintable() else text


class Unreachable(Exception):
    """The coordinator did not answer (connection error or 5xx after the retries, or in back-off)."""


class Transport:
    """Requests to one coordinator (or to replicas of it) with one bearer token.

    Args:
        url: the coordinator, e.g. ``http://127.0.0.1:8765``, or replicas of one coordinator separated
            by commas (``http://a:8765,http://b:8765``): a request that gets no answer from one
            replica (connection error, 5xx) is retried on the next.
        token: the tenant's bearer token.
        timeout_s: per-request timeout; connect_timeout_s: connection timeout.
        retries: retries per call on connection errors and 5xx; backoff_s: first backoff (doubles).
        probe_interval_s: during an outage, contact the coordinator at most this often.
        transport: an httpx transport (``httpx.MockTransport`` in unit tests).
    """

    def __init__(self, url: str, token: str, *, timeout_s: float = 5.0, connect_timeout_s: float = 1.0,
                 retries: int = 2, backoff_s: float = 0.1, probe_interval_s: float = 2.0, transport: Any = None,
                 on_outage: str = "memory") -> None:
        import httpx

        urls = [u.strip().rstrip("/") for u in url.split(",")] if isinstance(url, str) else [url]
        for u in urls:
            if not isinstance(u, str) or not u.startswith(("http://", "https://")):
                raise ValueError(f"url must start with http:// or https://, but got {u!r}.")
            try:
                parsed = httpx.URL(u)
            except (httpx.InvalidURL, ValueError) as exc:
                raise ValueError(f"url {u!r} is not a valid URL ({exc}); write it as http://HOST:PORT") from None
            if not parsed.host or not 0 < (parsed.port or 80) < 65536:
                raise ValueError(f"url {u!r} needs a host and a port in [1, 65535]; write it as http://HOST:PORT")
        if not token:
            raise ValueError("token is empty; create one with 'evalstop tenants add NAME'.")
        self.urls = urls
        self._current = 0  # the replica that answered last
        self.url = ",".join(urls)
        self._http = httpx.Client(
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s), transport=transport,
        )
        self._httpx = httpx
        self.retries, self.backoff_s, self.probe_interval_s = retries, backoff_s, probe_interval_s
        self.kept_in = on_outage  # where fail-open operations go during an outage (for the log line)
        self.unreachable = False
        self._next_probe = 0.0

    def send(self, method: str, path: str, body: dict[str, Any] | None = None, retries: int | None = None,
             timeout: float | None = None, text: bool = False) -> Any:
        httpx = self._httpx
        attempts = 1 + (self.retries if retries is None else retries)
        attempts = max(attempts, len(self.urls))  # every replica gets one try at least
        last = ""
        for attempt in range(attempts):
            base = self.urls[self._current]
            try:
                r = self._http.request(method, base + path, json=body,
                                       **({} if timeout is None else {"timeout": timeout}))
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if r.status_code < 400:
                    if r.status_code == 204:
                        return None
                    if text:  # an export: the answer is text (CSV or JSON), returned as it came
                        return r.text
                    try:
                        return r.json()
                    except (ValueError, RecursionError):  # HTML from a proxy, a torn or absurdly nested body
                        last = f"HTTP {r.status_code} with an answer that is not JSON: {_excerpt(r.text)}"
                elif r.status_code not in _OUTAGE:
                    try:
                        detail = r.json().get("detail", r.text)
                    except (ValueError, RecursionError, AttributeError):
                        detail = r.text
                    raise ClientError.of(method, f"{base}{path}", r.status_code, _excerpt(str(detail), 2000),
                                         _retry_after(r.headers.get("retry-after")))
                else:
                    last = f"HTTP {r.status_code}"
            if len(self.urls) > 1:
                self._current = (self._current + 1) % len(self.urls)  # the next replica
            if attempt + 1 < attempts:
                time.sleep(self.backoff_s * 2**attempt)
        raise Unreachable(last)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             decode: Callable[[Any], Any] | None = None) -> Any:
        """One request, honouring the outage back-off; returns the answer (``decode(answer)`` with a
        ``decode``). Raises Unreachable when no replica answers, and also when the answer is not what
        the route returns (``decode`` raises): a coordinator that answers nonsense is treated as away."""
        now = time.monotonic()
        if self.unreachable and now < self._next_probe:
            raise Unreachable("in back-off")
        try:
            result = self.send(method, path, body, retries=0 if self.unreachable else None)
            if decode is not None:
                try:
                    result = decode(result)
                except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
                    raise Unreachable(f"a malformed answer to {method} {path}: {_excerpt(str(exc))}") from None
        except Unreachable as exc:
            if not self.unreachable:
                log.warning(
                    "EvalStop coordinator at %s is unreachable (%s); training continues (fail-open), reports are "
                    "kept in %s and replayed when it returns", self.url, exc,
                    self.kept_in)
            self.unreachable = True
            self._next_probe = time.monotonic() + self.probe_interval_s
            raise
        if self.unreachable:
            self.unreachable = False
            log.warning("EvalStop coordinator at %s is reachable again", self.url)
        return result

    def close(self) -> None:
        self._http.close()

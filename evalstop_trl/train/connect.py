"""Which client a callback reports through: embedded SQLite, a service URL, or an object given."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..clients.api import EvalStopAPI
from ..clients.embedded import EmbeddedClient
from ..clients.http import EvalStopClient
from ..core.coordinator import DEFAULT_LEASE_S, Coordinator
from ..stores.sqlite import SQLiteStore

__all__ = ["connect"]


def connect(coordinator: Any, token: str | None, output_dir: str | os.PathLike) -> EvalStopAPI:
    """A client for ``coordinator``:

    * None: ``$EVALSTOP_URL`` if set (e.g. by ``evalstop run``), else an embedded coordinator over
      ``<output_dir>/evalstop.db`` with the service's default lease (a job silent for 300 s is
      ``lost`` to whoever opens the file next; the session's heartbeats keep a live one running);
    * an ``http(s)://`` URL: :class:`EvalStopClient` with ``token`` (or ``$EVALSTOP_TOKEN``) and a
      durable outbox at ``<output_dir>/evalstop-outbox.jsonl``;
    * a :class:`Coordinator`: an embedded client over it; an :class:`EvalStopAPI` (either client,
      or a test's own): itself.
    """
    if coordinator is None and os.environ.get("EVALSTOP_URL"):
        coordinator = os.environ["EVALSTOP_URL"]
    if coordinator is None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        return EmbeddedClient(Coordinator(SQLiteStore(out / "evalstop.db", shared=True), lease_s=DEFAULT_LEASE_S))
    if isinstance(coordinator, str):
        token = token or os.environ.get("EVALSTOP_TOKEN")
        if not token:
            raise ValueError("EvalStopCallback: a coordinator URL needs a token: pass token=... or set "
                             "EVALSTOP_TOKEN (create one with 'evalstop tenants add NAME').")
        return EvalStopClient(coordinator, token, outbox=Path(output_dir) / "evalstop-outbox.jsonl")
    if isinstance(coordinator, Coordinator):
        return EmbeddedClient(coordinator)
    if isinstance(coordinator, EvalStopAPI):
        return coordinator
    raise ValueError(f"EvalStopCallback: coordinator must be None, a URL, a client or a Coordinator, "
                     f"but got {type(coordinator).__name__}.")

"""Looking into a coordinator from the command line, the embedded default included.

``evalstop audit [JOB] --db PATH`` reads an embedded coordinator's ``evalstop.db`` (the file the
callback keeps in its output folder, tenant ``local``); ``--url URL`` a running ``evalstop serve``
with the tenant's token (``$EVALSTOP_TOKEN``). :func:`open_client` is the one place a command picks
between the two, so every inspection command reads both the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .common import CLIError, add_token_flags, existing_db, read_token

__all__ = ["add_inspect_commands", "add_target_flags", "embedded_db", "open_client"]


def add_target_flags(p: argparse.ArgumentParser) -> None:
    """``--db PATH [--tenant T]`` or ``--url URL [--token T]``."""
    p.add_argument("--db", help="an embedded coordinator's SQLite file (e.g. out/evalstop.db); no server needed")
    p.add_argument("--tenant", default="local", help="with --db: the tenant (default: local, the embedded one)")
    p.add_argument("--url", help="coordinator URL (default: $EVALSTOP_URL or http://127.0.0.1:8765)")
    add_token_flags(p)


def embedded_db(cwd: str = ".") -> str | None:
    """The embedded coordinator's file a command run next to it means: ``./evalstop.db``, else the one
    ``evalstop.db`` in a folder of ``cwd`` (an output folder); None if there is none, or several."""
    here = os.path.join(cwd, "evalstop.db")
    if os.path.isfile(here):
        return here
    found = sorted(os.path.join(cwd, d, "evalstop.db") for d in os.listdir(cwd)
                   if os.path.isfile(os.path.join(cwd, d, "evalstop.db")))
    return found[0] if len(found) == 1 else None


def open_client(args: argparse.Namespace):
    """An :class:`~evalstop_trl.clients.api.EvalStopAPI` client for ``args``: embedded over ``--db`` (leases
    applied: a job whose process died shows as lost), else HTTP to ``--url``. With neither (and no
    ``$EVALSTOP_URL`` or token), the embedded file next to the command (:func:`embedded_db`), said on stderr."""
    no_target = not (getattr(args, "db", None) or getattr(args, "url", None) or os.environ.get("EVALSTOP_URL"))
    if no_target and not (getattr(args, "token", None) or getattr(args, "token_file", None)
                          or os.environ.get("EVALSTOP_TOKEN")):
        found = embedded_db()
        if found is not None:
            print(f"evalstop: reading the embedded coordinator's {found} (--db; --url for a service)", file=sys.stderr)
            args.db = found
    if getattr(args, "db", None):
        from ..clients.embedded import EmbeddedClient
        from ..core.coordinator import Coordinator
        from ..stores.sqlite import SQLiteStore

        try:
            store = SQLiteStore(existing_db(args.db), shared=True)  # a training process may be writing it
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        coordinator = Coordinator(store, lease_s=_lease())
        names = [t.name for t in coordinator.tenants.list()]
        if names and args.tenant not in names:  # a service's database: its jobs belong to its tenants
            shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            print(f"evalstop: reading tenant {args.tenant!r} of {args.db}, whose tenants are {shown}: pass "
                  "--tenant NAME for theirs", file=sys.stderr)
        return EmbeddedClient(coordinator, tenant=args.tenant)
    from ..clients.http import EvalStopClient

    url = args.url or os.environ.get("EVALSTOP_URL", "http://127.0.0.1:8765")
    try:
        token = read_token(args)
    except CLIError as exc:
        if no_target:  # most likely a run's embedded file: say how to read it
            raise CLIError(f"{exc}; or read an embedded coordinator's file with --db PATH/evalstop.db") from None
        raise
    return EvalStopClient(url, token, retries=0)


def _lease() -> float | None:
    raw = os.environ.get("EVALSTOP_LEASE_S", "300")
    try:
        lease = float(raw)
    except ValueError:
        raise CLIError(f"EVALSTOP_LEASE_S must be a number of seconds, got {raw!r}") from None
    return lease or None


def add_inspect_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="a job's (or every job's) audit trail: stops, acks, launcher events, ...",
                       description="Print the append-only audit trail of one job, or of all the tenant's jobs, "
                                   "from a running service (--url) or an embedded evalstop.db (--db).")
    p.add_argument("job_id", nargs="?")
    add_target_flags(p)
    p.add_argument("--json", action="store_true", help="one JSON array of audit records")
    p.set_defaults(func=_cmd_audit)

    for name, (what, description, reason) in _VERDICTS.items():
        f = sub.add_parser(name, help=what, description=description)
        f.add_argument("job_id")
        f.add_argument("--reason", default=reason)
        add_target_flags(f)
        f.set_defaults(func=_cmd_verdict, verdict=name)


#: The operator's verdicts on a job: the client method of the same name, help, description, default reason.
_VERDICTS = {
    "stop": ("stop a job by hand, with a reason (its trainer stops at its next heartbeat, its launcher at once)",
             "Stop a job by hand: the in-loop callback stops at its next step after its next heartbeat "
             "(heartbeat_s, 5 s), keeping its best; evalstop run delivers the stop to its command. A job already "
             "stopped stays as it is.", "stopped by the operator"),
    "fail": ("mark a dead job failed, with a reason (in its audit log); `evalstop prune` then deletes ended jobs",
             "Mark a job failed (an operator's verdict on a dead job: it frees its quota and its status says "
             "why). A stopped, finished or failed job stays as it is.", "marked failed by the operator"),
}


def _cmd_verdict(args: argparse.Namespace) -> int:
    from ..core.errors import EvalStopError

    client = open_client(args)
    try:
        view = getattr(client, args.verdict)(args.job_id, reason=args.reason)
    except EvalStopError as exc:
        raise CLIError(str(exc)) from None
    finally:
        client.close()
    print(f"{args.job_id}: {view.status if view is not None else 'kept in the outbox'}")
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    from ..core.codec import to_wire
    from ..core.errors import EvalStopError

    client = open_client(args)
    try:
        records = client.audit(args.job_id)
    except EvalStopError as exc:
        raise CLIError(str(exc)) from None
    finally:
        client.close()
    if args.json:
        print(json.dumps([to_wire(a) for a in records]))
        return 0
    if not records:
        print("no audit records" + (f" for job {args.job_id}" if args.job_id else ""), file=sys.stderr)
    for a in records:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.at))
        evidence = ", ".join(f"{k}={v}" for k, v in a.evidence.items())
        line = f"{when}  {a.job_id:<24} {a.kind.value:<17} {a.actor:<22} {a.reason}"
        print(_printable(line + (f"  [{evidence}]" if evidence else "")))
    return 0


def _printable(text: str) -> str:
    """Tenant text on one terminal line: control characters escaped (no forged lines)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)

"""``evalstop serve | tenants | status``: the service side of the CLI (imports inside commands)."""

from __future__ import annotations

import argparse
import json
import os

from .cli import CLIError


def _db_path(args: argparse.Namespace) -> str:
    path = args.db or os.environ.get("EVALSTOP_DB")
    if not path:
        raise CLIError("no database: pass --db PATH or set EVALSTOP_DB")
    return path


def _open_coordinator(path: str):
    from .coordinator import Coordinator
    from .store import SQLiteStore

    try:
        return Coordinator(SQLiteStore(path))
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _cmd_tenants(args: argparse.Namespace) -> int:
    from .errors import EvalStopError

    coord = _open_coordinator(_db_path(args))
    try:
        if args.action == "add":
            try:
                token = coord.add_tenant(args.name)
            except EvalStopError as exc:
                raise CLIError(str(exc)) from None
            if args.json:
                print(json.dumps({"tenant": args.name, "token": token}))
            else:
                print(f"tenant {args.name} created; its token (shown once, keep it secret):\n{token}")
        elif args.action == "list":
            rows = [{"tenant": t.name, "created_at": t.created_at, "revoked": t.revoked}
                    for t in coord.store.list_tenants()]
            if args.json:
                print(json.dumps(rows))
            else:
                for r in rows:
                    print(f"{r['tenant']}\t{'revoked' if r['revoked'] else 'active'}")
        elif args.action == "revoke":
            if not coord.store.revoke_tenant(args.name):
                raise CLIError(f"no tenant named {args.name!r}")
            print(f"tenant {args.name} revoked")
    finally:
        coord.close()
    return 0


def add_service_commands(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("tenants", help="manage tenants and their tokens")
    tsub = t.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_ in (("add", "create a tenant and print its token once"),
                        ("list", "list tenants"), ("revoke", "revoke a tenant's token")):
        p = tsub.add_parser(name, help=help_)
        if name != "list":
            p.add_argument("name")
        p.add_argument("--db", help="SQLite database (default: $EVALSTOP_DB)")
        p.add_argument("--json", action="store_true")
    t.set_defaults(func=_cmd_tenants)

"""``evalstop serve | tenants | status``: the service side of the CLI (imports inside commands)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .common import CLIError


def _db_path(args: argparse.Namespace) -> str:
    path = args.db or os.environ.get("EVALSTOP_DB")
    if not path:
        raise CLIError("no database: pass --db PATH or set EVALSTOP_DB")
    return path


def _open_coordinator(path: str):
    from ..core.coordinator import Coordinator

    return Coordinator(_open_store(path))


def _open_store(path: str):
    from ..stores.sqlite import SQLiteStore

    try:
        return SQLiteStore(path)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _cmd_tenants(args: argparse.Namespace) -> int:
    from ..core.errors import EvalStopError
    from ..core.tenants import Tenants

    store = _open_store(_db_path(args))
    tenants = Tenants(store)
    try:
        if args.action == "add":
            try:
                token = tenants.add(args.name)
            except EvalStopError as exc:
                raise CLIError(str(exc)) from None
            if args.json:
                print(json.dumps({"tenant": args.name, "token": token}))
            else:
                print(f"tenant {args.name} created; its token (shown once, keep it secret):\n{token}")
        elif args.action == "list":
            rows = [{"tenant": t.name, "created_at": t.created_at, "revoked": t.revoked}
                    for t in tenants.list()]
            if args.json:
                print(json.dumps(rows))
            else:
                for r in rows:
                    print(f"{r['tenant']}\t{'revoked' if r['revoked'] else 'active'}")
        elif args.action == "revoke":
            try:
                tenants.revoke(args.name)
            except EvalStopError as exc:
                raise CLIError(str(exc)) from None
            print(f"tenant {args.name} revoked")
    finally:
        store.close()
    return 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise CLIError(f"{name} must be an integer port number, got {raw!r}") from None


def _tune_gc() -> None:
    """Keep the cyclic garbage collector out of the report latency tail.

    The coordinator keeps every job's reports in memory; with CPython's default thresholds the
    collector runs every 700 allocations and its full passes over that state stalled the event loop:
    the p99 of paced reports in scripts/load_test.py fell from 102-155 ms to 30-61 ms with this.
    The state loaded at start-up is frozen (never scanned again) and young collections run 100x
    less often; request garbage is mostly freed by reference counting anyway."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(70_000, 50, 1000)


def _cmd_serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from ..service.app import create_app

    path = _db_path(args)
    host = args.host or os.environ.get("EVALSTOP_HOST", "127.0.0.1")
    port = args.port if args.port is not None else _env_int("EVALSTOP_PORT", 8765)
    if not 0 <= port <= 65535:
        raise CLIError(f"port must be in 0..65535, got {port}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    coord = _open_coordinator(path)
    _tune_gc()
    print(f"evalstop serving {path} on http://{host}:{port} (API under /v1, docs at /docs)", flush=True)
    uvicorn.run(create_app(coord), host=host, port=port, log_level=args.log_level, access_log=False,
                timeout_keep_alive=30)  # training jobs report every few seconds: keep their connections
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from ..clients.http import EvalStopClient
    from ..core.errors import EvalStopError

    url = args.url or os.environ.get("EVALSTOP_URL", "http://127.0.0.1:8765")
    token = args.token or os.environ.get("EVALSTOP_TOKEN")
    if not token:
        raise CLIError("no token: pass --token or set EVALSTOP_TOKEN")
    if args.plot and not args.job_id:
        raise CLIError("--plot draws one job: evalstop status JOB_ID --plot OUT.png")
    client = EvalStopClient(url, token, retries=0)
    try:
        jobs = [client.status(args.job_id)] if args.job_id else client.list_jobs()
        if args.plot:
            reports = [r.to_dict() for r in client.reports(args.job_id)]
            audit = [a for a in client.audit() if a.get("job_id") == args.job_id]
    except EvalStopError as exc:  # a refusal (4xx) or an unreachable coordinator
        raise CLIError(str(exc)) from None
    finally:
        client.close()
    if args.plot:
        from ..analysis.plots import plot_job

        try:
            written = plot_job(args.plot, jobs[0].to_dict(), reports, audit)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        print(f"plot written to {written}", file=sys.stderr)
    if args.json:
        print(json.dumps([j.to_dict() for j in jobs]))
        return 0
    print(f"{'job':<24}{'type':<10}{'status':<10}{'reports':>8}{'best step':>10}{'best score':>11}  decision")
    for j in jobs:
        d = j.decision
        best = "" if j.best_score is None else f"{j.best_score:.4f}"
        print(f"{j.job_id:<24}{j.job_type:<10}{j.status:<10}{j.n_reports:>8}{str(j.best_step or ''):>10}{best:>11}  "
              f"{d.action.value + ': ' + d.reason if d else ''}")
    return 0


def add_service_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="run the coordinator service (FastAPI + uvicorn)")
    s.add_argument("--db", help="SQLite database (default: $EVALSTOP_DB)")
    s.add_argument("--host", help="bind address (default: $EVALSTOP_HOST or 127.0.0.1)")
    s.add_argument("--port", type=int, help="port (default: $EVALSTOP_PORT or 8765)")
    s.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    s.set_defaults(func=_cmd_serve)

    st = sub.add_parser("status", help="show a tenant's jobs on a running coordinator")
    st.add_argument("job_id", nargs="?")
    st.add_argument("--url", help="coordinator URL (default: $EVALSTOP_URL or http://127.0.0.1:8765)")
    st.add_argument("--token", help="tenant token (default: $EVALSTOP_TOKEN)")
    st.add_argument("--json", action="store_true")
    st.add_argument("--plot", metavar="OUT.png", help="draw JOB_ID's curves with its best and stop steps (.png, .svg, .pdf)")
    st.set_defaults(func=_cmd_status)

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

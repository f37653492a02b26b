"""``evalstop serve | tenants | status``: the service side of the CLI (imports inside commands)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .common import CLIError


def _db_path(args: argparse.Namespace) -> str:
    path = args.db or os.environ.get("EVALSTOP_DB")
    if not path:
        raise CLIError("no database: pass --db PATH (SQLite) or --db postgresql://... , or set EVALSTOP_DB")
    return path


def _open_store(path: str):
    from ..stores import open_store

    try:
        return open_store(path)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _cmd_tenants(args: argparse.Namespace) -> int:
    from ..core.errors import EvalStopError
    from ..core.tenants import Tenants

    store = _open_store(_db_path(args))
    tenants = Tenants(store, default_quotas=_quotas_from_env())
    try:
        try:
            return _TENANT_ACTIONS[args.action](tenants, args)
        except EvalStopError as exc:
            raise CLIError(str(exc)) from None
    finally:
        store.close()


def _tenant_add(tenants, args: argparse.Namespace) -> int:
    token = tenants.add(args.name)
    secret = tenants.webhook_secret(args.name)
    if args.json:
        print(json.dumps({"tenant": args.name, "token": token, "webhook_secret": secret}))
    else:
        print(f"tenant {args.name} created; its token (shown once, keep it secret):\n{token}\n"
              f"its webhook secret (verifies X-EvalStop-Signature on webhook payloads):\n{secret}")
    return 0


def _tenant_list(tenants, args: argparse.Namespace) -> int:
    rows = [{"tenant": t.name, "created_at": t.created_at, "revoked": t.revoked,
             "quotas": tenants.quotas(t.name).to_dict()} for t in tenants.list()]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'tenant':<20}{'state':<9}{'active jobs':>12}{'reports/job':>12}{'reports/s':>10}{'burst':>7}  mode")
    for r in rows:
        q = r["quotas"]
        print(f"{r['tenant']:<20}{'revoked' if r['revoked'] else 'active':<9}{q['max_active_jobs']:>12}"
              f"{q['max_reports_per_job']:>12}{q['report_rate']:>10g}{q['report_burst']:>7}  {q['default_mode']}")
    return 0


def _tenant_revoke(tenants, args: argparse.Namespace) -> int:
    tenants.revoke(args.name)
    print(f"tenant {args.name} revoked")
    return 0


def _tenant_rotate(tenants, args: argparse.Namespace) -> int:
    token = tenants.rotate(args.name)
    if args.json:
        print(json.dumps({"tenant": args.name, "token": token}))
    else:
        print(f"tenant {args.name}: new token (the old one no longer works; shown once):\n{token}")
    return 0


def _tenant_quota(tenants, args: argparse.Namespace) -> int:
    overrides = {k: getattr(args, k) for k in _QUOTA_FLAGS if getattr(args, k) is not None}
    quotas = tenants.set_quotas(args.name, overrides) if overrides else tenants.quotas(args.name)
    print(json.dumps({"tenant": args.name, "quotas": quotas.to_dict()}) if args.json else
          f"tenant {args.name}: " + ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}"
                                              for k, v in quotas.to_dict().items()))
    return 0


_TENANT_ACTIONS = {"add": _tenant_add, "list": _tenant_list, "revoke": _tenant_revoke, "rotate": _tenant_rotate,
                   "quota": _tenant_quota}


def _env(name: str, cast, default, what: str):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return cast(raw)
    except ValueError:
        raise CLIError(f"{name} must be {what}, got {raw!r}") from None


def _quotas_from_env(args: argparse.Namespace | None = None):
    """Server-wide default quotas: flags, else EVALSTOP_* variables, else the built-in defaults."""
    from ..core.errors import InvalidInput
    from ..core.records import Quotas

    d = Quotas()
    values = {}
    for field, cast in _QUOTA_FLAGS.items():
        what = {int: "an integer", float: "a number", str: "enforce or shadow"}[cast]
        flag = getattr(args, field, None) if args is not None else None
        values[field] = flag if flag is not None else _env(f"EVALSTOP_{field.upper()}", cast, getattr(d, field), what)
    try:
        return Quotas(**values)
    except InvalidInput as exc:
        raise CLIError(str(exc)) from None


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

    The coordinator keeps every job's live state in memory; with CPython's default thresholds the
    collector runs every 700 allocations and its full passes over that state stalled the event loop:
    the p99 of paced reports in scripts/load_test.py fell from 102-155 ms to 30-61 ms with this.
    The state loaded at start-up is frozen (never scanned again) and young collections run 100x
    less often; request garbage is mostly freed by reference counting anyway."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(70_000, 50, 1000)


def _tune_gil() -> None:
    """Hand the GIL to the event loop sooner: a worker thread building a page of 1,000 jobs for one
    tenant holds it for up to the switch interval (5 ms by default) each time the loop wants it, which
    another tenant's report waits out several times (tests/service/test_security.py measures the effect)."""
    import sys

    sys.setswitchinterval(0.0005)


def _raise_fd_limit(wanted: int) -> int:
    """Raise the soft open-files limit towards ``wanted`` (never above the hard limit); returns it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(max(soft, wanted), hard if hard != resource.RLIM_INFINITY else wanted)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def _cmd_serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from ..core.coordinator import DEFAULT_LEASE_S, Coordinator
    from ..service.app import ServiceSettings, create_app
    from ..service.middleware import PerAddress
    from ..service.protocol import guarded_protocol
    from ..service.webhooks import WebhookPolicy

    path = _db_path(args)
    host = args.host or os.environ.get("EVALSTOP_HOST", "127.0.0.1")
    port = args.port if args.port is not None else _env_int("EVALSTOP_PORT", 8765)
    if not 0 <= port <= 65535:
        raise CLIError(f"port must be in 0..65535, got {port}")
    allow = tuple(args.webhook_allow or [p for p in os.environ.get("EVALSTOP_WEBHOOK_ALLOW", "").split(",") if p])
    max_conn = args.max_connections or _env("EVALSTOP_MAX_CONNECTIONS", int, 1000, "an integer")
    header_timeout = args.header_timeout_s or _env("EVALSTOP_HEADER_TIMEOUT_S", float, 10.0, "a number of seconds")
    body_timeout = args.body_timeout_s or _env("EVALSTOP_BODY_TIMEOUT_S", float, 10.0, "a number of seconds")
    if not 1 <= max_conn <= 100_000 or not 0 < header_timeout <= 600 or not 0 < body_timeout <= 600:
        raise CLIError("--max-connections must be in [1, 100000] and the timeouts in (0, 600] seconds")
    unauth = _unauth_limits(args)
    try:
        settings = ServiceSettings(webhooks=WebhookPolicy(allow=allow), body_timeout_s=body_timeout,
                                   metrics_token=args.metrics_token or os.environ.get("EVALSTOP_METRICS_TOKEN") or None,
                                   metrics_public=args.metrics_public or os.environ.get("EVALSTOP_METRICS_PUBLIC") == "1",
                                   per_address=PerAddress(unauth["rate"], unauth["burst"]))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    quotas = _quotas_from_env(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    lease = args.lease_s if args.lease_s is not None else _env("EVALSTOP_LEASE_S", float, DEFAULT_LEASE_S, "a number of seconds")
    if not (lease == 0 or 1 <= lease <= 7 * 86400):
        raise CLIError(f"--lease-s must be 0 (no leases) or in [1, 604800] seconds, got {lease:g}")
    coord = Coordinator(_open_store(path), quotas=quotas, lease_s=lease or None, outage_grace=True)
    _raise_fd_limit(max_conn + 256)
    _tune_gc()
    _tune_gil()
    _check_can_listen(host, port)  # the banner never precedes a bind error
    print(f"evalstop serving {path} on http://{host}:{port} (API under /v1, OpenAPI at /openapi.json; webhooks to: "
          f"{', '.join(allow) or 'nowhere'})", flush=True)
    uvicorn.run(create_app(coord, settings), host=host, port=port, log_level=args.log_level, access_log=False,
                http=guarded_protocol(header_timeout, max_conn, unauth["connections"], unauth["per_tenant"]),
                timeout_keep_alive=30)  # training jobs report every few seconds: keep their connections
    return 0


def _check_can_listen(host: str, port: int) -> None:
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            sock.bind(infos[0][4])
    except OSError as exc:
        raise CLIError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _unauth_limits(args: argparse.Namespace) -> dict:
    """Per-address limits on unauthenticated connections and requests, and connections per tenant: flags, else
    EVALSTOP_*, else defaults."""
    limits = {}
    for key, flag, cast, default in (("connections", "unauth_connections_per_ip", int, 16),
                                     ("per_tenant", "max_connections_per_tenant", int, 64),
                                     ("rate", "unauth_rate_per_ip", float, 20.0),
                                     ("burst", "unauth_burst_per_ip", int, 100)):
        value = getattr(args, flag)
        limits[key] = value if value is not None else _env(f"EVALSTOP_{flag.upper()}", cast, default, "a number")
    if not 0 <= limits["connections"] <= 100_000:
        raise CLIError(f"--unauth-connections-per-ip must be in [0, 100000] (0: no limit), got {limits['connections']}")
    if not 0 <= limits["per_tenant"] <= 100_000:
        raise CLIError(f"--max-connections-per-tenant must be in [0, 100000] (0: no limit), got {limits['per_tenant']}")
    return limits


def _ago(seconds: float) -> str:
    """'12s ago', '5m ago', '3h ago', '2d ago'."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{max(0.0, seconds):.0f}s ago"


def add_target_flags(p: argparse.ArgumentParser) -> None:
    from .inspection import add_target_flags as add

    add(p)


def _cmd_status(args: argparse.Namespace) -> int:
    from ..core.codec import to_wire
    from ..core.errors import EvalStopError
    from ..core.records import AuditKind
    from .inspection import open_client

    if args.plot and not args.job_id:
        raise CLIError("--plot draws one job: evalstop status JOB_ID --plot OUT.png")
    client = open_client(args)
    try:
        jobs = [client.status(args.job_id)] if args.job_id else client.list_jobs()
        audit = client.audit(args.job_id) if args.job_id else []
        if args.plot:
            reports = [to_wire(r) for r in client.reports(args.job_id)]
    except EvalStopError as exc:  # a refusal (4xx) or an unreachable coordinator
        raise CLIError(str(exc)) from None
    finally:
        client.close()
    if args.plot:
        from ..analysis.plots import plot_job

        try:
            written = plot_job(args.plot, to_wire(jobs[0]), reports, [to_wire(a) for a in audit])
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        print(f"plot written to {written}", file=sys.stderr)
    if args.json:
        print(json.dumps([to_wire(j) for j in jobs]))
        return 0
    print(f"{'job':<24}{'type':<11}{'status':<10}{'reports':>8}{'best step':>10}{'best score':>11}{'last seen':>11}"
          "  decision")
    now = time.time()
    for j in jobs:
        d = j.decision
        best = "" if j.best_score is None else f"{j.best_score:.4f}"
        seen = "" if j.last_seen is None else _ago(now - j.last_seen)
        said = d.action.value + ": " + d.reason if d else ""
        if j.policy.get("mode") == "shadow":
            said = "[shadow] " + (f"would stop at step {j.would_stop_step}: {j.would_stop.reason}"
                                  if j.would_stop is not None else said or "no eval yet")
        print(f"{j.job_id:<24}{j.job_type:<11}{j.status:<10}{j.n_reports:>8}{str(j.best_step or ''):>10}{best:>11}"
              f"{seen:>11}  {said}")
    lags = [a.evidence["stop_lag"] for a in audit if a.kind is AuditKind.ACK and "stop_lag" in a.evidence]
    if lags:
        print(f"stop lag: {lags[-1]} step(s) trained after the eval that decided the stop")
    return 0


#: every quota (core.records.Quotas) as a flag --max-jobs ... and a variable EVALSTOP_MAX_JOBS ...
_QUOTA_FLAGS = {"max_active_jobs": int, "max_reports_per_job": int, "report_rate": float, "report_burst": int,
                "max_jobs": int, "max_reports_per_tenant": int, "max_events_per_job": int,
                "max_snapshots_per_job": int, "event_rate": float, "event_burst": int, "default_mode": str,
                "audit_rate": float, "audit_burst": int, "audit_bytes_rate": float, "audit_bytes_burst": int,
                "max_audit_bytes": int}


def _add_quota_flags(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--max-active-jobs", type=int, help=f"{what}: jobs not yet stopped/finished/failed "
                   "(env EVALSTOP_MAX_ACTIVE_JOBS; default 1000)")
    p.add_argument("--max-reports-per-job", type=int, help=f"{what} (env EVALSTOP_MAX_REPORTS_PER_JOB; default 100000)")
    p.add_argument("--report-rate", type=float, help=f"{what}: reports per second per tenant, beyond it 429 "
                   "(env EVALSTOP_REPORT_RATE; default 1000)")
    p.add_argument("--report-burst", type=int, help=f"{what} (env EVALSTOP_REPORT_BURST; default 2000)")
    p.add_argument("--max-jobs", type=int, help=f"{what}: all jobs, finished ones included, until pruned "
                   "(env EVALSTOP_MAX_JOBS; default 100000)")
    p.add_argument("--max-reports-per-tenant", type=int, help=f"{what}: stored reports of all the tenant's jobs "
                   "(env EVALSTOP_MAX_REPORTS_PER_TENANT; default 10000000)")
    p.add_argument("--max-events-per-job", type=int, help=f"{what}: launcher events of one job "
                   "(env EVALSTOP_MAX_EVENTS_PER_JOB; default 1000)")
    p.add_argument("--max-snapshots-per-job", type=int, help=f"{what}: snapshots one job publishes "
                   "(env EVALSTOP_MAX_SNAPSHOTS_PER_JOB; default 10000)")
    p.add_argument("--event-rate", type=float, help=f"{what}: launcher events, snapshots and registration amendments "
                   "per second per tenant, beyond it 429 (env EVALSTOP_EVENT_RATE; default 50)")
    p.add_argument("--event-burst", type=int, help=f"{what} (env EVALSTOP_EVENT_BURST; default 500)")
    p.add_argument("--audit-rate", type=float, help=f"{what}: audit lines a tenant's own requests write per second "
                   "(fail, stop, ack, events, amendments, deletions), beyond it 429 (env EVALSTOP_AUDIT_RATE; default 20)")
    p.add_argument("--audit-burst", type=int, help=f"{what} (env EVALSTOP_AUDIT_BURST; default 2000)")
    p.add_argument("--audit-bytes-rate", type=float, help=f"{what}: those lines' bytes per second "
                   "(env EVALSTOP_AUDIT_BYTES_RATE; default 10000)")
    p.add_argument("--audit-bytes-burst", type=int, help=f"{what} (env EVALSTOP_AUDIT_BYTES_BURST; default 1000000)")
    p.add_argument("--max-audit-bytes", type=int, help=f"{what}: the tenant's stored audit bytes, past it 429 until "
                   "retention reclaims them (env EVALSTOP_MAX_AUDIT_BYTES; default 268435456)")
    p.add_argument("--default-mode", choices=("enforce", "shadow"),
                   help=f"{what}: the mode of jobs registered without policy.mode; shadow records 'would stop' "
                   "and never stops a job (env EVALSTOP_DEFAULT_MODE; default enforce)")


def add_service_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="run the coordinator service (FastAPI + uvicorn)")
    s.add_argument("--db", help="a SQLite file or a postgresql://user@host/db URL (default: $EVALSTOP_DB)")
    s.add_argument("--host", help="bind address (default: $EVALSTOP_HOST or 127.0.0.1)")
    s.add_argument("--port", type=int, help="port (default: $EVALSTOP_PORT or 8765)")
    s.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    s.add_argument("--webhook-allow", action="append", metavar="PATTERN",
                   help="where webhooks may go: a host, a host glob (*.example.com) or an address/network "
                        "(10.0.0.0/8); repeatable (env EVALSTOP_WEBHOOK_ALLOW, comma-separated; default: nowhere)")
    s.add_argument("--metrics-token", help="require this bearer token on /metrics (env EVALSTOP_METRICS_TOKEN); "
                   "without it /metrics answers 401 unless --metrics-public")
    s.add_argument("--metrics-public", action="store_true",
                   help="serve /metrics to anyone without a token (env EVALSTOP_METRICS_PUBLIC=1; default: off)")
    s.add_argument("--unauth-connections-per-ip", type=int, help="connections per client address (IPv6: per /64) "
                   "not yet authenticated, beyond it closed at once; 0 = no limit (env "
                   "EVALSTOP_UNAUTH_CONNECTIONS_PER_IP; default 16)")
    s.add_argument("--unauth-rate-per-ip", type=float, help="unauthenticated requests (public paths, refused tokens) "
                   "per second per client address, beyond it 429; 0 = no limit (env EVALSTOP_UNAUTH_RATE_PER_IP; "
                   "default 20)")
    s.add_argument("--unauth-burst-per-ip", type=int, help="the burst of --unauth-rate-per-ip "
                   "(env EVALSTOP_UNAUTH_BURST_PER_IP; default 100)")
    s.add_argument("--max-connections", type=int, help="open connections at most (env EVALSTOP_MAX_CONNECTIONS; 1000); "
                   "when full, a new one reclaims an idle keep-alive connection of the tenant holding the most")
    s.add_argument("--max-connections-per-tenant", type=int, help="open connections one tenant's requests may hold, "
                   "beyond it 429 and the connection closed; 0 = no limit (env EVALSTOP_MAX_CONNECTIONS_PER_TENANT; "
                   "default 64)")
    s.add_argument("--header-timeout-s", type=float, help="seconds for a request head to arrive (10)")
    s.add_argument("--body-timeout-s", type=float, help="seconds for a whole request body to arrive (10)")
    s.add_argument("--lease-s", type=float, help="a job silent (no report, no heartbeat) this long becomes 'lost' "
                   "and frees its quota; 0 turns leases off (env EVALSTOP_LEASE_S; default 300)")
    _add_quota_flags(s, "default quota")
    s.set_defaults(func=_cmd_serve)

    st = sub.add_parser("status", help="show a tenant's jobs: on a running coordinator (--url) or in an embedded "
                        "evalstop.db (--db)")
    st.add_argument("job_id", nargs="?")
    add_target_flags(st)
    st.add_argument("--json", action="store_true")
    st.add_argument("--plot", metavar="OUT.png", help="draw JOB_ID's curves with its best and stop steps (.png, .svg, .pdf)")
    st.set_defaults(func=_cmd_status)

    t = sub.add_parser("tenants", help="manage tenants, their tokens and quotas")
    tsub = t.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_ in (("add", "create a tenant and print its token (and webhook secret) once"),
                        ("list", "list tenants with their quotas"), ("revoke", "revoke a tenant's token"),
                        ("rotate", "give a tenant a new token (the old one stops working)"),
                        ("quota", "show or set a tenant's quotas (overrides of the server's defaults)")):
        p = tsub.add_parser(name, help=help_)
        if name != "list":
            p.add_argument("name")
        if name == "quota":
            _add_quota_flags(p, "this tenant's quota")
        p.add_argument("--db", help="a SQLite file or a postgresql://user@host/db URL (default: $EVALSTOP_DB)")
        p.add_argument("--json", action="store_true")
    t.set_defaults(func=_cmd_tenants)

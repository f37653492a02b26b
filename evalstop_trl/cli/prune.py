"""``evalstop prune``: retention. Deletes the jobs that ended long ago, with their rows.

    evalstop prune --db PATH --older-than DAYS [--audit-older-than DAYS] [--tenant T] [--dry-run] [--json]

A job is pruned when it is stopped, finished, failed or lost and was last updated more than
``DAYS`` days ago; its reports, snapshots (evals) and webhook deliveries go with it, in one
transaction. The audit log is append-only (it is the record of every stop) and kept unless
``--audit-older-than`` gives it a retention too: then the audit lines older than that go in the same
transaction, all of those of the jobs no longer stored (pruned now or before, or deleted), and of a
stored job all but its newest line of each kind (its stop, its ack, its latest amendment stay while
the job does), so a job id kept alive cannot keep a flood of old lines.
The store's append-only guard lets only this transaction delete audit lines. Run it
while no ``evalstop serve`` uses a SQLite file (a running server keeps the jobs it loaded until it
restarts); on PostgreSQL, restart the replicas afterwards for the same reason.
"""

from __future__ import annotations

import argparse
import json
import time

from .common import CLIError

__all__ = ["add_prune_command"]


def _cmd_prune(args: argparse.Namespace) -> int:
    from .service import _db_path, _open_store

    if not 0 <= args.older_than <= 100_000:
        raise CLIError(f"--older-than must be a number of days in [0, 100000], got {args.older_than:g}")
    audit_days = args.audit_older_than
    if audit_days is not None and not 0 <= audit_days <= 100_000:
        raise CLIError(f"--audit-older-than must be a number of days in [0, 100000], got {audit_days:g}")
    store = _open_store(_db_path(args))
    try:
        now = time.time()
        counts = store.prune(now - args.older_than * 86400, args.tenant, dry_run=args.dry_run,
                             audit_before=None if audit_days is None else now - audit_days * 86400)
    finally:
        store.close()
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, **counts._asdict()}))
    else:
        verb = "would delete" if args.dry_run else "deleted"
        print(f"{verb} {counts.jobs} job(s) that ended over {args.older_than:g} day(s) ago"
              f"{f' (tenant {args.tenant})' if args.tenant else ''}: {counts.reports} report(s), {counts.evals} "
              f"snapshot(s), {counts.deliveries} webhook delivery(ies); "
              + ("the audit log is kept" if audit_days is None else
                 f"{counts.audit} audit line(s) over {audit_days:g} day(s) old (a stored job keeps its newest of each kind)"))
    return 0


def add_prune_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prune", help="delete jobs that ended more than DAYS ago (retention; the audit log is kept)")
    p.add_argument("--db", help="a SQLite file or a postgresql:// URL (default: $EVALSTOP_DB)")
    p.add_argument("--older-than", type=float, required=True, metavar="DAYS",
                   help="prune stopped/finished/failed/lost jobs last updated more than DAYS days ago")
    p.add_argument("--audit-older-than", type=float, metavar="DAYS",
                   help="also delete the audit lines older than DAYS days (a stored job keeps its newest line of "
                        "each kind; default: keep the audit log whole)")
    p.add_argument("--tenant", help="only this tenant's jobs")
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_prune)

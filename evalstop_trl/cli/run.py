"""``evalstop run [--url URL] [--token T] [--job-id ID] [--grace-s S] -- CMD [ARGS...]``.

Runs CMD under the launcher (see :mod:`evalstop_trl.launcher`). Without ``--url`` (or
``$EVALSTOP_URL``) it uses the embedded default: an ``evalstop serve`` of its own on a free loopback
port over ``--db`` (default ``./evalstop.db``), with a ``local`` tenant whose token it rotates for
this run. One launcher at a time may use an embedded database.
"""

from __future__ import annotations

import argparse
import os
import sys

from .common import CLIError

__all__ = ["add_run_command"]


def _cmd_run(args: argparse.Namespace) -> int:
    from ..clients.http import EvalStopClient
    from ..core.errors import EvalStopError
    from ..core.records import check_name
    from ..launcher import Launcher

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CLIError("no command: write it after '--', e.g. evalstop run -- python train.py")
    if not 0 <= args.grace_s <= 86_400:
        raise CLIError(f"--grace-s must be in [0, 86400] seconds, got {args.grace_s}")
    job_id = args.job_id or os.environ.get("EVALSTOP_JOB_ID") or _default_job_id(command)
    try:
        check_name("--job-id", job_id)
    except EvalStopError as exc:
        raise CLIError(str(exc)) from None
    policy = {"detector": args.detector, **({"k": args.k} if args.k is not None else {}),
              **({"min_delta": args.min_delta} if args.min_delta is not None else {})}
    url = args.url or os.environ.get("EVALSTOP_URL")
    server = None
    if url:
        token = args.token or os.environ.get("EVALSTOP_TOKEN")
        if not token:
            raise CLIError("no token: pass --token or set EVALSTOP_TOKEN (or drop --url for the embedded default)")
    else:
        from ..service.local import EmbeddedServer

        try:
            server = EmbeddedServer(args.db).start()
        except (ValueError, RuntimeError) as exc:
            raise CLIError(str(exc)) from None
        url, token = server.url, server.token
        print(f"evalstop run: embedded coordinator {url} over {args.db}", file=sys.stderr, flush=True)
    client = EvalStopClient(url, token, retries=1)
    try:
        launcher = Launcher(client, job_id, url=url, token=token, grace_s=args.grace_s, job_type=args.job_type,
                            planned_steps=args.planned_steps, policy=policy)
        try:
            result = launcher.run(command)
        except EvalStopError as exc:
            raise CLIError(f"cannot register job {job_id!r}: {exc}") from None
        except FileNotFoundError as exc:
            raise CLIError(f"cannot start {command[0]!r}: {exc.strerror}") from None
        if result.escalations:
            print(f"evalstop run: job {job_id} stopped by its launcher ({' then '.join(result.escalations)}); "
                  f"exit status {result.exit_status}", file=sys.stderr, flush=True)
        return result.exit_status
    finally:
        client.close()
        if server is not None:
            server.stop()


def _default_job_id(command: list[str]) -> str:
    import re
    import time

    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", os.path.basename(command[-1] if command else "job"))[:80] or "job"
    return f"{stem.lstrip('-._') or 'job'}-{int(time.time())}"


def add_run_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a training command under a launcher that delivers its stop",
                       description="Register a job, run CMD as a child in its own process group with "
                       "EVALSTOP_URL/EVALSTOP_TOKEN/EVALSTOP_JOB_ID set, and on a STOP the child does not "
                       "acknowledge within --grace-s send SIGTERM to its process group, then SIGKILL. "
                       "Exits with the child's status.")
    p.add_argument("--url", help="coordinator URL (default: $EVALSTOP_URL, else an embedded one over --db)")
    p.add_argument("--token", help="tenant token (default: $EVALSTOP_TOKEN)")
    p.add_argument("--db", default="evalstop.db", help="database of the embedded default (default ./evalstop.db)")
    p.add_argument("--job-id", help="the job (default: $EVALSTOP_JOB_ID, else the command's name and the time)")
    p.add_argument("--job-type", default="rlhf", help="rlhf, grpo, rloo, dpo, ... (default rlhf)")
    p.add_argument("--planned-steps", type=int, help="planned training steps")
    p.add_argument("--detector", default="decline", help="the stop rule (default decline)")
    p.add_argument("--k", type=int, help="consecutive declines (decline) or evals without improvement (patience)")
    p.add_argument("--min-delta", type=float, dest="min_delta", help="a change must exceed this to count")
    p.add_argument("--grace-s", type=float, default=30.0, help="seconds to acknowledge a stop, and between "
                   "SIGTERM and SIGKILL (default 30)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p.set_defaults(func=_cmd_run)

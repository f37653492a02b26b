"""``evalstop run [--url URL] [--token-file PATH] [--job-id ID] [--grace-s S] -- CMD [ARGS...]``.

Runs CMD under the launcher (see :mod:`evalstop_trl.launcher`). Without ``--url`` (or
``$EVALSTOP_URL``) it uses the embedded default: an ``evalstop serve`` of its own on a free loopback
port over ``--db`` (default ``./evalstop.db``), with a ``local`` tenant whose token it rotates for
this run. One launcher at a time may use an embedded database.

The token comes from ``--token-file PATH`` or ``--token`` (visible in ``ps``), else ``$EVALSTOP_TOKEN``
(:func:`~.common.read_token`).
The job id from ``--job-id``, else ``$EVALSTOP_JOB_ID``, else the command's script name and a random
suffix (printed).

Exit status: 0 (or ``--stopped-exit-code N``) when EvalStop stopped the job; otherwise the command's
own status (128 + N when a signal N ended it); 2 for bad input, a refused registration or a command
that cannot start.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from .common import CLIError, add_job_flags, add_token_flags, after_dashes, job_policy, read_token

__all__ = ["add_run_command"]

_EPILOG = """exit status:
  0 (or --stopped-exit-code N)  EvalStop stopped the job before the command ended (a scheduler that
                                retries failed jobs does not rerun it)
  the command's own status      otherwise; 128 + N when a signal N ended it
  2                             bad input, a refused registration, or a command that cannot start
  3                             the command succeeded but --metric never appeared in its --metric-from log
                                (the keys the log has are printed)

Descendants of the command (a setsid'd or backgrounded process included) are the launcher's: it
signals all of them on a stop, terminates those still running when the command exits, and exits
only once they are gone. SIGHUP, SIGINT, SIGTERM, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to the
command's process group. An unreachable coordinator never stops the command (fail-open)."""


def _cmd_run(args: argparse.Namespace) -> int:
    from ..clients.http import EvalStopClient
    from ..core.errors import EvalStopError
    from ..core.records import check_name
    from ..launcher import Launcher, heartbeat_interval, log_text
    from ..launcher.metrics import MetricFrom

    command = after_dashes(args.argv, "command", "evalstop run -- python train.py")
    policy = job_policy(args)
    metric_from = None
    if args.metric_from or args.metric:
        try:
            metric_from = MetricFrom.parse(args.metric_from or "", args.metric)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    job_id = args.job_id or os.environ.get("EVALSTOP_JOB_ID")
    if not job_id:
        job_id = _default_job_id(command)
        print(f"evalstop run: job id {job_id} (choose one with --job-id or EVALSTOP_JOB_ID)", file=sys.stderr,
              flush=True)
    try:
        check_name("--job-id", job_id)
    except EvalStopError as exc:
        raise CLIError(str(exc)) from None
    url = args.url or os.environ.get("EVALSTOP_URL")
    server = None
    if url:
        token = read_token(args)
    else:
        from ..service.local import EmbeddedServer

        try:
            server = EmbeddedServer(args.db).start()
        except (ValueError, RuntimeError) as exc:
            raise CLIError(str(exc)) from None
        url, token = server.url, server.token
        print(f"evalstop run: embedded coordinator {url} over {args.db}", file=sys.stderr, flush=True)
    try:
        client = EvalStopClient(url, token, retries=1)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    try:
        launcher = Launcher(client, job_id, url=url, token=token, grace_s=args.grace_s, job_type=args.job_type,
                            planned_steps=args.planned_steps, policy=policy,
                            heartbeat_s=heartbeat_interval(args.lease_s), stopped_exit_code=args.stopped_exit_code,
                            metric_from=metric_from)
        try:
            result = launcher.run(command)
        except EvalStopError as exc:
            raise CLIError(f"cannot register job {log_text(job_id)}: {log_text(exc)}") from None
        except OSError as exc:
            raise CLIError(f"cannot start {log_text(command[0])!r}: {exc.strerror}") from None
        if result.escalations:
            print(f"evalstop run: job {job_id} stopped by its launcher ({' then '.join(result.escalations)}); "
                  f"command status {result.child_status}, exit status {result.exit_status}", file=sys.stderr,
                  flush=True)
        return result.exit_status
    finally:
        client.close()
        if server is not None:
            server.stop()


_SCRIPT = re.compile(r".+\.(py|sh|bash|zsh|pl|rb|js|ts|lua|jl|r|R)$")


def _default_job_id(command: list[str]) -> str:
    """The command's script name (``train`` for ``python train.py``, ``mod`` for ``python -m pkg.mod``,
    else the program's name) and a random suffix."""
    import secrets

    name = os.path.basename(command[0])
    for i, arg in enumerate(command[1:], start=1):
        if arg == "-m" and i + 1 < len(command):
            name = command[i + 1].rsplit(".", 1)[-1]
            break
        if _SCRIPT.fullmatch(arg) and not arg.startswith("-"):
            name = os.path.splitext(os.path.basename(arg))[0]
            break
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", name)[:60].lstrip("-._") or "job"
    return f"{stem}-{secrets.token_hex(3)}"


def add_run_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a training command under a launcher that delivers its stop",
                       description="Register a job, run CMD as a child in a session of its own with "
                       "EVALSTOP_URL/EVALSTOP_TOKEN/EVALSTOP_JOB_ID set, send heartbeats for it, and on a STOP "
                       "the command does not acknowledge within --grace-s send SIGTERM to every process it "
                       "started, then SIGKILL.", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="coordinator URL (default: $EVALSTOP_URL, else an embedded one over --db)")
    add_token_flags(p)
    p.add_argument("--db", default="evalstop.db", help="database of the embedded default (default ./evalstop.db)")
    p.add_argument("--job-id", help="the job (default: $EVALSTOP_JOB_ID, else the command's script name and a "
                   "random suffix, printed)")
    add_job_flags(p, grace="seconds to acknowledge a stop, and between SIGTERM and SIGKILL")
    p.add_argument("--metric-from", metavar="jsonl:PATH|verl_console:PATH|tensorboard:DIR",
                   help="report the job's evals from the logs CMD writes: a JSONL file (verl's file logger "
                   "{step, data: {...}}, W&B's history, or {step, KEY: value} lines), verl's console output in a "
                   "file (step:N - key:value - ...), or TensorBoard event files under DIR; the stop is delivered as "
                   "without it (SIGTERM after --grace-s, then SIGKILL)")
    p.add_argument("--metric", metavar="KEY", help="with --metric-from: the JSON key or TensorBoard tag of the "
                   "world-feedback score (e.g. val-core/openai/gsm8k/reward/mean@1)")
    p.add_argument("argv", metavar="command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p.set_defaults(func=_cmd_run)

"""What every ``evalstop`` subcommand shares: the user-error exception and its exit status, and how a
command that talks to a coordinator gets its tenant token."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

__all__ = ["EXIT_BAD_INPUT", "CLIError", "add_job_flags", "add_token_flags", "after_dashes", "existing_db", "job_policy",
           "read_token"]

EXIT_BAD_INPUT = 2
_MAX_TOKEN = 4096


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def existing_db(path: str) -> str:
    """``path``, a ``--db`` SQLite file that must already be there: a command that reads or serves a
    coordinator's jobs never creates an empty one (where it would wait for jobs that never come).

    Raises:
        CLIError: no file at ``path`` (the message says where the callback writes it), or a folder.
    """
    if os.path.isdir(path):
        raise CLIError(f"--db {path} is a folder, not a database: pass the evalstop.db in it "
                       f"({os.path.join(path, 'evalstop.db')})")
    if not os.path.exists(path):
        raise CLIError(f"no database at {path}: pass the file that exists (the callback writes "
                       "<output_dir>/evalstop.db; `evalstop serve --db` the one it was given), or --url for a "
                       "running coordinator")
    if os.path.isfile(path) and os.path.getsize(path) == 0:  # a read must not write a schema into it
        raise CLIError(f"--db {path} is an empty file, not a coordinator's database")
    return path


def add_token_flags(parser: argparse.ArgumentParser) -> None:
    """``--token-file PATH`` and ``--token T`` (the token's sources, see :func:`read_token`)."""
    parser.add_argument("--token-file", metavar="PATH",
                        help="read the tenant token from this file (default: $EVALSTOP_TOKEN)")
    parser.add_argument("--token", help="tenant token; visible to every user in `ps`: prefer --token-file or "
                                        "$EVALSTOP_TOKEN")


def add_job_flags(parser: argparse.ArgumentParser, grace: str) -> None:
    """The flags of a command that registers a job and delivers its stop (``evalstop run``, ``evalstop
    ray submit``, ``evalstop slurm watch``): its plan, its stop rule, the grace (``grace``: what it
    means for this command), the exit status of a stopped job and the heartbeats."""
    parser.add_argument("--job-type", help="rlhf, grpo, rloo, dpo, ... (default: rlhf, the generic RL kind, until a "
                        "callback in the job names its trainer)")
    parser.add_argument("--planned-steps", type=int, help="planned training steps")
    parser.add_argument("--detector", help="the stop rule (default: the coordinator's, decline)")
    parser.add_argument("--k", type=int, help="consecutive declines (decline) or evals without improvement "
                        "(patience)")
    parser.add_argument("--min-delta", type=float, dest="min_delta", help="a change must exceed this to count")
    parser.add_argument("--grace-s", type=float, default=30.0, help=f"{grace} (default 30)")
    parser.add_argument("--stopped-exit-code", type=int, default=0, metavar="N",
                        help="exit status when EvalStop stopped the job (default 0)")
    parser.add_argument("--lease-s", type=float, default=300.0, help="the coordinator's lease (evalstop serve "
                        "--lease-s): a heartbeat every lease/4 s, at most 60 s; 0 = none (default 300)")


def after_dashes(argv: list[str], what: str, example: str) -> list[str]:
    """The command written after ``--`` (argparse's REMAINDER keeps the ``--``); CLIError naming
    ``what`` is missing, with ``example``, when there is none."""
    command = list(argv[1:] if argv and argv[0] == "--" else argv)
    if not command:
        raise CLIError(f"no {what}: write it after '--', e.g. {example}")
    return command


def job_policy(args: argparse.Namespace) -> dict | None:
    """The policy the flags of :func:`add_job_flags` ask for (None: the coordinator's default), after
    checking their ranges (CLIError)."""
    if not 0 <= args.grace_s <= 86_400:
        raise CLIError(f"--grace-s must be in [0, 86400] seconds, got {args.grace_s}")
    if not 0 <= args.stopped_exit_code <= 255:
        raise CLIError(f"--stopped-exit-code must be in [0, 255], got {args.stopped_exit_code}")
    if not 0 <= args.lease_s <= 86_400:
        raise CLIError(f"--lease-s must be in [0, 86400] seconds (0: no heartbeats), got {args.lease_s}")
    params = {**({"k": args.k} if args.k is not None else {}),
              **({"min_delta": args.min_delta} if args.min_delta is not None else {})}
    return {"detector": args.detector or "decline", **params} if args.detector or params else None


def read_token(args: argparse.Namespace, required: bool = True) -> str | None:
    """The tenant token of a command: ``--token-file PATH`` (its first line), else ``--token`` (with a
    warning on stderr: any user of the machine can read a command line), else ``$EVALSTOP_TOKEN``.

    Raises:
        CLIError: both --token and --token-file; an unreadable, empty or oversized token file; no
            token at all (with ``required``).
    """
    given, path = getattr(args, "token", None), getattr(args, "token_file", None)
    if given and path:
        raise CLIError("pass --token or --token-file, not both")
    if path:
        file = Path(path)
        try:
            mode = file.stat().st_mode
            if not stat.S_ISREG(mode):
                raise CLIError(f"--token-file {path} is not a regular file")
            text = file.read_text(encoding="utf-8", errors="strict")[: _MAX_TOKEN + 1]
        except OSError as exc:
            raise CLIError(f"cannot read --token-file {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise CLIError(f"--token-file {path} is not UTF-8 text") from None
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token or len(token) > _MAX_TOKEN:
            raise CLIError(f"--token-file {path} holds no token (one line of at most {_MAX_TOKEN} characters)")
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            print(f"warning: --token-file {path} can be read by other users (chmod 600 it)", file=sys.stderr)
        return token
    if given:
        print("warning: --token is visible to every user of this machine (`ps`); use --token-file PATH or "
              "$EVALSTOP_TOKEN", file=sys.stderr)
        return given
    token = os.environ.get("EVALSTOP_TOKEN", "").strip()
    if token:
        return token
    if required:
        raise CLIError("no token: pass --token-file PATH or set EVALSTOP_TOKEN (or pass --token)")
    return None

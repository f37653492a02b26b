"""``evalstop outbox flush PATH --url URL [--token-file F]``: replay a leftover outbox.

A training process whose coordinator was unreachable until it ended leaves its queued operations in
``<output_dir>/evalstop-outbox.jsonl``; this sends them, in order, to the coordinator now. Lines that
cannot be replayed go to ``<outbox>.quarantine`` with the reason (see :mod:`evalstop_trl.clients.outbox`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .common import CLIError, add_token_flags, read_token

__all__ = ["add_outbox_command"]


def _cmd_flush(args: argparse.Namespace) -> int:
    from ..clients.http import EvalStopClient
    from ..core.errors import EvalStopError

    path = Path(args.path)
    if not path.is_file():
        raise CLIError(f"no outbox at {path}")
    url = args.url or os.environ.get("EVALSTOP_URL")
    if not url:
        raise CLIError("pass --url (or set EVALSTOP_URL)")
    token = read_token(args)
    import logging

    # the one line printed below says what was sent: not the client's own "replayed N" too
    logging.getLogger("evalstop.client").addFilter(lambda r: not r.getMessage().startswith("replayed "))
    try:
        client = EvalStopClient(url, token, outbox=path, retries=1)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    try:
        before = client.pending
        try:
            empty = client.flush()
        except EvalStopError as exc:
            raise CLIError(str(exc)) from None
        left = client.pending
    finally:
        client.close()
    print(f"{path}: {before - left} of {before} queued operation(s) sent to {url}; {left} left")
    return 0 if empty else 1


def add_outbox_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("outbox", help="replay a training run's leftover outbox")
    osub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    f = osub.add_parser("flush", help="send the queued operations of an outbox file to a coordinator")
    f.add_argument("path", help="the outbox, e.g. OUTPUT_DIR/evalstop-outbox.jsonl")
    f.add_argument("--url", help="coordinator URL (default: $EVALSTOP_URL)")
    add_token_flags(f)
    f.set_defaults(func=_cmd_flush)

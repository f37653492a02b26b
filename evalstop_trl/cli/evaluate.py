"""``evalstop evaluate --url URL --token-file F --fn package.module:function [--fn-path DIR] [--workers K]
[--device D] [--max-evals M] [--root DIR] [--lease-s S] [--allow-pickle]`` (or ``--db PATH`` for the
embedded default).

The function is imported from the installed packages, or from ``--fn-path`` (which must not be the
root or under it: tenants write there); neither the root nor the current folder is ever on
``sys.path``. Snapshots load from safetensors only unless ``--allow-pickle``. See
:mod:`evalstop_trl.train.evaluator` for the security model.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path

from .common import CLIError, add_token_flags, existing_db, read_token

__all__ = ["add_evaluate_command"]

#: how long ``evalstop evaluate --db`` waits by default for a training job to create its database
DB_WAIT_S = 60.0


_SQLITE_HEADER = b"SQLite format 3\x00"


def _ready(path: str) -> bool:
    """A SQLite file with its header written (a job's callback may have just created it, still empty)."""
    try:
        with open(path, "rb") as fh:
            return os.path.isfile(path) and fh.read(16) == _SQLITE_HEADER
    except OSError:
        return False


def _await_db(path: str, wait_s: float) -> str:
    """``path`` once it is a SQLite database (a worker may start before the job whose callback creates the
    file, and the job's output folder), at most ``wait_s`` seconds; never created here. A path whose
    grandparent folder does not exist either is refused at once (a typo, not a job yet to come)."""
    import sys
    import time

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent) and not os.path.isdir(os.path.dirname(parent)):
        raise CLIError(f"no folder {parent} for --db {path}: pass the evalstop.db of a run's output folder")
    if os.path.isdir(path) or (os.path.exists(path) and not os.path.isfile(path)):
        return existing_db(path)  # a folder: said at once
    deadline = time.monotonic() + wait_s
    if not _ready(path) and wait_s > 0:
        print(f"evalstop evaluate: waiting up to {wait_s:g} s for {path} (a training job's callback creates it; "
              "--wait-db S)", file=sys.stderr, flush=True)
        while not _ready(path) and time.monotonic() < deadline:
            time.sleep(0.2)
    if os.path.exists(path) and not _ready(path):
        raise CLIError(f"--db {path} is not a SQLite database (no SQLite header after {wait_s:g} s)")
    return existing_db(path)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from ..train.evaluator import Evaluator, isolate_sys_path, load_function

    root = Path(args.root).resolve()
    if not root.is_dir():
        raise CLIError(f"--root {args.root} is not a folder")
    if args.fn_path is not None:
        fn_path = Path(args.fn_path).resolve()
        if fn_path == root or root in fn_path.parents:
            raise CLIError(f"--fn-path {fn_path} is the root or under it ({root}): tenants write there; keep the "
                           "function's code elsewhere")
    isolate_sys_path(root)  # the function and what the loaders import come from the installed packages
    try:
        fn = load_function(args.fn, args.fn_path)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if not 1 <= args.workers <= 64 or not 1 <= args.lease_s <= 3600:
        raise CLIError("--workers must be in [1, 64] and --lease-s in [1, 3600]")
    url = args.url or os.environ.get("EVALSTOP_URL")
    if url:
        from ..clients.http import EvalStopClient

        try:
            client = EvalStopClient(url, read_token(args), retries=2)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    elif args.db:
        from ..clients.embedded import EmbeddedClient
        from ..core.coordinator import Coordinator
        from ..stores import open_store
        from ..stores.sqlite import SQLiteStore

        try:  # a SQLite file is shared with the training process that writes it: versioned writes
            store = open_store(args.db) if "://" in args.db else SQLiteStore(_await_db(args.db, args.wait_db),
                                                                                     shared=True)
            client = EmbeddedClient(Coordinator(store))
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    else:
        raise CLIError("pass --url (a coordinator) or --db (an embedded database)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per claim (one a second when idle)
    evaluator = Evaluator(client, fn, root, workers=args.workers, device=args.device, lease_s=args.lease_s,
                          max_evals=args.max_evals, allow_pickle=args.allow_pickle)
    signal.signal(signal.SIGTERM, lambda *a: evaluator.stop())
    try:
        done = evaluator.run()
    except KeyboardInterrupt:
        evaluator.stop()
        done = evaluator.done
    finally:
        client.close()
    print(f"evalstop evaluate: {done} eval(s) done", flush=True)
    return 0


def add_evaluate_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="score jobs' snapshots with a world-feedback function (external evaluators)")
    p.add_argument("--url", help="coordinator URL (default: $EVALSTOP_URL)")
    add_token_flags(p)
    p.add_argument("--db", help="an embedded database instead of a URL (never created: it is waited for, --wait-db)")
    p.add_argument("--wait-db", type=float, default=DB_WAIT_S, metavar="S",
                   help=f"with --db: seconds to wait for a training job to create the file, then refuse it "
                   f"(default {DB_WAIT_S:g}; a worker may start before its job)")
    p.add_argument("--fn", required=True, help="package.module:function, called as function(model, tokenizer) -> float; "
                                               "imported from the installed packages or --fn-path")
    p.add_argument("--fn-path", metavar="DIR", help="import --fn's top-level package from this folder (not the root "
                                                    "nor under it; default: installed packages only)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="also load pickled weights (pytorch_model.bin); default: safetensors only")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-evals", type=int, help="stop after this many evals")
    p.add_argument("--lease-s", type=float, default=300.0, help="how long a claimed snapshot stays with a worker")
    p.add_argument("--root", default=".", help="only snapshots (and adapters' base models) under this folder are "
                                               "opened; symlinks out of it are refused (default: here)")
    p.set_defaults(func=_cmd_evaluate)

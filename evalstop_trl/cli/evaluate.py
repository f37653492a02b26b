"""``evalstop evaluate --url URL --token T --fn package.module:function [--workers K] [--device D]
[--max-evals M] [--root DIR] [--lease-s S]`` (or ``--db PATH`` for the embedded default)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from .common import CLIError

__all__ = ["add_evaluate_command"]


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from ..train.evaluator import Evaluator, load_function

    sys.path.insert(0, os.getcwd())  # --fn may name a module of the current folder
    try:
        fn = load_function(args.fn)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if not 1 <= args.workers <= 64 or not 1 <= args.lease_s <= 3600:
        raise CLIError("--workers must be in [1, 64] and --lease-s in [1, 3600]")
    url = args.url or os.environ.get("EVALSTOP_URL")
    if url:
        from ..clients.http import EvalStopClient

        token = args.token or os.environ.get("EVALSTOP_TOKEN")
        if not token:
            raise CLIError("no token: pass --token or set EVALSTOP_TOKEN")
        client = EvalStopClient(url, token, retries=2)
    elif args.db:
        from ..clients.embedded import EmbeddedClient
        from ..core.coordinator import Coordinator
        from ..stores import open_store

        try:
            client = EmbeddedClient(Coordinator(open_store(args.db)))
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    else:
        raise CLIError("pass --url (a coordinator) or --db (an embedded database)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    evaluator = Evaluator(client, fn, args.root, workers=args.workers, device=args.device, lease_s=args.lease_s,
                          max_evals=args.max_evals)
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
    p.add_argument("--token", help="tenant token (default: $EVALSTOP_TOKEN)")
    p.add_argument("--db", help="an embedded database instead of a URL")
    p.add_argument("--fn", required=True, help="package.module:function, called as function(model, tokenizer) -> float")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-evals", type=int, help="stop after this many evals")
    p.add_argument("--lease-s", type=float, default=300.0, help="how long a claimed snapshot stays with a worker")
    p.add_argument("--root", default=".", help="only snapshots under this folder are opened (default: here)")
    p.set_defaults(func=_cmd_evaluate)

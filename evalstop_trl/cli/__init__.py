"""The ``evalstop`` command: its subcommands are those :func:`build_parser` adds (``evalstop --help``
lists them; the parser is their one home).

Each subcommand imports what it needs when it runs, so ``evalstop replay --help`` stays fast and
never imports torch, FastAPI or uvicorn. Bad input exits with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..core.extras import install_hint
from .common import EXIT_BAD_INPUT, CLIError

__all__ = ["CLIError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evalstop", description="Stop reward-hacked RLHF runs from world feedback.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from .calibrate import add_calibrate_command
    from .evaluate import add_evaluate_command
    from .inspection import add_inspect_commands
    from .outbox import add_outbox_command
    from .prune import add_prune_command
    from .remote import add_remote_commands
    from .replay import add_replay_command
    from .run import add_run_command
    from .service import add_service_commands  # light: heavy imports happen inside the commands
    from .shadow import add_shadow_command

    add_service_commands(sub)
    add_run_command(sub)
    add_remote_commands(sub)
    add_replay_command(sub)
    add_calibrate_command(sub)
    add_outbox_command(sub)
    add_evaluate_command(sub)
    add_prune_command(sub)
    add_inspect_commands(sub)
    add_shadow_command(sub)
    return parser


#: commands that need an extra as a whole (the others name the extra of the module they miss)
_COMMAND_EXTRA = {"serve": "service", "calibrate": "calibrate", "ray": "ray"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CLIError as exc:
        print(f"evalstop {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ModuleNotFoundError as exc:  # a command of an extra that is not installed: say which
        hint = install_hint(exc, _COMMAND_EXTRA.get(args.command))
        if hint is None:
            raise
        print(f"evalstop {args.command}: error: {hint}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader went away (`| head`): not an error (before OSError, its base)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        print(f"evalstop {args.command}: error: {exc.strerror or exc}: {exc.filename or ''}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

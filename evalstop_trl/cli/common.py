"""What every ``evalstop`` subcommand shares: the user-error exception and its exit status."""

from __future__ import annotations

__all__ = ["EXIT_BAD_INPUT", "CLIError"]

EXIT_BAD_INPUT = 2


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""

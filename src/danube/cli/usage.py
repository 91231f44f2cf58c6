"""What the command-line tools share."""

from __future__ import annotations


class UsageError(Exception):
    """Bad flags the parser cannot see (for example `-m` and `-f` both missing)."""

"""What the command-line tools share."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_SERVICE = "http://127.0.0.1:6650"


class UsageError(Exception):
    """Bad flags the parser cannot see (for example `-m` and `-f` both missing)."""


def add_service_addr(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-s", "--service-addr", default=DEFAULT_SERVICE,
        help=f"broker URL, or several of a cluster comma-separated (default {DEFAULT_SERVICE})",
    )  # fmt: skip


def read_input(path: Path) -> bytes:
    """A file the user named (payload, schema), or a one-line error saying why not."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror}") from None

"""What the command-line tools share."""

from __future__ import annotations

import argparse

DEFAULT_SERVICE = "http://127.0.0.1:6650"


class UsageError(Exception):
    """Bad flags the parser cannot see (for example `-m` and `-f` both missing)."""


def add_service_addr(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-s", "--service-addr", default=DEFAULT_SERVICE,
        help=f"broker URL, or several of a cluster comma-separated (default {DEFAULT_SERVICE})",
    )  # fmt: skip

"""The progress line `danube-cli produce` and `consume` keep on stderr."""

from __future__ import annotations

import sys
import time
from typing import TextIO

PROGRESS_SECONDS = 1.0
"""How often a terminal's line is rewritten."""
LOG_PROGRESS_SECONDS = 10.0
"""How often a line is added when stderr is a file or a pipe (a log): there `\\r` rewrites
nothing, so every line stays, and a line a second would flood it."""


class Progress:
    """A status line on stderr, so long runs show they are alive without flooding the
    terminal or a log. On a terminal the line is rewritten in place (`\\r`) at most once a
    second; elsewhere (issue 26: the line appeared twice, glued together, in a pipe) each
    report is a line of its own, at most one per 10 s, and the final count is printed once."""

    def __init__(self, verb: str, total: int | None, stream: TextIO | None = None) -> None:
        self._verb = verb
        self._total = total
        self._stream = stream if stream is not None else sys.stderr
        self._terminal = self._stream.isatty()
        self._period = PROGRESS_SECONDS if self._terminal else LOG_PROGRESS_SECONDS
        self._started = time.monotonic()
        self._last = self._started
        self.count = 0

    def tick(self) -> None:
        self.count += 1
        if self.count == self._total:
            return  # `finish` reports the last one
        now = time.monotonic()
        if now - self._last >= self._period:
            self._last = now
            self._print(now, end="\r" if self._terminal else "\n")

    def finish(self) -> None:
        self._print(time.monotonic(), end="\n")

    def _print(self, now: float, end: str) -> None:
        elapsed = max(now - self._started, 1e-9)
        of = f"/{self._total}" if self._total else ""
        print(
            f"{self._verb} {self.count}{of} messages in {elapsed:.1f} s "
            f"({self.count / elapsed:.0f} msg/s)",
            file=self._stream,
            end=end,
            flush=True,
        )

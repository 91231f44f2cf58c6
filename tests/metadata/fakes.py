"""Test doubles shared by the metadata tests."""

from __future__ import annotations


class FakeClock:
    """Lease deadlines are compared to this instead of the trio clock, so tests expire a lease
    by advancing a number rather than sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

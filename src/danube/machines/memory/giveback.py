"""Giving memory back to the system after a large drop of accounted use (spec/memory.md,
"Giving memory back"; issue 28 point 3: after the load, memory returns near its start).

When streams close, caches empty and held records are acknowledged, the pools give their
bytes back at once, but the process does not: CPython's allocator keeps freed arenas while
any object lives in them, and glibc's malloc keeps freed heap at the top and in its free
lists. The soak's broker held 215 MiB of RSS after its load against 183 MiB before it with
the same topics, while the pools had given back 53 MiB. A collection (`gc.collect`, which
also frees reference cycles a closed stream may leave) followed by glibc's `malloc_trim(0)`
returns what can be returned.

Both cost time on the event loop (a full collection visits every tracked object: tens of
milliseconds with thousands of topics), so the decision is rate-limited and made only after
a large drop: when the pools' accounted total fell by at least `drop_bytes` from its highest
point since the last return, and `MIN_INTERVAL_MS` passed since it. Pure: totals and times
in, the `ReturnMemory` effect out; the production port carries it out, the simulator
records it.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_INTERVAL_MS = 30_000
"""At most one return in this long."""
DROP_SHARE = 16
"""A large drop: a sixteenth of the budget (16 MiB of 256 MiB; a budget is at least 16 MiB,
the simulator's kilobyte pools scale it down with them)."""

OVER_RSS_DROP_SHARE = 4
"""While RSS is over its mark a return needs a quarter of a large drop since the last one:
what the squeeze evicted. Without it a process whose own baseline is over the mark (a small
budget) collected every `MIN_INTERVAL_MS` for ever, holding the loop each time for nothing
(review finding)."""


@dataclass(frozen=True, slots=True)
class ReturnMemory:
    """Effect: collect garbage and give freed heap back to the system (`freed`: the fall of
    accounted bytes that decided it, for the log)."""

    freed: int


class MemoryReturn:
    """Decides when the broker gives memory back (module docstring)."""

    __slots__ = ("_high", "_last_ms", "drop_bytes", "returns")

    def __init__(self, budget: int) -> None:
        self.drop_bytes = max(1, budget // DROP_SHARE)
        self._high = 0
        self._last_ms: int | None = None
        self.returns = 0
        """How many `ReturnMemory` were decided (a counter)."""

    def seen(self, accounted: int) -> None:
        """The pools held `accounted` bytes a moment ago (before a squeeze evicts in the same
        tick): the highest point the next `observe` measures the drop from."""
        self._high = max(self._high, accounted)

    def observe(
        self, accounted: int, now_ms: int, over_rss: bool = False
    ) -> tuple[ReturnMemory, ...]:
        """The pools hold `accounted` bytes now: a `ReturnMemory` when that is a large drop,
        or when the process's RSS is over its high-water mark (`over_rss`, `RssGuard`: the
        caches were just squeezed, what they freed is to go back) and they freed at least
        `OVER_RSS_DROP_SHARE`'s share of a large drop, and the last return is long enough
        ago."""
        if accounted >= self._high:
            self._high = accounted
            if not over_rss:
                return ()
        fell = self._high - accounted
        if fell < (self.drop_bytes // OVER_RSS_DROP_SHARE if over_rss else self.drop_bytes):
            return ()
        if self._last_ms is not None and now_ms - self._last_ms < MIN_INTERVAL_MS:
            return ()
        self._high = accounted
        self._last_ms = now_ms
        self.returns += 1
        return (ReturnMemory(fell),)

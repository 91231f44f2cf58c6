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
"""While RSS is over its mark a return needs a quarter of a large drop since the last one,
of what is not in the caches' pages. Without it a process whose own baseline is over the
mark (a small budget) collected every `MIN_INTERVAL_MS` for ever, holding the loop each time
for nothing (review finding). The caches' part does not count there (issue 28 part 13): what
the squeeze evicts is in pages (`danube.machines.memory.pages`), which went back to the kernel
as they were evicted; a collection and a trim after it held the loop 240-268 ms to give back
0.3-0.7 MiB (the 10-minute soak of part 12)."""


@dataclass(frozen=True, slots=True)
class ReturnMemory:
    """Effect: collect garbage and give freed heap back to the system (`freed`: the fall of
    accounted bytes that decided it, for the log)."""

    freed: int


class MemoryReturn:
    """Decides when the broker gives memory back (module docstring)."""

    __slots__ = ("_high", "_high_heap", "_last_ms", "drop_bytes", "returns")

    def __init__(self, budget: int) -> None:
        self.drop_bytes = max(1, budget // DROP_SHARE)
        self._high = 0
        self._high_heap = 0
        """The highest accounted total less the caches' since the last return."""
        self._last_ms: int | None = None
        self.returns = 0
        """How many `ReturnMemory` were decided (a counter)."""

    def seen(self, accounted: int, cached: int = 0) -> None:
        """The pools held `accounted` bytes a moment ago, `cached` of them the caches' (before
        a squeeze evicts in the same tick): the highest point the next `observe` measures the
        drop from."""
        self._high = max(self._high, accounted)
        self._high_heap = max(self._high_heap, accounted - cached)

    def observe(
        self, accounted: int, now_ms: int, over_rss: bool = False, cached: int = 0
    ) -> tuple[ReturnMemory, ...]:
        """The pools hold `accounted` bytes now, `cached` of them the caches': a
        `ReturnMemory` when that is a large drop, or when the process's RSS is over its
        high-water mark (`over_rss`, `RssGuard`) and what is not the caches' (state,
        publishes, held records: memory of the allocators, which only a collection and a trim
        give back) fell by at least `OVER_RSS_DROP_SHARE`'s share of a large drop (the caches'
        pages went back as the squeeze evicted them, and their fall is forgotten), and the
        last return is long enough ago."""
        heap = accounted - cached
        self._high_heap = max(self._high_heap, heap)
        if accounted >= self._high:
            self._high = accounted
            if not over_rss:
                return ()
        if over_rss:
            fell = self._high_heap - heap
            # what the caches gave of the drop went back with their pages: it no longer
            # counts toward a large drop either, once RSS is under the mark again
            self._high = min(self._high, accounted + fell)
            needed = self.drop_bytes // OVER_RSS_DROP_SHARE
        else:
            fell = self._high - accounted
            needed = self.drop_bytes
        if fell < needed:
            return ()
        if self._last_ms is not None and now_ms - self._last_ms < MIN_INTERVAL_MS:
            return ()
        self._high = accounted
        self._high_heap = heap
        self._last_ms = now_ms
        self.returns += 1
        return (ReturnMemory(fell),)

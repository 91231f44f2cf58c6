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

A return is light unless a full one is due (issue 28 part 15): the 10-minute soak's nine
returns held the loop 52-278 ms each, almost all of it the full collection (the trim runs in
a worker thread), and under the squeeze they came every 30 s for a few hundred KiB. A light
return collects the young generations only (0 and 1: cheap, and it frees little, since the
automatic collector already visits them; cyclic garbage that reached generation 2 waits for the
automatic collection of that generation or the next full return) and trims, which is what
gives most back; a full one (every generation) at most once in
`FULL_MIN_INTERVAL_MS`, and that interval doubles (to `FULL_MAX_INTERVAL_MS`) each time a full
return did not give back enough: RSS never fell by a quarter of a large drop below the sample
that decided it, less what the pools evicted after that sample (their pages go back at once,
whatever the collection does), at any sample until the next return. A full return that gave
enough sets it
back to the least. The first return of a process is full.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_INTERVAL_MS = 30_000
"""At most one return in this long."""
DROP_SHARE = 16
"""A large drop: a sixteenth of the budget (16 MiB of 256 MiB; a budget is at least 16 MiB,
the simulator's kilobyte pools scale it down with them)."""

FULL_MIN_INTERVAL_MS = 120_000
"""At most one full collection in this long (a light return in between)."""
FULL_MAX_INTERVAL_MS = 960_000
"""The longest the back-off waits between full collections that gave back too little."""

OVER_RSS_DROP_SHARE = 4
"""While RSS is over its mark a return needs a quarter of a large drop since the last one:
what the squeeze evicted. Without it a process whose own baseline is over the mark (a small
budget) collected every `MIN_INTERVAL_MS` for ever, holding the loop each time for nothing
(review finding)."""


@dataclass(frozen=True, slots=True)
class ReturnMemory:
    """Effect: collect garbage and give freed heap back to the system (`freed`: the fall of
    accounted bytes that decided it, for the log; `full`: collect every generation, else the
    young ones only, generations 0 and 1)."""

    freed: int
    full: bool = True


class MemoryReturn:
    """Decides when the broker gives memory back (module docstring)."""

    __slots__ = (
        "_full_low",
        "_full_rss",
        "_high",
        "_last_full_ms",
        "_last_ms",
        "drop_bytes",
        "full_interval_ms",
        "full_returns",
        "returns",
    )

    def __init__(self, budget: int) -> None:
        self.drop_bytes = max(1, budget // DROP_SHARE)
        self._high = 0
        self._last_ms: int | None = None
        self._last_full_ms: int | None = None
        self._full_rss: int | None = None
        """The RSS sampled when the last full return was decided, until the next return
        judges what it gave back (None: judged, or RSS not known then)."""
        self._full_low: int | None = None
        """The lowest RSS sampled since (the trim runs in a worker thread: the sample just
        after may come before it is done)."""
        self.full_interval_ms = FULL_MIN_INTERVAL_MS
        """The least time from a full return to the next (the back-off)."""
        self.returns = 0
        """How many `ReturnMemory` were decided (a counter)."""
        self.full_returns = 0
        """How many of them were full (a counter)."""

    def _judge_full(self) -> None:
        """At the next return: the last full one gave back enough (RSS fell by a quarter of a
        large drop at some sample since: the interval back to the least) or not (doubled, up
        to the most)."""
        if self._full_rss is None or self._full_low is None:
            self._full_rss = self._full_low = None  # not judged: never against later samples
            return
        gave = self._full_rss - self._full_low
        self._full_rss = self._full_low = None
        if gave >= self.drop_bytes // OVER_RSS_DROP_SHARE:
            self.full_interval_ms = FULL_MIN_INTERVAL_MS
        else:
            self.full_interval_ms = min(FULL_MAX_INTERVAL_MS, 2 * self.full_interval_ms)

    def seen(self, accounted: int) -> None:
        """The pools held `accounted` bytes a moment ago (before a squeeze evicts in the same
        tick): the highest point the next `observe` measures the drop from."""
        self._high = max(self._high, accounted)

    def observe(
        self,
        accounted: int,
        now_ms: int,
        over_rss: bool = False,
        rss: int | None = None,
        evicted: int = 0,
    ) -> tuple[ReturnMemory, ...]:
        """The pools hold `accounted` bytes now: a `ReturnMemory` when that is a large drop,
        or when the process's RSS is over its high-water mark (`over_rss`, `RssGuard`: the
        caches were just squeezed, what they freed is to go back) and they freed at least
        `OVER_RSS_DROP_SHARE`'s share of a large drop, and the last return is long enough
        ago. Full when the back-off allows one (module docstring); `rss`, the process's RSS
        now (None: not known), is what judges the last full return; `evicted`, what the pools
        evicted after `rss` was sampled (their pages go back to the kernel at once, so the
        next samples fall by them whatever the collection does: not the full return's
        credit; review finding: the squeeze's own evictions reset the back-off every time)."""
        if rss is not None and self._full_rss is not None:
            self._full_low = rss if self._full_low is None else min(self._full_low, rss)
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
        self._judge_full()
        last_full = self._last_full_ms
        full = last_full is None or now_ms - last_full >= self.full_interval_ms
        if full:
            self._last_full_ms = now_ms
            self._full_rss = None if rss is None else rss - evicted
            self._full_low = None
            self.full_returns += 1
        return (ReturnMemory(fell, full),)

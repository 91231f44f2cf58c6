"""The budget held on what the process really uses (spec/memory.md, "The process's RSS";
issue 28 point 1).

The pools account what they can measure (cached batches, publishes in flight, held records,
state at measured costs), but the process holds more: the interpreter, gRPC buffers,
fragmentation of CPython's arenas and glibc's heap. The 10-minute soak peaked at 271.7 MiB
of RSS against its 256 MiB budget while the pools accounted 110.5 MiB. So the runtime samples
its resident set at each memory tick (/proc/self/statm, `danube.runtime.memory_return.
rss_bytes`) and hands it here, and this decides:

- while RSS is above `HIGH_WATER` of the budget, the cache pool's effective limit drops by
  the overshoot (`CacheLedger.squeeze`: the ledger evicts the broker's oldest batches at
  once, whichever topic holds them), and what publishes may borrow of the cache pool drops
  by the part of the overshoot the caches could not give (publishes wait, then are refused:
  back-pressure once the caches are empty);
- memory is given back (`ReturnMemory`, rate-limited like any return) while RSS is over;
- the limit recovers as RSS falls: the squeeze is the overshoot of the last sample, not a
  sum, so a sample under the mark lifts it entirely.

What RSS holds beyond what the pools account (`unaccounted`) is reported as a metric.
Pure: RSS, accounted bytes and times in, the squeeze and effects out.
"""

from __future__ import annotations

from danube.values.sizes import MIB

HIGH_WATER = 0.9
"""The share of the budget RSS may reach before the cache pool gives way (230 MiB of 256)."""


class RssGuard:
    """Turns the sampled RSS into the cache pool's squeeze (module docstring)."""

    __slots__ = ("budget", "high", "rss", "squeeze", "squeezed_samples", "unaccounted")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.high = int(budget * HIGH_WATER)
        """The high-water mark in bytes."""
        self.rss: int | None = None
        """The last sampled RSS (None: never sampled, or not readable on this system)."""
        self.squeeze = 0
        """Bytes the cache pool's limit is lowered by now (the overshoot of the last sample)."""
        self.unaccounted = 0
        """RSS less what the pools accounted at the last sample (never below 0)."""
        self.squeezed_samples = 0
        """Samples that found RSS over the mark (a counter, for metrics and tests)."""

    def sample(self, rss: int | None, accounted: int) -> bool:
        """The process holds `rss` bytes now and the pools account `accounted`: the squeeze
        is updated; True when RSS is over the mark (the caller gives memory back)."""
        self.rss = rss
        if rss is None:  # no /proc here: nothing to hold the budget against
            self.squeeze = 0
            self.unaccounted = 0
            return False
        self.unaccounted = max(0, rss - accounted)
        self.squeeze = max(0, rss - self.high)
        if self.squeeze:
            self.squeezed_samples += 1
        return self.squeeze > 0


def baseline_warning(rss: int | None, budget: int) -> str | None:
    """Why this budget cannot be held, or None: the process's RSS once started (before any
    load) is already over the high-water mark, so the caches stay squeezed to nothing and
    every read goes to disk. Logged at start (`event=memory_budget_below_baseline`) with the
    smallest budget that would leave the caches any room (review finding: a 64 MiB budget
    under a broker that starts at 80 MiB was squeezed for good, silently)."""
    if rss is None or rss < int(budget * HIGH_WATER):
        return None
    least = -(-int(rss / HIGH_WATER) // MIB) * MIB
    return (
        f"the broker holds {rss} bytes of RSS before any load, over {HIGH_WATER:.0%} of its "
        f"memory budget of {budget} bytes: the hot caches will stay empty and reads go to "
        f"disk. Give it a --memory-budget well above {least} bytes"
    )

"""The consumer pool: records reliable subscriptions hold for their consumers (spec/memory.md,
"Consumer queues").

A reliable subscription keeps the record of every offset it read and that is not yet
acknowledged (`SubscriptionRecord.records`: in flight to a consumer, waiting in its outbox, or
waiting to be sent again). Its window (`max_unacked_messages`) bounds how many; this pool
bounds them all together. Each held record is accounted at `len(record) + HELD_PER_RECORD`
(`HeldRecords` reports every record it takes and lets go). The outbox of a consumer's stream
holds references to those very records, so it adds no bytes of its own.

When the pool is full, a subscription that already holds records reads no more: its next
read waits (`paused`) and the records stay on disk (or in the hot cache, which the cache pool
bounds) until acknowledgements make room; `resume` hands back the reads that fit again, in
the order they were paused (the reliable log asks at the acknowledgement that made room and
at each tick). A subscription that holds nothing may always read once, so no subscription is
starved by others' slow consumers, also one whose read paused while it held records and
whose consumers acknowledged them all since (`resume(holds_nothing)`): the pool may exceed
its share by one read per such subscription (`READ_MAX_BYTES` at most each).

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

HELD_PER_RECORD = 2_048
"""A held record beyond its bytes: its dict slot and outbox entry, and what delivering it
costs the broker until it is acknowledged (the delivery's frame and stream buffers).
`bench/state_memory.py` measured 2,187 B of RSS per message delivered and not acknowledged
(64-byte payloads, less what the cache pool accounted for them), over 3,000: an upper bound
rounded down, not a fit (bench/RESULTS.md 2026-11-29)."""


class ConsumerPool:
    """Accounted bytes of every reliable subscription's held records, and the reads paused
    for want of room."""

    __slots__ = ("limit", "paused", "paused_reads", "peak", "used")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"a consumer pool needs room, got {limit} bytes")
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.paused: deque[tuple[str, str, int, Any]] = deque()
        """(topic, subscription, its epoch, the read): reads waiting for room, oldest first."""
        self.paused_reads = 0
        """Reads paused since the start (a counter, for metrics)."""

    @property
    def full(self) -> bool:
        return self.used >= self.limit

    def may_read(self, holding: bool) -> bool:
        """Whether a subscription may read now: room left, or it holds nothing yet."""
        return not holding or not self.full

    def pause(self, topic: str, subscription: str, epoch: int, read: Any) -> None:
        self.paused.append((topic, subscription, epoch, read))
        self.paused_reads += 1

    def resume(
        self, holds_nothing: Callable[[str, str, int], bool] | None = None
    ) -> list[tuple[str, str, int, Any]]:
        """The paused reads to carry out now: all of them once there is room (each is judged
        again as it is carried out, and pauses again if the pool filled meanwhile); while it
        is full, those of subscriptions that hold nothing any more (`holds_nothing(topic,
        subscription, epoch)`: their consumers acknowledged everything since the read
        paused, or they are gone), which may always read once."""
        if not self.paused:
            return []
        if not self.full:
            ready = list(self.paused)
            self.paused.clear()
            return ready
        if holds_nothing is None:
            return []
        ready, kept = [], deque()
        for paused in self.paused:
            (ready if holds_nothing(*paused[:3]) else kept).append(paused)
        self.paused = kept
        return ready

    def put_back(self, reads: list[tuple[str, str, int, Any]]) -> None:
        """Reads `resume` handed out and the caller did not carry out (the pool filled again
        before their turn): back at the front, in their order, not counted as new pauses."""
        self.paused.extendleft(reversed(reads))

    def took(self, size: int) -> None:
        self.used += size
        self.peak = max(self.peak, self.used)

    def let_go(self, size: int) -> None:
        self.used -= size


class HeldRecords(dict[int, bytes]):
    """A subscription's held records (offset → record) that report to the consumer pool what
    they take and let go. Only `[offset] = record`, `pop` and `clear` change it."""

    __slots__ = ("held", "pool")

    def __init__(self, pool: ConsumerPool) -> None:
        super().__init__()
        self.pool = pool
        self.held = 0
        """Accounted bytes of the records held here."""

    def __setitem__(self, offset: int, record: bytes) -> None:
        old = self.get(offset)
        if old is not None:
            self._let_go(old)
        size = len(record) + HELD_PER_RECORD
        self.held += size
        self.pool.took(size)
        super().__setitem__(offset, record)

    def pop(self, offset: int, default: Any = None) -> Any:  # type: ignore[override]
        record = super().pop(offset, None)
        if record is None:
            return default
        self._let_go(record)
        return record

    def clear(self) -> None:
        self.pool.let_go(self.held)
        self.held = 0
        super().clear()

    def _let_go(self, record: bytes) -> None:
        size = len(record) + HELD_PER_RECORD
        self.held -= size
        self.pool.let_go(size)

    def _unsupported(self, *_: object, **__: object) -> None:
        raise TypeError("HeldRecords changes only by [offset] = record, pop and clear")

    __delitem__ = popitem = update = setdefault = __ior__ = _unsupported  # type: ignore[assignment]

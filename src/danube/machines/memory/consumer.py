"""The consumer pool: records reliable subscriptions hold for their consumers (spec/memory.md,
"Consumer queues").

A reliable subscription keeps the record of every offset it read and that is not yet
acknowledged (`SubscriptionRecord.records`: in flight to a consumer, waiting in its outbox, or
waiting to be sent again). Its window (`max_unacked_messages`) bounds how many; this pool
bounds them all together. Each held record is accounted at `len(record) + HELD_PER_RECORD`
(`HeldRecords` reports every record it takes and lets go). The outbox of a consumer's stream
holds references to those very records, so it adds no bytes of its own.

What a read may take is decided when its records come back, before any is held
(`admissible`): a subscription that already holds records takes only what fits in the pool's
own room; when not one of its records fits, its read waits (`paused`) and the records stay on
disk (or in the hot cache, which the cache pool bounds) until acknowledgements make room.
`resume` hands back the reads whose room came, in the order they were paused (the reliable
log asks at the acknowledgement that made room and at each tick).

A subscription that holds nothing may read beyond the pool's own room, so no subscription is
starved by others' slow consumers: it borrows of the cache pool (the cache gives way first:
its ledger evicts at once), at most `FREE_READ_BYTES` together with the room left, and at
least its first record when that alone fits. What it borrows is only what the cache pool has
left after the state's room and what publishes borrow (`CacheLedger.lendable`): so the
caches, the state, the publishes and the held records together never pass the budget. A read
that finds not even that room waits too, and goes on once it comes.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from danube.machines.memory.ledger import CacheLedger

HELD_PER_RECORD = 2_048
"""A held record beyond its bytes: its dict slot and outbox entry, and what delivering it
costs the broker until it is acknowledged (the delivery's frame and stream buffers).
`bench/state_memory.py` measured 2,187 B of RSS per message delivered and not acknowledged
(64-byte payloads, less what the cache pool accounted for them), over 3,000: an upper bound
rounded down, not a fit (bench/RESULTS.md 2026-11-29)."""
FREE_READ_BYTES = 64 * 1024
"""The most a read of a subscription holding nothing may take beyond the pool's own room (it
borrows that of the cache pool), unless its first record alone is larger: enough for a few
records, so such a subscription progresses, small enough that many of them borrow little.
Before, such a read took up to the 4 MiB of a file read each, whatever the pool held: the pool
passed its share by that much per subscription (review finding)."""
MIN_READ_BYTES = HELD_PER_RECORD + 1
"""The room a read needs to be worth carrying out (the smallest record): below it, it waits;
one whose first record needs more waits for that much (`pause`'s `need`)."""
Paused = tuple[str, str, int, Any]
"""(topic, subscription, its epoch, the read)."""


class ConsumerPool:
    """Accounted bytes of every reliable subscription's held records, what of them is
    borrowed of the cache pool, and the reads paused for want of room."""

    __slots__ = (
        "_relend",
        "ledger",
        "limit",
        "needs",
        "paused",
        "paused_reads",
        "peak",
        "queue_refused",
        "queued",
        "used",
    )

    def __init__(
        self,
        limit: int,
        ledger: CacheLedger | None = None,
        relend: Callable[[], None] | None = None,
    ) -> None:
        """`ledger`: the cache pool reads of subscriptions holding nothing borrow of (None:
        they borrow without bound, as a pool alone in a test). `relend`: called when what
        is borrowed changed, so the cache pool shrinks or grows back and publishes waiting
        for its room are served (`broker_pools`)."""
        if limit <= 0:
            raise ValueError(f"a consumer pool needs room, got {limit} bytes")
        self.limit = limit
        self.ledger = ledger
        self._relend = relend
        self.used = 0
        self.peak = 0
        self.paused: deque[Paused] = deque()
        """Reads waiting for room, oldest first."""
        self.needs: dict[tuple[str, str, int], int] = {}
        """(topic, subscription, epoch) of a paused read -> the room it waits for, when more
        than `MIN_READ_BYTES` (its first record did not fit)."""
        self.paused_reads = 0
        """Reads paused since the start (a counter, for metrics)."""
        self.queued = 0
        """Bytes in non-reliable consumer queues (`enqueue`): in the pool's own share with
        the held records, never borrowed."""
        self.queue_refused = 0
        """Non-reliable messages dropped for want of room in the pool (a counter)."""

    @property
    def own_room(self) -> int:
        """What is left of the pool's own share."""
        return max(0, self.limit - self.used - self.queued)

    @property
    def borrowed(self) -> int:
        """Bytes of the cache pool the held records take now (beyond the share, with what
        non-reliable queues hold)."""
        return max(0, self.used + self.queued - self.limit)

    @property
    def full(self) -> bool:
        """No room in the pool's own share for one more read."""
        return self.own_room < MIN_READ_BYTES

    def room(self, holding: bool) -> int:
        """The most a subscription may still be given: the pool's own room if it holds
        records; else that and what the cache pool may lend (`CacheLedger.lendable`)."""
        if holding:
            return self.own_room
        if self.ledger is None:
            return self.own_room + (1 << 62)
        return self.own_room + self.ledger.lendable()

    def allowance(self, holding: bool) -> int:
        """What a read of such a subscription may take now (module docstring): the room it
        has, a read of one holding nothing cut to `FREE_READ_BYTES` beyond the own room."""
        room = self.room(holding)
        return room if holding else min(room, max(self.own_room, FREE_READ_BYTES))

    def may_read(self, holding: bool) -> bool:
        """Whether a read is worth carrying out now (else it waits: `pause`)."""
        return self.allowance(holding) >= MIN_READ_BYTES

    def admissible(self, sizes: Sequence[int], holding: bool) -> int:
        """How many of the records just read (their lengths, in order) the subscription may
        hold: those that fit in its allowance, at least the first when it holds nothing and
        that one fits in its room. 0: none, its read waits (`pause` with `need`)."""
        allowance = self.allowance(holding)
        taken = count = 0
        for size in sizes:
            taken += size + HELD_PER_RECORD
            if taken > allowance:
                break
            count += 1
        if count == 0 and sizes and not holding:
            return int(sizes[0] + HELD_PER_RECORD <= self.room(holding))
        return count

    def pause(self, topic: str, subscription: str, epoch: int, read: Any, need: int = 0) -> None:
        """The read waits until its subscription has `need` bytes of room (at least
        `MIN_READ_BYTES`)."""
        self.paused.append((topic, subscription, epoch, read))
        if need > MIN_READ_BYTES:
            self.needs[(topic, subscription, epoch)] = need
        else:
            self.needs.pop((topic, subscription, epoch), None)
        self.paused_reads += 1

    def ready(self, paused: Paused, holding: bool) -> bool:
        """Whether a paused read has the room it waits for now."""
        need = self.needs.get(paused[:3], MIN_READ_BYTES)
        return self.room(holding) >= need and self.allowance(holding) >= MIN_READ_BYTES

    def resume(self, holds_nothing: Callable[[str, str, int], bool] | None = None) -> list[Paused]:
        """The paused reads to carry out now, in order: those whose room came (`ready`; a
        subscription that holds nothing any more, `holds_nothing(topic, subscription,
        epoch)`, may borrow). Each is judged again as it is carried out (`ready`) and pauses
        again if the room went meanwhile. Without the question every read is judged as one
        of a subscription holding records. A read keeps what it waits for until the caller
        carries it out (`carried_out`): one put back (`put_back`) still waits for it (review
        finding: it was forgotten here, and a read waiting for 8,000 bytes went out with 5,000
        free, only to pause again)."""
        if not self.paused:
            return []
        ready, kept = [], deque()
        for paused in self.paused:
            holding = holds_nothing is None or not holds_nothing(*paused[:3])
            if self.ready(paused, holding):
                ready.append(paused)
            else:
                kept.append(paused)
        self.paused = kept
        return ready

    def discard(self, gone: Callable[[str, str, int], bool]) -> None:
        """Drops the paused reads of subscriptions `gone(topic, subscription, epoch)`
        (removed, or rebuilt since: their reads are void)."""
        kept: deque[Paused] = deque()
        for paused in self.paused:
            if gone(*paused[:3]):
                self.needs.pop(paused[:3], None)
            else:
                kept.append(paused)
        self.paused = kept

    def carried_out(self, paused: Paused) -> None:
        """A read `resume` handed out goes out now: what it waited for is forgotten."""
        if self.needs:
            self.needs.pop(paused[:3], None)

    def put_back(self, reads: list[Paused]) -> None:
        """Reads `resume` handed out and the caller did not carry out (the room went again
        before their turn): back at the front, in their order, not counted as new pauses."""
        self.paused.extendleft(reversed(reads))

    def took(self, size: int) -> None:
        self.used += size
        self.peak = max(self.peak, self.used)
        if self.used + self.queued > self.limit:
            self._lend()

    def let_go(self, size: int) -> None:
        borrowing = self.used + self.queued > self.limit
        self.used -= size
        if borrowing:
            self._lend()

    def enqueue(self, size: int) -> bool:
        """Whether a non-reliable message of `size` bytes may wait in a consumer queue: only
        within the pool's own room (it never borrows: at most once, it may be dropped and
        counted instead, `DropReason.MEMORY_BUDGET`); taken when it may."""
        if self.used + self.queued + size > self.limit:
            self.queue_refused += 1
            return False
        self.queued += size
        return True

    def dequeue(self, size: int) -> None:
        """Non-reliable messages left their queues (sent, moved, dropped, their subscription
        gone): their room comes back, and what held records borrow may shrink."""
        borrowing = self.used + self.queued > self.limit
        self.queued -= size
        if borrowing:
            self._lend()

    def _lend(self) -> None:
        """What is borrowed changed: the cache pool shrinks by it (its ledger evicts at
        once) or grows back."""
        ledger = self.ledger
        if ledger is not None and ledger.consumers != self.borrowed:
            ledger.consumers = self.borrowed
            if self._relend is not None:
                self._relend()


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

"""The publish pool: memory held by publishes accepted and not yet answered (spec/memory.md,
"Back-pressure").

A publish reserves what its request costs when it enters the core's flow, before anything of
it is stored, and gives it back when it is answered: acknowledged (its records are in the WAL
and the hot cache, which the cache ledger accounts from then on) or refused. While the pool is
full a publish waits for room (the flow sleeps and asks again), so a plain `SendMessage` is
answered RESOURCE_EXHAUSTED after a bounded wait and a stream of batches is read no further
(its reader is inside the wait), which stops HTTP/2 from granting the producer more window.

The cache gives way first: a publish that does not fit in the publish pool's own share
borrows from the cache pool, up to `BORROWABLE_CACHE_SHARE` of it, by shrinking the cache
ledger's pool (which evicts the broker's oldest cached batches at once: they are on disk,
a read the cache cannot serve goes there). The ledger gets its room back as publishes are
answered. So `cache ledger total + publish pool used <= cache pool + publish pool` always, and
publishes wait only once the cache has given what it may.

Pure: `now` comes in as milliseconds; no clock, no I/O.
"""

from __future__ import annotations

from danube.machines.memory.ledger import CacheLedger

PUBLISH_WAIT_MS = 3_000
"""How long a plain `SendMessage` waits for room before RESOURCE_EXHAUSTED (`memory.
publish_wait_ms`): long enough to ride out a slow fsync, short enough that a client sees why."""
STREAM_WAIT_MS = 30_000
"""How long a batch of a `PublishBatches` stream waits: the stream is not read meanwhile (the
producer is paused by flow control, not refused), but a disk that never catches up must end
in an answer."""
RETRY_MS = 10
"""How often a waiting publish asks for room again."""
BORROWABLE_CACHE_SHARE = 0.5
"""Of the cache pool, what publishes may borrow: the other half stays for the hot tail that
consumers read right after it is written."""

SEND_PER_MESSAGE = 1_500
"""Accounted bytes of one `SendMessage` in flight beyond twice its payload (the decoded
`Record`'s payload and the WAL's pending frame; the stamped record itself is in the hot cache,
which the ledger accounts): the `Record`, the step and its effects, the flow's generator
frames (`bench/publish_memory.py`, tracemalloc; bench/RESULTS.md 2026-11-29)."""
BATCH_PER_MESSAGE = 12
"""A `PublishBatch` in flight per message beyond its frame: its entries in the positions and
sizes arrays (the stamped frame is in the hot cache)."""
BATCH_PER_REQUEST = 1_400
"""... and per batch: the request, the checked `ClientBatch`, its arrays, the step, the flow's
frames (`bench/publish_memory.py`)."""


def send_cost(payload_bytes: int) -> int:
    """Accounted bytes of one `SendMessage` in flight: its payload twice (decoded, and in the
    WAL's pending frame until written) and the objects around it."""
    return 2 * payload_bytes + SEND_PER_MESSAGE


def batch_cost(frame_bytes: int, count: int) -> int:
    """Accounted bytes of one `PublishBatch` in flight: the frame it arrived in (held until it
    is answered) and the objects around it; its stamped copy is the hot cache's."""
    return frame_bytes + BATCH_PER_MESSAGE * count + BATCH_PER_REQUEST


class PublishPool:
    """Bytes of publishes in flight on one broker, the pool's share of the budget, and what
    it borrows from the cache pool."""

    __slots__ = (
        "_cache_pool",
        "_ledger",
        "borrowable",
        "limit",
        "paused_ms",
        "peak",
        "pressure",
        "refused",
        "stream_wait_ms",
        "used",
        "wait_ms",
    )

    def __init__(
        self,
        limit: int,
        *,
        ledger: CacheLedger | None = None,
        wait_ms: int = PUBLISH_WAIT_MS,
        stream_wait_ms: int = STREAM_WAIT_MS,
    ) -> None:
        """`limit`: the publish pool's share of the budget. `ledger`: the cache pool it may
        borrow from (None: it borrows nothing)."""
        if limit <= 0:
            raise ValueError(f"a publish pool needs room, got {limit} bytes")
        self.limit = limit
        self._ledger = ledger
        self._cache_pool = ledger.pool if ledger is not None else 0
        self.borrowable = int(self._cache_pool * BORROWABLE_CACHE_SHARE)
        self.wait_ms = wait_ms
        self.stream_wait_ms = stream_wait_ms
        self.used = 0
        """Accounted bytes of the publishes holding a reservation."""
        self.peak = 0
        """The most `used` has ever been (the simulator checks it against the capacity)."""
        self.pressure = 0
        """Bytes of the budget taken by memory outside the pools: admission leaves them free.
        The simulator's memory-pressure fault sets it; production leaves it 0 for now."""
        self.paused_ms = 0
        """Time publishes spent waiting for room, added up (a counter, for metrics)."""
        self.refused = 0
        """Publishes refused RESOURCE_EXHAUSTED for want of room (a counter)."""

    @property
    def capacity(self) -> int:
        """The most the pool ever holds: its share and what it may borrow. A request larger
        than this can never be admitted and is refused at once."""
        return self.limit + self.borrowable

    @property
    def borrowed(self) -> int:
        """Bytes of the cache pool the publishes hold now."""
        return max(0, self.used - self.limit)

    def reserve(self, size: int) -> bool:
        """Takes `size` bytes if they fit (evicting cached batches for what is borrowed) and
        says whether they did; a publish that got False waits or is refused."""
        if self.used + size > self.capacity - self.pressure:
            return False
        self.used += size
        self.peak = max(self.peak, self.used)
        self._lend()
        return True

    def release(self, size: int) -> None:
        """A publish that reserved `size` bytes was answered (acknowledged or refused)."""
        if size > self.used:
            raise ValueError(f"releasing {size} bytes of a pool holding {self.used}")
        self.used -= size
        self._lend()

    def waited(self, ms: int, *, refused: bool) -> None:
        """A publish waited `ms` for room, then got it (or was refused)."""
        self.paused_ms += ms
        if refused:
            self.refused += 1

    def _lend(self) -> None:
        """The cache pool shrinks by what publishes borrow (its ledger evicts at once) and
        grows back as they give it up."""
        ledger = self._ledger
        if ledger is not None:
            ledger.pool = self._cache_pool - self.borrowed
            ledger.fit()

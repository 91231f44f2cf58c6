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
answered. What the state (`danube.machines.memory.state`) took of the cache pool, or may
take up to its share, and what held records borrow of it (`danube.machines.memory.consumer`)
are not borrowed again. So `cache ledger total + state + publish pool used <= cache pool + publish
pool` at every admission, and publishes wait only once the cache has given what it may.

Waiters are served in order, woken by the release that frees their room (no polling): a
publish that does not fit joins the queue (`RoomWaiter`); a newcomer never passes a queue
that is not empty; each release admits the waiters from the head on while they fit. A head
that does not fit yet may be passed by smaller waiters behind it that do, at most
`MAX_BYPASS` times: then nothing more is admitted until the room freed reaches it. So a large
publish is not starved by small ones (they pass it a bounded number of times, then the
publishes in flight drain and it goes), and small ones are not blocked for ever by a large
one either (they pass it a few times, and it leaves the queue at the latest when its wait
ends). At most `max_waiters` publishes wait, holding at most `max_waiting_bytes` together
(the pool's share, unless the queue is empty: one request may always wait); beyond, a publish
is refused at once.

Pure: `now` comes in as milliseconds; no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from danube.machines.memory.ledger import CacheLedger

PUBLISH_WAIT_MS = 3_000
"""How long a plain `SendMessage` waits for room before RESOURCE_EXHAUSTED (`memory.
publish_wait_ms`): long enough to ride out a slow fsync, short enough that a client sees why."""
STREAM_WAIT_MS = 30_000
"""How long a batch of a `PublishBatches` stream waits: the stream is not read meanwhile (the
producer is paused by flow control, not refused), but a disk that never catches up must end
in an answer."""
MAX_WAITERS = 1_024
"""Publishes that may wait for room at once (`max_waiters`): each holds its request (up to
the pool's capacity) outside the pool while it waits, so an unbounded queue would be memory
nobody accounts. Beyond it a publish is refused RESOURCE_EXHAUSTED at once. Their bytes are
bounded too (`max_waiting_bytes`, the pool's share by default): 1,024 waiters of 10 MiB
each would be 10 GiB outside the budget (review finding)."""
MAX_BYPASS = 8
"""How many times waiters behind the head may be admitted past it while it does not fit:
enough that a large publish does not hold up small ones the moment room frees, few enough
that it is served once the publishes in flight drain."""
REPLICATION_SHARE = 0.5
"""Of the publish pool's ceiling, what replication send queues may hold together
(`PublishPool.replication_room`)."""
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


@dataclass(eq=False, slots=True)
class RoomWaiter:
    """A publish waiting in the queue for `size` bytes of room. `granted` turns True when the
    pool admitted it (the room is then reserved for it); `wake`, set by the host while it
    waits, is called at that moment (`AwaitRoom`)."""

    size: int
    granted: bool = False
    wake: Callable[[], None] | None = None
    bypassed: int = 0
    """Waiters admitted past this one while it was the head (`MAX_BYPASS`)."""


def borrowable_at_most(cache_pool: int, state_limit: int) -> int:
    """The most publishes may ever borrow of a cache pool of `cache_pool` bytes whose state
    share is `state_limit`: `BORROWABLE_CACHE_SHARE` of it, less what the state's share keeps
    back (`PublishPool.room_to_borrow` with no state, held record or cache)."""
    return max(0, min(int(cache_pool * BORROWABLE_CACHE_SHARE), cache_pool - state_limit))


class PublishPool:
    """Bytes of publishes in flight on one broker, the pool's share of the budget, and what
    it borrows from the cache pool."""

    __slots__ = (
        "_cache_pool",
        "_ledger",
        "_waiters",
        "borrowable",
        "limit",
        "max_waiters",
        "max_waiting_bytes",
        "paused_ms",
        "peak",
        "pressure",
        "refused",
        "replicating",
        "stream_wait_ms",
        "used",
        "wait_ms",
        "waiting_bytes",
    )

    def __init__(
        self,
        limit: int,
        *,
        ledger: CacheLedger | None = None,
        wait_ms: int = PUBLISH_WAIT_MS,
        stream_wait_ms: int = STREAM_WAIT_MS,
        max_waiters: int = MAX_WAITERS,
        max_waiting_bytes: int | None = None,
    ) -> None:
        """`limit`: the publish pool's share of the budget. `ledger`: the cache pool it may
        borrow from (None: it borrows nothing). `max_waiting_bytes`: what waiting publishes
        may hold together (default: `limit`)."""
        if limit <= 0:
            raise ValueError(f"a publish pool needs room, got {limit} bytes")
        self.limit = limit
        self._ledger = ledger
        self._cache_pool = ledger.pool if ledger is not None else 0
        self.borrowable = int(self._cache_pool * BORROWABLE_CACHE_SHARE)
        self.wait_ms = wait_ms
        self.stream_wait_ms = stream_wait_ms
        self.max_waiters = max_waiters
        self.max_waiting_bytes = limit if max_waiting_bytes is None else max_waiting_bytes
        self.waiting_bytes = 0
        """Accounted bytes of the publishes waiting in the queue: memory they hold outside
        the pool (their requests), so bounded by `max_waiting_bytes`."""
        self._waiters: deque[RoomWaiter] = deque()
        """Publishes waiting for room, oldest first."""
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
        self.replicating = 0
        """Of `used`, bytes queued on replication links to followers, not yet written to
        their streams (`replication_queued`)."""

    @property
    def capacity(self) -> int:
        """The most the pool may hold now: its share and what it may borrow now."""
        return self.limit + self.room_to_borrow

    @property
    def ceiling(self) -> int:
        """The most the pool could ever hold: its share and what it may ever borrow
        (`borrowable_at_most`). A request larger than this can never be admitted and is
        refused at once. Review finding: this was `limit + borrowable` while the room to
        borrow always keeps the state's share back, so a request between the two waited its
        whole wait on an idle broker, and, larger than `max_waiting_bytes`, made every other
        publish be refused meanwhile."""
        ledger = self._ledger
        if ledger is None:
            return self.limit
        return self.limit + borrowable_at_most(self._cache_pool, ledger.state_limit)

    @property
    def room_to_borrow(self) -> int:
        """What publishes may borrow of the cache pool now: `borrowable` (half of it), but
        never what the state (topics, subscriptions, consumers, open streams) already took of
        it. Review finding: with the state charged to the cache pool and publishes still
        borrowing half of it, cache + state + publishes reached 216 MiB against a cache and
        publish pool of 192 (a 256 MiB budget under `danube-cli load`'s 3,000 streams).
        Nor what held records borrow of it (`CacheLedger.consumers`), nor the state's room up
        to its share (`CacheLedger.state_limit`), which they may not borrow either: so state
        created later within its share always finds its room (`CacheLedger.lendable`). Nor
        the RSS squeeze (`CacheLedger.squeeze`): a process over its high-water mark lends
        less, so publishes wait once the caches have given what they held."""
        ledger = self._ledger
        if ledger is None:
            return 0
        kept = max(ledger.state, ledger.state_limit) + ledger.consumers + ledger.squeeze
        return max(0, min(self.borrowable, self._cache_pool - kept))

    @property
    def borrowed(self) -> int:
        """Bytes of the cache pool the publishes hold now."""
        return max(0, self.used - self.limit)

    @property
    def waiting(self) -> int:
        """Publishes waiting for room now."""
        return len(self._waiters)

    @property
    def overlooked(self) -> int:
        """Bytes the first waiter waits for although they fit in the room free now: 0 unless
        a release forgot to serve the queue (the simulator's invariant 18 checks it)."""
        waiters = self._waiters
        return waiters[0].size if waiters and self.fits(waiters[0].size) else 0

    def fits(self, size: int) -> bool:
        """Whether `size` bytes fit in the room free now (capacity less pressure)."""
        return self.used + size <= self.capacity - self.pressure

    def reserve(self, size: int) -> bool:
        """Takes `size` bytes if they fit and nobody waits before (evicting cached batches
        for what is borrowed) and says whether they did; a publish that got False waits
        (`enqueue`) or is refused."""
        if self._waiters or not self.fits(size):
            return False
        self._take(size)
        return True

    def enqueue(self, size: int) -> RoomWaiter | None:
        """Puts a publish of `size` bytes at the end of the queue; None when `max_waiters`
        already wait, or when the waiters would hold more than `max_waiting_bytes` with it
        (refuse it at once). An empty queue takes any request that may ever fit: the bound
        is then that one request."""
        waiters = self._waiters
        if len(waiters) >= self.max_waiters:
            return None
        if waiters and self.waiting_bytes + size > self.max_waiting_bytes:
            return None
        waiter = RoomWaiter(size)
        waiters.append(waiter)
        self.waiting_bytes += size
        self.serve()
        return waiter

    def withdraw(self, waiter: RoomWaiter) -> None:
        """A waiter leaves (its wait ended, or its client left): out of the queue, or, if it
        was admitted meanwhile, its room given back. Either may let others in."""
        if waiter.granted:
            waiter.granted = False
            self.release(waiter.size)
            return
        try:
            self._waiters.remove(waiter)
        except ValueError:
            return
        self.waiting_bytes -= waiter.size
        self.serve()

    def release(self, size: int) -> None:
        """A publish that reserved `size` bytes was answered (acknowledged or refused); the
        room freed goes to the waiters first."""
        if size > self.used:
            raise ValueError(f"releasing {size} bytes of a pool holding {self.used}")
        self.used -= size
        self.lend()
        self.serve()

    def relieve(self) -> None:
        """Memory pressure ended: its room goes to the waiters."""
        self.pressure = 0
        self.serve()

    def serve(self) -> None:
        """Admits waiters in order while they fit; past a head that does not fit, at most
        `MAX_BYPASS` times in all (module docstring). Each admitted waiter is woken."""
        waiters = self._waiters
        while waiters:
            head = waiters[0]
            if self.fits(head.size):
                waiters.popleft()
                self._grant(head)
                continue
            if head.bypassed >= MAX_BYPASS:
                return
            passer = next((w for w in waiters if w is not head and self.fits(w.size)), None)
            if passer is None:
                return
            head.bypassed += 1
            waiters.remove(passer)
            self._grant(passer)

    def _grant(self, waiter: RoomWaiter) -> None:
        self.waiting_bytes -= waiter.size
        self._take(waiter.size)
        waiter.granted = True
        if waiter.wake is not None:
            waiter.wake()

    def _take(self, size: int) -> None:
        self.used += size
        self.peak = max(self.peak, self.used)
        self.lend()

    @property
    def replication_room(self) -> int:
        """What replication send queues may hold together: `REPLICATION_SHARE` of the
        ceiling. Review finding: never refused, the queues of one follower that was down
        filled the pool before their own 128 MiB cap (at a 256 MiB budget the pool holds 96),
        so every publish on the broker was refused for as long as the link lived."""
        return int(self.ceiling * REPLICATION_SHARE)

    def replication_fits(self, size: int) -> bool:
        """Whether `size` more bytes may be queued for followers; False: the link that would
        queue them is lost instead (its queue dropped, as when it fills: the owner resends
        from the WAL once the follower is back), so a lagging follower holds back at most
        `replication_room` of the publishes, never all of them."""
        return self.replicating + size <= self.replication_room

    def replication_queued(self, size: int) -> None:
        """`size` bytes of `Replicate`s were queued for a follower's stream (positive) or
        left the queue (negative: written, or dropped with a lost link, which the owner
        resends after). They are publishes not answered yet in another form: charged to
        this pool, never refused (replication must not lose what producers were or will be
        told is stored), so that while followers lag, new publishes wait for room, then are
        refused, as for a slow disk: producers are paused, nothing is dropped. The bound is
        the owner machine's in-flight window per follower and topic, and the producers it
        holds back (spec/memory.md, "Replication send queues")."""
        if size >= 0:
            self.replicating += size
            self._take(size)
            return
        size = min(-size, self.replicating)
        self.replicating -= size
        self.release(size)

    def waited(self, ms: int, *, refused: bool) -> None:
        """A publish waited `ms` for room, then got it (or was refused)."""
        self.paused_ms += ms
        if refused:
            self.refused += 1

    def restate(self) -> None:
        """The state charged to the cache pool changed (`StatePool`): the cache pool shrinks
        or grows back (`lend`), and room the state gave back goes to the waiters."""
        self.lend()
        self.serve()

    def lend(self) -> None:
        """The cache pool shrinks by what publishes and held records borrow and what state
        holds (its ledger evicts at once) and grows back as they give it up."""
        ledger = self._ledger
        if ledger is not None:
            ledger.publishes = self.borrowed
            ledger.pool = max(0, self._cache_pool - self.borrowed - ledger.state - ledger.consumers)
            ledger.fit()

"""The broker-wide cache ledger: one LRU across every topic's hot cache (spec/memory.md).

Each topic's `HotCache` reports the batches it adds and drops. The ledger keeps their order
across topics (a batch is used most recently when it is appended: reads of the hot tail come
right after), and when the accounted bytes of all caches exceed the cache pool it tells the
caches holding the broker's oldest batches to drop them, whichever topic they belong to, until
the total fits again. So a thousand idle topics hold only their share of the pool, and one
busy topic may use all of it. A topic's own `cache_bytes` still bounds its cache on its own.

Caches of topics idle for `idle_ms` (no batch added) are emptied at a tick
(`evict_idle`): a topic nobody writes to has nothing hot to keep, and under a pool far from
full nothing else would ever evict it (the soak's caches kept their 10-25 MiB after the load).
Its reads go to the segment files, as for any batch not cached.

Entries of batches a cache dropped by itself (its own bound, retention) stay in the order until
they reach its head and are skipped then: the ledger never walks the order to remove them.
An entry is the cache alone (no tuple, no offset: nothing allocated per batch, issue 28): a
cache's entries come in the order of its batches, so its k-th entry taken off the order is
about its k-th batch, still held unless the cache has dropped more than k batches.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol


class LedgerCache(Protocol):
    """What the ledger needs of a topic's cache."""

    topic: str
    dropped_batches: int
    """Batches the cache has dropped over its life."""
    ledger_popped: int
    """Written by the ledger: how many of the cache's entries it took off its order."""

    @property
    def oldest(self) -> int | None: ...

    def drop_oldest_for_ledger(self) -> None:
        """Drops the oldest batch, reporting it with `CacheLedger.dropped` like any other."""
        ...


class CacheLedger:
    """Accounted bytes of every hot cache of one broker, and the pool they share."""

    __slots__ = (
        "_active",
        "_batches",
        "_by_topic",
        "_next_sweep_ms",
        "_now_ms",
        "_order",
        "consumers",
        "evicted_bytes",
        "idle_evicted_bytes",
        "idle_ms",
        "pool",
        "publishes",
        "share",
        "squeeze",
        "state",
        "state_limit",
        "total",
    )

    def __init__(self, pool: int, idle_ms: int = 0) -> None:
        if pool < 0:
            raise ValueError(f"a cache pool cannot be negative, got {pool}")
        self.pool = pool
        self.total = 0
        """Accounted bytes of every cache registered, added up."""
        self._by_topic: dict[str, int] = {}
        self._order: deque[LedgerCache] = deque()
        """The cache of each batch added, oldest first."""
        self._batches = 0
        """Batches held by the caches (the live entries of `_order`)."""
        self.evicted_bytes = 0
        """Bytes the ledger made caches drop to fit the pool (a counter, for metrics)."""
        self.state = 0
        """Bytes of the cache pool charged to topics, subscriptions and consumers
        (`danube.machines.memory.state`): `pool` is what is left of it for caches."""
        self.share = pool
        """The cache pool's whole share of the budget, before state and borrowing."""
        self.state_limit = 0
        """What state may take of it (`StatePool.limit`): room kept for it, not lent."""
        self.publishes = 0
        """Bytes of it publishes borrow (`PublishPool.lend`)."""
        self.consumers = 0
        """Bytes of it held records borrow (`ConsumerPool`: reads of subscriptions holding
        nothing); `pool` is the share less state, publishes and consumers."""
        self.idle_ms = idle_ms
        """A cache with no batch added for this long is emptied (0: never; `evict_idle`)."""
        self.idle_evicted_bytes = 0
        """Bytes emptied from idle caches (a counter)."""
        self._active: dict[LedgerCache, int] = {}
        """Cache -> the tick time before its newest batch was added."""
        self._now_ms: int | None = None
        """The last tick's time (None before the first)."""
        self._next_sweep_ms = 0
        self.squeeze = 0
        """Bytes the cache pool's share is lowered by while the process's RSS is over its
        high-water mark (`danube.machines.memory.rss.RssGuard`): the caches' `limit` and
        what may be lent shrink by it; 0 when RSS is under the mark."""

    @property
    def limit(self) -> int:
        """What the caches may hold now: `pool` less the RSS `squeeze`."""
        return max(0, self.pool - self.squeeze)

    def lendable(self) -> int:
        """What publishes and held records may still borrow: the share less the state's room
        (what it holds, at least what it may take, so state created later within its share
        never finds its room lent) and what is lent already. Borrowing no more than this
        keeps caches + state + publishes + held records within the budget."""
        reserved = max(self.state, self.state_limit)
        lent = self.publishes + self.consumers + self.squeeze
        return max(0, self.share - reserved - lent)

    def by_topic(self) -> dict[str, int]:
        """Accounted bytes per topic (a copy)."""
        return dict(self._by_topic)

    def added(self, cache: LedgerCache, size: int) -> None:
        """`cache` holds a new batch: count it. The cache calls `fit` once it has applied its
        own bound, so that the ledger evicts only what that bound left over the pool."""
        self._order.append(cache)
        self._active[cache] = self._now_ms or 0
        self.total += size
        self._batches += 1
        topic = cache.topic
        self._by_topic[topic] = self._by_topic.get(topic, 0) + size
        if len(self._order) > 2 * self._batches + 64:
            self._compact()

    def dropped(self, cache: LedgerCache, size: int) -> None:
        """`cache` dropped a batch of `size` accounted bytes (for whatever reason); an empty
        cache is no longer watched for idleness (nor kept alive by the ledger)."""
        if cache.oldest is None:
            self._active.pop(cache, None)
        self.total -= size
        self._batches -= 1
        topic = cache.topic
        left = self._by_topic[topic] - size
        if left:
            self._by_topic[topic] = left
        else:
            del self._by_topic[topic]

    def fit(self) -> None:
        """Evicts the broker's oldest batches while the caches together exceed their limit
        (the pool less the RSS squeeze; the newest batch too, if it alone does): afterwards
        `total <= limit`."""
        order = self._order
        limit = self.limit
        while self.total > limit and order:
            cache = order.popleft()
            entry = cache.ledger_popped
            cache.ledger_popped = entry + 1
            if entry < cache.dropped_batches:
                continue  # the cache dropped that batch itself, or was released
            before = self.total
            cache.drop_oldest_for_ledger()
            self.evicted_bytes += before - self.total

    def evict_idle(self, now_ms: int) -> None:
        """At a tick: empties the caches whose newest batch is `idle_ms` old or more. The
        caches are visited once every quarter of `idle_ms`, not at every tick. The core's
        clock is the wall clock, which may step: at the first tick (batches added before it
        carry no time) and when the clock went back, every cache counts as active now, so
        no cache is emptied early and none is kept for as long as the step (review finding)."""
        if self._now_ms is None or now_ms < self._now_ms:
            for cache in self._active:
                self._active[cache] = now_ms
            self._next_sweep_ms = min(self._next_sweep_ms, now_ms)
        self._now_ms = now_ms
        if not self.idle_ms or now_ms < self._next_sweep_ms:
            return
        self._next_sweep_ms = now_ms + max(1, self.idle_ms // 4)
        idle = [c for c, at in self._active.items() if now_ms - at >= self.idle_ms]
        for cache in idle:
            before = self.total
            while cache.oldest is not None:
                cache.drop_oldest_for_ledger()
            self._active.pop(cache, None)
            self.idle_evicted_bytes += before - self.total

    def _compact(self) -> None:
        """Drops the entries of batches no cache holds any more (a cache holds a suffix of
        the batches it added: those it has not dropped), and counts them as taken off."""
        live: deque[LedgerCache] = deque()
        entries: dict[LedgerCache, int] = {}
        for cache in self._order:
            entry = entries.get(cache, cache.ledger_popped)
            entries[cache] = entry + 1
            if entry >= cache.dropped_batches:
                live.append(cache)
        for cache, end in entries.items():
            cache.ledger_popped = min(end, cache.dropped_batches)
        self._order = live

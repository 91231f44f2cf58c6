"""Read-only views of a `BrokerCore`'s state for metrics and operators: plain values, computed
when asked (a scrape), so the publish and dispatch paths pay nothing for them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from danube.machines.node.core import BrokerCore, TopicRecord


@dataclass(frozen=True, slots=True)
class SubscriptionStats:
    name: str
    consumers: int
    """Consumers attached to the subscription: registered and with their receive stream
    open (a registered consumer whose stream closed is not attached)."""
    backlog: int | None
    """Reliable: messages stored and not yet acknowledged (from the cursor); None otherwise."""
    redeliveries: int
    """Reliable: messages sent again since the subscription was loaded here; 0 otherwise."""


@dataclass(frozen=True, slots=True)
class TopicStats:
    topic: str
    reliable: bool
    messages_in: int
    """Messages accepted since the topic was loaded on this broker."""
    bytes_in: int
    producers: int
    subscriptions: tuple[SubscriptionStats, ...]
    upload_lag: int | None
    """With an object tier: committed offsets not yet in an indexed object; else None."""


def topic_stats(core: BrokerCore) -> list[TopicStats]:
    """Every topic this broker serves (not those on their way out), by name."""
    return [_topic(core, record) for record in core.topic_records() if not record.phase.moving]


def _topic(core: BrokerCore, record: TopicRecord) -> TopicStats:
    wal = record.log.wal if record.phase.writable else None  # `record.wal`: not a touch
    committed = wal.readable_offset if wal is not None else None
    subscriptions = []
    for sub in record.subscriptions.values():
        backlog = sub.machine.backlog(committed)
        redeliveries = sub.machine.redelivered
        attached = _attached(core, sub.consumers.values())
        subscriptions.append(SubscriptionStats(sub.name, attached, backlog, redeliveries))
    return TopicStats(
        record.name.full,
        record.reliable,
        record.messages_in,
        record.bytes_in,
        len(record.producers),
        tuple(subscriptions),
        _upload_lag(record, committed),
    )


def _attached(core: BrokerCore, consumer_ids: Iterable[int]) -> int:
    count = 0
    for consumer_id in consumer_ids:
        consumer = core.consumer_record(consumer_id)
        if consumer is not None and consumer.stream:
            count += 1
    return count


def _upload_lag(record: TopicRecord, committed: int | None) -> int | None:
    if record.uploader is None or committed is None or record.wal is None:
        return None
    indexed = record.uploader.indexed_next
    start = indexed if indexed is not None else record.wal.first_offset
    return max(0, committed - start)


def consumer_target(core: BrokerCore, consumer_id: int) -> tuple[str, str] | None:
    """(topic, subscription) of a consumer, or None when it is gone."""
    consumer = core.consumer_record(consumer_id)
    if consumer is None:
        return None
    return consumer.topic.full, consumer.subscription


@dataclass(frozen=True, slots=True)
class MemoryUse:
    """The broker's memory budget, its pools and what each holds now (spec/memory.md)."""

    budget: int
    pools: tuple[tuple[str, int, int], ...]
    """(pool, size, bytes in use): `cache` (hot caches, accounted), `publish` (publishes
    accepted and not yet answered, `PublishPool`), `consumer` (non-reliable consumer
    queues)."""
    cache_evicted: int
    """Accounted bytes the cache pool evicted (across topics) since the broker started."""
    publish_borrowed: int = 0
    """Bytes of the cache pool the publishes hold now (the cache gave way)."""
    publish_paused_ms: int = 0
    """Time publishes waited for room in the publish pool, added up, since the start."""
    publish_refused: int = 0
    """Publishes refused RESOURCE_EXHAUSTED for want of room since the start."""
    held: tuple[tuple[str, str, int], ...] = ()
    """(topic, subscription, bytes) of every reliable subscription holding records now: the
    consumer pool by subscription, so that a slow consumer's share can be told from the rest
    (the soak, issue 28 point 3)."""
    cached: tuple[tuple[str, int], ...] = ()
    """(topic, accounted bytes) of every topic whose hot cache holds something now."""
    rss: int | None = None
    """The process's resident set at the last tick (None: not sampled; `RssGuard`)."""
    unaccounted: int = 0
    """RSS less what the pools accounted at that tick."""
    rss_squeeze: int = 0
    """Bytes the cache pool is lowered by now because RSS is over its high-water mark."""


def memory_use(core: BrokerCore) -> MemoryUse | None:
    """None when the core has no budget (tests, a core built without one)."""
    pools, ledger, publish = core.memory, core.cache_ledger, core.publish_pool
    if pools is None or ledger is None or publish is None:
        return None
    held = core.logs.consumer_pool
    consumer = held.used + held.queued if held is not None else 0
    # Non-reliable queues are in the pool (`ConsumerPool.enqueue`, spec/memory.md,
    # "Consumer queues"); without one they are only shown.
    holders: list[tuple[str, str, int]] = []
    cached: list[tuple[str, int]] = []
    for record in core.topic_records():
        for name, sub in record.subscriptions.items():
            if held is None:
                consumer += getattr(sub.machine, "queued_bytes", 0)
            holding = getattr(sub.records, "held", 0)
            if holding:
                holders.append((record.name.full, name, holding))
        wal = record.log.wal
        if wal is not None and wal.cached_bytes:
            cached.append((record.name.full, wal.cached_bytes))
    return MemoryUse(
        pools.budget,
        (
            ("cache", pools.cache, ledger.total),
            ("publish", pools.publish, publish.used),
            ("consumer", pools.consumer, consumer),
            ("state", core.state_pool.limit if core.state_pool else 0, ledger.state),
        ),
        ledger.evicted_bytes,
        publish.borrowed,
        publish.paused_ms,
        publish.refused,
        tuple(holders),
        tuple(cached),
        *_rss_of(core),
    )


def _rss_of(core: BrokerCore) -> tuple[int | None, int, int]:
    """The last RSS sample, what it holds beyond the pools, the cache pool's squeeze."""
    guard = core.pools.rss_guard
    if guard is None:
        return None, 0, 0
    return guard.rss, guard.unaccounted, guard.squeeze

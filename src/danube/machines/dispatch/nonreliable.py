"""Non-reliable (at-most-once) dispatch for one subscription.

Each consumer has a bounded queue of messages waiting for its stream writer. A message goes to
one queue or is dropped and counted; nothing here ever blocks the publisher, so a slow consumer
costs the others nothing and the broker at most `QueueLimits` per consumer.

Queued messages were never handed to the transport, so they can still move without being
duplicated: when a consumer disconnects its queue is re-routed to the consumers that remain
(Danube drops it), and on Key-Shared every membership or filter change moves queued messages
to their key's new owner, so one consumer at a time holds a key's pending messages. A queue
that receives moved messages is kept in publish order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from danube.machines.dispatch.keyshared import HashRing, KeyFilter, accepts
from danube.machines.dispatch.types import ConsumerReady, DropReason, QueueLimits, SubscriptionType


@dataclass(frozen=True, slots=True)
class Queued:
    seq: int
    """Publish order within the subscription."""
    message: Any
    size: int
    key: bytes


@dataclass(slots=True)
class _Consumer:
    consumer_id: int
    name: str
    filters: tuple[KeyFilter, ...]
    connected: bool = False
    queue: deque[Queued] = field(default_factory=deque)
    queued_bytes: int = 0


class NonReliableSubscription:
    """Routes each published message of one subscription to at most one consumer queue."""

    def __init__(self, sub_type: SubscriptionType, limits: QueueLimits) -> None:
        self.sub_type = sub_type
        self.limits = limits
        self._consumers: dict[int, _Consumer] = {}
        self._round_robin = 0
        self._active: int | None = None
        self._ring = HashRing()
        self._published = 0
        self.delivered = 0
        self.dropped: dict[DropReason, int] = dict.fromkeys(DropReason, 0)
        self.pool: Any = None
        """The broker's consumer pool (`ConsumerPool`: `enqueue`, `dequeue`), which bounds
        every non-reliable queue together; None: each queue's own bound only."""

    @property
    def queued_bytes(self) -> int:
        """Message bytes waiting in this subscription's consumer queues (the consumer-queue
        pool's use, spec/memory.md)."""
        return sum(consumer.queued_bytes for consumer in self._consumers.values())

    # -- membership ---------------------------------------------------------------------------

    def add_consumer(
        self, consumer_id: int, name: str, key_filters: tuple[str, ...], now_ms: int = 0
    ) -> list[ConsumerReady]:
        """Registers a consumer, disconnected until `connect` (Subscribe then connects it)."""
        if consumer_id in self._consumers:
            raise ValueError(f"consumer {consumer_id} is already registered")
        self._consumers[consumer_id] = _Consumer(
            consumer_id, name, tuple(KeyFilter(p) for p in key_filters)
        )
        return []

    def set_filters(
        self, consumer_id: int, key_filters: tuple[str, ...], now_ms: int = 0
    ) -> list[ConsumerReady]:
        self._consumers[consumer_id].filters = tuple(KeyFilter(p) for p in key_filters)
        return self._follow_key_owners()

    def remove_consumer(self, consumer_id: int, now_ms: int = 0) -> list[ConsumerReady]:
        effects = self.disconnect(consumer_id)
        del self._consumers[consumer_id]
        return effects

    def subscribed(self, consumer_id: int, now_ms: int = 0) -> list[ConsumerReady]:
        """Subscribe connects the consumer: its messages need no stream to be queued."""
        return self.connect(consumer_id)

    def stream_reset(self, consumer_id: int, now_ms: int = 0) -> list[ConsumerReady]:
        """A new stream of a connected consumer: its queue was never sent, so it stays."""
        return []

    def connect(self, consumer_id: int, now_ms: int = 0) -> list[ConsumerReady]:
        consumer = self._consumers[consumer_id]
        if consumer.connected:
            return []
        consumer.connected = True
        if self._active is None and self.sub_type in _SINGLE_ACTIVE:
            self._active = consumer_id
        effects = [ConsumerReady(consumer_id)] if consumer.queue else []
        if self.sub_type is SubscriptionType.KEY_SHARED:
            self._ring.add(consumer_id, consumer.name)
            effects.extend(self._follow_key_owners())
        return effects

    def disconnect(self, consumer_id: int, now_ms: int = 0) -> list[ConsumerReady]:
        """Marks the consumer gone; a Failover standby takes over; its queued messages go to
        the consumers that remain."""
        consumer = self._consumers[consumer_id]
        if not consumer.connected:
            return []
        consumer.connected = False
        self._ring.remove(consumer_id)
        if self._active == consumer_id:
            self._active = next(
                (c.consumer_id for c in self._consumers.values() if c.connected), None
            )
        return self._reroute(self._unqueue(consumer, list(consumer.queue)))

    def is_connected(self, consumer_id: int) -> bool:
        return self._consumers[consumer_id].connected

    @property
    def active_consumer(self) -> int | None:
        """The consumer that receives everything (Exclusive, Failover); None for the others."""
        return self._active

    @property
    def consumer_ids(self) -> list[int]:
        return list(self._consumers)

    def queued(self, consumer_id: int) -> int:
        return len(self._consumers[consumer_id].queue)

    # -- data path ----------------------------------------------------------------------------

    def publish(self, message: Any, size: int, key: bytes) -> list[ConsumerReady]:
        item = Queued(self._published, message, size, key)
        self._published += 1
        target = self._target(item)
        if target is None or not self._pooled(item):
            return []
        was_empty = not target.queue
        self._push(target, item)
        return [ConsumerReady(target.consumer_id)] if was_empty else []

    def take(self, consumer_id: int, limit: int) -> list[Any]:
        """Hands up to `limit` queued messages to the consumer's stream writer."""
        consumer = self._consumers[consumer_id]
        taken = []
        size = consumer.queued_bytes
        while consumer.queue and len(taken) < limit:
            item = consumer.queue.popleft()
            consumer.queued_bytes -= item.size
            taken.append(item.message)
        self.delivered += len(taken)
        if self.pool is not None and taken:
            self.pool.dequeue(size - consumer.queued_bytes)
        return taken

    def release(self) -> None:
        """The subscription is gone: its queues are dropped and their room given back."""
        for consumer in self._consumers.values():
            if self.pool is not None and consumer.queued_bytes:
                self.pool.dequeue(consumer.queued_bytes)
            consumer.queue.clear()
            consumer.queued_bytes = 0

    def ack(self, offset: int, now_ms: int = 0) -> list[ConsumerReady]:
        """At-most-once delivery takes no acknowledgements: nothing to do."""
        return []

    def nack(
        self, offset: int, delay_ms: int | None, now_ms: int = 0, *, reason: str | None = None
    ) -> list[ConsumerReady]:
        """Nothing is kept to deliver again."""
        return []

    def is_pending(self, offset: int) -> bool:
        return False

    # -- statistics ---------------------------------------------------------------------------

    @property
    def redelivered(self) -> int:
        """Nothing is ever sent twice."""
        return 0

    def drop_counts(self) -> dict[DropReason, int]:
        return dict(self.dropped)

    def backlog(self, readable_end: int | None) -> int | None:
        """No history, so no backlog."""
        return None

    # -- routing ------------------------------------------------------------------------------

    def _target(self, item: Queued) -> _Consumer | None:
        """The consumer whose queue takes `item`, or None after counting the drop."""
        if self.sub_type is SubscriptionType.SHARED:
            return self._round_robin_target(item)
        if self.sub_type is SubscriptionType.KEY_SHARED:
            owner = self._key_owner(item.key)
            if isinstance(owner, DropReason):
                return self._drop(owner)
            return self._with_room(owner, item)
        if self._active is None:
            return self._drop(DropReason.NO_CONSUMER)
        return self._with_room(self._consumers[self._active], item)

    def _round_robin_target(self, item: Queued) -> _Consumer | None:
        consumers = list(self._consumers.values())
        connected = False
        for step in range(len(consumers)):
            consumer = consumers[(self._round_robin + step) % len(consumers)]
            if not consumer.connected:
                continue
            connected = True
            if self._has_room(consumer, item):
                self._round_robin = (self._round_robin + step + 1) % len(consumers)
                return consumer
        return self._drop(DropReason.QUEUE_FULL if connected else DropReason.NO_CONSUMER)

    def _key_owner(self, key: bytes) -> _Consumer | DropReason:
        if not len(self._ring):
            return DropReason.NO_CONSUMER
        eligible = frozenset(
            c.consumer_id
            for c in self._consumers.values()
            if c.connected and accepts(c.filters, key)
        )
        if not eligible:
            return DropReason.NO_KEY_MATCH
        owner = self._ring.owner(key, eligible)
        assert owner is not None
        return self._consumers[owner]

    def _follow_key_owners(self) -> list[ConsumerReady]:
        """Key-Shared: moves queued messages whose key now belongs to another consumer."""
        if self.sub_type is not SubscriptionType.KEY_SHARED:
            return []
        moving: list[Queued] = []
        for consumer in self._consumers.values():
            leaving = [i for i in consumer.queue if self._key_owner(i.key) is not consumer]
            moving.extend(self._unqueue(consumer, leaving))
        return self._reroute(moving)

    def _reroute(self, items: list[Queued]) -> list[ConsumerReady]:
        """Routes already-published messages again, merging them into their new queues in
        publish order."""
        effects = []
        touched: dict[int, _Consumer] = {}
        for item in sorted(items, key=lambda i: i.seq):
            target = self._target(item)
            if target is None or not self._pooled(item):
                continue
            if not target.queue:
                effects.append(ConsumerReady(target.consumer_id))
            self._push(target, item)
            touched[target.consumer_id] = target
        for consumer in touched.values():
            consumer.queue = deque(sorted(consumer.queue, key=lambda i: i.seq))
        return effects

    def _unqueue(self, consumer: _Consumer, items: Iterable[Queued]) -> list[Queued]:
        removed = {id(i) for i in items}
        if not removed:
            return []
        leaving = [i for i in consumer.queue if id(i) in removed]
        consumer.queue = deque(i for i in consumer.queue if id(i) not in removed)
        size = sum(i.size for i in leaving)
        consumer.queued_bytes -= size
        if self.pool is not None and size:
            self.pool.dequeue(size)  # back in the pool: `_reroute` asks for it again
        return leaving

    def _pooled(self, item: Queued) -> bool:
        """Whether the consumer pool has room for the message (else dropped, counted)."""
        if self.pool is None or self.pool.enqueue(item.size):
            return True
        self._drop(DropReason.MEMORY_BUDGET)
        return False

    def _has_room(self, consumer: _Consumer, item: Queued) -> bool:
        return (
            len(consumer.queue) < self.limits.max_messages
            and consumer.queued_bytes + item.size <= self.limits.max_bytes
        )

    def _with_room(self, consumer: _Consumer, item: Queued) -> _Consumer | None:
        return consumer if self._has_room(consumer, item) else self._drop(DropReason.QUEUE_FULL)

    def _push(self, consumer: _Consumer, item: Queued) -> None:
        consumer.queue.append(item)
        consumer.queued_bytes += item.size

    def _drop(self, reason: DropReason) -> None:
        self.dropped[reason] += 1


_SINGLE_ACTIVE = (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER)

"""Non-reliable (at-most-once) dispatch for one subscription.

Each consumer has a bounded queue of messages waiting for its stream writer. A message goes to
one queue or is dropped and counted; nothing here ever blocks the publisher, so a slow consumer
costs the others nothing and the broker at most `QueueLimits` per consumer.

Messages still queued for a consumer that disconnects were never handed to the transport, so
they are re-dispatched to the consumers that remain (at-most-once still holds, and less is lost
than Danube, which drops them).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from danube.dispatch.keyshared import HashRing, KeyFilter, accepts
from danube.dispatch.types import ConsumerReady, DropReason, QueueLimits, SubscriptionType


@dataclass(frozen=True, slots=True)
class Queued:
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
        self.delivered = 0
        self.dropped: dict[DropReason, int] = dict.fromkeys(DropReason, 0)

    # -- membership ---------------------------------------------------------------------------

    def add_consumer(self, consumer_id: int, name: str, key_filters: tuple[str, ...]) -> None:
        """Registers a consumer, disconnected until `connect` (Subscribe then connects it)."""
        self._consumers[consumer_id] = _Consumer(
            consumer_id, name, tuple(KeyFilter(p) for p in key_filters)
        )

    def set_filters(self, consumer_id: int, key_filters: tuple[str, ...]) -> None:
        self._consumers[consumer_id].filters = tuple(KeyFilter(p) for p in key_filters)

    def remove_consumer(self, consumer_id: int) -> list[ConsumerReady]:
        effects = self.disconnect(consumer_id)
        del self._consumers[consumer_id]
        return effects

    def connect(self, consumer_id: int) -> list[ConsumerReady]:
        consumer = self._consumers[consumer_id]
        if consumer.connected:
            return []
        consumer.connected = True
        if self.sub_type is SubscriptionType.KEY_SHARED:
            self._ring.add(consumer_id, consumer.name)
        if self._active is None and self.sub_type in _SINGLE_ACTIVE:
            self._active = consumer_id
        return [ConsumerReady(consumer_id)] if consumer.queue else []

    def disconnect(self, consumer_id: int) -> list[ConsumerReady]:
        """Marks the consumer gone; a Failover standby takes over; undelivered messages are
        offered to the remaining consumers."""
        consumer = self._consumers[consumer_id]
        if not consumer.connected:
            return []
        consumer.connected = False
        self._ring.remove(consumer_id)
        if self._active == consumer_id:
            self._active = next(
                (c.consumer_id for c in self._consumers.values() if c.connected), None
            )
        stranded = list(consumer.queue)
        consumer.queue.clear()
        consumer.queued_bytes = 0
        effects: list[ConsumerReady] = []
        for item in stranded:
            effects.extend(self._route(item))
        return effects

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
        return self._route(Queued(message, size, key))

    def take(self, consumer_id: int, limit: int) -> list[Any]:
        """Hands up to `limit` queued messages to the consumer's stream writer."""
        consumer = self._consumers[consumer_id]
        taken = []
        while consumer.queue and len(taken) < limit:
            item = consumer.queue.popleft()
            consumer.queued_bytes -= item.size
            taken.append(item.message)
        self.delivered += len(taken)
        return taken

    def _route(self, item: Queued) -> list[ConsumerReady]:
        if self.sub_type is SubscriptionType.SHARED:
            return self._route_round_robin(item)
        if self.sub_type is SubscriptionType.KEY_SHARED:
            return self._route_by_key(item)
        if self._active is None:
            return self._drop(DropReason.NO_CONSUMER)
        return self._enqueue(self._consumers[self._active], item)

    def _route_round_robin(self, item: Queued) -> list[ConsumerReady]:
        consumers = list(self._consumers.values())
        connected = False
        for step in range(len(consumers)):
            consumer = consumers[(self._round_robin + step) % len(consumers)]
            if not consumer.connected:
                continue
            connected = True
            if self._has_room(consumer, item):
                self._round_robin = (self._round_robin + step + 1) % len(consumers)
                return self._enqueue(consumer, item)
        return self._drop(DropReason.QUEUE_FULL if connected else DropReason.NO_CONSUMER)

    def _route_by_key(self, item: Queued) -> list[ConsumerReady]:
        if not len(self._ring):
            return self._drop(DropReason.NO_CONSUMER)
        eligible = frozenset(
            c.consumer_id
            for c in self._consumers.values()
            if c.connected and accepts(c.filters, item.key)
        )
        if not eligible:
            return self._drop(DropReason.NO_KEY_MATCH)
        owner = self._ring.owner(item.key, eligible)
        assert owner is not None
        return self._enqueue(self._consumers[owner], item)

    def _has_room(self, consumer: _Consumer, item: Queued) -> bool:
        return (
            len(consumer.queue) < self.limits.max_messages
            and consumer.queued_bytes + item.size <= self.limits.max_bytes
        )

    def _enqueue(self, consumer: _Consumer, item: Queued) -> list[ConsumerReady]:
        if not self._has_room(consumer, item):
            return self._drop(DropReason.QUEUE_FULL)
        was_empty = not consumer.queue
        consumer.queue.append(item)
        consumer.queued_bytes += item.size
        return [ConsumerReady(consumer.consumer_id)] if was_empty else []

    def _drop(self, reason: DropReason) -> list[ConsumerReady]:
        self.dropped[reason] += 1
        return []


_SINGLE_ACTIVE = (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER)

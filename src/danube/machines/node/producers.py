"""Producer sessions and the publish paths: creating producers (idempotent by name), one
message or a checked batch to a topic, pacing at `max_publish_rate`, and producers of topics
that left this broker (answered UNAVAILABLE so clients look the topic up again)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any, cast

from danube.machines.dispatch import NonReliableSubscription, SubscriptionType
from danube.machines.dispatch.protocol import Subscription
from danube.machines.node import pacing, paths
from danube.machines.node.catalogue import Catalogue
from danube.machines.node.effects import BatchPublished, Effect, PersistMeta, Step
from danube.machines.node.idle_producers import IdleSweep, expired_message, unknown_message
from danube.machines.node.records import (
    ProducerRecord,
    TopicRecord,
    check_not_moving,
    check_not_stopped,
    new_id,
)
from danube.machines.node.reliable_log import ReliableLogs
from danube.machines.node.remembered_producers import MAX_REMEMBERED, Gone, RememberedProducers
from danube.machines.wal import batches, records
from danube.machines.wal.machine import WalMachine
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, ErrorCode, invalid, not_found, quoted
from danube.values.names import MAX_NAME_LENGTH, parse_topic, too_long

MAX_DEPARTED_PRODUCERS = MAX_REMEMBERED
MAX_QUEUED_WAL_BYTES = 64 * 1024 * 1024
"""Appends waiting for the disk beyond this are refused (UNAVAILABLE) instead of queued."""


def check_label(value: str, what: str) -> str:
    if not value or too_long(value) or not value.isprintable():
        raise invalid(
            f"{what} must be 1 to {MAX_NAME_LENGTH} bytes (UTF-8) of printable characters"
        )
    return value


class Producers:
    def __init__(
        self,
        catalogue: Catalogue,
        logs: ReliableLogs,
        rng: random.Random,
        *,
        auto_create_topics: bool,
        clustered: bool,
        routing_key_of: Callable[[bytes], bytes],
        producer_idle_ms: int = 0,
    ) -> None:
        """`producer_idle_ms`: a producer that neither publishes nor is health-checked for
        this long is removed (`idle_producers`); 0: never."""
        self._catalogue = catalogue
        self._topics = catalogue.topics_by_name
        self._logs = logs
        self._rng = rng
        self._auto_create = auto_create_topics
        self._clustered = clustered
        self._routing_key_of = routing_key_of
        self.by_id: dict[int, ProducerRecord] = {}
        self.remembered = RememberedProducers(MAX_DEPARTED_PRODUCERS)
        """Producers gone, and why (`remembered_producers`): of topics deleted here (their
        publishes NOT_FOUND, `forget`), of topics that left this broker or removed for
        idleness (told so with UNAVAILABLE: a status every client retries, then looks the
        topic up and creates the producer again; an unknown producer is NOT_FOUND, which
        Danube's clients do not recover from)."""
        self.idle = IdleSweep(producer_idle_ms)
        self.expired = 0
        """Producers removed for idleness since the start (a counter)."""

    def create_producer(
        self,
        topic: str,
        producer_name: str,
        *,
        access_mode: int,
        strategy: DispatchStrategy,
    ) -> Step[int]:
        """Idempotent per (topic, producer_name): a repeat returns the existing id. A
        producer's schema subject is the registry's business (`danube.runtime.schema_gate`
        checks and binds it around this call), not the topic's life cycle."""
        name = parse_topic(topic)
        check_label(producer_name, "producer_name")
        effects: list[Effect] = []
        record = self._topics.get(topic)
        if record is None:
            if self._clustered:
                raise DanubeError(
                    ErrorCode.UNAVAILABLE, f"{topic} is not served by this broker; look it up"
                )
            if not self._auto_create:
                raise not_found(f"topic {topic} does not exist and auto_create_topics is off")
            effects.extend(self._catalogue.add_topic(name, strategy))
            record = self._topics[topic]
        elif record.strategy is not strategy:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"topic {topic} is {record.strategy.label}; the producer asked for "
                f"{strategy.label}",
            )
        else:
            check_not_stopped(record)
            check_not_moving(record)
        existing = record.producers.get(producer_name)
        if existing is None:
            limit = self._catalogue.policies(record).max_producers_per_topic
            if limit and len(record.producers) >= limit:
                raise DanubeError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"topic {topic} already has {limit} producers (max_producers_per_topic)",
                )
        # Only once nothing can refuse the creation: a deferred load taken off the queue by
        # a step that is then thrown away would never start (the topic would stay LOADING).
        effects.extend(self._logs.deferred.start(topic))  # the reply waits for the load
        if existing is not None:
            return Step(existing, tuple(effects))
        producer = ProducerRecord(new_id(self._rng, self.by_id), producer_name, name, access_mode)
        self.by_id[producer.producer_id] = producer
        record.producers[producer_name] = producer.producer_id
        value = {
            "producer_id": producer.producer_id,
            "producer_name": producer_name,
            "topic_name": topic,
            "access_mode": access_mode,
            "status": True,
        }
        effects.append(PersistMeta(puts=((paths.producer(name, producer.producer_id), value),)))
        return Step(producer.producer_id, tuple(effects))

    def restored(self, record: TopicRecord, producer: ProducerRecord) -> None:
        """A producer read back from the metadata store."""
        self.by_id[producer.producer_id] = producer
        record.producers[producer.name] = producer.producer_id

    def healthy(self, producer_id: int) -> bool:
        """A producer's health check: OK while it is registered (and it counts as active,
        `idle_producers`); CLOSE once it is not."""
        producer = self.by_id.get(producer_id)
        if producer is None:
            return False
        producer.active = True
        return True

    def depart(self, record: TopicRecord) -> None:
        """The topic moved: its producers' publishes say to look it up again."""
        self.remembered.remember(record.producers.values(), Gone.MOVED, record.name.full)

    def expire_idle(self, now_ms: int) -> list[Effect]:
        """At a tick: producers idle for `producer_idle_ms` are removed (`idle_producers`):
        their record, their name on the topic, their metadata. Their later health checks
        answer CLOSE; their publishes UNAVAILABLE, saying why."""
        if not self.idle.due(now_ms):
            return []
        deletes: dict[str, list[str]] = {}
        gone: dict[str, list[int]] = {}
        for producer in self.idle.idle(self.by_id.values(), now_ms):
            del self.by_id[producer.producer_id]
            record = self._topics.get(producer.topic.full)
            if record is not None and record.producers.get(producer.name) == producer.producer_id:
                del record.producers[producer.name]
            gone.setdefault(producer.topic.full, []).append(producer.producer_id)
            key = paths.producer(producer.topic, producer.producer_id)
            deletes.setdefault(producer.topic.full, []).append(key)
            self.expired += 1
        for topic, ids in gone.items():
            self.remembered.remember(ids, Gone.EXPIRED, topic)
        # one write per topic: each is fenced by its topic's claim, so a topic claimed away
        # meanwhile refuses its own deletes, not every other topic's (review finding)
        return [PersistMeta(deletes=tuple(keys)) for keys in deletes.values()]

    def forget(self, record: TopicRecord) -> None:
        """The topic's producers are unknown from now on (health checks answer CLOSE). Those
        not departed (the topic was deleted, not moved) are remembered as deleted: their
        publishes answer Danube's NOT_FOUND even once the topic is created again, not the
        UNAVAILABLE of an id unknown to a served topic, which the clients recover from."""
        for producer_id in record.producers.values():
            del self.by_id[producer_id]
        self.remembered.remember_deleted(record.producers.values())

    # -- publishing ---------------------------------------------------------------------------

    def publish_pace(self, topic: str, count: int, now_ms: int) -> int:
        """How long (ms) the driver holds `count` messages before publishing them
        (`danube.machines.node.pacing`). 0 for a topic without a rate or not served here (publish
        says why)."""
        record = self._topics.get(topic)
        rate = self._catalogue.policies(record).max_publish_rate if record is not None else 0
        if record is None or not rate:
            return 0
        return pacing.pace(record.pace, topic, rate, count, now_ms)

    def publish(
        self,
        producer_id: int,
        topic: str,
        message: Any,
        size: int,
        routing_key: bytes | None,
        *,
        encode: Callable[[int], bytes] | None = None,
        now_ms: int = 0,
    ) -> Step[int]:
        """See `BrokerCore.publish`."""
        producer, record = self._publisher(producer_id, topic)
        limit = self._catalogue.policies(record).max_message_size
        if limit and size > limit:
            raise invalid(f"message of {size} bytes exceeds max_message_size of {limit} bytes")
        if record.reliable:
            return self._append(record, size, encode, now_ms)
        sequence = record.messages_in
        record.messages_in += 1
        record.bytes_in += size
        key = routing_key if routing_key is not None else producer.name.encode()
        effects: list[Effect] = []
        for sub in record.subscriptions.values():
            effects.extend(_deliver(sub.dispatcher, message, size, key))
        return Step(sequence, tuple(effects))

    def _publisher(self, producer_id: int, topic: str) -> tuple[ProducerRecord, TopicRecord]:
        producer = self.by_id.get(producer_id)
        gone = self.remembered.why(producer_id) if producer is None else None
        if gone is not None and gone[0] is not Gone.DELETED:
            why, topic_left = gone
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                expired_message(topic_left, producer_id, self.idle.idle_ms)
                if why is Gone.EXPIRED
                else f"{topic_left} moved to another broker; look it up and create the "
                "producer there",
            )
        if producer is None:
            # served here and not of a deleted topic: most likely expired before a restart
            if topic in self._topics and gone is None:
                raise DanubeError(ErrorCode.UNAVAILABLE, unknown_message(topic, producer_id))
            raise not_found(
                f"producer {producer_id} does not exist on this broker; create the producer again"
            )
        producer.active = True  # idle tracking's only cost on the publish path
        if producer.topic.full != topic:
            raise invalid(
                f"producer {producer_id} belongs to {producer.topic.full}, not {quoted(topic)}"
            )
        record = self._topics[topic]
        check_not_moving(record)
        return producer, record

    def publish_batch(
        self, producer_id: int, topic: str, batch: batches.ClientBatch, *, now_ms: int
    ) -> Step[BatchPublished]:
        """See `BrokerCore.publish_batch`."""
        _, record = self._publisher(producer_id, topic)
        limit = self._catalogue.policies(record).max_message_size
        if limit:
            index, size = batch.largest_payload()
            if size > limit:
                raise invalid(
                    f"message {index} of the batch has {size} bytes, more than "
                    f"max_message_size of {limit} bytes; nothing of the batch was stored"
                )
        stamp = functools.partial(
            batches.stamp,
            batch,
            publish_ms=now_ms,
            producer_id=producer_id,
            topic=topic,
            broker_addr=self._catalogue.identity.broker_url,
        )
        if record.reliable:
            log = self._writable(record)
            first, effects = log.append_packed(stamp(first_offset=log.next_offset), now_ms)
            record.messages_in += batch.count
            record.bytes_in += batch.payload_bytes
            published = BatchPublished(first, batch.count, stored=True)
            return Step(published, tuple(self._logs.wal_effects(record, effects, now_ms)))
        first = record.messages_in
        packed = stamp(first_offset=first)
        record.messages_in += batch.count
        record.bytes_in += batch.payload_bytes
        subscriptions = list(record.subscriptions.values())
        keyed = any(sub.sub_type is SubscriptionType.KEY_SHARED for sub in subscriptions)
        out: list[Effect] = []
        for index, size in enumerate(batch.payload_sizes.tolist()):
            message = packed[index]
            key = self._routing_key_of(message) if keyed else b""
            for sub in subscriptions:
                out.extend(_deliver(sub.dispatcher, message, size, key))
        return Step(BatchPublished(first, batch.count, stored=False), tuple(out))

    def append_record(self, record: TopicRecord, message: records.Record, now_ms: int) -> Step[int]:
        """The broker's own message (a dead letter, `dead_letters`) on a reliable topic: a
        producer's path (`_append`: the WAL at the topic's durability, its back-pressure),
        without a producer session, pacing or `max_message_size`, which would make a
        message near the limit impossible to dead-letter. Answered by `PublishAcked`."""
        check_not_stopped(record)
        check_not_moving(record)

        def encode(offset: int) -> bytes:
            message.topic_offset = offset
            return records.encode(message)

        return self._append(record, len(message.payload), encode, now_ms)

    def _writable(self, record: TopicRecord) -> WalMachine:
        log = self._logs.ready_wal(record)
        if log.queued_bytes > MAX_QUEUED_WAL_BYTES:
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                f"{record.name.full} is writing {log.queued_bytes} bytes behind the disk; "
                "retry shortly",
            )
        return log

    def _append(
        self,
        record: TopicRecord,
        size: int,
        encode: Callable[[int], bytes] | None,
        now_ms: int,
    ) -> Step[int]:
        if encode is None:
            raise ValueError("a reliable publish needs encode")
        log = self._writable(record)
        offset = log.next_offset
        first, effects = log.append((encode(offset),), now_ms)
        assert first == offset
        record.messages_in += 1
        record.bytes_in += size
        return Step(offset, tuple(self._logs.wal_effects(record, effects, now_ms)))


def _deliver(dispatcher: Subscription, message: Any, size: int, key: bytes) -> list[Effect]:
    """A non-reliable topic's message to one subscription (its dispatcher queues or drops)."""
    return list(cast(NonReliableSubscription, dispatcher).publish(message, size, key))

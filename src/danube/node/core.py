"""The broker-node core: every decision the data plane makes, as a pure state machine.

Requests come in as method calls with plain values; the answer is a `Step`: a value for the
caller plus effects for the driver. `ConsumerReady` and `EndStream` act on consumer streams at
once; `PersistMeta` changes must be durable, in order, before the reply to the request (and to
any later request) leaves. Validation happens before any mutation, so a `DanubeError`
leaves the state untouched.

Deliberate differences from Danube are listed in spec/protocol.md.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from danube.core.config import DispatchStrategy, Policies
from danube.core.errors import DanubeError, ErrorCode, invalid, not_found
from danube.core.names import (
    MAX_NAME_LENGTH,
    TopicName,
    parse_topic,
    partition_index,
    partition_name,
    validate_namespace,
)
from danube.dispatch import (
    LATEST,
    ConsumerReady,
    NonReliableSubscription,
    QueueLimits,
    StartKind,
    StartPosition,
    SubscriptionType,
)
from danube.node import paths

T = TypeVar("T")

_U64 = (1 << 64) - 1
_SUBSCRIPTION_NAME_RE = re.compile(r"[\w.-]+")


@dataclass(frozen=True, slots=True)
class PersistMeta:
    """Effect: one atomic metadata change. The driver applies it, durably, before it executes
    any later effect or answers the request that caused it."""

    puts: tuple[tuple[str, Any], ...] = ()
    deletes: tuple[str, ...] = ()
    delete_prefixes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EndStream:
    """Effect: finish the consumer's receive stream of this generation (status OK)."""

    consumer_id: int
    generation: int


Effect = PersistMeta | ConsumerReady | EndStream


@dataclass(frozen=True, slots=True)
class Step(Generic[T]):
    value: T
    effects: tuple[Effect, ...] = ()


@dataclass(frozen=True, slots=True)
class BrokerIdentity:
    broker_url: str
    connect_url: str

    @property
    def proxy(self) -> bool:
        return self.broker_url != self.connect_url


@dataclass(slots=True)
class ProducerRecord:
    producer_id: int
    name: str
    topic: TopicName
    access_mode: int


@dataclass(slots=True)
class ConsumerRecord:
    consumer_id: int
    name: str
    topic: TopicName
    subscription: str
    key_filters: tuple[str, ...]
    order: int
    """Subscribe order across the broker: Failover promotes the earliest connected consumer."""
    stream: int = 0
    """Generation of the live receive stream; 0 when none is open."""


@dataclass(slots=True)
class SubscriptionRecord:
    name: str
    sub_type: SubscriptionType
    dispatcher: NonReliableSubscription
    consumers: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class TopicRecord:
    name: TopicName
    strategy: DispatchStrategy
    producers: dict[str, int] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionRecord] = field(default_factory=dict)
    messages_in: int = 0
    bytes_in: int = 0


def _check_label(value: str, what: str) -> str:
    if not value or len(value) > MAX_NAME_LENGTH or not value.isprintable():
        raise invalid(f"{what} must be 1 to {MAX_NAME_LENGTH} printable characters")
    return value


class BrokerCore:
    """One broker's topics, producers and subscriptions. Single-threaded by contract."""

    def __init__(
        self,
        identity: BrokerIdentity,
        *,
        rng: random.Random,
        default_policies: Policies,
        queue_limits: QueueLimits,
        auto_create_topics: bool = True,
    ) -> None:
        self.identity = identity
        self._rng = rng
        self._default_policies = default_policies
        self._queue_limits = queue_limits
        self._auto_create = auto_create_topics
        self._namespaces: dict[str, Policies] = {}
        self._topics: dict[str, TopicRecord] = {}
        self._producers: dict[int, ProducerRecord] = {}
        self._consumers: dict[int, ConsumerRecord] = {}
        self._stream_generations = 0
        self._subscribe_order = 0

    # -- restore and bootstrap ----------------------------------------------------------------

    def restore(self, entries: Mapping[str, Any]) -> None:
        """Rebuilds state from a metadata scan. Consumers come back disconnected: their clients
        reconnect with the same ids, and a restart is invisible to them."""
        for key, value in sorted(entries.items()):
            parts = key.strip("/").split("/")
            if parts[0] == "namespaces" and len(parts) == 3 and parts[2] == "policy":
                self._namespaces[parts[1]] = _policies_from_json(value)
        for key, value in sorted(entries.items()):
            parts = key.strip("/").split("/")
            if parts[0] == "topics" and len(parts) == 4 and parts[3] == "delivery":
                topic = TopicName(parts[1], parts[2])
                if topic.namespace in self._namespaces:
                    self._topics[topic.full] = TopicRecord(
                        topic, DispatchStrategy.from_label(value)
                    )
        for key, value in sorted(entries.items()):
            parts = key.strip("/").split("/")
            if parts[0] != "topics" or len(parts) < 5:
                continue
            record = self._topics.get(f"/{parts[1]}/{parts[2]}")
            if record is None:
                continue
            if parts[3] == "producers" and len(parts) == 5:
                self._restore_producer(record, value)
            elif parts[3] == "subscriptions" and len(parts) == 5:
                self._add_subscription(
                    record, value["subscription_name"], SubscriptionType(value["subscription_type"])
                )
        consumers = []
        for key, value in entries.items():
            parts = key.strip("/").split("/")
            if parts[0] == "topics" and len(parts) == 7 and parts[5] == "consumers":
                record = self._topics.get(f"/{parts[1]}/{parts[2]}")
                if record is not None and parts[4] in record.subscriptions:
                    consumers.append((value.get("order", 0), record, parts[4], value))
        # Subscribe order decides Failover promotion, so it must survive a restart.
        for order, record, sub_name, value in sorted(consumers, key=lambda c: c[0]):
            self._add_consumer(
                record,
                record.subscriptions[sub_name],
                value["consumer_id"],
                value["consumer_name"],
                tuple(value.get("key_filters", ())),
                order,
            )
            self._subscribe_order = max(self._subscribe_order, order)

    def _restore_producer(self, record: TopicRecord, value: Mapping[str, Any]) -> None:
        producer = ProducerRecord(
            value["producer_id"], value["producer_name"], record.name, value["access_mode"]
        )
        self._producers[producer.producer_id] = producer
        record.producers[producer.name] = producer.producer_id

    def bootstrap(self, namespaces: Iterable[str]) -> Step[None]:
        """Creates the configured namespaces that do not exist yet (`default` always)."""
        wanted = [validate_namespace(n) for n in dict.fromkeys(["default", *namespaces])]
        puts = []
        for namespace in wanted:
            if namespace not in self._namespaces:
                self._namespaces[namespace] = self._default_policies
                puts.append(
                    (paths.namespace_policy(namespace), _policies_to_json(self._default_policies))
                )
        return Step(None, (PersistMeta(puts=tuple(puts)),) if puts else ())

    # -- namespaces and topics ----------------------------------------------------------------

    def namespaces(self) -> list[str]:
        return sorted(self._namespaces)

    def create_namespace(self, name: str) -> Step[None]:
        validate_namespace(name)
        if name in self._namespaces:
            raise DanubeError(ErrorCode.ALREADY_EXISTS, f"namespace {name!r} already exists")
        self._namespaces[name] = self._default_policies
        put = (paths.namespace_policy(name), _policies_to_json(self._default_policies))
        return Step(None, (PersistMeta(puts=(put,)),))

    def delete_namespace(self, name: str) -> Step[None]:
        self._require_namespace(name)
        topics = self.topics(name)
        if topics:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"namespace {name!r} still has {len(topics)} topic(s); delete them first",
            )
        del self._namespaces[name]
        return Step(None, (PersistMeta(delete_prefixes=(paths.namespace_prefix(name),)),))

    def namespace_policies(self, name: str) -> dict[str, int]:
        return _policies_to_json(self._require_namespace(name))

    def topics(self, namespace: str) -> list[str]:
        self._require_namespace(namespace)
        return sorted(t for t, r in self._topics.items() if r.name.namespace == namespace)

    def topic_strategy(self, topic: str) -> DispatchStrategy:
        return self._topic(topic).strategy

    def create_topic(self, topic: str, strategy: DispatchStrategy) -> Step[None]:
        name = parse_topic(topic)
        if topic in self._topics:
            raise DanubeError(ErrorCode.ALREADY_EXISTS, f"topic {topic} already exists")
        return Step(None, self._create_topic(name, strategy))

    def create_partitioned_topic(
        self, base: str, partitions: int, strategy: DispatchStrategy
    ) -> Step[None]:
        parse_topic(base)
        if not 1 <= partitions <= 10_000:
            raise invalid(f"partitions must be between 1 and 10000, got {partitions}")
        names = [parse_topic(partition_name(base, i)) for i in range(partitions)]
        existing = [n.full for n in names if n.full in self._topics]
        if existing:
            raise DanubeError(ErrorCode.ALREADY_EXISTS, f"topic {existing[0]} already exists")
        self._require_namespace(names[0].namespace)
        self._check_partition_conflicts(names[0])
        self._check_strategy_supported(strategy)
        effects: list[Effect] = []
        for name in names:
            effects.extend(self._create_topic(name, strategy))
        return Step(None, tuple(effects))

    def delete_topic(self, topic: str) -> Step[None]:
        """Deletes a topic, or every partition when given a partitioned topic's base name.
        Its producers and consumers are forgotten (health checks answer CLOSE) and open
        receive streams end."""
        parse_topic(topic)
        targets = [topic] if topic in self._topics else self.partitions(topic)
        if not targets:
            raise not_found(f"topic {topic} does not exist")
        effects: list[Effect] = []
        for target in targets:
            effects.extend(self._delete_topic(self._topics[target]))
        return Step(None, tuple(effects))

    def _delete_topic(self, record: TopicRecord) -> list[Effect]:
        effects: list[Effect] = [
            PersistMeta(
                deletes=(paths.namespace_topic(record.name),),
                delete_prefixes=(paths.topic_prefix(record.name),),
            )
        ]
        for producer_id in record.producers.values():
            del self._producers[producer_id]
        for sub in record.subscriptions.values():
            for consumer_id in sub.consumers.values():
                consumer = self._consumers.pop(consumer_id)
                if consumer.stream:
                    effects.append(EndStream(consumer_id, consumer.stream))
        del self._topics[record.name.full]
        return effects

    def _create_topic(self, name: TopicName, strategy: DispatchStrategy) -> tuple[Effect, ...]:
        self._require_namespace(name.namespace)
        self._check_partition_conflicts(name)
        self._check_strategy_supported(strategy)
        self._topics[name.full] = TopicRecord(name, strategy)
        return (
            PersistMeta(
                puts=(
                    (paths.namespace_topic(name), None),
                    (paths.topic_delivery(name), strategy.label),
                )
            ),
        )

    @staticmethod
    def _check_strategy_supported(strategy: DispatchStrategy) -> None:
        if strategy is DispatchStrategy.RELIABLE:
            raise DanubeError(
                ErrorCode.UNIMPLEMENTED,
                "reliable dispatch is not available in this broker version; "
                "use dispatch strategy NonReliable",
            )

    def _check_partition_conflicts(self, name: TopicName) -> None:
        partition = name.partition_of
        if partition is not None and partition[0] in self._topics:
            raise DanubeError(
                ErrorCode.ALREADY_EXISTS,
                f"cannot create partition {name.full}: {partition[0]} exists as a "
                "non-partitioned topic",
            )
        if partition is None and self.partitions(name.full):
            raise DanubeError(
                ErrorCode.ALREADY_EXISTS,
                f"cannot create topic {name.full}: it exists as a partitioned topic",
            )

    def partitions(self, base: str) -> list[str]:
        """Names of `<base>-part-<n>`, ordered by n (only exact partitions, unlike Danube's
        prefix match)."""
        found = []
        for name in self._topics:
            index = partition_index(name, base)
            if index is not None:
                found.append((index, name))
        return [name for _, name in sorted(found)]

    def topic_partitions(self, topic: str) -> list[str]:
        """TopicPartitions: the topic itself, its partitions, or nothing."""
        parse_topic(topic)
        if topic in self._topics:
            return [topic]
        return self.partitions(topic)

    def lookup(self, topic: str) -> BrokerIdentity:
        parse_topic(topic)
        if topic not in self._topics:
            raise not_found(f"topic {topic} does not exist")
        return self.identity

    def subscriptions(self, topic: str) -> list[str]:
        return sorted(self._topic(topic).subscriptions)

    def _require_namespace(self, namespace: str) -> Policies:
        policies = self._namespaces.get(namespace)
        if policies is None:
            raise not_found(
                f"namespace {namespace!r} does not exist; create it first "
                "(or list it in bootstrap_namespaces)"
            )
        return policies

    def _topic(self, topic: str) -> TopicRecord:
        parse_topic(topic)
        record = self._topics.get(topic)
        if record is None:
            raise not_found(f"topic {topic} does not exist")
        return record

    # -- producers ----------------------------------------------------------------------------

    def create_producer(
        self,
        topic: str,
        producer_name: str,
        *,
        access_mode: int,
        strategy: DispatchStrategy,
        schema_subject: str | None,
    ) -> Step[int]:
        """Idempotent per (topic, producer_name): a repeat returns the existing id."""
        name = parse_topic(topic)
        _check_label(producer_name, "producer_name")
        if schema_subject:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"schema subject {schema_subject!r} is not registered (this broker version "
                "has no schema registry yet); create the producer without a schema",
            )
        effects: list[Effect] = []
        record = self._topics.get(topic)
        if record is None:
            if not self._auto_create:
                raise not_found(f"topic {topic} does not exist and auto_create_topics is off")
            effects.extend(self._create_topic(name, strategy))
            record = self._topics[topic]
        elif record.strategy is not strategy:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"topic {topic} is {record.strategy.label}; the producer asked for "
                f"{strategy.label}",
            )
        existing = record.producers.get(producer_name)
        if existing is not None:
            return Step(existing, tuple(effects))
        limit = self._require_namespace(name.namespace).max_producers_per_topic
        if limit and len(record.producers) >= limit:
            raise DanubeError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"topic {topic} already has {limit} producers (max_producers_per_topic)",
            )
        producer = ProducerRecord(self._new_id(self._producers), producer_name, name, access_mode)
        self._producers[producer.producer_id] = producer
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

    def publish(
        self, producer_id: int, topic: str, message: Any, size: int, routing_key: bytes | None
    ) -> Step[int]:
        """Hands one message to every subscription of the producer's topic and returns its
        sequence number on the topic (0, 1, 2... since the topic was loaded on this broker).

        The caller stamps the sequence as the non-reliable `topic_offset` before its next
        await, so consumers can see gaps where messages were dropped. Key-Shared routes by
        `routing_key`, or by the producer's name when the message has none (as Danube)."""
        producer = self._producers.get(producer_id)
        if producer is None:
            raise not_found(
                f"producer {producer_id} does not exist on this broker; create the producer again"
            )
        if producer.topic.full != topic:
            raise invalid(f"producer {producer_id} belongs to {producer.topic.full}, not {topic!r}")
        record = self._topics[topic]
        limit = self._namespaces[producer.topic.namespace].max_message_size
        if limit and size > limit:
            raise invalid(f"message of {size} bytes exceeds max_message_size of {limit} bytes")
        sequence = record.messages_in
        record.messages_in += 1
        record.bytes_in += size
        key = routing_key if routing_key is not None else producer.name.encode()
        effects: list[Effect] = []
        for sub in record.subscriptions.values():
            effects.extend(sub.dispatcher.publish(message, size, key))
        return Step(sequence, tuple(effects))

    def producer_healthy(self, producer_id: int) -> bool:
        return producer_id in self._producers

    # -- consumers ----------------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        consumer_name: str,
        subscription: str,
        sub_type: int,
        key_filters: tuple[str, ...],
        start: StartPosition = LATEST,
    ) -> Step[int]:
        """Returns the consumer id; the same name in the same subscription takes over its
        previous session (same id, old stream ended). `start` only matters for a subscription
        this call creates."""
        record = self._topic(topic)
        _check_label(consumer_name, "consumer_name")
        if (
            not subscription
            or len(subscription) > MAX_NAME_LENGTH
            or not _SUBSCRIPTION_NAME_RE.fullmatch(subscription)
        ):
            raise invalid(
                f"invalid subscription name {subscription!r}: use letters, digits, '_', '-' "
                f"or '.' (1 to {MAX_NAME_LENGTH} characters)"
            )
        if sub_type not in SubscriptionType._value2member_map_:
            raise invalid(f"unknown subscription type {sub_type}; expected 0 to 3")
        kind = SubscriptionType(sub_type)
        if kind is not SubscriptionType.KEY_SHARED and key_filters:
            raise invalid("key_filters are only allowed on Key-Shared subscriptions")
        policies = self._namespaces[record.name.namespace]
        sub = record.subscriptions.get(subscription)
        effects: list[Effect] = []
        if sub is not None and sub.sub_type is not kind:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"subscription {subscription!r} on {topic} is {sub.sub_type.name}; "
                f"cannot join it as {kind.name}",
            )
        if sub is not None and consumer_name in sub.consumers:
            return self._take_over(record, sub, sub.consumers[consumer_name], key_filters)
        if sub is None:
            if start.kind is not StartKind.LATEST and record.strategy is (
                DispatchStrategy.NON_RELIABLE
            ):
                raise DanubeError(
                    ErrorCode.FAILED_PRECONDITION,
                    f"{topic} is non-reliable and keeps no history: a subscription can only "
                    "start at the latest message",
                )
            limit = policies.max_subscriptions_per_topic
            if limit and len(record.subscriptions) >= limit:
                raise DanubeError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"topic {topic} already has {limit} subscriptions "
                    "(max_subscriptions_per_topic)",
                )
        else:
            if kind is SubscriptionType.EXCLUSIVE:
                effects.extend(self._evict_disconnected_exclusive(record, sub))
            limit = policies.max_consumers_per_subscription
            if limit and len(sub.consumers) >= limit:
                raise DanubeError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"subscription {subscription!r} already has {limit} consumers "
                    "(max_consumers_per_subscription)",
                )
        limit = policies.max_consumers_per_topic
        if limit and sum(len(s.consumers) for s in record.subscriptions.values()) >= limit:
            raise DanubeError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"topic {topic} already has {limit} consumers (max_consumers_per_topic)",
            )
        if sub is None:
            sub = self._add_subscription(record, subscription, kind)
            value = {"subscription_name": subscription, "subscription_type": int(kind)}
            effects.append(
                PersistMeta(puts=((paths.subscription(record.name, subscription), value),))
            )
        self._subscribe_order += 1
        consumer = self._add_consumer(
            record,
            sub,
            self._new_id(self._consumers),
            consumer_name,
            key_filters,
            self._subscribe_order,
        )
        effects.append(self._persist_consumer(consumer))
        effects.extend(sub.dispatcher.connect(consumer.consumer_id))
        return Step(consumer.consumer_id, tuple(effects))

    def _evict_disconnected_exclusive(
        self, record: TopicRecord, sub: SubscriptionRecord
    ) -> list[Effect]:
        """An Exclusive subscription admits a new consumer name only when the holder is gone:
        Danube refuses forever once any consumer object exists, which locks the subscription
        after a client crash."""
        holders = list(sub.consumers.values())
        if any(sub.dispatcher.is_connected(c) for c in holders):
            raise DanubeError(
                ErrorCode.PERMISSION_DENIED,
                f"subscription {sub.name!r} on {record.name.full} is Exclusive and already "
                "has an active consumer",
            )
        effects: list[Effect] = []
        for consumer_id in holders:
            effects.extend(self._remove_consumer(record, sub, consumer_id))
        return effects

    def _remove_consumer(
        self, record: TopicRecord, sub: SubscriptionRecord, consumer_id: int
    ) -> list[Effect]:
        consumer = self._consumers.pop(consumer_id)
        del sub.consumers[consumer.name]
        effects: list[Effect] = list(sub.dispatcher.remove_consumer(consumer_id))
        effects.append(PersistMeta(deletes=(paths.consumer(record.name, sub.name, consumer_id),)))
        if consumer.stream:
            effects.append(EndStream(consumer_id, consumer.stream))
        return effects

    def _take_over(
        self,
        record: TopicRecord,
        sub: SubscriptionRecord,
        consumer_id: int,
        key_filters: tuple[str, ...],
    ) -> Step[int]:
        consumer = self._consumers[consumer_id]
        effects: list[Effect] = []
        if consumer.stream:
            effects.append(EndStream(consumer_id, consumer.stream))
            consumer.stream = 0
        if key_filters != consumer.key_filters:
            consumer.key_filters = key_filters
            effects.append(self._persist_consumer(consumer))
            effects.extend(sub.dispatcher.set_filters(consumer_id, key_filters))
        effects.extend(sub.dispatcher.connect(consumer_id))
        return Step(consumer_id, tuple(effects))

    def _add_subscription(
        self, record: TopicRecord, name: str, kind: SubscriptionType
    ) -> SubscriptionRecord:
        sub = SubscriptionRecord(name, kind, NonReliableSubscription(kind, self._queue_limits))
        record.subscriptions[name] = sub
        return sub

    @staticmethod
    def _persist_consumer(consumer: ConsumerRecord) -> PersistMeta:
        value = {
            "consumer_id": consumer.consumer_id,
            "consumer_name": consumer.name,
            "key_filters": list(consumer.key_filters),
            "order": consumer.order,
        }
        key = paths.consumer(consumer.topic, consumer.subscription, consumer.consumer_id)
        return PersistMeta(puts=((key, value),))

    def _add_consumer(
        self,
        record: TopicRecord,
        sub: SubscriptionRecord,
        consumer_id: int,
        name: str,
        key_filters: tuple[str, ...],
        order: int,
    ) -> ConsumerRecord:
        consumer = ConsumerRecord(consumer_id, name, record.name, sub.name, key_filters, order)
        self._consumers[consumer_id] = consumer
        sub.consumers[name] = consumer_id
        sub.dispatcher.add_consumer(consumer_id, name, key_filters)
        return consumer

    def open_stream(self, consumer_id: int) -> Step[int]:
        """Starts a receive stream; a previous stream of the same consumer ends (takeover)."""
        consumer = self._consumer(consumer_id)
        effects: list[Effect] = []
        if consumer.stream:
            effects.append(EndStream(consumer_id, consumer.stream))
        self._stream_generations += 1
        consumer.stream = self._stream_generations
        sub = self._subscription_of(consumer)
        effects.extend(sub.dispatcher.connect(consumer_id))
        return Step(consumer.stream, tuple(effects))

    def close_stream(self, consumer_id: int, generation: int) -> Step[None]:
        """The stream of this generation ended; if it was the consumer's current one, the
        consumer is disconnected (a Failover standby takes over)."""
        consumer = self._consumers.get(consumer_id)
        if consumer is None or not generation or consumer.stream != generation:
            return Step(None)
        consumer.stream = 0
        return Step(None, tuple(self._subscription_of(consumer).dispatcher.disconnect(consumer_id)))

    def take(self, consumer_id: int, generation: int, limit: int) -> list[Any] | None:
        """Messages for the stream writer; None when this stream is no longer current."""
        consumer = self._consumers.get(consumer_id)
        if consumer is None or not generation or consumer.stream != generation:
            return None
        return self._subscription_of(consumer).dispatcher.take(consumer_id, limit)

    def consumer_healthy(self, consumer_id: int) -> bool:
        """Known consumers are healthy even while their stream is down: the official clients
        answer CLOSE by discarding the next message and re-subscribing, which a consumer that
        only needs to reopen its stream (after a broker restart, say) should not do."""
        return consumer_id in self._consumers

    def check_ack(self, topic: str, subscription: str) -> None:
        """Ack and Nack on non-reliable topics only need a known target."""
        record = self._topic(topic)
        if subscription not in record.subscriptions:
            raise not_found(f"subscription {subscription!r} does not exist on {topic}")

    def live_streams(self) -> list[EndStream]:
        """Every open stream, for a clean shutdown."""
        return [EndStream(c.consumer_id, c.stream) for c in self._consumers.values() if c.stream]

    def _consumer(self, consumer_id: int) -> ConsumerRecord:
        consumer = self._consumers.get(consumer_id)
        if consumer is None:
            raise not_found(
                f"consumer {consumer_id} does not exist on this broker; subscribe again"
            )
        return consumer

    def _subscription_of(self, consumer: ConsumerRecord) -> SubscriptionRecord:
        return self._topics[consumer.topic.full].subscriptions[consumer.subscription]

    def _new_id(self, taken: Mapping[int, object]) -> int:
        while True:
            candidate = self._rng.randint(1, _U64)
            if candidate not in taken:
                return candidate

    # -- statistics ---------------------------------------------------------------------------

    def drop_counts(self) -> dict[tuple[str, str, str], int]:
        """(topic, subscription, reason) -> messages dropped so far."""
        counts = {}
        for topic, record in self._topics.items():
            for sub in record.subscriptions.values():
                for reason, count in sub.dispatcher.dropped.items():
                    if count:
                        counts[(topic, sub.name, reason.value)] = count
        return counts


def _policies_to_json(policies: Policies) -> dict[str, int]:
    return {name: getattr(policies, name) for name in Policies.__slots__}


def _policies_from_json(value: Mapping[str, Any] | None) -> Policies:
    known = {k: v for k, v in (value or {}).items() if k in Policies.__slots__}
    return Policies(**known)

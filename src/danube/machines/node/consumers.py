"""Consumer sessions: subscriptions and their consumers, receive streams (generations,
takeovers), what a stream writer takes, and acknowledgements. Every dispatcher is reached
through the `danube.machines.dispatch.protocol.Subscription` protocol, so the same code serves
reliable and non-reliable topics; their effects go through `ReliableLogs.dispatch`."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping
from typing import Any

from danube.machines.dispatch import (
    LATEST,
    NonReliableSubscription,
    QueueLimits,
    StartKind,
    StartPosition,
    SubscriptionType,
)
from danube.machines.dispatch import reliable as rd
from danube.machines.dispatch.protocol import Subscription
from danube.machines.memory.consumer import HeldRecords
from danube.machines.node import paths
from danube.machines.node.catalogue import Catalogue
from danube.machines.node.effects import Effect, EndStream, PersistMeta, Step
from danube.machines.node.producers import check_label
from danube.machines.node.records import (
    ConsumerRecord,
    SubscriptionRecord,
    TopicRecord,
    check_not_moving,
    check_not_stopped,
    new_id,
)
from danube.machines.node.reliable_log import ReliableLogs
from danube.machines.node.settings import SubscriptionSettings
from danube.values.errors import DanubeError, ErrorCode, invalid, not_found, quoted
from danube.values.names import MAX_NAME_LENGTH, parse_topic, too_long

_SUBSCRIPTION_NAME_RE = re.compile(r"[\w.-]+")


class Consumers:
    def __init__(
        self,
        catalogue: Catalogue,
        logs: ReliableLogs,
        rng: random.Random,
        by_id: dict[int, ConsumerRecord],
        *,
        queue_limits: QueueLimits,
        max_unacked_messages: int,
        clustered: bool,
    ) -> None:
        self._catalogue = catalogue
        self._topics = catalogue.topics_by_name
        self._logs = logs
        self._rng = rng
        self._queue_limits = queue_limits
        self._max_unacked = max_unacked_messages
        self._clustered = clustered
        self.by_id = by_id
        """Every consumer by id (shared with `ReliableLogs`, which rebuilds subscriptions)."""
        self.stream_generations = 0
        self.subscribe_order = 0

    # -- subscribing --------------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        consumer_name: str,
        subscription: str,
        sub_type: int,
        key_filters: tuple[str, ...],
        start: StartPosition = LATEST,
        *,
        now_ms: int = 0,
    ) -> Step[int]:
        """See `BrokerCore.subscribe`."""
        record = self._catalogue.topic(topic)
        check_label(consumer_name, "consumer_name")
        check_subscription_name(subscription)
        if sub_type not in SubscriptionType._value2member_map_:
            raise invalid(f"unknown subscription type {sub_type}; expected 0 to 3")
        kind = SubscriptionType(sub_type)
        if kind is not SubscriptionType.KEY_SHARED and key_filters:
            raise invalid("key_filters are only allowed on Key-Shared subscriptions")
        policies = self._catalogue.policies(record)
        sub = record.subscriptions.get(subscription)
        effects: list[Effect] = []
        if sub is not None and sub.sub_type is not kind:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"subscription {quoted(subscription)} on {topic} is {sub.sub_type.name}; "
                f"cannot join it as {kind.name}",
            )
        check_not_stopped(record)
        check_not_moving(record)
        self._want_wal(record)
        if sub is not None and consumer_name in sub.consumers:
            return self._take_over(record, sub, sub.consumers[consumer_name], key_filters, now_ms)
        start_offset = 0
        if sub is None:
            if start.kind is not StartKind.LATEST and not record.reliable:
                raise DanubeError(
                    ErrorCode.FAILED_PRECONDITION,
                    f"{topic} is non-reliable and keeps no history: a subscription can only "
                    "start at the latest message",
                )
            if record.reliable:
                start_offset = self._start_offset(record, start)
            limit = policies.max_subscriptions_per_topic
            if limit and len(record.subscriptions) >= limit:
                raise DanubeError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"topic {topic} already has {limit} subscriptions "
                    "(max_subscriptions_per_topic)",
                )
        else:
            if kind is SubscriptionType.EXCLUSIVE:
                effects.extend(self._evict_disconnected_exclusive(record, sub, now_ms))
            limit = policies.max_consumers_per_subscription
            if limit and len(sub.consumers) >= limit:
                raise DanubeError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"subscription {quoted(subscription)} already has {limit} consumers "
                    "(max_consumers_per_subscription)",
                )
        limit = policies.max_consumers_per_topic
        if limit and sum(len(s.consumers) for s in record.subscriptions.values()) >= limit:
            raise DanubeError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"topic {topic} already has {limit} consumers (max_consumers_per_topic)",
            )
        if sub is None:
            sub = self.add_subscription(record, subscription, kind, start_offset)
            value = {"subscription_name": subscription, "subscription_type": int(kind)}
            puts: list[tuple[str, Any]] = [(paths.subscription(record.name, subscription), value)]
            if record.reliable:
                # The dispatcher assumes start - 1 is durable (reliable.py, "Cursor"). The
                # stored cursor never names an offset not yet readable (a LATEST start during
                # a publish, say): recovery takes a stored cursor as proof that its offsets
                # were acknowledged (`recovery_evidence`), and a crash before that publish's
                # fsync would then stop a healthy topic as damaged.
                self._logs.ready_wal(record)
                readable = self._logs.readable_end(record)
                stored = min(start_offset, readable) - 1
                puts.append((paths.cursor(record.name, subscription), stored))
                if readable:
                    sub.reliable.readable(readable - 1, now_ms)  # nobody connected: no effects
            effects.append(PersistMeta(puts=tuple(puts)))
        self.subscribe_order += 1
        consumer = self.add_consumer(
            record,
            sub,
            new_id(self._rng, self.by_id),
            consumer_name,
            key_filters,
            self.subscribe_order,
            now_ms,
        )
        effects.append(_persist_consumer(consumer))
        subscribed = sub.dispatcher.subscribed(consumer.consumer_id, now_ms)
        effects.extend(self._logs.dispatch(record, sub, subscribed, now_ms))
        return Step(consumer.consumer_id, tuple(effects))

    def _start_offset(self, record: TopicRecord, start: StartPosition) -> int:
        log = self._logs.ready_wal(record)
        if start.kind is StartKind.LATEST:
            return log.next_offset
        earliest = log.first_offset
        uploader = record.log.uploader
        if uploader is not None and uploader.entries:
            earliest = min(earliest, uploader.entries[0].start_offset)
        if start.kind is StartKind.EARLIEST:
            return earliest
        if start.offset < earliest:
            raise DanubeError(
                ErrorCode.OUT_OF_RANGE,
                f"offset {start.offset} of {record.name.full} is no longer retained; the "
                f"earliest is {earliest}",
            )
        if start.offset > log.next_offset:
            raise DanubeError(
                ErrorCode.OUT_OF_RANGE,
                f"offset {start.offset} of {record.name.full} is past the end; the next "
                f"message gets offset {log.next_offset}",
            )
        return start.offset

    def _evict_disconnected_exclusive(
        self, record: TopicRecord, sub: SubscriptionRecord, now_ms: int
    ) -> list[Effect]:
        """An Exclusive subscription admits a new consumer name only when the holder is gone:
        Danube refuses forever once any consumer object exists, which locks the subscription
        after a client crash."""
        holders = list(sub.consumers.values())
        if any(sub.dispatcher.is_connected(c) for c in holders):
            raise DanubeError(
                ErrorCode.PERMISSION_DENIED,
                f"subscription {quoted(sub.name)} on {record.name.full} is Exclusive and already "
                "has an active consumer",
            )
        effects: list[Effect] = []
        for consumer_id in holders:
            effects.extend(self._remove_consumer(record, sub, consumer_id, now_ms))
        return effects

    def _remove_consumer(
        self, record: TopicRecord, sub: SubscriptionRecord, consumer_id: int, now_ms: int
    ) -> list[Effect]:
        consumer = self.by_id.pop(consumer_id)
        del sub.consumers[consumer.name]
        self._logs.outbox.pop(consumer_id, None)
        removed = sub.dispatcher.remove_consumer(consumer_id, now_ms)
        effects = self._logs.dispatch(record, sub, removed, now_ms)
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
        now_ms: int,
    ) -> Step[int]:
        consumer = self.by_id[consumer_id]
        effects: list[Effect] = []
        if consumer.stream:
            effects.append(EndStream(consumer_id, consumer.stream))
            consumer.stream = 0
            effects.extend(self._reset_stream(record, sub, consumer_id, now_ms))
        if key_filters != consumer.key_filters:
            consumer.key_filters = key_filters
            effects.append(_persist_consumer(consumer))
            changed = sub.dispatcher.set_filters(consumer_id, key_filters, now_ms)
            effects.extend(self._logs.dispatch(record, sub, changed, now_ms))
        subscribed = sub.dispatcher.subscribed(consumer_id, now_ms)
        effects.extend(self._logs.dispatch(record, sub, subscribed, now_ms))
        return Step(consumer_id, tuple(effects))

    def _reset_stream(
        self, record: TopicRecord, sub: SubscriptionRecord, consumer_id: int, now_ms: int
    ) -> list[Effect]:
        """The consumer's stream is replaced: what it had not sent goes out again."""
        self._logs.outbox.pop(consumer_id, None)
        reset = sub.dispatcher.stream_reset(consumer_id, now_ms)
        return self._logs.dispatch(record, sub, reset, now_ms)

    def add_subscription(
        self,
        record: TopicRecord,
        name: str,
        kind: SubscriptionType,
        start_offset: int,
        *,
        attempts: Mapping[int, int] | None = None,
    ) -> SubscriptionRecord:
        """`attempts`: failure counts read back with the cursor (restart, topic move)."""
        dispatcher: Subscription
        if record.reliable:
            settings = record.settings.get(name) or SubscriptionSettings()
            reliable = rd.ReliableSubscription(
                kind,
                max(start_offset, 0),
                max_unacked_messages=settings.max_unacked_messages or self._max_unacked,
                policy=self._catalogue.failure_policy(record, name),
                attempts=attempts,
            )
            reliable.dispatch_rate = self._catalogue.policies(record).max_subscription_dispatch_rate
            dispatcher = reliable
        else:
            dispatcher = NonReliableSubscription(kind, self._queue_limits)
            dispatcher.pool = self._logs.consumer_pool  # bounds every queue together
        sub = SubscriptionRecord(name, kind, dispatcher, owner=record)
        if record.reliable and self._logs.consumer_pool is not None:
            sub.records = HeldRecords(self._logs.consumer_pool)
        if self._topics.get(record.name.full) is record:  # else counted when it is added
            self._topics.subscriptions += 1
        record.subscriptions[name] = sub
        if record.touched is not None:  # its timers: the next ticks visit the topic
            record.touched.add(record.name.full)
        return sub

    def add_consumer(
        self,
        record: TopicRecord,
        sub: SubscriptionRecord,
        consumer_id: int,
        name: str,
        key_filters: tuple[str, ...],
        order: int,
        now_ms: int = 0,
    ) -> ConsumerRecord:
        consumer = ConsumerRecord(consumer_id, name, record.name, sub.name, key_filters, order)
        self.by_id[consumer_id] = consumer
        sub.consumers[name] = consumer_id
        # A new consumer is disconnected: nothing to dispatch yet.
        sub.dispatcher.add_consumer(consumer_id, name, key_filters, now_ms)
        return consumer

    def unsubscribe(self, topic: str, subscription: str) -> Step[None]:
        """See `BrokerCore.unsubscribe`."""
        record = self._catalogue.topic(topic)
        check_subscription_name(subscription)
        sub = record.subscriptions.get(subscription)
        if sub is None:
            raise not_found(f"subscription {quoted(subscription)} does not exist on {topic}")
        attached = [self.by_id[c].name for c in sub.consumers.values() if self.by_id[c].stream]
        if attached:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"subscription {quoted(subscription)} on {topic} has {len(attached)} attached "
                f"consumer(s) ({', '.join(sorted(attached))}); close them first",
            )
        for consumer_id in sub.consumers.values():
            del self.by_id[consumer_id]
            self._logs.outbox.pop(consumer_id, None)
        _let_go_all(sub)
        del record.subscriptions[subscription]
        if self._topics.get(record.name.full) is record:
            self._topics.subscriptions -= 1
        record.settings.pop(subscription, None)
        key = paths.subscription(record.name, subscription)
        return Step(None, (PersistMeta(deletes=(key,), delete_prefixes=(key + "/",)),))

    def forget(self, record: TopicRecord) -> list[Effect]:
        """The topic's consumers are unknown from now on (health checks answer CLOSE) and
        their open receive streams end."""
        effects: list[Effect] = []
        for sub in record.subscriptions.values():
            _let_go_all(sub)  # their room goes back to the consumer pool
            for consumer_id in sub.consumers.values():
                consumer = self.by_id.pop(consumer_id)
                self._logs.outbox.pop(consumer_id, None)
                if consumer.stream:
                    effects.append(EndStream(consumer_id, consumer.stream))
        return effects

    def _want_wal(self, record: TopicRecord) -> None:
        """A consumer coming (back) to a topic whose WAL a restart has not loaded yet moves
        its load ahead of the sweep, as a publish does: its subscription is restored and
        waits for the log, which the sweep alone might reach minutes later."""
        if record.reliable and record.log.wal is None:
            self._logs.deferred.want(record.name.full)

    # -- receive streams ----------------------------------------------------------------------

    def open_stream(self, consumer_id: int, *, now_ms: int = 0) -> Step[int]:
        """See `BrokerCore.open_stream`."""
        consumer = self._consumer(consumer_id)
        record = self._topics[consumer.topic.full]
        sub = record.subscriptions[consumer.subscription]
        effects: list[Effect] = []
        self._want_wal(record)
        if consumer.stream:
            effects.append(EndStream(consumer_id, consumer.stream))
        self.stream_generations += 1
        consumer.stream = self.stream_generations
        effects.extend(self._reset_stream(record, sub, consumer_id, now_ms))
        connected = sub.dispatcher.connect(consumer_id, now_ms)
        effects.extend(self._logs.dispatch(record, sub, connected, now_ms))
        return Step(consumer.stream, tuple(effects))

    def close_stream(self, consumer_id: int, generation: int, *, now_ms: int = 0) -> Step[None]:
        """See `BrokerCore.close_stream`."""
        consumer = self.by_id.get(consumer_id)
        if consumer is None or not generation or consumer.stream != generation:
            return Step(None)
        consumer.stream = 0
        record = self._topics[consumer.topic.full]
        sub = record.subscriptions[consumer.subscription]
        self._logs.outbox.pop(consumer_id, None)
        gone = sub.dispatcher.disconnect(consumer_id, now_ms)
        return Step(None, tuple(self._logs.dispatch(record, sub, gone, now_ms)))

    def take(self, consumer_id: int, generation: int, limit: int) -> list[Any] | None:
        """See `BrokerCore.take`."""
        consumer = self.by_id.get(consumer_id)
        if consumer is None or not generation or consumer.stream != generation:
            return None
        sub = self._topics[consumer.topic.full].subscriptions[consumer.subscription]
        # Not a touch (`sub.machine`): a reliable dispatcher's take changes nothing (its
        # deliveries are in the outbox), and a non-reliable topic has no tick work.
        taken = sub.machine.take(consumer_id, limit)
        box = self._logs.outbox.get(consumer_id)
        if box:
            taken.extend(box.popleft() for _ in range(min(limit - len(taken), len(box))))
        return taken

    def healthy(self, consumer_id: int) -> bool:
        return consumer_id in self.by_id

    def live_streams(self) -> list[EndStream]:
        """Every open stream, for a clean shutdown."""
        return [EndStream(c.consumer_id, c.stream) for c in self.by_id.values() if c.stream]

    def _consumer(self, consumer_id: int) -> ConsumerRecord:
        consumer = self.by_id.get(consumer_id)
        if consumer is None:
            raise not_found(
                f"consumer {consumer_id} does not exist on this broker; subscribe again"
            )
        return consumer

    # -- acknowledgements ---------------------------------------------------------------------

    def ack(self, topic: str, subscription: str, offset: int, *, now_ms: int = 0) -> Step[None]:
        """See `BrokerCore.ack`."""
        return self.ack_many(topic, subscription, (offset,), now_ms=now_ms)

    def ack_many(
        self, topic: str, subscription: str, offsets: Iterable[int], *, now_ms: int = 0
    ) -> Step[None]:
        """`ack` of each offset, in one step (the batched path's AckBatch). Each ack's
        effects are carried out before the next ack: an ack can free the window and deliver
        an offset again that a later ack of the same batch settles, and the settled offset's
        record is let go then (the simulator's seeds 1, 7, 21, 23 and 49 with `--operator 0.2`
        found the Deliver of a record already let go). Reads the consumer pool paused go on
        at once when the acks made room or left the subscription holding nothing
        (spec/memory.md, "Consumer queues")."""
        record, sub = self._ack_target(topic, subscription)
        dispatcher = sub.dispatcher
        out: list[Effect] = []
        for offset in offsets:
            effects = dispatcher.ack(offset, now_ms)
            if not dispatcher.is_pending(offset):
                sub.records.pop(offset, None)
            out.extend(self._logs.dispatch(record, sub, effects, now_ms))
        if record.reliable:
            out.extend(self._resume_after_acks(sub, now_ms))
        return Step(None, tuple(out))

    def _resume_after_acks(self, sub: SubscriptionRecord, now_ms: int) -> list[Effect]:
        """Reads the consumer pool paused go on at the acknowledgements that let them, not
        at the next tick: all of them once the pool has room, the subscription's own when
        it holds nothing any more (spec/memory.md, "Consumer queues")."""
        pool = self._logs.consumer_pool
        if pool is None or not pool.paused or (pool.full and sub.records):
            return []
        return self._logs.resume_reads(now_ms)

    def nack(
        self,
        topic: str,
        subscription: str,
        offset: int,
        delay_ms: int | None,
        *,
        now_ms: int,
        reason: str | None = None,
    ) -> Step[None]:
        """Redelivers the offset after `delay_ms` or the failure policy's delay."""
        record, sub = self._ack_target(topic, subscription)
        effects = sub.dispatcher.nack(offset, delay_ms, now_ms, reason=reason)
        return Step(None, tuple(self._logs.dispatch(record, sub, effects, now_ms)))

    def _ack_target(self, topic: str, subscription: str) -> tuple[TopicRecord, SubscriptionRecord]:
        """Cluster mode: an ack for a topic that left (or is leaving) this broker is refused
        as UNAVAILABLE, so the client looks it up again; the new owner delivers the message
        again from the persisted cursor."""
        if self._clustered and topic not in self._topics:
            parse_topic(topic)
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                f"{topic} is not served by this broker (it moved); the message will be "
                "delivered again by its owner",
            )
        record = self._catalogue.topic(topic)
        check_not_moving(record)
        sub = record.subscriptions.get(subscription)
        if sub is None:
            raise not_found(f"subscription {subscription!r} does not exist on {topic}")
        return record, sub

    # -- statistics ---------------------------------------------------------------------------

    def drop_counts(self) -> dict[tuple[str, str, str], int]:
        """(topic, subscription, reason) -> messages dropped so far."""
        counts = {}
        for topic, record in self._topics.items():
            for sub in record.subscriptions.values():
                for reason, count in sub.dispatcher.drop_counts().items():
                    if count:
                        counts[(topic, sub.name, reason.value)] = count
        return counts


def _let_go_all(sub: SubscriptionRecord) -> None:
    """The subscription is gone: what it holds (a reliable one's records, a non-reliable
    one's queues) gives its room back to the consumer pool."""
    sub.records.clear()
    if isinstance(sub.dispatcher, NonReliableSubscription):
        sub.dispatcher.release()


def check_subscription_name(subscription: str) -> None:
    if (
        not subscription
        or too_long(subscription)
        or not _SUBSCRIPTION_NAME_RE.fullmatch(subscription)
    ):
        raise invalid(
            f"invalid subscription name {quoted(subscription)}: use letters, digits, '_', "
            f"'-' or '.' (1 to {MAX_NAME_LENGTH} bytes in UTF-8)"
        )


def _persist_consumer(consumer: ConsumerRecord) -> PersistMeta:
    value = {
        "consumer_id": consumer.consumer_id,
        "consumer_name": consumer.name,
        "key_filters": list(consumer.key_filters),
        "order": consumer.order,
    }
    key = paths.consumer(consumer.topic, consumer.subscription, consumer.consumer_id)
    return PersistMeta(puts=((key, value),))

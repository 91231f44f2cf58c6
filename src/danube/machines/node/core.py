"""The broker-node core: every decision the data plane makes, as pure state machines.

Requests come in as method calls with plain values; the answer is a `Step`: a value for the
caller plus effects for the driver (`danube.machines.node.effects`). `ConsumerReady` and `EndStream`
act on consumer streams at once; `PersistMeta` changes must be durable, in order, before the
reply to the request (and to any later request) leaves. Validation happens before any
mutation, so a `DanubeError` leaves the state untouched.

`BrokerCore` only routes: each request goes to the machine whose job it is.

- `catalogue`: namespaces, topics, partitions and policies;
- `restore`: the state rebuilt from a metadata scan (start, and claims in cluster mode);
- `lifecycle`: topics deleted or moved away; their phase is `danube.machines.node.phase`;
- `producers`: producer sessions and the publish paths, paced by `pacing`;
- `consumers`: subscriptions, consumers, receive streams and acknowledgements, over the
  `danube.machines.dispatch.protocol.Subscription` protocol both dispatchers implement;
- `subscription_settings`: a subscription's failure policy and dispatch window;
- `reliable_log`: each reliable topic's WAL and uploader, subscriptions' reads, timers;
- `object_tier`: the object store's answers to the uploaders;
- `core_replication`: the routes of replication, owner's and follower's side (a mixin).

Deliberate differences from Danube are listed in spec/protocol.md.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from danube import keys
from danube.machines.dispatch import LATEST, QueueLimits, StartPosition, SubscriptionType
from danube.machines.memory.budget import MemoryPools
from danube.machines.memory.pools import broker_pools
from danube.machines.node.catalogue import Catalogue, policies_to_json
from danube.machines.node.consumers import Consumers
from danube.machines.node.core_replication import ReplicationRoutes
from danube.machines.node.dead_letters import DeadLetters
from danube.machines.node.departed_subscriptions import DepartedSubscriptions
from danube.machines.node.effects import (
    AskEpochEnd,
    BatchPublished,
    BrokerIdentity,
    CutWal,
    DeadLetterPublish,
    DropWal,
    Effect,
    EndStream,
    ForwardDeadLetter,
    LoadWal,
    PersistMeta,
    PolicyDropped,
    PublishAcked,
    PublishFailed,
    ReadObject,
    ReadWal,
    RepairWal,
    ReplicaAnswer,
    ReplicaPropose,
    ReplicaRead,
    ReplicaSend,
    RetentionSkipped,
    SaveEpochs,
    Step,
    TierHalted,
    TierIo,
    TopicStopped,
    WalIo,
)
from danube.machines.node.lifecycle import Lifecycle
from danube.machines.node.object_tier import ObjectTier
from danube.machines.node.pacing import MAX_PUBLISH_WAIT_MS, PUBLISH_BURST_US
from danube.machines.node.phase import TopicPhase
from danube.machines.node.producers import MAX_DEPARTED_PRODUCERS, MAX_QUEUED_WAL_BYTES, Producers
from danube.machines.node.records import (
    ConsumerRecord,
    ProducerRecord,
    SubscriptionRecord,
    TopicRecord,
)
from danube.machines.node.reliable_log import READ_MAX_BYTES, ReliableLogs
from danube.machines.node.replica_follower import FollowerReplicas
from danube.machines.node.replica_owner import ReplicaConfig, ReplicationSettings
from danube.machines.node.restore import Restorer
from danube.machines.node.settings import SubscriptionFailureSettings
from danube.machines.node.subscription_settings import SubscriptionSettingsAdmin
from danube.machines.tiering import uploader as tier
from danube.machines.wal import batches
from danube.machines.wal import machine as wal
from danube.values.config import DispatchStrategy, Policies, TopicDurability
from danube.values.errors import DanubeError, ErrorCode

__all__ = [
    "MAX_DEPARTED_PRODUCERS",
    "MAX_PUBLISH_WAIT_MS",
    "MAX_QUEUED_WAL_BYTES",
    "PUBLISH_BURST_US",
    "READ_MAX_BYTES",
    "AskEpochEnd",
    "BatchPublished",
    "BrokerCore",
    "BrokerIdentity",
    "ConsumerRecord",
    "CutWal",
    "DeadLetterPublish",
    "DropWal",
    "Effect",
    "EndStream",
    "ForwardDeadLetter",
    "LoadWal",
    "PersistMeta",
    "PolicyDropped",
    "ProducerRecord",
    "PublishAcked",
    "PublishFailed",
    "ReadObject",
    "ReadWal",
    "RepairWal",
    "ReplicaAnswer",
    "ReplicaConfig",
    "ReplicaPropose",
    "ReplicaRead",
    "ReplicaSend",
    "ReplicationSettings",
    "RetentionSkipped",
    "SaveEpochs",
    "Step",
    "SubscriptionRecord",
    "TierHalted",
    "TierIo",
    "TopicPhase",
    "TopicRecord",
    "TopicStopped",
    "WalIo",
    "policies_to_json",
]

_DEFAULT_WAL = wal.WalConfig()
_DEFAULT_DURABILITY = TopicDurability()


class BrokerCore(ReplicationRoutes):
    """One broker's topics, producers and subscriptions. Single-threaded by contract."""

    def __init__(
        self,
        identity: BrokerIdentity,
        *,
        rng: random.Random,
        default_policies: Policies,
        queue_limits: QueueLimits,
        auto_create_topics: bool = True,
        wal_config: wal.WalConfig = _DEFAULT_WAL,
        max_unacked_messages: int = 10,
        routing_key_of: Callable[[bytes], bytes] = lambda record: b"",
        uploads: tier.UploaderConfig | None = None,
        durability: TopicDurability = _DEFAULT_DURABILITY,
        clustered: bool = False,
        replication: ReplicationSettings | None = None,
        memory: MemoryPools | None = None,
    ) -> None:
        """`memory`: the broker's memory budget split into pools (spec/memory.md); its cache
        pool bounds every topic's hot cache together (`cache_ledger`). None: each topic's
        cache is bounded by `wal_config.cache_bytes` alone.

        `routing_key_of` extracts a stored record's Key-Shared routing key (its routing
        key, else its producer's name); only the driver knows the record encoding.

        `durability` gives each reliable topic its level (spec/durability.md). At the
        `object` level a publish is answered only once the object holding it is indexed, and
        the active segment is sealed (and so uploaded) at most `object_batch_ms` after its
        oldest unanswered publish became durable, so that one upload answers every publish
        of its batch.

        `clustered`: topics come and go by ownership (`adopt`, `unload`, `remove`); the core
        never creates one itself on a producer's behalf, the cluster driver does."""
        if durability.uses_object and uploads is None:
            raise ValueError("the object durability level needs an object tier")
        self.identity = identity
        self._rng = rng
        self.catalogue = Catalogue(identity, default_policies)
        self.memory = memory
        self.pools = pools = broker_pools(memory)
        self.cache_ledger = pools.cache_ledger
        self.publish_pool = pools.publish_pool
        """Publishes in flight (spec/memory.md, "Back-pressure"): the request flows reserve
        and release (`danube.machines.requests.publish.admitted`)."""
        self.state_pool = pools.state_pool
        """Topics, subscriptions and consumers, charged to the cache pool (spec/memory.md,
        "State"): brought up to date at each tick and before each creation, which it may
        refuse (`_state_room`)."""
        consumers: dict[int, ConsumerRecord] = {}
        self.logs = ReliableLogs(
            self.catalogue,
            consumers,
            wal_config=wal_config,
            durability=durability,
            uploads=uploads,
            routing_key_of=routing_key_of,
            clustered=clustered,
            replication=replication,
            cache_ledger=self.cache_ledger,
        )
        self.logs.consumer_pool = pools.consumer_pool
        self.producers = Producers(
            self.catalogue,
            self.logs,
            rng,
            auto_create_topics=auto_create_topics,
            clustered=clustered,
            routing_key_of=routing_key_of,
            producer_idle_ms=memory.producer_idle_ms if memory else 0,
        )
        self.consumers = Consumers(
            self.catalogue,
            self.logs,
            rng,
            consumers,
            queue_limits=queue_limits,
            max_unacked_messages=max_unacked_messages,
            clustered=clustered,
        )
        self.dead_letters = DeadLetters(
            self.catalogue,
            self.logs,
            self.producers,
            auto_create_topics=auto_create_topics,
            clustered=clustered,
        )
        self.logs.republish = self.dead_letters.republish
        grace_ms = memory.departed_grace_ms if memory else 0  # spec/memory.md "Departed clients"
        self.departed = DepartedSubscriptions(self.logs, self._topics, consumers, grace_ms)
        self.dead_letters.state = (self.state_pool, self.state_counts)
        self.settings = SubscriptionSettingsAdmin(self.catalogue, self.logs, clustered=clustered)
        self.restorer = Restorer(self.catalogue, self.producers, self.consumers)
        self.lifecycle = Lifecycle(self.catalogue, self.producers, self.consumers, self.logs)
        self.tier = ObjectTier(self.catalogue, self.logs, rng)
        self._clustered = clustered
        self.followers = FollowerReplicas(wal_config, self.cache_ledger)
        """The topics other brokers own and replicate here."""

    # -- the machines' state, for white-box tests and the simulator's views -------------------

    @property
    def _namespaces(self) -> dict[str, Policies]:
        return self.catalogue.namespaces_by_name

    @property
    def _topics(self) -> dict[str, TopicRecord]:
        return self.catalogue.topics_by_name

    @property
    def _producers(self) -> dict[int, ProducerRecord]:
        return self.producers.by_id

    @property
    def _consumers(self) -> dict[int, ConsumerRecord]:
        return self.consumers.by_id

    @property
    def _outbox(self) -> dict[int, deque[bytes]]:
        return self.logs.outbox

    @property
    def _stream_generations(self) -> int:
        return self.consumers.stream_generations

    # -- restore, bootstrap and ownership (cluster mode, spec/cluster.md "Topic moves") -------

    def restore(self, entries: Mapping[str, Any]) -> Step[None]:
        """Rebuilds state from a metadata scan. Consumers come back disconnected: their clients
        reconnect with the same ids, and a restart is invisible to them. Reliable topics serve
        once their WAL is loaded: on first use or by a sweep (`deferred_loads`); subscriptions
        resume at their persisted cursor + 1. Topics already present are left as they are."""
        return self.logs.deferred.defer(self.restorer.restore(entries))

    def adopt(self, entries: Mapping[str, Any], *, keep_local: bool, epoch: int) -> Step[None]:
        """Starts serving the topics of a metadata read: a topic this broker has just
        claimed, under the claim of revision `epoch`. `keep_local` False discards a WAL
        directory an earlier ownership left here: another broker has written the topic since,
        so the history continues from the object index and the old directory holds nothing
        that is still the topic's."""
        step = self.restorer.adopt(entries, keep_local=keep_local, epoch=epoch)
        released: list[Effect] = []
        for effect in step.effects:
            if isinstance(effect, LoadWal) and self.followers.serves(effect.topic):
                # promoted here: the replica's log becomes the owner's (its files stay)
                released.extend(self.followers.release(effect.topic, delete_files=False).effects)
        return Step(None, (*released, *step.effects)) if released else step

    def serves(self, topic: str) -> bool:
        """The topic is loaded here and not on its way out."""
        return self.lifecycle.serves(topic)

    def unload(self, topic: str, now_ms: int) -> Step[None]:
        """First half of a move: refuse publishes and new clients, persist every cursor that
        moved and seal the WAL, so that the tiered uploader puts the tail in an object. The
        driver waits for `settled` and the metadata, then calls `remove`."""
        return self.lifecycle.unload(topic, now_ms)

    def settled(self, topic: str) -> bool:
        """An unloading topic's WAL is idle and every sealed segment is indexed (or the
        topic is stopped and can do neither); replicated, handed over to its in-sync
        followers instead once they hold the whole log (`Lifecycle.settled`)."""
        return self.lifecycle.settled(topic)

    def remove(self, topic: str, *, reason: str, delete_files: bool) -> Step[None]:
        """The topic leaves this broker without touching its metadata: after `unload`
        settled (`delete_files`: the objects hold everything), or at once when the broker
        lost its ownership (its files stay: they may hold the only copy of a tail)."""
        removed = self.lifecycle.remove(topic, reason=reason, delete_files=delete_files)
        return Step(None, (*removed.effects, *self.kept_after_remove(topic)))

    def namespace_seen(self, name: str, policies: Mapping[str, Any] | None) -> None:
        """Cluster mode: another broker created (policies) or deleted (None) a namespace."""
        self.catalogue.namespace_seen(name, policies)

    def topic_records(self) -> list[TopicRecord]:
        """Every topic record this broker holds, by name, for read-only views
        (`danube.machines.node.stats`); callers must not change them."""
        return self.catalogue.topic_records()

    def consumer_record(self, consumer_id: int) -> ConsumerRecord | None:
        """A consumer's record (read-only), None when it is gone."""
        return self.consumers.by_id.get(consumer_id)

    def served_topics(self) -> list[str]:
        return self.catalogue.served_topics()

    def bootstrap(self, namespaces: Iterable[str]) -> Step[None]:
        """Creates the configured namespaces that do not exist yet (`default` always)."""
        return self.catalogue.bootstrap(namespaces)

    # -- namespaces and topics ----------------------------------------------------------------

    def namespaces(self) -> list[str]:
        return self.catalogue.namespaces()

    def create_namespace(self, name: str) -> Step[None]:
        return self.catalogue.create_namespace(name)

    def delete_namespace(self, name: str) -> Step[None]:
        return self.catalogue.delete_namespace(name)

    def namespace_policies(self, name: str) -> dict[str, int]:
        return self.catalogue.namespace_policies(name)

    def topics(self, namespace: str) -> list[str]:
        return self.catalogue.topics(namespace)

    def topic_strategy(self, topic: str) -> DispatchStrategy:
        return self.catalogue.topic_strategy(topic)

    def create_topic(self, topic: str, strategy: DispatchStrategy) -> Step[None]:
        self._state_room(f"topic {topic}", topics=1)
        return self.catalogue.create_topic(topic, strategy)

    def create_partitioned_topic(
        self, base: str, partitions: int, strategy: DispatchStrategy
    ) -> Step[None]:
        self._state_room(f"{partitions} partitions of {base}", topics=partitions)
        return self.catalogue.create_partitioned_topic(base, partitions, strategy)

    def state_counts(self) -> tuple[int, int, int]:
        """Topics, subscriptions and consumers this core holds (`StatePool.update`)."""
        topics = self.catalogue.topics_by_name
        return len(topics), topics.subscriptions, len(self._consumers)

    def transport_open(self, streams: int, connections: int) -> None:
        """The runtime's open gRPC streams and client connections now (an input at each
        tick): charged to the state pool at once (spec/memory.md, "State")."""
        pool = self.state_pool
        if pool is not None:
            pool.transport(streams, connections)
            pool.update(*self.state_counts())

    def _state_room(self, what: str, **more: int) -> None:
        """Refuses creating `what` (RESOURCE_EXHAUSTED) when the state pool has no room."""
        pool = self.state_pool
        if pool is not None:
            pool.update(*self.state_counts())
            reason = pool.refusal(what=what, **more)
            if reason is not None:
                raise DanubeError(ErrorCode.RESOURCE_EXHAUSTED, reason)

    def delete_topic(self, topic: str) -> Step[None]:
        """Deletes a topic, or every partition when given a partitioned topic's base name.
        Its producers and consumers are forgotten (health checks answer CLOSE) and open
        receive streams end."""
        return self.lifecycle.delete_topic(topic)

    def partitions(self, base: str) -> list[str]:
        """Names of `<base>-part-<n>`, ordered by n (only exact partitions, unlike Danube's
        prefix match)."""
        return self.catalogue.partitions(base)

    def topic_partitions(self, topic: str) -> list[str]:
        """TopicPartitions: the topic itself, its partitions, or nothing."""
        return self.catalogue.topic_partitions(topic)

    def lookup(self, topic: str) -> BrokerIdentity:
        return self.catalogue.lookup(topic)

    def subscriptions(self, topic: str) -> list[str]:
        return self.catalogue.subscriptions(topic)

    # -- operator settings (admin API; rules in danube.machines.node.settings) ---------------------

    def set_namespace_policies(self, name: str, changes: Mapping[str, Any]) -> Step[dict]:
        """Changes the named fields; they apply at once to every topic of the namespace that
        does not set them itself. Limits already exceeded are not enforced backwards: a topic
        over a lowered limit keeps its producers and consumers and takes no new ones."""
        return self.catalogue.set_namespace_policies(name, changes)

    def topic_policies(self, topic: str) -> tuple[dict[str, int], list[str]]:
        """The policies in force for the topic, and the fields it sets itself."""
        return self.catalogue.topic_policies(topic)

    def set_topic_policies(self, topic: str, changes: Mapping[str, Any]) -> Step[dict]:
        return self.catalogue.set_topic_policies(topic, changes)

    def clear_topic_policies(self, topic: str) -> Step[dict]:
        return self.catalogue.clear_topic_policies(topic)

    def topic_overrides(self, topic: str) -> dict[str, int]:
        return self.catalogue.topic_overrides(topic)

    def persist_topic_policies_again(self, topic: str) -> Step[dict | None]:
        """The write again of a topic's overrides; `tick` makes it after a failed write."""
        return self.catalogue.persist_topic_policies_again(topic)

    def subscription_type(self, topic: str, subscription: str) -> SubscriptionType | None:
        return self.settings.subscription_type(topic, subscription)

    def failure_policy(self, topic: str, subscription: str) -> SubscriptionFailureSettings | None:
        """The subscription's own policy; None when it runs with the broker's defaults."""
        return self.settings.failure_policy(topic, subscription)

    def set_failure_policy(
        self,
        topic: str,
        subscription: str,
        policy: SubscriptionFailureSettings,
        *,
        now_ms: int = 0,
    ) -> Step[None]:
        """Stored for the subscription, which may not exist yet, and applied at once to a
        live one (Danube only reads it when the subscription loads)."""
        return self.settings.set_failure_policy(topic, subscription, policy, now_ms)

    def clear_failure_policy(self, topic: str, subscription: str, *, now_ms: int = 0) -> Step[bool]:
        """Drops the subscription's own policy, stored and live: it follows its namespace's
        default again (else the broker's). False: it had none."""
        return self.settings.clear_failure_policy(topic, subscription, now_ms)

    def blocked(self, topic: str, subscription: str) -> tuple[int, ...]:
        """Offsets the Block poison policy holds on a live reliable subscription."""
        return self.settings.blocked(topic, subscription)

    def resolve_blocked(
        self, topic: str, subscription: str, offset: int, *, release: bool, now_ms: int = 0
    ) -> Step[bool]:
        """An operator's decision on a blocked message: `release` sends it again with its
        attempts reset, else it is skipped (dropped, counted). False: it is not blocked."""
        return self.settings.resolve_blocked(topic, subscription, offset, release, now_ms)

    def dead_letter_done(
        self, publish: DeadLetterPublish, failure: str | None, *, now_ms: int = 0
    ) -> Step[None]:
        """The driver's report on a dead letter's append: stored at its topic's durability
        (failure None: the original's cursor may pass it) or refused or lost (asked again
        after the policy's backoff)."""
        return self.dead_letters.done(publish, failure, now_ms)

    def dispatch_window(self, topic: str, subscription: str) -> int | None:
        """The subscription's own `max_unacked_messages`; None when it uses the broker's."""
        return self.settings.dispatch_window(topic, subscription)

    def set_dispatch_window(
        self, topic: str, subscription: str, max_unacked_messages: int, *, now_ms: int = 0
    ) -> Step[None]:
        """Danube stores this and never reads it; here it is the subscription's window from
        now on."""
        return self.settings.set_dispatch_window(topic, subscription, max_unacked_messages, now_ms)

    def unsubscribe(self, topic: str, subscription: str) -> Step[None]:
        """Removes a subscription nobody is attached to, with its cursor, consumers and
        settings. A consumer with an open receive stream keeps it: close that consumer
        first. Consumers registered but not attached (their client went away) go with it;
        a client that comes back finds its consumer unknown and subscribes again."""
        return self.consumers.unsubscribe(topic, subscription)

    # -- producers ----------------------------------------------------------------------------

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
        if topic not in self._topics:  # created on the producer's behalf
            self._state_room(f"topic {topic}", topics=1)
        return self.producers.create_producer(
            topic, producer_name, access_mode=access_mode, strategy=strategy
        )

    def publish_pace(self, topic: str, count: int, now_ms: int) -> int:
        """How long (ms) the driver holds `count` messages before publishing them, so the
        topic takes at most `max_publish_rate` messages a second after a burst of one
        second's worth (`danube.machines.node.pacing`). More than MAX_PUBLISH_WAIT_MS of waiting is
        refused (RESOURCE_EXHAUSTED): the producer sends faster than the rate for too long.
        0 for a topic without a rate or not served here (publish says why)."""
        return self.producers.publish_pace(topic, count, now_ms)

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
        """Publishes one message and returns its offset.

        Non-reliable: the message goes to every subscription now; the offset is its sequence
        number on the topic (0, 1, 2... since the topic was loaded on this broker), which the
        caller stamps as `topic_offset` before its next await, so consumers can see gaps where
        messages were dropped. Key-Shared routes by `routing_key`, or by the producer's name
        when the message has none (as Danube).

        Reliable: `encode(offset)` gives the record to store (the message stamped with its
        offset); the reply must wait for a `PublishAcked` covering the offset (or fail on
        `PublishFailed` / `TopicStopped`)."""
        return self.producers.publish(
            producer_id, topic, message, size, routing_key, encode=encode, now_ms=now_ms
        )

    def publish_batch(
        self, producer_id: int, topic: str, batch: batches.ClientBatch, *, now_ms: int
    ) -> Step[BatchPublished]:
        """Publishes a checked batch (`batches.check_batch`) as one frame and returns the
        offset of its first message; message i gets that offset + i. All or nothing: a
        refusal stores none of it. Reliable topics answer as `publish` does, once a
        `PublishAcked` covers the batch's last offset; non-reliable ones deliver each
        message now, numbered as `publish` numbers them."""
        return self.producers.publish_batch(producer_id, topic, batch, now_ms=now_ms)

    def producer_healthy(self, producer_id: int) -> bool:
        return self.producers.healthy(producer_id)

    def producer_active(self, producer_id: int) -> None:
        """A publish of the producer arrived: it is not idle (`idle_producers`)."""
        producer = self.producers.by_id.get(producer_id)
        if producer is not None:
            producer.active = True

    # -- consumers ----------------------------------------------------------------------------

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
        """Returns the consumer id; the same name in the same subscription takes over its
        previous session (same id, old stream ended). `start` only matters for a subscription
        this call creates."""
        record = self._topics.get(topic)
        sub = record.subscriptions.get(subscription) if record is not None else None
        if record is not None and (sub is None or consumer_name not in sub.consumers):
            self._state_room(
                f"consumer {consumer_name} of {subscription} on {topic}",
                subscriptions=sub is None,
                consumers=1,
            )
        return self.consumers.subscribe(
            topic, consumer_name, subscription, sub_type, key_filters, start, now_ms=now_ms
        )

    def open_stream(self, consumer_id: int, *, now_ms: int = 0) -> Step[int]:
        """Starts a receive stream; a previous stream of the same consumer ends (takeover;
        on a reliable topic what it had in flight goes out again)."""
        return self.consumers.open_stream(consumer_id, now_ms=now_ms)

    def close_stream(self, consumer_id: int, generation: int, *, now_ms: int = 0) -> Step[None]:
        """The stream of this generation ended; if it was the consumer's current one, the
        consumer is disconnected (a Failover standby takes over; on a reliable topic its
        unacknowledged messages go out again)."""
        return self.consumers.close_stream(consumer_id, generation, now_ms=now_ms)

    def take(self, consumer_id: int, generation: int, limit: int) -> list[Any] | None:
        """Messages for the stream writer (reliable topics: stored records, as bytes); None
        when this stream is no longer current."""
        return self.consumers.take(consumer_id, generation, limit)

    def consumer_healthy(self, consumer_id: int) -> bool:
        """Known consumers are healthy even while their stream is down: the official clients
        answer CLOSE by discarding the next message and re-subscribing, which a consumer that
        only needs to reopen its stream (after a broker restart, say) should not do."""
        return self.consumers.healthy(consumer_id)

    def ack(self, topic: str, subscription: str, offset: int, *, now_ms: int = 0) -> Step[None]:
        """Acknowledges an offset of a reliable subscription (matched by offset alone, as
        Danube; a late, repeated or unknown ack is ignored). Non-reliable topics only check
        that the target exists."""
        return self.consumers.ack(topic, subscription, offset, now_ms=now_ms)

    def ack_many(
        self, topic: str, subscription: str, offsets: Iterable[int], *, now_ms: int = 0
    ) -> Step[None]:
        """`ack` of each offset, in one step (the batched path's AckBatch)."""
        return self.consumers.ack_many(topic, subscription, offsets, now_ms=now_ms)

    def nack(
        self,
        topic: str,
        subscription: str,
        offset: int,
        delay_ms: int | None,
        *,
        now_ms: int = 0,
        reason: str | None = None,
    ) -> Step[None]:
        """Redelivers the offset after `delay_ms` or the failure policy's delay; `reason`
        (the client's) is what a dead letter of it says last failed."""
        return self.consumers.nack(
            topic, subscription, offset, delay_ms, now_ms=now_ms, reason=reason
        )

    def live_streams(self) -> list[EndStream]:
        """Every open stream, for a clean shutdown."""
        return self.consumers.live_streams()

    # -- reliable topics: WAL and dispatch ----------------------------------------------------

    def wal_syncs_every_write(self, topic: str) -> bool:
        """Whether the topic's WAL driver must fsync every write before reporting it done
        (`WalConfig.synced_writes`, for every level but `flush`)."""
        if self.followers.serves(topic):
            return True
        return self.logs.wal_syncs_every_write(topic)

    def recovery_evidence(self, topic: str) -> tuple[int, int]:
        """(acknowledged end, indexed end) of a reliable topic, for WAL recovery
        (`ReliableLogs.recovery_evidence` says why each)."""
        if self.followers.serves(topic):
            return 0, 0
        return self.logs.recovery_evidence(topic)

    @property
    def aligns_to_index(self) -> bool:
        """Cluster mode: a load aligns a local log to the object index (a promoted follower's
        segments are its own, `recovery.plan_align`); a standalone broker's are the index's."""
        return self._clustered

    def wal_io_done(
        self, topic: str, effect: wal.Effect, error: str | None, *, now_ms: int
    ) -> Step[None]:
        """A file effect of `WalIo` finished (`error` None) or failed."""
        if self.followers.serves(topic):
            return self.followers.wal_io_done(topic, effect, error, now_ms)
        return self.logs.wal_io_done(topic, effect, error, now_ms=now_ms)

    def wal_read_done(
        self, read: ReadWal | ReadObject, records: tuple[bytes, ...], *, now_ms: int
    ) -> Step[None]:
        return self.logs.wal_read_done(read, records, now_ms=now_ms)

    def wal_read_failed(
        self, read: ReadWal | ReadObject, reason: str, *, missing: bool, now_ms: int
    ) -> Step[None]:
        """`missing`: retention deleted the file meanwhile, so the read is planned again.
        Anything else (a frame that no longer verifies, a failing disk) stops the topic."""
        return self.logs.wal_read_failed(read, reason, missing=missing, now_ms=now_ms)

    def tick(
        self, now_ms: int, monotonic_ms: int | None = None, rss: int | None = None
    ) -> Step[None]:
        """Time passes: WAL flushes, rotation and retention; ack deadlines, redeliveries and
        cursor flushes of reliable subscriptions; topic overrides whose write failed are
        written again (`Catalogue.overrides_to_write_again`); a changed namespace default
        failure policy reaches the live subscriptions. The memory pools time idle caches and
        returns on `monotonic_ms` (default `now_ms`): a wall clock set back held them off;
        `rss`, the process's resident set the runtime sampled, squeezes the cache pool."""
        clock = now_ms if monotonic_ms is None else monotonic_ms
        if self.state_pool is not None:  # the ids of producers gone (spec/memory.md "State")
            self.state_pool.remembered(len(self.producers.remembered))
        again: list[Any] = [*self.pools.tick(self.state_counts(), clock, rss)]  # spec/memory.md
        step = self.logs.tick(now_ms)
        again.extend(self.catalogue.overrides_to_write_again(now_ms))
        again.extend(self.settings.apply_namespace_defaults(now_ms))  # issue 24
        again.extend(self.producers.expire_idle(clock))  # spec/memory.md "Departed clients"
        again.extend(self.departed.tick(clock, now_ms))
        return Step(None, (*step.effects, *again)) if again else step

    def cached_bytes_held(self) -> int:
        """Accounted bytes the hot caches of every WAL machine this core holds (its topics'
        and its replicas') add up to: what `cache_ledger.total` must equal (the simulator
        checks it, spec/memory.md)."""
        held = sum(r.log.wal.cached_bytes for r in self._topics.values() if r.log.wal)
        replicas = self.followers.replicas.values()
        return held + sum(r.wal.cached_bytes for r in replicas if r.wal is not None)

    def metadata_written(self, touched: Iterable[str], failure: str | None, *, now_ms: int) -> None:
        """A `PersistMeta` touching keys `touched` was stored (`failure` None) or failed;
        the interpreter reports every one, in the order they were written. The catalogue
        writes a topic's overrides again after a failed write (`Catalogue.metadata_written`)."""
        self.catalogue.metadata_written(touched, failure, now_ms)

    def quiesce(self, now_ms: int) -> Step[None]:
        """Graceful shutdown: persists every reliable cursor that moved since it was last
        persisted (so a restart redelivers as little as possible) and seals every WAL; the
        driver then waits until `wal_busy` is false."""
        return self.logs.quiesce(now_ms)

    def wal_busy(self) -> bool:
        """Some WAL still has appends or I/O under way (shutdown waits for them)."""
        return self.logs.wal_busy()

    def fence_claims(self, keys_touched: Iterable[str]) -> dict[str, int] | None:
        """Cluster mode: the claim revision each topic a metadata change touches was served
        under when the change was decided (a topic no longer served here is left out: the
        port refuses the change, `NotOwner`); None standalone. The change is written only
        while those claims stand: bound at the decision, not when the write goes out, so a
        change decided under a claim this broker has since lost and taken again cannot land
        under the new one, past what its load read."""
        if not self._clustered:
            return None
        claims: dict[str, int] = {}
        for key in keys_touched:
            topic = keys.topic_of_key(key)
            if topic is not None and topic not in claims:
                record = self._topics.get(topic)
                if record is not None and record.log.epoch > 0:
                    claims[topic] = record.log.epoch
        return claims

    # -- the object tier ----------------------------------------------------------------------

    def tier_upload_done(
        self,
        io: TierIo,
        size: int,
        crc32c: int,
        offset_index: tuple[tuple[int, int], ...],
        *,
        now_ms: int,
    ) -> Step[None]:
        return self.tier.upload_done(io, size, crc32c, offset_index, now_ms=now_ms)

    def tier_upload_failed(
        self, io: TierIo, kind: tier.UploadError, reason: str, *, now_ms: int
    ) -> Step[None]:
        return self.tier.upload_failed(io, kind, reason, now_ms=now_ms)

    def tier_index_committed(self, io: TierIo, *, now_ms: int) -> Step[None]:
        return self.tier.index_committed(io, now_ms=now_ms)

    def tier_index_read(self, io: TierIo, value: Any | None, *, now_ms: int) -> Step[None]:
        """A `CommitIndex` whose compare failed, and what its path holds when read afterwards
        (None: nothing, or the read failed); `ObjectTier.index_read` says how it is judged."""
        return self.tier.index_read(io, value, now_ms=now_ms)

    def tier_commit_failed(self, io: TierIo, *, now_ms: int) -> Step[None]:
        return self.tier.commit_failed(io, now_ms=now_ms)

    def tier_objects_listed(
        self, io: TierIo, objects: list[tier.StoredObject], *, now_ms: int
    ) -> Step[None]:
        return self.tier.objects_listed(io, objects, now_ms=now_ms)

    def tier_busy(self) -> bool:
        """Some topic still has uploads or commits under way (shutdown may wait a little)."""
        return self.tier.busy()

    # -- statistics ---------------------------------------------------------------------------

    def drop_counts(self) -> dict[tuple[str, str, str], int]:
        """(topic, subscription, reason) -> messages dropped so far."""
        return self.consumers.drop_counts()

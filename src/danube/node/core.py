"""The broker-node core: every decision the data plane makes, as a pure state machine.

Requests come in as method calls with plain values; the answer is a `Step`: a value for the
caller plus effects for the driver. `ConsumerReady` and `EndStream` act on consumer streams at
once; `PersistMeta` changes must be durable, in order, before the reply to the request (and to
any later request) leaves. Validation happens before any mutation, so a `DanubeError`
leaves the state untouched.

Deliberate differences from Danube are listed in spec/protocol.md.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from danube.core.config import OBJECT_DURABILITY, DispatchStrategy, Policies, TopicDurability
from danube.core.errors import DanubeError, ErrorCode, invalid, not_found, quoted
from danube.core.names import (
    MAX_NAME_LENGTH,
    TopicName,
    check_partition_conflict,
    parse_topic,
    partition_index,
    partition_names,
    too_long,
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
from danube.dispatch import reliable as rd
from danube.metadata.model import Delete, DeletePrefix, Op, Put
from danube.node import paths
from danube.node import settings as settings_rules
from danube.node.settings import SubscriptionFailureSettings, SubscriptionSettings
from danube.tiering import layout as tier_layout
from danube.tiering import reader as tier_reader
from danube.tiering import uploader as tier
from danube.tiering.index import IndexEntry, IndexFormatError
from danube.wal import batches
from danube.wal import machine as wal
from danube.wal.recovery import RecoveryPlan

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

    @property
    def keys(self) -> list[str]:
        """Every key (or prefix) the change touches: what its fence compares cover."""
        return [*self.delete_prefixes, *self.deletes, *(key for key, _ in self.puts)]

    def ops(self) -> list[Op]:
        """The change as store operations, in the order a store applies them."""
        return [
            *(DeletePrefix(prefix) for prefix in self.delete_prefixes),
            *(Delete(key) for key in self.deletes),
            *(Put(key, value) for key, value in self.puts),
        ]

    def apply_to(self, metadata: dict[str, Any]) -> None:
        """Applies the change to an in-memory key/value map in the order a store applies
        it (prefix deletes, deletes, puts): for drivers without a store (simulator, tests)."""
        for prefix in self.delete_prefixes:
            for key in [k for k in metadata if k.startswith(prefix)]:
                del metadata[key]
        for key in self.deletes:
            metadata.pop(key, None)
        for key, value in self.puts:
            metadata[key] = value


@dataclass(frozen=True, slots=True)
class EndStream:
    """Effect: finish the consumer's receive stream of this generation (status OK)."""

    consumer_id: int
    generation: int


@dataclass(frozen=True, slots=True)
class LoadWal:
    """Effect: recover the reliable topic's WAL directory (after deleting what is in it when
    `fresh`: a topic created now owns no data) and report with `wal_loaded` or
    `wal_load_failed`. Replies to the request that caused it wait for that."""

    topic: str
    fresh: bool


@dataclass(frozen=True, slots=True)
class RepairWal:
    """Effect: the topic's WAL failed an I/O (`danube.wal.machine.Failed`). Discard its file
    effects not yet started, truncate the segment to `truncate_to` bytes and fsync it, then
    recover as `LoadWal(topic, fresh=False)` does (or report `wal_load_failed`)."""

    topic: str
    segment_base: int
    truncate_to: int


@dataclass(frozen=True, slots=True)
class DropWal:
    """Effect: the topic is gone from this broker (deleted, moved away, or its ownership
    lost): fail the publishes still waiting with `reason`, stop its WAL I/O and, when
    `delete_files`, delete its directory."""

    topic: str
    reason: str
    delete_files: bool = True
    delete_objects: bool = False
    """The topic was deleted: its uploaded objects go too (after the WAL stops, before a
    topic created again under the name can upload)."""


@dataclass(frozen=True, slots=True)
class WalIo:
    """Effect: the topic's WAL file effects, to perform in order after those submitted
    before (spec/durability.md, driver contract); report each with `wal_io_done`."""

    topic: str
    effects: tuple[wal.Effect, ...]


@dataclass(frozen=True, slots=True)
class ReadWal:
    """Effect: read a file range for a subscription and report with `wal_read_done` (or
    `wal_read_failed`)."""

    topic: str
    subscription: str
    epoch: int
    plan: wal.FileRead


@dataclass(frozen=True, slots=True)
class ReadObject:
    """Effect: fetch an object byte range for a subscription, decode it with
    `danube.tiering.decode_object_read` and report with `wal_read_done` (or `wal_read_failed`)."""

    topic: str
    subscription: str
    epoch: int
    plan: tier_reader.ObjectRead


@dataclass(frozen=True, slots=True)
class TierIo:
    """Effect: an uploader effect for the object-store driver (`UploadSegment`,
    `CommitIndex`, `ListObjects`, `DeleteObject`); report with the `tier_*` inputs, passing
    this effect back. `uploader` names the uploader that asked: in cluster mode a topic can
    leave and come back while an answer is on its way, and the old uploader's answer must not
    reach the new one (it expects other work and could index another's object)."""

    topic: str
    effect: tier.UploadSegment | tier.CommitIndex | tier.ListObjects | tier.DeleteObject
    uploader: int


@dataclass(frozen=True, slots=True)
class TierHalted:
    """Effect: the topic's uploads stopped (log it). `resumable`: the cause is outside (the
    store, credentials); a restart of the broker resumes (an admin resume comes with the
    admin API)."""

    topic: str
    reason: str
    resumable: bool


@dataclass(frozen=True, slots=True)
class PublishAcked:
    """Effect: every publish to the topic with an offset up to `through_offset` may be
    answered with success."""

    topic: str
    through_offset: int


@dataclass(frozen=True, slots=True)
class PublishFailed:
    """Effect: publishes to the topic with an offset from `from_offset` on were not stored
    (or not as far as anyone can tell); answer them with UNAVAILABLE so producers retry."""

    topic: str
    from_offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class TopicStopped:
    """Effect: the topic cannot serve until an operator acts (say so in the log); waiting
    publishes fail."""

    topic: str
    reason: str


@dataclass(frozen=True, slots=True)
class RetentionSkipped:
    """Effect: retention deleted offsets [`first`, `end`) before the subscription read them:
    they are lost to it (log it; a later issue makes retention wait for tiering)."""

    topic: str
    subscription: str
    first: int
    end: int


Effect = (
    PersistMeta
    | ConsumerReady
    | EndStream
    | LoadWal
    | RepairWal
    | DropWal
    | WalIo
    | ReadWal
    | ReadObject
    | TierIo
    | TierHalted
    | PublishAcked
    | PublishFailed
    | TopicStopped
    | RetentionSkipped
)

_DEFAULT_WAL = wal.WalConfig()
_DEFAULT_DURABILITY = TopicDurability()
_FILE_EFFECTS = (wal.CreateSegment, wal.Write, wal.Fsync, wal.CloseSegment, wal.DeleteSegment)
READ_MAX_BYTES = 4 * 1024 * 1024
"""Largest file range one subscription read asks for (at index granularity)."""
MAX_QUEUED_WAL_BYTES = 64 * 1024 * 1024
"""Appends waiting for the disk beyond this are refused (UNAVAILABLE) instead of queued."""


@dataclass(frozen=True, slots=True)
class Step(Generic[T]):
    value: T
    effects: tuple[Effect, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchPublished:
    """Where a published batch went: message i has offset `first_offset` + i."""

    first_offset: int
    count: int
    stored: bool
    """Reliable topic: the answer waits for a `PublishAcked` covering `last_offset`;
    otherwise the messages were delivered and the answer is due at once."""

    @property
    def last_offset(self) -> int:
        return self.first_offset + self.count - 1


@dataclass(frozen=True, slots=True)
class BrokerIdentity:
    broker_url: str
    connect_url: str


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
    dispatcher: NonReliableSubscription | rd.ReliableSubscription
    consumers: dict[str, int] = field(default_factory=dict)
    records: dict[int, bytes] = field(default_factory=dict)
    """Reliable: the record of every offset read and not yet acknowledged."""
    epoch: int = 0
    """Reliable: bumped when the dispatcher is rebuilt, so older file reads are ignored."""
    read_lost: bool = False
    """Reliable: the dispatcher's outstanding read was dropped while the WAL was down."""

    @property
    def reliable(self) -> rd.ReliableSubscription:
        assert isinstance(self.dispatcher, rd.ReliableSubscription)
        return self.dispatcher


@dataclass(slots=True)
class TopicRecord:
    name: TopicName
    strategy: DispatchStrategy
    producers: dict[str, int] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionRecord] = field(default_factory=dict)
    uploader_id: int = 0
    """Which of this core's uploaders is the topic's (`TierIo.uploader`)."""
    messages_in: int = 0
    bytes_in: int = 0
    wal: wal.WalMachine | None = None
    """Reliable topics: None while the WAL is loading or repaired, or once stopped."""
    loaded: bool = False
    """The WAL was loaded once: a later load is a repair and rebuilds the subscriptions."""
    stopped: str | None = None
    """Why the topic cannot serve (corrupt segment, failed disk), for the operator."""
    index: list[IndexEntry] = field(default_factory=list)
    """Tiered: the object index read at restore, until the uploader takes it over."""
    uploader: tier.Uploader | None = None
    epoch: int = 0
    """Tiered: names this broker's objects of the topic (`layout.object_key`): the revision
    of its claim in cluster mode, 0 standalone."""
    sealed_through: int = 0
    """Tiered: end of the last segment the uploader was told is sealed."""
    object_ack: bool = False
    """The topic's durability level is `object` (set when its WAL loads)."""
    durable_through: int = -1
    """`object` acknowledgement: the WAL's last acknowledged (locally durable) offset."""
    acked_through: int = -1
    """`object` acknowledgement: the last offset the producers were told about."""
    ack_batch_since: int | None = None
    """`object` acknowledgement: when the oldest offset waiting for its object was durable."""
    unloading: bool = False
    """Cluster mode: the topic is moving away; it takes no more publishes or clients."""
    policies: dict[str, int] = field(default_factory=dict)
    """The topic's own policies, over its namespace's (`/topics/<ns>/<topic>/policy`)."""
    settings: dict[str, SubscriptionSettings] = field(default_factory=dict)
    """Subscriptions' own failure policy and window, by name; may name one that does not
    exist yet."""
    rate_clock_us: int = 0
    """`max_publish_rate` pacing: when the messages admitted so far would all have been
    taken at the rate (a GCRA's theoretical arrival time), in microseconds."""
    rate_clock_rate: int = 0
    """The rate `rate_clock_us` was reckoned at."""

    @property
    def reliable(self) -> bool:
        return self.strategy is DispatchStrategy.RELIABLE


def _check_label(value: str, what: str) -> str:
    if not value or too_long(value) or not value.isprintable():
        raise invalid(
            f"{what} must be 1 to {MAX_NAME_LENGTH} bytes (UTF-8) of printable characters"
        )
    return value


MAX_DEPARTED_PRODUCERS = 100_000
PUBLISH_BURST_US = 1_000_000
"""`max_publish_rate` lets a topic take one second's worth of messages at once."""
MAX_PUBLISH_WAIT_MS = 10_000
"""Past this much waiting at the publish rate, a publish is refused rather than held."""


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
        wal_config: wal.WalConfig = _DEFAULT_WAL,
        max_unacked_messages: int = 10,
        routing_key_of: Callable[[bytes], bytes] = lambda record: b"",
        uploads: tier.UploaderConfig | None = None,
        durability: TopicDurability = _DEFAULT_DURABILITY,
        clustered: bool = False,
    ) -> None:
        """`routing_key_of` extracts a stored record's Key-Shared routing key (its routing
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
        self._default_policies = default_policies
        self._queue_limits = queue_limits
        self._auto_create = auto_create_topics
        self._clustered = clustered
        self._wal_config = wal_config
        self._max_unacked = max_unacked_messages
        self._routing_key_of = routing_key_of
        self._uploads = uploads
        """Object tier settings; None in `local` storage mode (no objects)."""
        self._durability = durability
        self._outbox: dict[int, deque[bytes]] = {}
        """Reliable: records delivered to a consumer, waiting for its stream writer."""
        self._namespaces: dict[str, Policies] = {}
        self._topics: dict[str, TopicRecord] = {}
        self._producers: dict[int, ProducerRecord] = {}
        self._departed: dict[int, str] = {}
        """Producers of topics that left this broker: their publishes answer UNAVAILABLE, a
        status every client retries with a new lookup (an unknown producer is NOT_FOUND)."""
        self._consumers: dict[int, ConsumerRecord] = {}
        self._stream_generations = 0
        self._uploaders = 0
        self._subscribe_order = 0

    # -- restore and bootstrap ----------------------------------------------------------------

    def restore(self, entries: Mapping[str, Any]) -> Step[None]:
        """Rebuilds state from a metadata scan. Consumers come back disconnected: their clients
        reconnect with the same ids, and a restart is invisible to them. Reliable topics need
        their WAL loaded (the `LoadWal` effects) before they serve; subscriptions resume at
        their persisted cursor + 1. Topics already present are left as they are."""
        present = set(self._topics)
        for key, value in sorted(entries.items()):
            parts = key.strip("/").split("/")
            if parts[0] == "namespaces" and len(parts) == 3 and parts[2] == "policy":
                self._namespaces[parts[1]] = _policies_from_json(value)
        for key, value in sorted(entries.items()):
            parts = key.strip("/").split("/")
            if parts[0] == "topics" and len(parts) == 4 and parts[3] == "delivery":
                topic = TopicName(parts[1], parts[2])
                if topic.namespace in self._namespaces and topic.full not in present:
                    self._topics[topic.full] = TopicRecord(
                        topic, DispatchStrategy.from_label(value)
                    )
        for key, value in sorted(entries.items()):
            parts = key.strip("/").split("/")
            record = self._topics.get(f"/{parts[1]}/{parts[2]}") if len(parts) > 3 else None
            if parts[0] != "topics" or record is None or record.name.full in present:
                continue
            if len(parts) == 4 and parts[3] == "policy":
                record.policies = settings_rules.stored_policies(value)
            elif len(parts) == 6 and parts[3] == "subscriptions":
                self._restore_setting(record, parts[4], parts[5], value)
        for key, value in sorted(entries.items()):
            parts = key.strip("/").split("/")
            if parts[0] != "topics" or len(parts) < 5:
                continue
            record = self._topics.get(f"/{parts[1]}/{parts[2]}")
            if record is None or record.name.full in present:
                continue
            if parts[3] == "producers" and len(parts) == 5:
                self._restore_producer(record, value)
            elif parts[3] == "subscriptions" and len(parts) == 5:
                cursor = entries.get(paths.cursor(record.name, parts[4]), -1)
                self._add_subscription(
                    record,
                    value["subscription_name"],
                    SubscriptionType(value["subscription_type"]),
                    cursor + 1,
                )
        consumers = []
        for key, value in entries.items():
            parts = key.strip("/").split("/")
            if parts[0] == "topics" and len(parts) == 7 and parts[5] == "consumers":
                record = self._topics.get(f"/{parts[1]}/{parts[2]}")
                if (
                    record is not None
                    and record.name.full not in present
                    and parts[4] in record.subscriptions
                ):
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
        for key, value in sorted(entries.items()):
            parts = key.strip("/").split("/")
            if parts[:2] != ["storage", "topics"] or len(parts) != 6 or parts[4] != "segments":
                continue
            record = self._topics.get(f"/{parts[2]}/{parts[3]}")
            if (
                record is not None
                and record.name.full not in present
                and tier_layout.index_start(parts[5]) is not None
            ):
                try:
                    record.index.append(IndexEntry.from_json(value))
                except IndexFormatError:
                    continue  # the uploader's recovery reports what is missing
        loads = tuple(
            LoadWal(t, fresh=False)
            for t, r in self._topics.items()
            if r.reliable and t not in present
        )
        return Step(None, loads)

    @staticmethod
    def _restore_setting(record: TopicRecord, sub: str, kind: str, value: Any) -> None:
        """A stored setting that no longer validates (written by another version) is left
        out: the subscription runs with the broker's defaults rather than not at all."""
        settings = record.settings.setdefault(sub, SubscriptionSettings())
        try:
            if kind == "failure_policy" and isinstance(value, Mapping):
                settings.failure = SubscriptionFailureSettings.from_json(value)
            elif kind == "dispatch_config" and isinstance(value, Mapping):
                settings.max_unacked_messages = settings_rules.check_window(
                    int(value["max_unacked_messages"])
                )
        except (DanubeError, KeyError, ValueError, TypeError):
            pass
        if settings.empty:
            del record.settings[sub]

    def _restore_producer(self, record: TopicRecord, value: Mapping[str, Any]) -> None:
        producer = ProducerRecord(
            value["producer_id"], value["producer_name"], record.name, value["access_mode"]
        )
        self._producers[producer.producer_id] = producer
        record.producers[producer.name] = producer.producer_id

    # -- ownership (cluster mode, spec/cluster.md "Topic moves") --------------------------------

    def adopt(self, entries: Mapping[str, Any], *, keep_local: bool, epoch: int) -> Step[None]:
        """Starts serving the topics of a metadata read: a topic this broker has just
        claimed, under the claim of revision `epoch`. `keep_local` False discards a WAL
        directory an earlier ownership left here: another broker has written the topic since,
        so the history continues from the object index and the old directory holds nothing
        that is still the topic's."""
        step = self.restore(entries)
        loads: list[Effect] = []
        for effect in step.effects:
            if isinstance(effect, LoadWal):
                self._topics[effect.topic].epoch = epoch
                effect = LoadWal(effect.topic, fresh=not keep_local)
            loads.append(effect)
        return Step(None, tuple(loads))

    def serves(self, topic: str) -> bool:
        """The topic is loaded here and not on its way out."""
        record = self._topics.get(topic)
        return record is not None and not record.unloading

    def unload(self, topic: str, now_ms: int) -> Step[None]:
        """First half of a move: refuse publishes and new clients, persist every cursor that
        moved and seal the WAL, so that the tiered uploader puts the tail in an object. The
        driver waits for `settled` and the metadata, then calls `remove`."""
        record = self._topics.get(topic)
        if record is None or record.unloading:
            return Step(None)
        record.unloading = True
        effects: list[Effect] = []
        if record.wal is not None:
            effects.extend(self._wal_effects(record, record.wal.seal(now_ms), now_ms))
        if record.reliable:
            for sub in record.subscriptions.values():
                effects.extend(self._dispatch(record, sub, sub.reliable.flush(now_ms), now_ms))
        return Step(None, tuple(effects))

    def settled(self, topic: str) -> bool:
        """An unloading topic's WAL is idle and every sealed segment is indexed (or the
        topic is stopped and can do neither)."""
        record = self._topics.get(topic)
        if record is None or record.stopped is not None:
            return True
        if record.wal is not None and not record.wal.idle:
            return False
        return record.uploader is None or record.uploader.idle

    def remove(self, topic: str, *, reason: str, delete_files: bool) -> Step[None]:
        """The topic leaves this broker without touching its metadata: after `unload`
        settled (`delete_files`: the objects hold everything), or at once when the broker
        lost its ownership (its files stay: they may hold the only copy of a tail)."""
        record = self._topics.get(topic)
        if record is None:
            return Step(None)
        for producer_id in record.producers.values():
            self._departed[producer_id] = topic
        while len(self._departed) > MAX_DEPARTED_PRODUCERS:
            del self._departed[next(iter(self._departed))]
        return Step(None, tuple(self._forget(record, reason, delete_files)))

    def namespace_seen(self, name: str, policies: Mapping[str, Any] | None) -> None:
        """Cluster mode: another broker created (policies) or deleted (None) a namespace."""
        if policies is None:
            self._namespaces.pop(name, None)
        else:
            self._namespaces[name] = _policies_from_json(policies)

    def topic_records(self) -> list[TopicRecord]:
        """Every topic record this broker holds, by name, for read-only views
        (`danube.node.stats`); callers must not change them."""
        return [self._topics[name] for name in sorted(self._topics)]

    def consumer_record(self, consumer_id: int) -> ConsumerRecord | None:
        """A consumer's record (read-only), None when it is gone."""
        return self._consumers.get(consumer_id)

    def served_topics(self) -> list[str]:
        return sorted(self._topics)

    def bootstrap(self, namespaces: Iterable[str]) -> Step[None]:
        """Creates the configured namespaces that do not exist yet (`default` always)."""
        wanted = [validate_namespace(n) for n in dict.fromkeys(["default", *namespaces])]
        puts = []
        for namespace in wanted:
            if namespace not in self._namespaces:
                self._namespaces[namespace] = self._default_policies
                puts.append(
                    (paths.namespace_policy(namespace), policies_to_json(self._default_policies))
                )
        return Step(None, (PersistMeta(puts=tuple(puts)),) if puts else ())

    # -- namespaces and topics ----------------------------------------------------------------

    def namespaces(self) -> list[str]:
        return sorted(self._namespaces)

    def create_namespace(self, name: str) -> Step[None]:
        validate_namespace(name)
        if name in self._namespaces:
            raise DanubeError(ErrorCode.ALREADY_EXISTS, f"namespace {quoted(name)} already exists")
        self._namespaces[name] = self._default_policies
        put = (paths.namespace_policy(name), policies_to_json(self._default_policies))
        return Step(None, (PersistMeta(puts=(put,)),))

    def delete_namespace(self, name: str) -> Step[None]:
        self._require_namespace(name)
        topics = self.topics(name)
        if topics:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"namespace {quoted(name)} still has {len(topics)} topic(s); delete them first",
            )
        del self._namespaces[name]
        return Step(None, (PersistMeta(delete_prefixes=(paths.namespace_prefix(name),)),))

    def namespace_policies(self, name: str) -> dict[str, int]:
        return policies_to_json(self._require_namespace(name))

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
        names = partition_names(base, partitions)
        existing = [n.full for n in names if n.full in self._topics]
        if existing:
            raise DanubeError(ErrorCode.ALREADY_EXISTS, f"topic {existing[0]} already exists")
        self._require_namespace(names[0].namespace)
        self._check_partition_conflicts(names[0])
        effects: list[Effect] = []
        for name in names:
            effects.extend(self._create_topic(name, strategy))
        return Step(None, tuple(effects))

    def delete_topic(self, topic: str) -> Step[None]:
        """Deletes a topic, or every partition when given a partitioned topic's base name.
        Its producers and consumers are forgotten (health checks answer CLOSE) and open
        receive streams end."""
        partition = parse_topic(topic).partition_of
        if partition is not None:
            raise invalid(
                f"{topic} is a partition of {partition[0]}: delete the partitioned topic by "
                f"its base name {partition[0]} (as Danube, partitions go together)"
            )
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
                # the object index too: a topic created again under this name starts empty
                delete_prefixes=(
                    paths.topic_prefix(record.name),
                    tier_layout.index_prefix(record.name),
                ),
            )
        ]
        effects.extend(
            self._forget(record, f"topic {record.name.full} was deleted", True, objects=True)
        )
        return effects

    def _forget(
        self, record: TopicRecord, reason: str, delete_files: bool, *, objects: bool = False
    ) -> list[Effect]:
        """Removes the topic from memory: its producers and consumers are unknown from now on
        (health checks answer CLOSE) and open receive streams end."""
        effects: list[Effect] = []
        for producer_id in record.producers.values():
            del self._producers[producer_id]
        for sub in record.subscriptions.values():
            for consumer_id in sub.consumers.values():
                consumer = self._consumers.pop(consumer_id)
                self._outbox.pop(consumer_id, None)
                if consumer.stream:
                    effects.append(EndStream(consumer_id, consumer.stream))
        del self._topics[record.name.full]
        if record.reliable:
            effects.append(DropWal(record.name.full, reason, delete_files, objects))
        return effects

    def _create_topic(self, name: TopicName, strategy: DispatchStrategy) -> tuple[Effect, ...]:
        self._require_namespace(name.namespace)
        self._check_partition_conflicts(name)
        record = TopicRecord(name, strategy)
        self._topics[name.full] = record
        persist = PersistMeta(
            puts=(
                (paths.namespace_topic(name), None),
                (paths.topic_delivery(name), strategy.label),
            )
        )
        if record.reliable:
            return (persist, LoadWal(name.full, fresh=True))
        return (persist,)

    def _check_partition_conflicts(self, name: TopicName) -> None:
        partition = name.partition_of
        check_partition_conflict(
            name,
            base_exists=partition is not None and partition[0] in self._topics,
            partitioned=partition is None and bool(self.partitions(name.full)),
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

    # -- operator settings (admin API; rules in danube.node.settings) -------------------------

    def _policies(self, record: TopicRecord) -> Policies:
        """The limits in force: the namespace's as they are now (Danube snapshots them when
        the topic loads), with the topic's own over them."""
        return settings_rules.with_overrides(
            self._namespaces[record.name.namespace], record.policies
        )

    def set_namespace_policies(self, name: str, changes: Mapping[str, Any]) -> Step[dict]:
        """Changes the named fields; they apply at once to every topic of the namespace that
        does not set them itself. Limits already exceeded are not enforced backwards: a topic
        over a lowered limit keeps its producers and consumers and takes no new ones."""
        checked = settings_rules.policy_changes(changes)
        policies = dataclasses.replace(self._require_namespace(name), **checked)
        self._namespaces[name] = policies
        value = policies_to_json(policies)
        return Step(value, (PersistMeta(puts=((paths.namespace_policy(name), value),)),))

    def topic_policies(self, topic: str) -> tuple[dict[str, int], list[str]]:
        """The policies in force for the topic, and the fields it sets itself."""
        record = self._topic(topic)
        return policies_to_json(self._policies(record)), sorted(record.policies)

    def set_topic_policies(self, topic: str, changes: Mapping[str, Any]) -> Step[dict]:
        record = self._topic(topic)
        record.policies = {**record.policies, **settings_rules.policy_changes(changes)}
        put = (paths.topic_policy(record.name), dict(record.policies))
        return Step(policies_to_json(self._policies(record)), (PersistMeta(puts=(put,)),))

    def clear_topic_policies(self, topic: str) -> Step[dict]:
        record = self._topic(topic)
        record.policies = {}
        delete = PersistMeta(deletes=(paths.topic_policy(record.name),))
        return Step(policies_to_json(self._policies(record)), (delete,))

    def _reliable_topic(self, topic: str, what: str) -> TopicRecord:
        record = self._topic(topic)
        if not record.reliable:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"{topic} is non-reliable: {what} applies to reliable topics only",
            )
        return record

    def subscription_type(self, topic: str, subscription: str) -> SubscriptionType | None:
        sub = self._topic(topic).subscriptions.get(subscription)
        return sub.sub_type if sub is not None else None

    def failure_policy(self, topic: str, subscription: str) -> SubscriptionFailureSettings | None:
        """The subscription's own policy; None when it runs with the broker's defaults."""
        settings = self._topic(topic).settings.get(subscription)
        return settings.failure if settings is not None else None

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
        record = self._reliable_topic(topic, "a failure policy")
        self._check_subscription_name(subscription)
        record.settings.setdefault(subscription, SubscriptionSettings()).failure = policy
        stored = (paths.failure_policy(record.name, subscription), policy.to_json())
        return self._configure(record, subscription, stored, now_ms, policy=policy.dispatch_policy)

    def dispatch_window(self, topic: str, subscription: str) -> int | None:
        """The subscription's own `max_unacked_messages`; None when it uses the broker's."""
        settings = self._topic(topic).settings.get(subscription)
        return settings.max_unacked_messages if settings is not None else None

    def set_dispatch_window(
        self, topic: str, subscription: str, max_unacked_messages: int, *, now_ms: int = 0
    ) -> Step[None]:
        """Danube stores this and never reads it; here it is the subscription's window from
        now on."""
        record = self._reliable_topic(topic, "a dispatch config")
        self._check_subscription_name(subscription)
        window = settings_rules.check_window(max_unacked_messages)
        settings = record.settings.setdefault(subscription, SubscriptionSettings())
        settings.max_unacked_messages = window
        value = {"max_unacked_messages": window}
        stored = (paths.dispatch_config(record.name, subscription), value)
        return self._configure(record, subscription, stored, now_ms, max_unacked_messages=window)

    def _configure(
        self,
        record: TopicRecord,
        subscription: str,
        stored: tuple[str, Any],
        now_ms: int,
        **changes: Any,
    ) -> Step[None]:
        """Persists a subscription setting (the key and value in `stored`) and applies
        `changes` to the live subscription, if there is one yet."""
        effects: list[Effect] = [PersistMeta(puts=(stored,))]
        sub = record.subscriptions.get(subscription)
        if sub is not None:
            found = sub.reliable.configure(now_ms, **changes)
            effects.extend(self._dispatch(record, sub, found, now_ms))
        return Step(None, tuple(effects))

    def unsubscribe(self, topic: str, subscription: str) -> Step[None]:
        """Removes a subscription nobody is attached to, with its cursor, consumers and
        settings. A consumer with an open receive stream keeps it: close that consumer
        first. Consumers registered but not attached (their client went away) go with it;
        a client that comes back finds its consumer unknown and subscribes again."""
        record = self._topic(topic)
        self._check_subscription_name(subscription)
        sub = record.subscriptions.get(subscription)
        if sub is None:
            raise not_found(f"subscription {quoted(subscription)} does not exist on {topic}")
        attached = [
            self._consumers[c].name for c in sub.consumers.values() if self._consumers[c].stream
        ]
        if attached:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"subscription {quoted(subscription)} on {topic} has {len(attached)} attached "
                f"consumer(s) ({', '.join(sorted(attached))}); close them first",
            )
        for consumer_id in sub.consumers.values():
            del self._consumers[consumer_id]
            self._outbox.pop(consumer_id, None)
        del record.subscriptions[subscription]
        record.settings.pop(subscription, None)
        key = paths.subscription(record.name, subscription)
        return Step(None, (PersistMeta(deletes=(key,), delete_prefixes=(key + "/",)),))

    @staticmethod
    def _check_subscription_name(subscription: str) -> None:
        if (
            not subscription
            or too_long(subscription)
            or not _SUBSCRIPTION_NAME_RE.fullmatch(subscription)
        ):
            raise invalid(
                f"invalid subscription name {quoted(subscription)}: use letters, digits, '_', "
                f"'-' or '.' (1 to {MAX_NAME_LENGTH} bytes in UTF-8)"
            )

    def _require_namespace(self, namespace: str) -> Policies:
        policies = self._namespaces.get(namespace)
        if policies is None:
            raise not_found(
                f"namespace {quoted(namespace)} does not exist; create it first "
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
    ) -> Step[int]:
        """Idempotent per (topic, producer_name): a repeat returns the existing id. A
        producer's schema subject is the registry's business (`danube.broker.schema_gate`
        checks and binds it around this call), not the topic's life cycle."""
        name = parse_topic(topic)
        _check_label(producer_name, "producer_name")
        effects: list[Effect] = []
        record = self._topics.get(topic)
        if record is None:
            if self._clustered:
                raise DanubeError(
                    ErrorCode.UNAVAILABLE, f"{topic} is not served by this broker; look it up"
                )
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
        else:
            self._check_not_stopped(record)
            self._check_not_moving(record)
        existing = record.producers.get(producer_name)
        if existing is not None:
            return Step(existing, tuple(effects))
        limit = self._policies(record).max_producers_per_topic
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

    def publish_pace(self, topic: str, count: int, now_ms: int) -> int:
        """How long (ms) the driver holds `count` messages before publishing them, so the
        topic takes at most `max_publish_rate` messages a second after a burst of one
        second's worth (a GCRA: the debt is a clock running ahead of now). Holding the
        reply slows a producer down without an error, as Pulsar throttles (Danube only
        warns). More than MAX_PUBLISH_WAIT_MS of waiting is refused (RESOURCE_EXHAUSTED):
        the producer sends faster than the rate for too long. 0 for a topic without a rate
        or not served here (publish says why)."""
        record = self._topics.get(topic)
        rate = self._policies(record).max_publish_rate if record is not None else 0
        if record is None or not rate:
            return 0
        now_us = now_ms * 1000
        if record.rate_clock_rate != rate:
            # the messages owed were counted at the old rate: owe them at the new one
            owed_us = max(0, record.rate_clock_us - now_us)
            old = record.rate_clock_rate or rate
            record.rate_clock_us = now_us + owed_us * old // rate
            record.rate_clock_rate = rate
        start = max(record.rate_clock_us, now_us)
        behind_us = start - PUBLISH_BURST_US - now_us
        if behind_us > MAX_PUBLISH_WAIT_MS * 1000:
            raise DanubeError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"{topic} takes at most {rate} messages a second (max_publish_rate) and its "
                f"publishes are {behind_us // 1000} ms behind; slow down and retry",
            )
        record.rate_clock_us = start + -(-count * 1_000_000 // rate)
        # held until the last of them is within the rate: a batch waits for its own size,
        # for at most MAX_PUBLISH_WAIT_MS (a larger one leaves the rest owed by later ones)
        wait_us = record.rate_clock_us - PUBLISH_BURST_US - now_us
        return min(MAX_PUBLISH_WAIT_MS, max(0, -(-wait_us // 1000)))

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
        producer, record = self._publisher(producer_id, topic)
        limit = self._policies(record).max_message_size
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
            effects.extend(sub.dispatcher.publish(message, size, key))
        return Step(sequence, tuple(effects))

    def _publisher(self, producer_id: int, topic: str) -> tuple[ProducerRecord, TopicRecord]:
        producer = self._producers.get(producer_id)
        if producer is None and producer_id in self._departed:
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                f"{self._departed[producer_id]} moved to another broker; look it up and "
                "create the producer there",
            )
        if producer is None:
            raise not_found(
                f"producer {producer_id} does not exist on this broker; create the producer again"
            )
        if producer.topic.full != topic:
            raise invalid(
                f"producer {producer_id} belongs to {producer.topic.full}, not {quoted(topic)}"
            )
        record = self._topics[topic]
        self._check_not_moving(record)
        return producer, record

    def publish_batch(
        self, producer_id: int, topic: str, batch: batches.ClientBatch, *, now_ms: int
    ) -> Step[BatchPublished]:
        """Publishes a checked batch (`batches.check_batch`) as one frame and returns the
        offset of its first message; message i gets that offset + i. All or nothing: a
        refusal stores none of it. Reliable topics answer as `publish` does, once a
        `PublishAcked` covers the batch's last offset; non-reliable ones deliver each
        message now, numbered as `publish` numbers them."""
        _, record = self._publisher(producer_id, topic)
        limit = self._policies(record).max_message_size
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
            broker_addr=self.identity.broker_url,
        )
        if record.reliable:
            log = self._ready_wal(record)
            if log.queued_bytes > MAX_QUEUED_WAL_BYTES:
                raise DanubeError(
                    ErrorCode.UNAVAILABLE,
                    f"{topic} is writing {log.queued_bytes} bytes behind the disk; retry shortly",
                )
            first, effects = log.append_packed(stamp(first_offset=log.next_offset), now_ms)
            record.messages_in += batch.count
            record.bytes_in += batch.payload_bytes
            published = BatchPublished(first, batch.count, stored=True)
            return Step(published, tuple(self._wal_effects(record, effects, now_ms)))
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
                out.extend(sub.dispatcher.publish(message, size, key))
        return Step(BatchPublished(first, batch.count, stored=False), tuple(out))

    def _append(
        self,
        record: TopicRecord,
        size: int,
        encode: Callable[[int], bytes] | None,
        now_ms: int,
    ) -> Step[int]:
        if encode is None:
            raise ValueError("a reliable publish needs encode")
        log = self._ready_wal(record)
        if log.queued_bytes > MAX_QUEUED_WAL_BYTES:
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                f"{record.name.full} is writing {log.queued_bytes} bytes behind the disk; "
                "retry shortly",
            )
        offset = log.next_offset
        first, effects = log.append((encode(offset),), now_ms)
        assert first == offset
        record.messages_in += 1
        record.bytes_in += size
        return Step(offset, tuple(self._wal_effects(record, effects, now_ms)))

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
        *,
        now_ms: int = 0,
    ) -> Step[int]:
        """Returns the consumer id; the same name in the same subscription takes over its
        previous session (same id, old stream ended). `start` only matters for a subscription
        this call creates."""
        record = self._topic(topic)
        _check_label(consumer_name, "consumer_name")
        self._check_subscription_name(subscription)
        if sub_type not in SubscriptionType._value2member_map_:
            raise invalid(f"unknown subscription type {sub_type}; expected 0 to 3")
        kind = SubscriptionType(sub_type)
        if kind is not SubscriptionType.KEY_SHARED and key_filters:
            raise invalid("key_filters are only allowed on Key-Shared subscriptions")
        policies = self._policies(record)
        sub = record.subscriptions.get(subscription)
        effects: list[Effect] = []
        if sub is not None and sub.sub_type is not kind:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"subscription {quoted(subscription)} on {topic} is {sub.sub_type.name}; "
                f"cannot join it as {kind.name}",
            )
        self._check_not_stopped(record)
        self._check_not_moving(record)
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
            sub = self._add_subscription(record, subscription, kind, start_offset)
            value = {"subscription_name": subscription, "subscription_type": int(kind)}
            puts: list[tuple[str, Any]] = [(paths.subscription(record.name, subscription), value)]
            if record.reliable:
                # The dispatcher assumes start - 1 is durable (reliable.py, "Cursor"). The
                # stored cursor never names an offset not yet readable (a LATEST start during
                # a publish, say): recovery takes a stored cursor as proof that its offsets
                # were acknowledged (`recovery_evidence`), and a crash before that publish's
                # fsync would then stop a healthy topic as damaged.
                readable = self._ready_wal(record).readable_offset
                stored = min(start_offset, readable) - 1
                puts.append((paths.cursor(record.name, subscription), stored))
                if readable:
                    sub.reliable.readable(readable - 1, now_ms)  # nobody connected: no effects
            effects.append(PersistMeta(puts=tuple(puts)))
        self._subscribe_order += 1
        consumer = self._add_consumer(
            record,
            sub,
            self._new_id(self._consumers),
            consumer_name,
            key_filters,
            self._subscribe_order,
            now_ms,
        )
        effects.append(self._persist_consumer(consumer))
        if isinstance(sub.dispatcher, NonReliableSubscription):
            # A reliable consumer is connected by its receive stream, which its messages need.
            effects.extend(sub.dispatcher.connect(consumer.consumer_id))
        return Step(consumer.consumer_id, tuple(effects))

    def _start_offset(self, record: TopicRecord, start: StartPosition) -> int:
        log = self._ready_wal(record)
        if start.kind is StartKind.LATEST:
            return log.next_offset
        earliest = log.first_offset
        if record.uploader is not None and record.uploader.entries:
            earliest = min(earliest, record.uploader.entries[0].start_offset)
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
        consumer = self._consumers.pop(consumer_id)
        del sub.consumers[consumer.name]
        self._outbox.pop(consumer_id, None)
        effects: list[Effect] = []
        if isinstance(sub.dispatcher, NonReliableSubscription):
            effects.extend(sub.dispatcher.remove_consumer(consumer_id))
        else:
            effects.extend(
                self._dispatch(
                    record, sub, sub.dispatcher.remove_consumer(consumer_id, now_ms), now_ms
                )
            )
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
        consumer = self._consumers[consumer_id]
        effects: list[Effect] = []
        if consumer.stream:
            effects.append(EndStream(consumer_id, consumer.stream))
            consumer.stream = 0
            if not isinstance(sub.dispatcher, NonReliableSubscription):
                effects.extend(self._disconnect_reliable(record, sub, consumer_id, now_ms))
        if key_filters != consumer.key_filters:
            consumer.key_filters = key_filters
            effects.append(self._persist_consumer(consumer))
            if isinstance(sub.dispatcher, NonReliableSubscription):
                effects.extend(sub.dispatcher.set_filters(consumer_id, key_filters))
            else:
                effects.extend(
                    self._dispatch(
                        record,
                        sub,
                        sub.dispatcher.set_filters(consumer_id, key_filters, now_ms),
                        now_ms,
                    )
                )
        if isinstance(sub.dispatcher, NonReliableSubscription):
            effects.extend(sub.dispatcher.connect(consumer_id))
        return Step(consumer_id, tuple(effects))

    def _disconnect_reliable(
        self, record: TopicRecord, sub: SubscriptionRecord, consumer_id: int, now_ms: int
    ) -> list[Effect]:
        """What the consumer's stream had not sent is in flight to it and goes out again."""
        self._outbox.pop(consumer_id, None)
        return self._dispatch(record, sub, sub.reliable.disconnect(consumer_id, now_ms), now_ms)

    def _add_subscription(
        self, record: TopicRecord, name: str, kind: SubscriptionType, start_offset: int
    ) -> SubscriptionRecord:
        dispatcher: NonReliableSubscription | rd.ReliableSubscription
        if record.reliable:
            settings = record.settings.get(name) or SubscriptionSettings()
            dispatcher = rd.ReliableSubscription(
                kind,
                max(start_offset, 0),
                max_unacked_messages=settings.max_unacked_messages or self._max_unacked,
                policy=settings.failure.dispatch_policy if settings.failure else rd.DEFAULT_POLICY,
            )
            dispatcher.dispatch_rate = self._policies(record).max_subscription_dispatch_rate
        else:
            dispatcher = NonReliableSubscription(kind, self._queue_limits)
        sub = SubscriptionRecord(name, kind, dispatcher)
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
        now_ms: int = 0,
    ) -> ConsumerRecord:
        consumer = ConsumerRecord(consumer_id, name, record.name, sub.name, key_filters, order)
        self._consumers[consumer_id] = consumer
        sub.consumers[name] = consumer_id
        if isinstance(sub.dispatcher, NonReliableSubscription):
            sub.dispatcher.add_consumer(consumer_id, name, key_filters)
        else:
            # A new consumer is disconnected: nothing to dispatch yet.
            sub.dispatcher.add_consumer(consumer_id, name, key_filters, now_ms)
        return consumer

    def open_stream(self, consumer_id: int, *, now_ms: int = 0) -> Step[int]:
        """Starts a receive stream; a previous stream of the same consumer ends (takeover;
        on a reliable topic what it had in flight goes out again)."""
        consumer = self._consumer(consumer_id)
        record = self._topics[consumer.topic.full]
        sub = record.subscriptions[consumer.subscription]
        effects: list[Effect] = []
        if consumer.stream:
            effects.append(EndStream(consumer_id, consumer.stream))
        self._stream_generations += 1
        consumer.stream = self._stream_generations
        if isinstance(sub.dispatcher, NonReliableSubscription):
            effects.extend(sub.dispatcher.connect(consumer_id))
        else:
            effects.extend(self._disconnect_reliable(record, sub, consumer_id, now_ms))
            connected = sub.dispatcher.connect(consumer_id, now_ms)
            effects.extend(self._dispatch(record, sub, connected, now_ms))
        return Step(consumer.stream, tuple(effects))

    def close_stream(self, consumer_id: int, generation: int, *, now_ms: int = 0) -> Step[None]:
        """The stream of this generation ended; if it was the consumer's current one, the
        consumer is disconnected (a Failover standby takes over; on a reliable topic its
        unacknowledged messages go out again)."""
        consumer = self._consumers.get(consumer_id)
        if consumer is None or not generation or consumer.stream != generation:
            return Step(None)
        consumer.stream = 0
        record = self._topics[consumer.topic.full]
        sub = record.subscriptions[consumer.subscription]
        if isinstance(sub.dispatcher, NonReliableSubscription):
            return Step(None, tuple(sub.dispatcher.disconnect(consumer_id)))
        return Step(None, tuple(self._disconnect_reliable(record, sub, consumer_id, now_ms)))

    def take(self, consumer_id: int, generation: int, limit: int) -> list[Any] | None:
        """Messages for the stream writer (reliable topics: stored records, as bytes); None
        when this stream is no longer current."""
        consumer = self._consumers.get(consumer_id)
        if consumer is None or not generation or consumer.stream != generation:
            return None
        dispatcher = self._subscription_of(consumer).dispatcher
        if isinstance(dispatcher, NonReliableSubscription):
            return dispatcher.take(consumer_id, limit)
        box = self._outbox.get(consumer_id)
        if not box:
            return []
        return [box.popleft() for _ in range(min(limit, len(box)))]

    def consumer_healthy(self, consumer_id: int) -> bool:
        """Known consumers are healthy even while their stream is down: the official clients
        answer CLOSE by discarding the next message and re-subscribing, which a consumer that
        only needs to reopen its stream (after a broker restart, say) should not do."""
        return consumer_id in self._consumers

    def ack(self, topic: str, subscription: str, offset: int, *, now_ms: int = 0) -> Step[None]:
        """Acknowledges an offset of a reliable subscription (matched by offset alone, as
        Danube; a late, repeated or unknown ack is ignored). Non-reliable topics only check
        that the target exists."""
        record, sub = self._ack_target(topic, subscription)
        if isinstance(sub.dispatcher, NonReliableSubscription):
            return Step(None)
        effects = sub.dispatcher.ack(offset, now_ms)
        if not sub.dispatcher.is_pending(offset):
            sub.records.pop(offset, None)
        return Step(None, tuple(self._dispatch(record, sub, effects, now_ms)))

    def ack_many(
        self, topic: str, subscription: str, offsets: Iterable[int], *, now_ms: int = 0
    ) -> Step[None]:
        """`ack` of each offset, in one step (the batched path's AckBatch)."""
        record, sub = self._ack_target(topic, subscription)
        if isinstance(sub.dispatcher, NonReliableSubscription):
            return Step(None)
        dispatcher = sub.dispatcher
        effects: list[rd.Effect] = []
        for offset in offsets:
            effects.extend(dispatcher.ack(offset, now_ms))
            if not dispatcher.is_pending(offset):
                sub.records.pop(offset, None)
        return Step(None, tuple(self._dispatch(record, sub, effects, now_ms)))

    def nack(
        self,
        topic: str,
        subscription: str,
        offset: int,
        delay_ms: int | None,
        *,
        now_ms: int = 0,
    ) -> Step[None]:
        """Redelivers the offset after `delay_ms` or the failure policy's delay."""
        record, sub = self._ack_target(topic, subscription)
        if isinstance(sub.dispatcher, NonReliableSubscription):
            return Step(None)
        effects = sub.dispatcher.nack(offset, delay_ms, now_ms)
        return Step(None, tuple(self._dispatch(record, sub, effects, now_ms)))

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
        record = self._topic(topic)
        self._check_not_moving(record)
        sub = record.subscriptions.get(subscription)
        if sub is None:
            raise not_found(f"subscription {subscription!r} does not exist on {topic}")
        return record, sub

    # -- reliable topics: WAL and dispatch ------------------------------------------------------

    def wal_syncs_every_write(self, topic: str) -> bool:
        """Whether the topic's WAL driver must fsync every write before reporting it done
        (`WalConfig.synced_writes`, for every level but `flush`)."""
        level = self._durability.level(topic, self._wal_config.durability)
        return self._wal_config.synced_writes and level != wal.Durability.FLUSH.value

    def recovery_evidence(self, topic: str) -> tuple[int, int]:
        """(acknowledged end, indexed end) of a reliable topic, for WAL recovery
        (`danube.wal.recovery.RecoveryEvidence`): one past the highest subscription cursor
        (0 in `flush` mode, where a consumer may acknowledge what a power failure loses, and in
        cluster mode, where a failover gives up the acknowledged offsets beyond the index,
        spec/durability.md "Losing a broker") and one past the object index's last offset.
        Both are durable records of how far the log reached: a log that recovers to less lost
        durable data."""
        record = self._topics.get(topic)
        if record is None:
            return 0, 0
        indexed = max((e.next_offset for e in record.index), default=0)
        if record.uploader is not None:
            indexed = max([indexed, *(e.next_offset for e in record.uploader.entries)])
        level = self._durability.level(topic, self._wal_config.durability)
        if level == wal.Durability.FLUSH.value or self._clustered:
            return 0, indexed
        cursors = [
            sub.dispatcher.cursor
            for sub in record.subscriptions.values()
            if isinstance(sub.dispatcher, rd.ReliableSubscription)
        ]
        acknowledged = max(cursors, default=-1) + 1
        if record.wal is not None:
            # A repair in a running broker: a live cursor may sit where a subscription
            # started (LATEST during a publish), past what any fsync covered; only what was
            # durable can have been acknowledged.
            acknowledged = min(acknowledged, record.wal.durable_offset)
        return acknowledged, indexed

    def wal_durable_end(self, topic: str) -> int | None:
        """Every offset of the topic below this is covered by a completed fsync (the WAL
        checkpoint's value); None while the topic has no working WAL."""
        record = self._topics.get(topic)
        if record is None or record.wal is None or record.wal.failure is not None:
            return None
        return record.wal.durable_offset

    def wal_loaded(self, topic: str, plan: RecoveryPlan, *, now_ms: int) -> Step[None]:
        """The topic's WAL was recovered: at start, or after a repair. A repair cuts only
        records nobody could read (`fsync` mode), so dispatch carries on where it was; only
        when it cut records a subscription had read (`flush` mode) does that subscription
        restart at its cursor + 1, as after a broker restart."""
        record = self._topics.get(topic)
        if record is None or record.stopped is not None:
            return Step(None)
        tiered = self._uploads is not None
        indexed_next = max((e.next_offset for e in record.index), default=0)
        level = self._durability.level(topic, self._wal_config.durability)
        record.object_ack = level == OBJECT_DURABILITY
        mode = wal.Durability.FLUSH if level == wal.Durability.FLUSH.value else wal.Durability.FSYNC
        config = dataclasses.replace(
            self._wal_config, durability=mode, synced_writes=self.wal_syncs_every_write(topic)
        )
        log = record.wal = wal.WalMachine(
            topic, config, plan, tiered=tiered, start_offset=indexed_next
        )
        effects: list[Effect] = []
        if self._uploads is not None and record.uploader is None:
            record.uploader = tier.Uploader(record.name, self._uploads, record.epoch)
            self._uploaders += 1
            record.uploader_id = self._uploaders
            sealed = [
                tier.SealedSegment(s.base_offset, s.next_offset, s.size) for s in plan.segments
            ]
            index, record.index = record.index, []
            record.sealed_through = max(
                [indexed_next, *(s.next_offset for s in plan.segments)], default=0
            )
            effects.extend(
                self._tier_effects(record, record.uploader.recovered(index, sealed, now_ms))
            )
        elif record.uploader is not None:
            # A repair: recovery closed the segment that was open. Tell the uploader about
            # every local segment it has not heard of, and release the indexed ones again.
            uploader = record.uploader
            indexed = {entry.start_offset for entry in uploader.entries}
            for found in plan.segments:
                if found.base_offset in indexed:
                    log.allow_delete(found.base_offset)
                elif found.base_offset >= record.sealed_through:
                    sealed = uploader.segment_sealed(
                        found.base_offset, found.next_offset, found.size, now_ms
                    )
                    effects.extend(self._tier_effects(record, sealed))
                    record.sealed_through = found.next_offset
        for sub in record.subscriptions.values():
            if record.loaded and log.readable_offset < sub.reliable.read_position:
                self._rebuild(sub, now_ms)
            elif sub.read_lost:
                # its read was dropped while the WAL was down: an empty answer asks again
                sub.read_lost = False
                retry = sub.reliable.records_read((), now_ms)
                effects.extend(self._dispatch(record, sub, retry, now_ms))
            if log.readable_offset:
                readable = sub.reliable.readable(log.readable_offset - 1, now_ms)
                effects.extend(self._dispatch(record, sub, readable, now_ms))
        record.loaded = True
        return Step(None, tuple(effects))

    def _rebuild(self, sub: SubscriptionRecord, now_ms: int) -> None:
        old = sub.reliable
        fresh = rd.ReliableSubscription(
            sub.sub_type,
            old.cursor + 1,
            max_unacked_messages=old.max_unacked_messages,
            cursor_flush_ms=old.cursor_flush_ms,
            policy=old.policy,
        )
        fresh.redelivered = old.redelivered
        fresh.dispatch_rate = old.dispatch_rate
        sub.dispatcher, sub.records = fresh, {}
        sub.epoch += 1
        sub.read_lost = False
        members = sorted((self._consumers[c] for c in sub.consumers.values()), key=_order)
        for consumer in members:
            self._outbox.pop(consumer.consumer_id, None)
            fresh.add_consumer(consumer.consumer_id, consumer.name, consumer.key_filters, now_ms)
            if consumer.stream:
                fresh.connect(consumer.consumer_id, now_ms)

    def wal_load_failed(self, topic: str, reason: str) -> Step[None]:
        """Recovery refused the topic's segments (corruption) or the disk failed: the topic
        stops until an operator acts; other topics are not affected."""
        record = self._topics.get(topic)
        if record is None:
            return Step(None)
        record.wal = None
        record.stopped = reason
        return Step(None, (TopicStopped(topic, reason),))

    def wal_io_done(
        self, topic: str, effect: wal.Effect, error: str | None, *, now_ms: int
    ) -> Step[None]:
        """A file effect of `WalIo` finished (`error` None) or failed."""
        record = self._topics.get(topic)
        if record is None or record.wal is None:
            return Step(None)
        log = record.wal
        effects: list[wal.Effect] = []
        if isinstance(effect, wal.Write):
            if error is None:
                effects = log.write_done(effect.write_id, now_ms)
            else:
                effects = log.write_failed(effect.write_id, error)
        elif isinstance(effect, wal.Fsync):
            if error is None:
                effects = log.fsync_done(effect.fsync_id, now_ms)
            else:
                effects = log.fsync_failed(effect.fsync_id, error)
        # A failed CreateSegment fails the segment's first Write; a failed close or delete
        # of a closed segment leaves its data intact (the driver logs it).
        return Step(None, tuple(self._wal_effects(record, effects, now_ms)))

    def wal_read_done(
        self, read: ReadWal | ReadObject, records: tuple[bytes, ...], *, now_ms: int
    ) -> Step[None]:
        record, sub = self._read_target(read)
        if sub is None:
            return Step(None)
        assert record is not None
        admitted = self._admit(record, sub, read.plan.from_offset, records, now_ms)
        return Step(None, tuple(self._dispatch(record, sub, admitted, now_ms)))

    def wal_read_failed(
        self, read: ReadWal | ReadObject, reason: str, *, missing: bool, now_ms: int
    ) -> Step[None]:
        """`missing`: retention deleted the file meanwhile, so the read is planned again.
        Anything else (a frame that no longer verifies, a failing disk) stops the topic."""
        record, sub = self._read_target(read)
        if sub is None:
            return Step(None)
        assert record is not None
        if missing:
            plan = read.plan
            again = rd.Read(plan.from_offset, max(plan.end_offset - plan.from_offset, 1))
            return Step(None, tuple(self._dispatch(record, sub, [again], now_ms)))
        return Step(None, tuple(self._stop(record, reason)))

    def _read_target(
        self, read: ReadWal | ReadObject
    ) -> tuple[TopicRecord | None, SubscriptionRecord | None]:
        record = self._topics.get(read.topic)
        if record is None:
            return None, None
        sub = record.subscriptions.get(read.subscription)
        if sub is None or sub.epoch != read.epoch:
            return None, None
        if record.wal is None:
            sub.read_lost = True
            return None, None
        return record, sub

    def _stop(self, record: TopicRecord, reason: str) -> list[Effect]:
        record.wal = None
        record.stopped = reason
        return [TopicStopped(record.name.full, reason)]

    def tick(self, now_ms: int) -> Step[None]:
        """Time passes: WAL flushes, rotation and retention; ack deadlines, redeliveries and
        cursor flushes of reliable subscriptions."""
        effects: list[Effect] = []
        batch = self._durability.object_batch_ms
        for record in self._topics.values():
            if record.wal is None:
                continue
            effects.extend(self._wal_effects(record, record.wal.tick(now_ms), now_ms))
            since = record.ack_batch_since
            if since is not None and now_ms - since >= batch:
                # Seal the segment holding the waiting publishes: its upload answers them.
                record.ack_batch_since = None
                if record.durable_through >= record.sealed_through:
                    effects.extend(self._wal_effects(record, record.wal.seal(now_ms), now_ms))
            uploader = record.uploader
            if uploader is not None:
                due = uploader.next_timer_ms
                if due is not None and due <= now_ms:
                    effects.extend(self._tier_effects(record, uploader.tick(now_ms)))
            rate = self._policies(record).max_subscription_dispatch_rate
            for sub in record.subscriptions.values():
                if sub.reliable.dispatch_rate != rate:
                    # a policy changed (here or, in a cluster, through another broker)
                    found = sub.reliable.configure(now_ms, dispatch_rate=rate)
                    effects.extend(self._dispatch(record, sub, found, now_ms))
                due = sub.reliable.next_timer_ms
                if due is not None and due <= now_ms:
                    effects.extend(self._dispatch(record, sub, sub.reliable.tick(now_ms), now_ms))
        return Step(None, tuple(effects))

    def quiesce(self, now_ms: int) -> Step[None]:
        """Graceful shutdown: persists every reliable cursor that moved since it was last
        persisted (so a restart redelivers as little as possible) and seals every WAL; the
        driver then waits until `wal_busy` is false."""
        effects: list[Effect] = []
        for record in self._topics.values():
            if record.wal is None:
                continue
            effects.extend(self._wal_effects(record, record.wal.seal(now_ms), now_ms))
            for sub in record.subscriptions.values():
                effects.extend(self._dispatch(record, sub, sub.reliable.flush(now_ms), now_ms))
        return Step(None, tuple(effects))

    def wal_busy(self) -> bool:
        """Some WAL still has appends or I/O under way (shutdown waits for them)."""
        return any(r.wal is not None and not r.wal.idle for r in self._topics.values())

    def _ready_wal(self, record: TopicRecord) -> wal.WalMachine:
        self._check_not_stopped(record)
        if record.wal is None:
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                f"{record.name.full} is loading its write-ahead log; retry shortly",
            )
        return record.wal

    @staticmethod
    def _check_not_moving(record: TopicRecord) -> None:
        if record.unloading:
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                f"{record.name.full} is moving to another broker; look it up again",
            )

    @staticmethod
    def _check_not_stopped(record: TopicRecord) -> None:
        if record.stopped is not None:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"topic {record.name.full} is stopped: {record.stopped}",
            )

    def _wal_effects(
        self, record: TopicRecord, effects: Iterable[wal.Effect], now_ms: int
    ) -> list[Effect]:
        """Turns the WAL machine's effects into the core's: file I/O for the driver,
        acknowledgements for waiting publishes, new records for every subscription."""
        topic = record.name.full
        out: list[Effect] = []
        io: list[wal.Effect] = []
        for effect in effects:
            if isinstance(effect, _FILE_EFFECTS):
                io.append(effect)
                if isinstance(effect, wal.CloseSegment) and record.uploader is not None:
                    assert record.wal is not None
                    next_offset, size = record.wal.segment_extent(effect.segment_base)
                    sealed = record.uploader.segment_sealed(
                        effect.segment_base, next_offset, size, now_ms
                    )
                    record.sealed_through = next_offset
                    out.extend(self._tier_effects(record, sealed))
            elif isinstance(effect, wal.Acknowledge):
                if not record.object_ack:
                    out.append(PublishAcked(topic, effect.through_offset))
                else:
                    record.durable_through = max(record.durable_through, effect.through_offset)
                    if record.ack_batch_since is None:
                        record.ack_batch_since = now_ms
            elif isinstance(effect, wal.Readable):
                for sub in record.subscriptions.values():
                    readable = sub.reliable.readable(effect.through_offset, now_ms)
                    out.extend(self._dispatch(record, sub, readable, now_ms))
            elif isinstance(effect, wal.Failed):
                record.wal = None
                out.append(PublishFailed(topic, effect.unacknowledged_from, effect.reason))
                out.append(RepairWal(topic, effect.segment_base, effect.truncate_to))
        if io:
            out.insert(0, WalIo(topic, tuple(io)))
        return out

    def _dispatch(
        self,
        record: TopicRecord,
        sub: SubscriptionRecord,
        effects: Iterable[rd.Effect],
        now_ms: int,
    ) -> list[Effect]:
        """Carries out a reliable subscription's effects: reads served from the WAL cache
        are fed straight back (and may deliver), file reads go to the driver, deliveries
        queue the records for the consumer's stream, cursor moves are persisted."""
        out: list[Effect] = []
        work = deque(effects)
        dispatcher = sub.reliable
        while work:
            effect = work.popleft()
            if isinstance(effect, rd.Deliver):
                box = self._outbox.setdefault(effect.consumer_id, deque())
                if not box:
                    out.append(ConsumerReady(effect.consumer_id))
                box.extend(sub.records[offset] for offset in effect.offsets)
            elif isinstance(effect, rd.PersistCursor):
                key = paths.cursor(record.name, sub.name)
                out.append(PersistMeta(puts=((key, effect.cursor),)))
            elif record.wal is None:
                sub.read_lost = True
            else:
                result = record.wal.read(effect.from_offset, effect.max_records, READ_MAX_BYTES)
                if isinstance(result, wal.CachedRecords):
                    work.extend(self._admit(record, sub, result.offset, result.records, now_ms))
                elif isinstance(result, wal.FileRead):
                    out.append(ReadWal(record.name.full, sub.name, sub.epoch, result))
                else:
                    planned = self._plan_history(record, effect, result.first_offset)
                    if isinstance(planned, tier_reader.ObjectRead):
                        out.append(ReadObject(record.name.full, sub.name, sub.epoch, planned))
                    else:
                        lost = (dispatcher.read_position, planned.first_offset)
                        work.extend(dispatcher.records_lost(planned.first_offset, now_ms))
                        out.append(RetentionSkipped(record.name.full, sub.name, *lost))
        return out

    def _plan_history(
        self, record: TopicRecord, read: rd.Read, wal_first: int
    ) -> tier_reader.ObjectRead | tier_reader.NotAvailable:
        """A read below the local WAL: from objects when the index has it."""
        if record.uploader is None:
            return tier_reader.NotAvailable(wal_first)
        planned = tier_reader.plan_read(
            record.uploader.entries, wal_first, read.from_offset, read.max_records, READ_MAX_BYTES
        )
        assert not isinstance(planned, tier_reader.LocalRead), "below the WAL's first offset"
        return planned

    def _tier_effects(self, record: TopicRecord, effects: Iterable[tier.Effect]) -> list[Effect]:
        out: list[Effect] = []
        topic = record.name.full
        for effect in effects:
            if isinstance(effect, tier.AllowLocalDelete):
                if record.wal is not None:
                    record.wal.allow_delete(effect.segment_base)
            elif isinstance(effect, tier.Halted):
                out.append(TierHalted(topic, effect.reason, effect.resumable))
            else:
                out.append(TierIo(topic, effect, record.uploader_id))
        return out

    def _tier(self, io: TierIo, call: Callable[[tier.Uploader], list[tier.Effect]]) -> Step[None]:
        """Feeds an answer to the uploader that asked, if the topic still has it."""
        record = self._topics.get(io.topic)
        if record is None or record.uploader is None or record.uploader_id != io.uploader:
            return Step(None)
        return Step(None, tuple(self._tier_effects(record, call(record.uploader))))

    def tier_upload_done(
        self,
        io: TierIo,
        size: int,
        crc32c: int,
        offset_index: tuple[tuple[int, int], ...],
        *,
        now_ms: int,
    ) -> Step[None]:
        assert isinstance(io.effect, tier.UploadSegment)
        key = io.effect.key
        return self._tier(io, lambda u: u.upload_done(key, size, crc32c, offset_index, now_ms))

    def tier_upload_failed(
        self, io: TierIo, kind: tier.UploadError, reason: str, *, now_ms: int
    ) -> Step[None]:
        assert isinstance(io.effect, tier.UploadSegment)
        key, jitter = io.effect.key, self._rng.randrange(250)
        return self._tier(
            io, lambda u: u.upload_failed(key, kind, now_ms, reason=reason, jitter_ms=jitter)
        )

    def tier_index_committed(self, io: TierIo, *, now_ms: int) -> Step[None]:
        assert isinstance(io.effect, tier.CommitIndex)
        start = io.effect.entry.start_offset
        step = self._tier(io, lambda u: u.index_committed(start, now_ms))
        return Step(None, (*step.effects, *self._object_acks(io.topic)))

    def tier_index_read(self, io: TierIo, value: Any | None, *, now_ms: int) -> Step[None]:
        """A `CommitIndex` whose compare failed, and what its path holds when read afterwards
        (None: nothing, or the read failed). An entry is judged by `index_exists` (one that
        parses but is unsound halts the uploader); nothing means the compare failed on the
        fence (the claim is gone), and neither that nor a value that is no entry at all tells
        the outcome: the commit is retried, and the fence decides again."""
        if value is None:
            return self.tier_commit_failed(io, now_ms=now_ms)
        try:
            entry = IndexEntry.from_json(value)
        except IndexFormatError:
            return self.tier_commit_failed(io, now_ms=now_ms)
        step = self._tier(io, lambda u: u.index_exists(entry, now_ms))
        return Step(None, (*step.effects, *self._object_acks(io.topic)))

    def _object_acks(self, topic: str) -> tuple[Effect, ...]:
        """`object` acknowledgement: answer the publishes the index now covers."""
        record = self._topics.get(topic)
        if record is None or not record.object_ack or record.uploader is None:
            return ()
        indexed_next = record.uploader.indexed_next
        if indexed_next is None:
            return ()
        through = min(indexed_next - 1, record.durable_through)
        if through <= record.acked_through:
            return ()
        record.acked_through = through
        return (PublishAcked(topic, through),)

    def tier_commit_failed(self, io: TierIo, *, now_ms: int) -> Step[None]:
        assert isinstance(io.effect, tier.CommitIndex)
        start, jitter = io.effect.entry.start_offset, self._rng.randrange(250)
        return self._tier(io, lambda u: u.commit_failed(start, now_ms, jitter))

    def tier_objects_listed(
        self, io: TierIo, objects: list[tier.StoredObject], *, now_ms: int
    ) -> Step[None]:
        return self._tier(io, lambda u: u.objects_listed(objects, now_ms))

    def tier_busy(self) -> bool:
        """Some topic still has uploads or commits under way (shutdown may wait a little)."""
        return any(r.uploader is not None and not r.uploader.idle for r in self._topics.values())

    def _admit(
        self,
        record: TopicRecord,
        sub: SubscriptionRecord,
        first: int,
        records: tuple[bytes, ...],
        now_ms: int,
    ) -> list[rd.Effect]:
        """Answers the subscription's read with records `first`, `first + 1`, ...; the
        records it admits are kept until acknowledged."""
        dispatcher = sub.reliable
        keyed = sub.sub_type is SubscriptionType.KEY_SHARED
        key_of = self._routing_key_of
        pairs = [(first + i, key_of(r) if keyed else b"") for i, r in enumerate(records)]
        before = dispatcher.read_position
        effects = dispatcher.records_read(pairs, now_ms)
        for offset in range(max(before, first), dispatcher.read_position):
            sub.records[offset] = records[offset - first]
        return effects

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
                if not isinstance(sub.dispatcher, NonReliableSubscription):
                    continue
                for reason, count in sub.dispatcher.dropped.items():
                    if count:
                        counts[(topic, sub.name, reason.value)] = count
        return counts


def policies_to_json(policies: Policies) -> dict[str, int]:
    return {name: getattr(policies, name) for name in Policies.__slots__}


def _policies_from_json(value: Mapping[str, Any] | None) -> Policies:
    known = {k: v for k, v in (value or {}).items() if k in Policies.__slots__}
    return Policies(**known)


def _order(consumer: ConsumerRecord) -> int:
    return consumer.order

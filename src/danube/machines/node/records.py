"""The broker core's records: what it knows about each topic, producer, consumer and
subscription. Plain data; the machines (`catalogue`, `producers`, `consumers`,
`reliable_log`, ...) decide, and a topic's life cycle is its one `phase`
(`danube.machines.node.phase`), from which every other "can it serve?" question is derived."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from danube.machines.dispatch import SubscriptionType
from danube.machines.dispatch import reliable as rd
from danube.machines.dispatch.protocol import Subscription
from danube.machines.node.pacing import PaceClock
from danube.machines.node.phase import TopicEvent, TopicPhase, advance
from danube.machines.node.reliable_log import TopicLog
from danube.machines.node.settings import SubscriptionSettings
from danube.machines.tiering import uploader as tier
from danube.machines.tiering.index import IndexEntry
from danube.machines.wal.machine import WalMachine
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import TopicName


@dataclass(slots=True)
class ProducerRecord:
    producer_id: int
    name: str
    topic: TopicName
    access_mode: int
    active: bool = True
    """It published or was health-checked since the last idle sweep (`idle_producers`): the
    one attribute a publish writes for idle tracking (no clock read on the publish path)."""
    seen_ms: int = -1
    """When an idle sweep last found it active (-1: not swept yet)."""


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


def subscribe_order(consumer: ConsumerRecord) -> int:
    return consumer.order


@dataclass(slots=True)
class SubscriptionRecord:
    name: str
    sub_type: SubscriptionType
    machine: Subscription
    """The dispatcher itself; `dispatcher` and `reliable` give it and note the topic touched.
    Only the tick's own reads of its timers (`ReliableLogs.tick`, `_next_due`) use this."""
    consumers: dict[str, int] = field(default_factory=dict)
    records: dict[int, bytes] = field(default_factory=dict)
    """Reliable: the record of every offset read and not yet acknowledged."""
    epoch: int = 0
    """Reliable: bumped when the dispatcher is rebuilt, so older file reads are ignored."""
    read_lost: bool = False
    """Reliable: the dispatcher's outstanding read was dropped while the WAL was down."""
    owner: TopicRecord | None = field(default=None, repr=False, compare=False)
    """The topic it belongs to, touched at every use of the dispatcher (issue 28 point 3)."""

    @property
    def dispatcher(self) -> Subscription:
        """The dispatcher. Every input to it comes through here, so its topic counts as
        touched and the next tick visits it (`topic_table`): a tick visits a topic with
        subscriptions only when touched or when one of their timers is due, not at every tick
        (with 1,000 topics the walk took 30 % of the broker's main thread, issue 28 point 3)."""
        owner = self.owner
        if owner is not None and owner.touched is not None:
            owner.touched.add(owner.name.full)
        return self.machine

    @dispatcher.setter
    def dispatcher(self, machine: Subscription) -> None:
        self.dispatcher  # noqa: B018 -- a new dispatcher touches its topic as well
        self.machine = machine

    @property
    def reliable(self) -> rd.ReliableSubscription:
        """The dispatcher of a reliable topic's subscription (only reliable topics ask)."""
        return cast(rd.ReliableSubscription, self.dispatcher)


@dataclass(slots=True)
class TopicRecord:
    name: TopicName
    strategy: DispatchStrategy
    phase: TopicPhase = TopicPhase.SERVING
    """Where the topic is in its life cycle; reliable topics start LOADING (`new_topic`)."""
    stop_reason: str = ""
    """Why the topic cannot serve (corrupt segment, failed disk), once `phase` is stopped."""
    producers: dict[str, int] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionRecord] = field(default_factory=dict)
    messages_in: int = 0
    bytes_in: int = 0
    log: TopicLog = field(default_factory=TopicLog)
    """Reliable topics: the WAL machine, the uploader and the acknowledgement state."""
    policies: dict[str, int] = field(default_factory=dict)
    """The topic's own policies, over its namespace's (`/topics/<ns>/<topic>/policy`)."""
    settings: dict[str, SubscriptionSettings] = field(default_factory=dict)
    """Subscriptions' own failure policy and window, by name; may name one that does not
    exist yet."""
    pace: PaceClock = field(default_factory=PaceClock)
    """`max_publish_rate` pacing (`danube.machines.node.pacing`)."""
    touched: set[str] | None = field(default=None, repr=False, compare=False)
    """The topic table's topics touched since the last tick (`topic_table`), once listed."""
    order: int = field(default=0, compare=False)
    """When the topic came into the topic table: a tick visits topics in this order."""
    wake_ms: int | None = field(default=None, compare=False)
    """The deadline the topic table holds for the topic's next tick (None: none)."""

    @property
    def reliable(self) -> bool:
        return self.strategy is DispatchStrategy.RELIABLE

    def touch(self) -> None:
        """An input reached one of the topic's machines that `wal` does not hand out (its
        replication, its uploader): the next tick visits it and takes its next deadline."""
        if self.touched is not None:
            self.touched.add(self.name.full)

    def advance(self, event: TopicEvent) -> None:
        """Moves the topic along its life cycle; an event its phase does not allow raises."""
        self.phase = advance(self.phase, event)
        if self.touched is not None:
            self.touched.add(self.name.full)

    @property
    def wal(self) -> WalMachine | None:
        """The working WAL: None while it loads or is repaired, once stopped, and for a
        non-reliable topic. Every input to the WAL comes through here, so the topic counts as
        touched: the next tick visits it (`topic_table`)."""
        if self.touched is not None:
            self.touched.add(self.name.full)
        return self.log.wal if self.phase.writable else None

    @property
    def wal_to_read(self) -> WalMachine | None:
        """`wal` for a question that changes nothing in the WAL (its durable end): no input,
        so not a touch (the interpreter asks after every WAL completion)."""
        return self.log.wal if self.phase.writable else None

    @property
    def uploader(self) -> tier.Uploader | None:
        return self.log.uploader

    @property
    def index(self) -> list[IndexEntry]:
        return self.log.index

    @property
    def stopped(self) -> str | None:
        """Why the topic cannot serve, for the operator; None while it can."""
        return self.stop_reason if self.phase.stopped else None

    @property
    def unloading(self) -> bool:
        """Cluster mode: the topic is moving away; it takes no more publishes or clients."""
        return self.phase.moving


def new_topic(name: TopicName, strategy: DispatchStrategy) -> TopicRecord:
    """A topic as it enters this broker: a reliable one serves once its WAL is loaded."""
    record = TopicRecord(name, strategy)
    if record.reliable:
        record.phase = TopicPhase.LOADING
    return record


def check_not_moving(record: TopicRecord) -> None:
    if record.phase.moving:
        raise DanubeError(
            ErrorCode.UNAVAILABLE,
            f"{record.name.full} is moving to another broker; look it up again",
        )


def check_not_stopped(record: TopicRecord) -> None:
    if record.phase.stopped:
        raise DanubeError(
            ErrorCode.FAILED_PRECONDITION,
            f"topic {record.name.full} is stopped: {record.stop_reason}",
        )


_U64 = (1 << 64) - 1


def new_id(rng: random.Random, taken: Mapping[int, object]) -> int:
    """A random producer or consumer id not in use (ids are u64 on the wire)."""
    while True:
        candidate = rng.randint(1, _U64)
        if candidate not in taken:
            return candidate

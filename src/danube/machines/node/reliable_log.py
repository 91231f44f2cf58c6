"""Reliable topics' logs: each topic's WAL machine and object uploader (`TopicLog`), and the
machine that drives them for the broker core (`ReliableLogs`): it loads and repairs WALs,
turns WAL effects into the core's (file I/O, acknowledgements, records for subscriptions),
serves subscriptions' reads from the WAL, its cache or the object tier, and runs timers.
The answers of the object store are `danube.machines.node.object_tier`'s."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from danube.effects import EpochHistory
from danube.machines.dispatch import ConsumerReady, SubscriptionType
from danube.machines.dispatch import reliable as rd
from danube.machines.dispatch.protocol import DispatchEffect
from danube.machines.memory.consumer import HELD_PER_RECORD, ConsumerPool
from danube.machines.memory.ledger import CacheLedger
from danube.machines.node.cursor_write import persist_cursor
from danube.machines.node.deferred_loads import DeferredLoads
from danube.machines.node.effects import (
    Effect,
    PolicyDropped,
    PublishAcked,
    PublishFailed,
    ReadObject,
    ReadWal,
    RepairWal,
    RetentionSkipped,
    SaveEpochs,
    Step,
    TierHalted,
    TierIo,
    TopicStopped,
    WalIo,
)
from danube.machines.node.phase import TopicEvent
from danube.machines.node.replica_owner import (
    OwnerReplicas,
    ReplicaConfig,
    ReplicationSettings,
)
from danube.machines.node.topic_deadline import next_due
from danube.machines.replication.owner import OwnerReplication
from danube.machines.tiering import reader as tier_reader
from danube.machines.tiering import uploader as tier
from danube.machines.tiering.index import IndexEntry
from danube.machines.wal import machine as wal
from danube.machines.wal.recovery import RecoveryPlan
from danube.values.config import OBJECT_DURABILITY, TopicDurability
from danube.values.errors import DanubeError, ErrorCode

if TYPE_CHECKING:
    from danube.machines.node.catalogue import Catalogue
    from danube.machines.node.records import ConsumerRecord, SubscriptionRecord, TopicRecord

_FILE_EFFECTS: frozenset[type] = frozenset(
    (wal.CreateSegment, wal.Write, wal.Fsync, wal.CloseSegment, wal.DeleteSegment)
)
"""The WAL's effects that are file I/O for the driver, by exact type (`wal_effects`)."""
READ_MAX_BYTES = 4 * 1024 * 1024
"""Largest file range one subscription read asks for (at index granularity)."""


@dataclass(slots=True)
class TopicLog:
    """One reliable topic's storage: its WAL machine and its uploader, with what ties the two
    to the publishes waiting for them."""

    wal: wal.WalMachine | None = None
    """The last WAL machine loaded; `TopicRecord.wal` says whether it works (the phase)."""
    index: list[IndexEntry] = field(default_factory=list)
    """Tiered: the object index read at restore, until the uploader takes it over."""
    uploader: tier.Uploader | None = None
    uploader_id: int = 0
    """Which of this core's uploaders is the topic's (`TierIo.uploader`)."""
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
    replica_config: ReplicaConfig | None = None
    """Cluster mode: the topic's replicas value as last read (`replica_owner`)."""
    replication: OwnerReplication | None = None
    """The owner's replication machine while the topic has followers to replicate to."""
    registering: bool = False
    """A proposal recording this owner's epoch in the replica set is under way."""
    registering_since: int = 0
    registering_on: int = -1
    """When it was made (`replica_owner.REGISTER_RETRY_MS`), on which replicas version."""
    held_end: int = 0
    """Replicated, not registered yet: the end the high watermark reached meanwhile."""
    handing_over: bool = False
    """Unloading, handed over to its in-sync followers (`OwnerReplicas.hand_over_ready`):
    no more in-sync proposals; the files stay when the topic is removed."""
    unreplicated: list[tuple[int, bytes]] = field(default_factory=list)
    """`(end offset, frames)` of the writes since the WAL's last `Acknowledge`: the group
    commit not durable yet, sent to the followers as it is written (`OwnerReplicas.written`)
    and again to a machine started meanwhile."""
    sealed_waiting: list[tuple[int, int, int]] = field(default_factory=list)
    """Replicated: sealed segments `(base, next offset, size)` the uploader hears of only once
    the high watermark covers them, so the object index never holds a record an in-sync
    follower may lack (a promoted follower's log always reaches the index)."""
    history: EpochHistory | None = None
    """The epochs recorded in the WAL directory (`danube.effects.WriteEpochs`): where each
    owner's (and, before a promotion, each followed owner's) records start."""


class ReliableLogs:
    """Drives every reliable topic's `TopicLog` and subscriptions' reads. Shares the topics
    with the catalogue and the consumers with the sessions; owns the outbox of records
    delivered to consumers and waiting for their stream writers."""

    def __init__(
        self,
        catalogue: Catalogue,
        consumers: Mapping[int, ConsumerRecord],
        *,
        wal_config: wal.WalConfig,
        durability: TopicDurability,
        uploads: tier.UploaderConfig | None,
        routing_key_of: Callable[[bytes], bytes],
        clustered: bool,
        replication: ReplicationSettings | None = None,
        cache_ledger: CacheLedger | None = None,
    ) -> None:
        self.cache_ledger = cache_ledger
        """The broker's hot-cache ledger (spec/memory.md), given to every WAL machine."""
        self._catalogue = catalogue
        self._topics = catalogue.topics_by_name
        self.deferred = DeferredLoads(self._topics)
        """Loads a restart deferred: on first use or by the sweep (`deferred_loads`)."""
        self._consumers = consumers
        self._wal_config = wal_config
        self._configs: dict[tuple[wal.Durability, bool], wal.WalConfig] = {}
        """The WAL configs topics use, one per (mode, synced writes): shared, not one copy
        per topic (a frozen value; 340 bytes an idle topic, issue 23)."""
        self._durability = durability
        self._uploads = uploads
        self._routing_key_of = routing_key_of
        self._clustered = clustered
        self._uploaders = 0
        self._policies_seen = catalogue.policy_generation
        self.outbox: dict[int, deque[bytes]] = {}
        """Records delivered to a consumer, waiting for its stream writer."""
        self.consumer_pool: ConsumerPool | None = None
        """Records reliable subscriptions hold, bounded by the budget (spec/memory.md,
        "Consumer queues"); set by the core. Full: reads of subscriptions holding some wait."""
        self.replicas = OwnerReplicas(self, replication or ReplicationSettings())
        """The owner's side of replication of the topics served here."""
        self.republish: (
            Callable[[TopicRecord, SubscriptionRecord, rd.DeadLetter, int], list[Effect]] | None
        ) = None
        """`DeadLetters.republish`, set by the core (it needs the producers' path)."""
        self.unconnected: dict[tuple[str, str], None] | None = None
        """(topic, subscription) left with no connected consumer by a dispatcher input, for
        `DepartedSubscriptions` (which sets it, and prunes it); None: not noted."""

    # -- loading and repair -------------------------------------------------------------------

    def wal_syncs_every_write(self, topic: str) -> bool:
        """Whether the topic's WAL driver must fsync every write before reporting it done
        (`WalConfig.synced_writes`, for every level but `flush`)."""
        level = self._durability.level(topic, self._wal_config.durability)
        return self._wal_config.synced_writes and level != wal.Durability.FLUSH.value

    def recovery_evidence(self, topic: str) -> tuple[int, int]:
        """(acknowledged end, indexed end) of a reliable topic, for WAL recovery
        (`danube.machines.wal.recovery.RecoveryEvidence`): one past the highest subscription cursor
        (0 in `flush` mode, where a consumer may acknowledge what a power failure loses, and in
        cluster mode, where a failover gives up the acknowledged offsets beyond the index,
        spec/durability.md "Losing a broker") and one past the object index's last offset.
        Both are durable records of how far the log reached: a log that recovers to less lost
        durable data."""
        record = self._topics.get(topic)
        if record is None:
            return 0, 0
        indexed = max((e.next_offset for e in record.log.index), default=0)
        if record.log.uploader is not None:
            indexed = max([indexed, *(e.next_offset for e in record.log.uploader.entries)])
        level = self._durability.level(topic, self._wal_config.durability)
        if level == wal.Durability.FLUSH.value or self._clustered:
            return 0, indexed
        subs = record.subscriptions.values() if record.reliable else ()
        cursors = [sub.reliable.cursor for sub in subs]
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
        log = record.wal_to_read if record is not None else None
        if log is None or log.failure is not None:
            return None
        return log.durable_offset

    def wal_loaded(self, topic: str, plan: RecoveryPlan, *, now_ms: int) -> Step[None]:
        step = self._wal_loaded(topic, plan, now_ms=now_ms)
        more = self.deferred.done(topic)  # a sweep load ended: the next one starts
        return Step(None, (*step.effects, *more)) if more else step

    def _wal_loaded(self, topic: str, plan: RecoveryPlan, *, now_ms: int) -> Step[None]:
        """The topic's WAL was recovered: at start, or after a repair. A repair cuts only
        records nobody could read (`fsync` mode), so dispatch carries on where it was; only
        when it cut records a subscription had read (`flush` mode) does that subscription
        restart at its cursor + 1, as after a broker restart."""
        record = self._topics.get(topic)
        if record is None or record.phase.stopped:
            return Step(None)
        state = record.log
        repaired = record.phase.repairing
        tiered = self._uploads is not None
        indexed_next = max((e.next_offset for e in state.index), default=0)
        level = self._durability.level(topic, self._wal_config.durability)
        state.object_ack = level == OBJECT_DURABILITY
        mode = wal.Durability.FLUSH if level == wal.Durability.FLUSH.value else wal.Durability.FSYNC
        shape = (mode, self.wal_syncs_every_write(topic))
        config = self._configs.get(shape)
        if config is None:
            config = self._configs[shape] = dataclasses.replace(
                self._wal_config, durability=mode, synced_writes=shape[1]
            )
        wal.release(state.wal)
        log = state.wal = wal.WalMachine(
            topic,
            config,
            plan,
            tiered=tiered,
            start_offset=indexed_next,
            cache_ledger=self.cache_ledger,
        )
        record.advance(TopicEvent.LOADED)
        state.unreplicated.clear()
        effects: list[Effect] = self._record_epoch(record, plan)
        if record.phase.stopped:  # a newer owner's follower lived here: this claim is stale
            return Step(None, tuple(effects))
        if self._uploads is not None and state.uploader is None:
            state.uploader = tier.Uploader(record.name, self._uploads, state.epoch)
            self._uploaders += 1
            state.uploader_id = self._uploaders
            sealed = [
                tier.SealedSegment(s.base_offset, s.next_offset, s.size) for s in plan.segments
            ]
            index, state.index = state.index, []
            state.sealed_through = max(
                [indexed_next, *(s.next_offset for s in plan.segments)], default=0
            )
            effects.extend(
                self.tier_effects(record, state.uploader.recovered(index, sealed, now_ms))
            )
        elif state.uploader is not None:
            # A repair: recovery closed the segment that was open. Tell the uploader about
            # every local segment it has not heard of, and release the indexed ones again.
            uploader = state.uploader
            indexed = {entry.start_offset for entry in uploader.entries}
            for found in plan.segments:
                if found.base_offset in indexed:
                    log.allow_delete(found.base_offset)
                elif found.base_offset >= state.sealed_through:
                    sealed = uploader.segment_sealed(
                        found.base_offset, found.next_offset, found.size, now_ms
                    )
                    effects.extend(self.tier_effects(record, sealed))
                    state.sealed_through = found.next_offset
        # Replicated, dispatch waits for the high watermark (a new owner's log may hold
        # records past what was acknowledged, which its followers may lack).
        effects.extend(self.replicas.restart(record, now_ms))
        if record.phase.stopped:  # the repair rewound below what the followers were sent
            return Step(None, tuple(effects))
        machine = state.replication
        readable_end = self.readable_end(record) if machine is None else machine.high_watermark
        for sub in record.subscriptions.values():
            if repaired and log.readable_offset < sub.reliable.read_position:
                self.rebuild(sub, now_ms)
            elif sub.read_lost:
                # its read was dropped while the WAL was down: an empty answer asks again
                sub.read_lost = False
                retry = sub.reliable.records_read((), now_ms)
                effects.extend(self.dispatch(record, sub, retry, now_ms))
            if readable_end:
                readable = sub.reliable.readable(readable_end - 1, now_ms)
                effects.extend(self.dispatch(record, sub, readable, now_ms))
        return Step(None, tuple(effects))

    def _record_epoch(self, record: TopicRecord, plan: RecoveryPlan) -> list[Effect]:
        """Cluster mode: the epochs file gains this owner's epoch, starting at the log end,
        in order before any append of it (`SaveEpochs` shares the WAL's file lane). A file
        that has seen a higher epoch means a newer owner exists: the topic stops here."""
        state = record.log
        history = state.history = plan.epochs if plan.epochs is not None else state.history
        if not self._clustered or state.epoch <= 0:
            return []
        if history is not None and history.seen > state.epoch:
            return self.replicas.deposed(record, history.seen)
        if history is not None and history.starts and history.starts[-1][0] == state.epoch:
            return []
        starts = history.starts if history is not None else ()
        seen = max(history.seen if history is not None else 0, state.epoch)
        start = record.wal.next_offset if record.wal is not None else plan.next_offset
        state.history = EpochHistory(seen, (*starts, (state.epoch, start)))
        return [SaveEpochs(record.name.full, state.history)]

    def rebuild(self, sub: SubscriptionRecord, now_ms: int, *, keep_past: bool = False) -> None:
        """A fresh dispatcher at the subscription's cursor, its records let go and read again,
        its consumers added back (connected if their stream is open). `keep_past`: also what
        the old one knew past its cursor and its counters (`departed_subscriptions`: nothing
        past the cursor was rewound, as after a repair here)."""
        old = sub.reliable
        fresh = rd.ReliableSubscription(
            sub.sub_type,
            old.cursor + 1,
            max_unacked_messages=old.max_unacked_messages,
            cursor_flush_ms=old.cursor_flush_ms,
            policy=old.policy,
            attempts=old.attempt_counts(),
        )
        if keep_past:
            fresh.carry_over(old)
            fresh.redeliveries_by_cause = old.redeliveries_by_cause
            fresh.dead_letters_stored = old.dead_letters_stored
        fresh.redelivered = old.redelivered
        fresh.dropped = old.dropped
        fresh.dispatch_rate = old.dispatch_rate
        sub.records.clear()  # gives their room back to the consumer pool
        sub.dispatcher = fresh
        sub.epoch += 1  # reads under way or paused for the old window are void
        sub.read_lost = False
        members = sorted((self._consumers[c] for c in sub.consumers.values()), key=_order)
        for consumer in members:
            self.outbox.pop(consumer.consumer_id, None)
            fresh.add_consumer(consumer.consumer_id, consumer.name, consumer.key_filters, now_ms)
            if consumer.stream:
                fresh.connect(consumer.consumer_id, now_ms)

    def wal_load_failed(self, topic: str, reason: str) -> Step[None]:
        """Recovery refused the topic's segments (corruption) or the disk failed: the topic
        stops until an operator acts; other topics are not affected."""
        record = self._topics.get(topic)
        more = self.deferred.done(topic)
        if record is None:
            return Step(None, tuple(more))
        wal.release(record.log.wal)
        record.log.wal = None
        record.stop_reason = reason
        record.advance(TopicEvent.LOAD_FAILED)
        return Step(None, (TopicStopped(topic, reason), *more))

    def wal_io_done(
        self, topic: str, effect: wal.Effect, error: str | None, *, now_ms: int
    ) -> Step[None]:
        """A file effect of `WalIo` finished (`error` None) or failed."""
        record = self._topics.get(topic)
        if record is None:
            return Step(None)
        log = record.wal
        if log is None:
            return Step(None)
        effects = log.io_done(effect, error, now_ms)
        return Step(None, tuple(self.wal_effects(record, effects, now_ms)))

    def ready_wal(self, record: TopicRecord) -> wal.WalMachine:
        """The topic's working WAL, or the reason a publish or subscribe must wait."""
        if record.phase.stopped:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                f"topic {record.name.full} is stopped: {record.stop_reason}",
            )
        log = record.wal
        if log is None:
            self.deferred.want(record.name.full)  # its load starts at the next tick
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                f"{record.name.full} is loading its write-ahead log; retry shortly",
            )
        return log

    def wal_effects(
        self, record: TopicRecord, effects: Iterable[wal.Effect], now_ms: int
    ) -> list[Effect]:
        """Turns the WAL machine's effects into the core's: file I/O for the driver,
        acknowledgements for waiting publishes, new records for every subscription."""
        state = record.log
        out: list[Effect] = []
        io: list[wal.Effect] = []
        # The WAL's effect classes have no subclasses: the exact type is the test (one type()
        # call and identity checks per effect, not a chain of isinstance: this runs about
        # five times a message).
        for effect in effects:
            kind = type(effect)
            if kind in _FILE_EFFECTS:
                io.append(effect)
                if kind is wal.Write:
                    out.extend(self.replicas.written(record, cast(wal.Write, effect), now_ms))
                elif kind is wal.CloseSegment and state.uploader is not None:
                    closed = cast(wal.CloseSegment, effect)
                    assert state.wal is not None  # `record.wal`, inlined: touched already
                    next_offset, size = state.wal.segment_extent(closed.segment_base)
                    state.sealed_waiting.append((closed.segment_base, next_offset, size))
                    high = state.replication.high_watermark if state.replication else None
                    out.extend(self.release_sealed(record, high, now_ms))
            elif kind is wal.Acknowledge:
                through = cast(wal.Acknowledge, effect).through_offset
                if state.replication is not None:
                    out.extend(self.replicas.durable(record, through, now_ms))
                else:
                    state.unreplicated.clear()
                    out.extend(self.acknowledge(record, through, now_ms))
            elif kind is wal.Readable:
                if state.replication is None:
                    through = cast(wal.Readable, effect).through_offset
                    if state.object_ack:  # no further than the index (`ObjectTier` goes on)
                        through = min(through, self.readable_end(record) - 1)
                    if through >= 0:
                        out.extend(self.make_readable(record, through, now_ms))
            elif isinstance(effect, wal.Failed):
                state.unreplicated.clear()
                wal.release(state.wal)
                state.wal = None
                record.advance(TopicEvent.WAL_FAILED)
                topic = record.name.full
                out.append(PublishFailed(topic, effect.unacknowledged_from, effect.reason))
                out.append(RepairWal(topic, effect.segment_base, effect.truncate_to))
        if io:  # the name is built only when needed (every WAL completion passes here)
            out.insert(0, WalIo(record.name.full, tuple(io)))
        return out

    def acknowledge(self, record: TopicRecord, through: int, now_ms: int) -> list[Effect]:
        """Publishes up to `through` are stored at the topic's level (and, replicated, on the
        in-sync followers): answer them, or at `object` wait for their object."""
        state = record.log
        if not state.object_ack:
            return [PublishAcked(record.name.full, through)]
        state.durable_through = max(state.durable_through, through)
        if state.ack_batch_since is None:
            state.ack_batch_since = now_ms
        return []

    def release_sealed(self, record: TopicRecord, end: int | None, now_ms: int) -> list[Effect]:
        """Tells the uploader of the sealed segments that lie below `end` (all: None)."""
        state = record.log
        out: list[Effect] = []
        uploader = state.uploader
        while uploader is not None and state.sealed_waiting:
            base, next_offset, size = state.sealed_waiting[0]
            if end is not None and next_offset > end:
                break
            state.sealed_waiting.pop(0)
            sealed = uploader.segment_sealed(base, next_offset, size, now_ms)
            record.touch()  # its batch window starts: `topic_deadline`
            state.sealed_through = next_offset
            out.extend(self.tier_effects(record, sealed))
        return out

    def make_readable(self, record: TopicRecord, through: int, now_ms: int) -> list[Effect]:
        """Dispatch may deliver offsets up to `through`."""
        out: list[Effect] = []
        for sub in record.subscriptions.values():
            out.extend(self.dispatch(record, sub, sub.reliable.readable(through, now_ms), now_ms))
        return out

    def readable_end(self, record: TopicRecord) -> int:
        """One past the last offset dispatch may deliver, unreplicated: the WAL's durable
        end, and at `object` no further than the object index. A record delivered before its
        object is indexed would be lost with the owner in a failover (the new owner continues
        at the index's end), its offset given to another message that a subscription's cursor,
        moved by the consumer's acknowledgement, already passed (spec/durability.md, "What
        consumers see")."""
        log = record.log.wal
        end = log.readable_offset if log is not None else 0
        if not record.log.object_ack:
            return end
        uploader = record.log.uploader
        indexed = self.indexed_end(record) if uploader is None else uploader.indexed_next or 0
        return min(end, indexed)

    def indexed_end(self, record: TopicRecord) -> int:
        """The end of what the object index holds (0 untiered): stored whatever happens to
        the brokers, so a new owner's high watermark starts there."""
        uploader = record.log.uploader
        entries = uploader.entries if uploader is not None else record.log.index
        return max((e.next_offset for e in entries), default=0)

    # -- subscriptions' reads -----------------------------------------------------------------

    def dispatch(
        self,
        record: TopicRecord,
        sub: SubscriptionRecord,
        effects: Iterable[DispatchEffect],
        now_ms: int,
    ) -> list[Effect]:
        """Carries out a subscription's effects: a non-reliable dispatcher's `ConsumerReady`
        goes to the driver as it is; a reliable one's reads served from the WAL cache are fed
        straight back (and may deliver), file reads go to the driver, deliveries queue the
        records for the consumer's stream, a dropped message's record is let go, cursor moves
        are persisted."""
        out: list[Effect] = []
        pool = self.consumer_pool
        work: deque[DispatchEffect] = deque(effects)
        while work:
            effect = work.popleft()
            if isinstance(effect, ConsumerReady):
                out.append(effect)
            elif isinstance(effect, rd.Deliver):
                box = self.outbox.setdefault(effect.consumer_id, deque())
                if not box:
                    out.append(ConsumerReady(effect.consumer_id))
                box.extend(sub.records[offset] for offset in effect.offsets)
            elif isinstance(effect, rd.Dropped):
                sub.records.pop(effect.offset, None)  # skipped by policy: never sent again
                drop = PolicyDropped(record.name.full, sub.name, effect.offset, effect.attempts)
                out.append(drop)
            elif isinstance(effect, rd.DeadLetter):
                # the dead letter is appended; the message stays in the window until stored
                assert self.republish is not None, "the core sets the republish flow"
                out.extend(self.republish(record, sub, effect, now_ms))
            elif isinstance(effect, rd.PersistCursor):
                out.append(persist_cursor(record, sub.name, effect))
            elif pool is not None and not pool.may_read(bool(sub.records)):
                # no room in the consumer pool: this read waits, its records stay on disk
                pool.pause(record.name.full, sub.name, sub.epoch, effect)
            elif record.wal is None:
                sub.read_lost = True
            else:
                size = READ_MAX_BYTES
                if pool is not None:  # no more than it may hold (`admit` judges the records)
                    size = max(1, min(size, pool.allowance(bool(sub.records))))
                result = record.wal.read(effect.from_offset, effect.max_records, size)
                if isinstance(result, wal.CachedRecords):
                    work.extend(self.admit(record, sub, result.offset, result.records, now_ms))
                elif isinstance(result, wal.FileRead):
                    out.append(ReadWal(record.name.full, sub.name, sub.epoch, result))
                else:
                    planned = self._plan_history(record, effect, result.first_offset, size)
                    if isinstance(planned, tier_reader.ObjectRead):
                        out.append(ReadObject(record.name.full, sub.name, sub.epoch, planned))
                    else:
                        dispatcher = sub.reliable
                        lost = (dispatcher.read_position, planned.first_offset)
                        work.extend(dispatcher.records_lost(planned.first_offset, now_ms))
                        out.append(RetentionSkipped(record.name.full, sub.name, *lost))
        noted = self.unconnected  # every input that may disconnect or hold records ends here
        if noted is not None and record.reliable and not sub.machine.connected_count:  # type: ignore[attr-defined]
            noted[record.name.full, sub.name] = None
        return out

    def _plan_history(
        self, record: TopicRecord, read: rd.Read, wal_first: int, size: int
    ) -> tier_reader.ObjectRead | tier_reader.NotAvailable:
        """A read below the local WAL: from objects when the index has it."""
        uploader = record.log.uploader
        if uploader is None:
            return tier_reader.NotAvailable(wal_first)
        planned = tier_reader.plan_read(
            uploader.entries, wal_first, read.from_offset, read.max_records, size
        )
        assert not isinstance(planned, tier_reader.LocalRead), "below the WAL's first offset"
        return planned

    def admit(
        self,
        record: TopicRecord,
        sub: SubscriptionRecord,
        first: int,
        records: tuple[bytes, ...],
        now_ms: int,
    ) -> list[rd.Effect]:
        """Answers the subscription's read with records `first`, `first + 1`, ...; the
        records it admits are kept until acknowledged. With a consumer pool, only those it
        has room for (`ConsumerPool.admissible`: the dispatcher reads the rest again); with
        room for none, the read waits for it (paused) and the dispatcher hears nothing."""
        dispatcher = sub.reliable
        before = dispatcher.read_position
        pool = self.consumer_pool
        if pool is not None and records:
            skip = min(max(before - first, 0), len(records))
            rest = records[skip:]
            count = pool.admissible([len(r) for r in rest], bool(sub.records))
            if rest and not count:
                again = rd.Read(first + skip, len(rest))
                need = len(rest[0]) + HELD_PER_RECORD
                pool.pause(record.name.full, sub.name, sub.epoch, again, need)
                return []
            records = records[: skip + count]
        keyed = sub.sub_type is SubscriptionType.KEY_SHARED
        key_of = self._routing_key_of
        pairs = [(first + i, key_of(r) if keyed else b"") for i, r in enumerate(records)]
        effects = dispatcher.records_read(pairs, now_ms)
        for offset in range(max(before, first), dispatcher.read_position):
            if dispatcher.is_pending(offset):  # not one acknowledged before it was read again
                sub.records[offset] = records[offset - first]
        return effects

    def wal_read_done(
        self, read: ReadWal | ReadObject, records: tuple[bytes, ...], *, now_ms: int
    ) -> Step[None]:
        record, sub = self._read_target(read)
        if sub is None:
            return Step(None)
        assert record is not None
        admitted = self.admit(record, sub, read.plan.from_offset, records, now_ms)
        return Step(None, tuple(self.dispatch(record, sub, admitted, now_ms)))

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
            return Step(None, tuple(self.dispatch(record, sub, [again], now_ms)))
        wal.release(record.log.wal)
        record.log.wal = None
        record.stop_reason = reason
        record.advance(TopicEvent.READ_FAILED)
        return Step(None, (TopicStopped(record.name.full, reason),))

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

    # -- time and shutdown --------------------------------------------------------------------

    def tick(self, now_ms: int) -> Step[None]:
        """Time passes: WAL flushes, rotation and retention; ack deadlines, redeliveries and
        cursor flushes of reliable subscriptions."""
        effects: list[Effect] = []
        batch = self._durability.object_batch_ms
        topics = self._topics
        policies = self._catalogue.policy_generation
        # touched since the last tick, or due: not every topic; every topic once after a
        # policy changed (a subscription's dispatch rate follows it, below)
        visits = topics.due(now_ms, every=policies != self._policies_seen)
        self._policies_seen = policies
        for record in visits:
            state = record.log
            log = state.wal  # `record.wal`, inlined: not a touch
            if log is None or not record.phase.writable:
                continue
            if log.tick_due(now_ms):  # most ticks of most topics: nothing for the WAL
                effects.extend(self.wal_effects(record, log.tick(now_ms), now_ms))
            if state.replication is not None:
                effects.extend(self.replicas.tick(record, now_ms))
            since = state.ack_batch_since
            if since is not None and now_ms - since >= batch:
                # Seal the segment holding the waiting publishes: its upload answers them.
                state.ack_batch_since = None
                if state.durable_through >= state.sealed_through:
                    effects.extend(self.seal(record, now_ms))
            uploader = state.uploader
            if uploader is not None:
                due = uploader.next_timer_ms
                if due is not None and due <= now_ms:
                    effects.extend(self.tier_effects(record, uploader.tick(now_ms)))
            if not record.subscriptions:
                continue  # nothing below to do (a producer-only topic: the policies unread)
            rate = self._catalogue.policies(record).max_subscription_dispatch_rate
            for sub in record.subscriptions.values():
                machine = cast(rd.ReliableSubscription, sub.machine)  # `sub.reliable`: a touch
                if machine.dispatch_rate != rate:
                    # a policy changed (here or, in a cluster, through another broker)
                    found = sub.reliable.configure(now_ms, dispatch_rate=rate)
                    effects.extend(self.dispatch(record, sub, found, now_ms))
                due = machine.next_timer_ms
                if due is not None and due <= now_ms:
                    effects.extend(self.dispatch(record, sub, sub.reliable.tick(now_ms), now_ms))
        for record in visits:
            topics.schedule(record, next_due(record, batch, self.replicas))
        if self.consumer_pool is not None and self.consumer_pool.paused:
            effects.extend(self.resume_reads(now_ms))
        effects.extend(self.deferred.due())  # loads a request asked for, the sweep's next
        return Step(None, tuple(effects))

    def resume_reads(self, now_ms: int) -> list[Effect]:
        """Reads the consumer pool paused, carried out once the room they wait for came
        (`ConsumerPool.ready`: the pool's own room, or for a subscription that holds nothing
        any more what it may borrow of the cache pool; each pauses again if the room went
        meanwhile); those of a subscription gone or rebuilt are dropped. Called at each
        tick and by the acknowledgements that let them go on (`Consumers.ack_many`)."""
        pool = self.consumer_pool
        assert pool is not None
        out: list[Effect] = []
        kept: list[tuple[str, str, int, Any]] = []
        pool.discard(self._gone)
        for paused in pool.resume(self._holds_nothing):
            topic, name, epoch, read = paused
            if not pool.ready(paused, not self._holds_nothing(topic, name, epoch)):
                # An earlier read of this round took the room again: this one would only
                # pause again. It keeps its place instead, so an acknowledgement that frees
                # one record's room costs one read, not one per paused subscription.
                kept.append(paused)
                continue
            pool.carried_out(paused)
            record = self._topics.get(topic)
            sub = record.subscriptions.get(name) if record is not None else None
            if record is not None and sub is not None and sub.epoch == epoch:
                out.extend(self.dispatch(record, sub, [read], now_ms))
        if kept:
            pool.put_back(kept)
        return out

    def _gone(self, topic: str, name: str, epoch: int) -> bool:
        """A paused read's subscription was removed or rebuilt since: the read is void."""
        record = self._topics.get(topic)
        sub = record.subscriptions.get(name) if record is not None else None
        return sub is None or sub.epoch != epoch

    def _holds_nothing(self, topic: str, name: str, epoch: int) -> bool:
        """A paused read's subscription holds no record now (or is gone or rebuilt)."""
        record = self._topics.get(topic)
        sub = record.subscriptions.get(name) if record is not None else None
        return sub is None or sub.epoch != epoch or not sub.records

    def seal(self, record: TopicRecord, now_ms: int) -> list[Effect]:
        """Seals the topic's active segment (if its WAL works), so the uploader takes it."""
        log = record.wal
        if log is None:
            return []
        return self.wal_effects(record, log.seal(now_ms), now_ms)

    def flush_cursors(self, record: TopicRecord, now_ms: int) -> list[Effect]:
        """Persists every cursor of the topic that moved since it was last persisted."""
        effects: list[Effect] = []
        for sub in record.subscriptions.values():
            effects.extend(self.dispatch(record, sub, sub.reliable.flush(now_ms), now_ms))
        return effects

    def quiesce(self, now_ms: int) -> Step[None]:
        """Graceful shutdown: persists every reliable cursor that moved since it was last
        persisted (so a restart redelivers as little as possible) and seals every WAL; the
        driver then waits until `wal_busy` is false."""
        effects: list[Effect] = []
        for record in self._topics.values():
            if record.wal is None:
                continue
            effects.extend(self.seal(record, now_ms))
            effects.extend(self.flush_cursors(record, now_ms))
        return Step(None, tuple(effects))

    def wal_busy(self) -> bool:
        """Some WAL still has appends or I/O under way (shutdown waits for them)."""
        return any(r.wal is not None and not r.wal.idle for r in self._topics.values())

    # -- the object tier's effects ------------------------------------------------------------

    def tier_effects(self, record: TopicRecord, effects: Iterable[tier.Effect]) -> list[Effect]:
        """Turns the uploader's effects into the core's: deletes it allows go to the WAL,
        the rest to the object-store driver."""
        out: list[Effect] = []
        for effect in effects:  # the topic's name is built per effect: most calls have none
            if isinstance(effect, tier.AllowLocalDelete):
                if record.wal is not None:
                    record.wal.allow_delete(effect.segment_base)
            elif isinstance(effect, tier.Halted):
                out.append(TierHalted(record.name.full, effect.reason, effect.resumable))
            else:
                out.append(TierIo(record.name.full, effect, record.log.uploader_id))
        return out


def _order(consumer: ConsumerRecord) -> int:
    return consumer.order

"""The invariants of spec/invariants.md, checked while a simulation runs and at its end.

The checker hears from the clients (what producers were told, what consumers received and
acknowledged) and from inside the broker (each acknowledgement to producers, each message a
stream writer sends, and, white-box, the dispatcher's in-flight sets). What it checks:

1. no acknowledged message lost: at the moment the broker acknowledges a publish in `fsync`
   mode its record is durable on the simulated disk;
2. one offset names one message: every delivery of an offset carries the same payload, and
   the records on disk at the end have dense offsets, each stamped with its own offset;
3. order: Exclusive/Failover send in offset order, and a run that restarts begins at an offset
   below which everything is acknowledged; Key-Shared sends a key's messages in offset order;
4. acknowledged is stored (safety, judged at once whatever the backlog): when a producer is
   told a message is stored, a WAL write holds it at an offset the WAL had acknowledged; at
   the end the records on disk and in indexed objects still hold it; and a subscription's
   cursor passes an offset only once one of its consumers acknowledged it, or its message is
   acknowledged by the subscription at another offset, still stored after the cursor, or
   never acknowledged to its producer;
4b. backlog drains (liveness, judged by `sim/run.py`'s drain): once faults stop, every
   subscription receives every acknowledged message, the drain failing only after a bounded
   time with no new first delivery (`backlog_stalled`);
5. exclusivity: an Exclusive/Failover subscription never has messages in flight to two
   consumers, and Key-Shared never has two messages of one key in flight;
15. damage is never silent: each time a topic's WAL is loaded (a restart, a repair), offsets
   continue at or after every offset acknowledged in `fsync` mode, so none is lost silently or
   assigned again; a damaged newest segment (`Faults.newest_damage`) must stop the topic
   instead (a stopped topic is not loaded, so not judged), and only a topic whose files a
   fault damaged (`bit_flip`, `newest_damage`) may be stopped as corrupt: a healthy topic
   stopped means the broker itself lost what its evidence says was stored;
7. objects equal frames (tiered runs): after every index commit and at the end, the index in
   the metadata is sound (`validate_index`: no gap, no overlap), its entries never change or
   vanish, `cur` names the newest, and each indexed object is whole, of the indexed size and
   CRC32C, holds exactly the indexed offsets (its sparse index naming real frame starts), and
   every record in it is the record the local WAL last wrote at that offset; a history read
   names only an indexed object, inside its entry, and returns those same records; an
   orphan deletion never names an indexed object; local retention deletes a segment only once
   all its offsets are indexed; and no read finds an offset in no tier (that would break 4).
16. no request fails internally: a request whose flow (or whose core call) raises anything
   but a `DanubeError` is a bug of the broker; production answers it INTERNAL, the simulator
   does too and reports it (a planted bug that corrupts a dispatcher shows first as a later
   request's `KeyError` inside the core).
20. only idle producers expire: a producer removed for idleness had neither a publish nor a
   health check (nor its creation) reach the broker for `producer_idle_ms` (`--departing`).
19. timers are never late: after each tick, no reliable subscription of a serving topic has a
   timer (ack deadline, redelivery, cursor flush) due at or before it: the tick visits only
   topics touched or due, so it must know of every subscription's timer.

`flush` durability gives up 1 and 2 on power failure (spec/durability.md): after one, the
checker stops judging offsets and reports the acknowledged messages lost instead. A topic the
broker stopped (a bit flip detected) is reported, not judged: its data is known bad.
"""

from __future__ import annotations

import struct
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from danube.kernels import crc32c
from danube.machines.dispatch.types import SubscriptionType
from danube.machines.tiering import IndexEntry, IndexFormatError, ObjectRead, layout, validate_index
from danube.machines.wal import format, records
from danube.machines.wal.machine import Durability
from danube.values.names import parse_topic
from sim.broker import Observer, SubscriptionRecordView
from sim.disk import SimDisk
from sim.memory_checks import MemoryChecks
from sim.objects import SimObjectStore
from sim.world import World

_SINGLE_ACTIVE = (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER)
_FRAME_LENGTH = struct.Struct("<4xI")
"""A frame's total length, after its CRC."""
TIER = "7 objects equal frames"
ONE_ANSWER = "8 each request answered once"
SILENT_DAMAGE = "15 damage is never silent"
NO_INTERNAL = "16 no request fails internally"
SAFETY = "4 acknowledged is stored"
LIVENESS = "4b backlog drains"
POISON = "17 poison messages are settled by policy"


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    detail: str
    time_us: int


@dataclass(slots=True)
class _Acks:
    """Offsets a subscription's consumers acknowledged, with the contiguous prefix."""

    offsets: set[int] = field(default_factory=set)
    below: int = 0
    """Every offset below this is acknowledged."""

    def add(self, offset: int) -> None:
        self.offsets.add(offset)
        while self.below in self.offsets:
            self.below += 1


@dataclass(slots=True)
class _Subscription:
    acks: _Acks = field(default_factory=_Acks)
    last_sent: int = -1
    received: Counter[bytes] = field(default_factory=Counter)
    key_pending: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    key_highest: dict[str, int] = field(default_factory=dict)
    sent: set[int] = field(default_factory=set)
    acked_received: int = 0
    """Acknowledged messages received at least once (the drain's measure of what is owed)."""
    judged_through: int = -1
    """Offsets up to here were judged against the dispatcher's cursor (invariant 4)."""
    dropped: set[int] = field(default_factory=set)
    """Offsets the poison policy skipped (also in `acks`: settled for the subscription)."""
    dead_lettered: set[int] = field(default_factory=set)
    """Offsets stored in the dead-letter topic (also in `acks`)."""
    sends: Counter[int] = field(default_factory=Counter)
    released: set[int] = field(default_factory=set)
    """Blocked offsets an operator released, not sent since: sends queued before the
    release may still pass over them."""
    """Stream-writer sends of each offset (first sends and redeliveries)."""


def stored_payload(record: bytes) -> bytes:
    """The payload (field 3) of a stored `StreamMessage`, walking the fields as the broker
    writes them (one-byte tags, varints and length-delimited fields): the checker reads every
    written record, and the full codec costs five times as much. A record the walk does not
    end cleanly on (a field running past the end, a second payload, another wire type) goes
    through the full codec, which rejects what is malformed."""
    pos, end = 0, len(record)
    payload: bytes | None = None
    try:
        while pos < end:
            tag = record[pos]
            pos += 1
            wire = tag & 7
            if tag > 0x7F or wire not in (0, 2):
                break
            if wire == 0:
                while record[pos] & 0x80:
                    pos += 1
                pos += 1
                continue
            length = shift = 0
            while True:
                byte = record[pos]
                pos += 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            if pos + length > end:
                break
            if tag >> 3 == 3:
                if payload is not None:
                    break
                payload = record[pos : pos + length]
            pos += length
        else:
            if payload is not None:
                return payload
    except IndexError:
        pass
    return records.decode(record).payload


class InvariantChecker(MemoryChecks, Observer):
    def __init__(
        self,
        world: World,
        disk: SimDisk,
        durability: Durability,
        *,
        metadata: Mapping[str, Any] | None = None,
        objects: SimObjectStore | None = None,
    ) -> None:
        """`objects` (with the broker's `metadata`): a tiered run, whose object tier is
        judged too."""
        self.world = world
        self.disk = disk
        self.durability = durability
        self.metadata: Mapping[str, Any] = {} if metadata is None else metadata
        self.objects = objects
        self.wal_records: dict[str, dict[int, bytes]] = defaultdict(dict)
        """Tiered: the record the local WAL last wrote at each offset."""
        self._entries: dict[str, dict[int, IndexEntry]] = defaultdict(dict)
        """Tiered: the index entries seen so far (already checked), by start offset."""
        self.tier_halts: list[tuple[str, str, bool]] = []
        self.violations: list[Violation] = []
        self.acknowledged_payloads: dict[str, dict[bytes, str | None]] = defaultdict(dict)
        self.offsets: dict[str, dict[int, bytes]] = defaultdict(dict)
        self.keys: dict[str, dict[int, str]] = defaultdict(dict)
        self.subscriptions: dict[tuple[str, str], _Subscription] = defaultdict(_Subscription)
        self.offsets_judged = True
        """False once a power failure in `flush` mode made offset reuse legitimate."""
        self.duplicates = 0
        self.lost: dict[tuple[str, str], int] = {}
        self.acknowledged_end: dict[str, int] = defaultdict(int)
        """One past the highest offset acknowledged in `fsync` mode, per topic."""
        self.wal_acked_end: dict[str, int] = defaultdict(int)
        """One past the highest offset the WAL acknowledged (either durability), per topic."""
        self.payload_at: dict[str, dict[int, bytes]] = defaultdict(dict)
        """The payload the WAL last wrote at each offset, per topic (invariant 4)."""
        self.stored_at: dict[str, dict[bytes, list[int]]] = defaultdict(dict)
        """Every offset a payload was written at, per topic (a retried publish has several)."""
        self._early: dict[str, dict[bytes, list[_Subscription]]] = defaultdict(dict)
        """Payloads received before their producer was told they are stored."""
        self._passed: dict[str, dict[bytes, list[tuple[str, _Subscription]]]] = defaultdict(dict)
        """Payloads a cursor passed unacknowledged before their producer was told they are
        stored: judged when it is."""
        self._held: dict[str, set[bytes]] = defaultdict(set)
        """At the end: the payloads the records on disk and in indexed objects hold."""
        self.redelivery_limit: int | None = None
        """The poison workload's `max_redelivery_count` (None: no poison workload)."""
        self.delay_caps: dict[tuple[str, str], int] = {}
        self.dead_letters: dict[str, dict[int, bytes]] = {}
        """Dead-letter topics (set by the poison workload): every record written, by offset."""
        self.attempts_judge: Any = None
        """The poison workload's judge of stored failure counts (`sim.poison.PoisonDuty`)."""

    def _violate(self, invariant: str, detail: str) -> None:
        self.world.log(f"VIOLATION {invariant}: {detail}")
        self.violations.append(Violation(invariant, detail, self.world.now))

    def answered_twice(self, client: str) -> None:
        """A request of `client` got a second answer (a waiter table that answers twice)."""
        self._violate(ONE_ANSWER, f"a request of {client} was answered twice")

    def internal_error(self, request: str, error: Exception) -> None:
        """A request failed with an exception no rule foresaw (production: INTERNAL)."""
        self._violate(NO_INTERNAL, f"{request} failed: {type(error).__name__}: {error}")

    def restarted(self) -> None:
        for state in self.subscriptions.values():
            state.key_pending.clear()
        if self.attempts_judge is not None:
            self.attempts_judge.restarted()

    def power_failed(self) -> None:
        if self.durability is Durability.FLUSH:
            self.offsets_judged = False

    # -- from the broker --------------------------------------------------------------------------

    def acknowledged(self, topic: str, through: int, durability: Durability) -> None:
        if durability is Durability.FSYNC and not self.disk.is_durable(topic, through):
            self._violate(
                "1 no acknowledged message lost",
                f"{topic} offset {through} acknowledged before it was durable",
            )
        if durability is Durability.FSYNC:
            self.acknowledged_end[topic] = max(self.acknowledged_end[topic], through + 1)
        self.wal_acked_end[topic] = max(self.wal_acked_end[topic], through + 1)

    def recovered(self, topic: str, next_offset: int, *, fresh: bool) -> None:
        if fresh:
            self.acknowledged_end[topic] = 0
            self.wal_acked_end[topic] = 0
            return
        acknowledged = self.acknowledged_end[topic]
        if self.offsets_judged and next_offset < acknowledged:
            self._violate(
                SILENT_DAMAGE,
                f"{topic} was loaded with offsets continuing at {next_offset}, but offsets "
                f"through {acknowledged - 1} were acknowledged: they are lost and will be "
                "assigned again",
            )

    def sent(
        self, topic: str, sub: SubscriptionRecordView, consumer_id: int, offset: int, key: str
    ) -> None:
        state = self.subscriptions[(topic, sub.name)]
        if not self.offsets_judged:
            return
        if self.attempts_judge is not None:
            self.attempts_judge.sent(topic, sub, offset)
        if sub.sub_type is SubscriptionType.KEY_SHARED:
            self._sent_key(topic, sub.name, state, offset, key)
        elif sub.sub_type in _SINGLE_ACTIVE:
            # a message the Block policy holds is passed over (Danube: messages already out
            # are still retried): a run may restart, or go on, after it
            state.released.discard(offset)
            held = state.released.union(sub.dispatcher.held if sub.dispatcher else ())
            below = state.acks.below
            while below in held or below in state.acks.offsets:
                below += 1
            if offset <= state.last_sent and below < offset:
                self._violate(
                    "3 order",
                    f"{topic}/{sub.name} ({sub.sub_type.name}) went back to offset {offset} "
                    f"after {state.last_sent}, but offset {below} is unacknowledged",
                )
            elif offset > state.last_sent + 1:
                skipped = [
                    o
                    for o in range(state.last_sent + 1, offset)
                    if o not in state.acks.offsets and o not in held
                ]
                if state.last_sent >= 0 and skipped:
                    self._violate(
                        "3 order",
                        f"{topic}/{sub.name} ({sub.sub_type.name}) sent {offset} after "
                        f"{state.last_sent}, skipping unacknowledged {skipped[:5]}",
                    )
            state.last_sent = offset
            dispatcher = sub.dispatcher
            if dispatcher is not None:
                others = [
                    c
                    for c in dispatcher.consumer_ids
                    if c != consumer_id and dispatcher.in_flight(c)
                ]
                if others:
                    self._violate(
                        "5 exclusivity",
                        f"{topic}/{sub.name} ({sub.sub_type.name}) has messages in flight to "
                        f"consumer {consumer_id} and to {others}",
                    )
        state.sent.add(offset)
        state.sends[offset] += 1

    def _sent_key(self, topic: str, sub: str, state: _Subscription, offset: int, key: str) -> None:
        pending = state.key_pending[key]
        pending -= state.acks.offsets
        others = pending - {offset}
        if others:
            self._violate(
                "5 exclusivity",
                f"{topic}/{sub}: key {key!r} offset {offset} sent while {sorted(others)[:5]} "
                "of the same key are unacknowledged",
            )
        highest = state.key_highest.get(key, -1)
        if offset < highest and offset not in state.sent:
            self._violate(
                "3 order",
                f"{topic}/{sub}: key {key!r} offset {offset} sent for the first time after "
                f"offset {highest} of the same key",
            )
        state.key_highest[key] = max(highest, offset)
        pending.add(offset)

    # -- from the clients -------------------------------------------------------------------------

    def produced(self, topic: str, payload: bytes, key: str | None) -> None:
        """A producer was told `payload` is stored: a WAL write holds it at an offset the WAL
        acknowledged (invariant 4, at once)."""
        acknowledged = self.acknowledged_payloads[topic]
        if payload in acknowledged:
            return
        acknowledged[payload] = key
        for state in self._early[topic].pop(payload, ()):
            state.acked_received += 1
        if not self.offsets_judged:
            return
        end, payload_at = self.wal_acked_end[topic], self.payload_at[topic]
        offsets = self.stored_at[topic].get(payload, ())
        if not any(o < end and payload_at.get(o) == payload for o in offsets):
            self._violate(
                SAFETY,
                f"{topic}: {payload!r} was acknowledged to its producer, but no WAL write the "
                f"WAL acknowledged holds it (written at offsets {list(offsets)[:5]}, the WAL "
                f"acknowledged up to offset {end - 1})",
            )
        for sub, state in self._passed[topic].pop(payload, ()):
            self._judge_passed(topic, sub, state, payload)

    def received(self, topic: str, sub: str, consumer: str, offset: int, payload: bytes) -> None:
        state = self.subscriptions[(topic, sub)]
        state.received[payload] += 1
        if state.received[payload] > 1:
            self.duplicates += 1
        elif payload in self.acknowledged_payloads[topic]:
            state.acked_received += 1
        else:
            self._early[topic].setdefault(payload, []).append(state)
        if not self.offsets_judged:
            return
        known = self.offsets[topic].setdefault(offset, payload)
        if known != payload:
            self._violate(
                "2 one offset, one message",
                f"{topic} offset {offset} delivered as {payload!r}, earlier as {known!r}",
            )

    def client_acked(self, topic: str, sub: str, offset: int) -> None:
        self.subscriptions[(topic, sub)].acks.add(offset)

    def policy_dropped(self, topic: str, subscription: str, offset: int, attempts: int) -> None:
        """The poison policy settled `offset` for the subscription (invariant 17): it counts
        as acknowledged from now on, and it must have had its deliveries first: at least
        `max_redelivery_count + 1` sends (more after a restart, which loses unstored counts, or a
        consumer leaving, whose resends are free). An operator's skip of a blocked message
        comes after the same number."""
        state = self.subscriptions[(topic, subscription)]
        state.dropped.add(offset)
        state.acks.add(offset)
        self._judge_sends(topic, subscription, offset, attempts, "dropped by policy")

    def _judge_sends(self, topic: str, sub: str, offset: int, attempts: int, what: str) -> None:
        state, limit = self.subscriptions[(topic, sub)], self.redelivery_limit
        if limit is not None and self.offsets_judged and state.sends[offset] < limit + 1:
            self._violate(
                POISON,
                f"{topic}/{sub}: offset {offset} {what} after {state.sends[offset]} send(s); "
                f"max_redelivery_count {limit} owes {limit + 1} (the machine counted "
                f"{attempts} failures)",
            )

    def dead_lettered(
        self,
        topic: str,
        subscription: str,
        offset: int,
        attempts: int,
        target: str,
        at: int,
        held: bool | None,
    ) -> None:
        """The dead letter of `offset` is stored, before the subscription passes the
        original (invariant 17): the dead-letter topic's WAL acknowledged offset `at`, whose
        record holds the original's payload and points back to it (`x-original-*`). From now
        on the offset is settled for the subscription. The subscription must still hold the
        original (`held`): one it passed before is lost if the store fails."""
        state = self.subscriptions[(topic, subscription)]
        record = self.dead_letters.get(target, {}).get(at)
        problem = None
        if held is False:
            problem = "the subscription passed the original before this was stored"
        elif record is None or self.wal_acked_end[target] <= at:
            problem = "that is not stored"
        else:
            letter = records.decode(record)
            origin = letter.attributes
            if letter.payload != self.payload_at[topic].get(offset):
                problem = f"that holds {letter.payload!r}, not the original's payload"
            names = ("x-original-topic", "x-original-subscription", "x-original-topic-offset")
            if tuple(origin.get(name) for name in names) != (topic, subscription, str(offset)):
                problem = f"that points back to {origin}"
        if problem is not None and self.offsets_judged:
            self._violate(
                POISON,
                f"{topic}/{subscription}: offset {offset} reported dead-lettered at {target} "
                f"offset {at}, but {problem}",
            )
        state.dead_lettered.add(offset)
        state.acks.add(offset)
        self._judge_sends(topic, subscription, offset, attempts, "dead-lettered")

    def retry_scheduled(
        self, topic: str, subscription: str, offset: int, delay: int, cap: int
    ) -> None:
        """The poison workload: a nacked message waits at most its policy's cap (the largest
        the subscription had: a policy change does not move a retry already scheduled)."""
        key = (topic, subscription)
        cap = self.delay_caps[key] = max(self.delay_caps.get(key, 0), cap)
        if self.redelivery_limit is not None and self.offsets_judged and delay > cap:
            self._violate(
                POISON,
                f"{topic}/{subscription}: nacked offset {offset} goes out again in {delay} ms, "
                f"past the policy's {cap} ms cap on redelivery delays",
            )

    def policy_released(self, topic: str, subscription: str, offset: int) -> None:
        """An operator released a blocked offset: it goes out again, in a new run."""
        self.subscriptions[(topic, subscription)].released.add(offset)

    def unsettled(self, topic: str, sub: str) -> list[bytes]:
        """Acknowledged messages the subscription neither acknowledged (by a consumer, at
        some offset holding them) nor dropped by policy (invariant 17, at the end)."""
        acked, payload_at = self.subscriptions[(topic, sub)].acks.offsets, self.payload_at[topic]
        stored_at = self.stored_at[topic]
        return [
            p
            for p in self.acknowledged_payloads[topic]
            if not any(o in acked and payload_at.get(o) == p for o in stored_at.get(p, ()))
        ]

    # -- invariant 4: what each subscription owes -------------------------------------------------

    def cursor_at(self, topic: str, sub: str, cursor: int) -> None:
        """The subscription's dispatcher says every offset up to `cursor` is acknowledged: each
        offset it passed for the first time must have been acknowledged by one of its
        consumers, or hold a message the subscription acknowledged elsewhere, still owes at an
        offset after the cursor, or that no producer was told is stored (yet)."""
        state = self.subscriptions[(topic, sub)]
        if not self.offsets_judged or cursor <= state.judged_through:
            return
        acked, payload_at = state.acks.offsets, self.payload_at[topic]
        first, state.judged_through = state.judged_through + 1, cursor
        for offset in range(first, cursor + 1):
            if offset in acked:
                continue
            payload = payload_at.get(offset)
            if payload is None:
                continue  # never written: it holds nothing acknowledged
            if payload in self.acknowledged_payloads[topic]:
                self._judge_passed(topic, sub, state, payload)
            else:
                self._passed[topic].setdefault(payload, []).append((sub, state))

    def _judge_passed(self, topic: str, sub: str, state: _Subscription, payload: bytes) -> None:
        """The cursor passed an unacknowledged offset holding acknowledged `payload`."""
        payload_at, acked = self.payload_at[topic], state.acks.offsets
        offsets = [
            o for o in self.stored_at[topic].get(payload, ()) if payload_at.get(o) == payload
        ]
        if any(o in acked or o > state.judged_through for o in offsets):
            return  # acknowledged at another offset, or still owed after the cursor
        self._violate(
            SAFETY,
            f"{topic}/{sub}: the cursor passed offset(s) {offsets[:5]} holding acknowledged "
            f"{payload!r}, which no consumer of the subscription acknowledged "
            f"({'received' if state.received[payload] else 'never received'}); nothing after "
            f"the cursor (now {state.judged_through}) holds it, so it is never delivered",
        )

    def owed(self, topic: str, sub: str) -> int:
        """Acknowledged messages of `topic` the subscription has not received yet."""
        state = self.subscriptions[(topic, sub)]
        return len(self.acknowledged_payloads[topic]) - state.acked_received

    def first_deliveries(self, topic: str, sub: str) -> int:
        """Distinct messages the subscription received (the drain's measure of progress)."""
        return len(self.subscriptions[(topic, sub)].received)

    def backlog_stalled(self, topic: str, sub: str, detail: str) -> None:
        """The drain ended without progress while the subscription still owed messages."""
        received = self.subscriptions[(topic, sub)].received
        missing = [p for p in self.acknowledged_payloads[topic] if not received[p]]
        self._violate(
            LIVENESS,
            f"{topic}/{sub} still owes {len(missing)} acknowledged message(s), e.g. "
            f"{sorted(missing)[:3]}: {detail}",
        )

    def recovery_unfinished(self, loading: list[str], deferred: int) -> None:
        """After the last restart, every stored topic's WAL must have been loaded (or the
        topic stopped as damaged) within the wait: a load taken off the restart's queue and
        never started leaves its topic refusing every client for ever."""
        self._violate(
            LIVENESS,
            f"recovery did not finish: {len(loading)} topic(s) still loading, e.g. "
            f"{loading[:3]}, {deferred} deferred load(s) not started",
        )

    # -- the object tier --------------------------------------------------------------------------

    def written(self, topic: str, data: bytes) -> None:
        """What each offset holds (invariant 4), and in tiered runs the record itself
        (invariant 7)."""
        stored = self.wal_records[topic] if self.objects is not None else None
        letters = self.dead_letters.get(topic)
        payload_at, stored_at = self.payload_at[topic], self.stored_at[topic]
        cursor = 0
        while cursor + _FRAME_LENGTH.size <= len(data):
            (length,) = _FRAME_LENGTH.unpack_from(data, cursor)
            if cursor + length > len(data):
                break  # the torn end of a write
            frame = format.decode_frame(data, cursor)
            for index, record in enumerate(frame.records):
                offset = frame.base_offset + index
                payload = stored_payload(record)
                payload_at[offset] = payload
                stored_at.setdefault(payload, []).append(offset)
                if stored is not None:
                    stored[offset] = record
                if letters is not None:
                    letters[offset] = record
            cursor += length

    def retention_skipped(self, topic: str, subscription: str, first: int, end: int) -> None:
        self._violate(
            SAFETY,
            f"{topic}/{subscription}: offsets {first}–{end - 1} were in no tier when the "
            "subscription read them",
        )

    def index_committed(self, topic: str) -> None:
        self._check_index(topic, everything=False)

    def object_read(self, topic: str, plan: ObjectRead) -> None:
        entry = self.indexed(topic).get(plan.segment_base)
        if entry is None or entry.key != plan.key:
            self._violate(TIER, f"{topic}: a history read names {plan.key}, which no entry names")
        elif not entry.start_offset <= plan.from_offset < plan.end_offset <= entry.next_offset:
            self._violate(
                TIER,
                f"{topic}: a read of offsets {plan.from_offset}–{plan.end_offset - 1} from "
                f"{plan.key} reaches outside its entry",
            )

    def object_served(self, topic: str, first: int, records: tuple[bytes, ...]) -> None:
        for index, record in enumerate(records):
            if not self._same_record(topic, first + index, record, "a history read"):
                return

    def object_deleted(self, topic: str, key: str) -> None:
        if any(entry.key == key for entry in self.indexed(topic).values()):
            self._violate(TIER, f"{topic}: the orphan collection deletes indexed object {key}")

    def segment_deleted(self, topic: str, base: int, next_offset: int) -> None:
        entries = sorted(self.indexed(topic).values(), key=lambda e: e.start_offset)
        if not (
            entries and entries[0].start_offset <= base and next_offset <= entries[-1].next_offset
        ):
            covered = (
                f"{entries[0].start_offset}–{entries[-1].end_offset}" if entries else "nothing"
            )
            self._violate(
                TIER,
                f"{topic}: local retention deletes segment {base} (offsets {base}–"
                f"{next_offset - 1}) while the index covers {covered}",
            )

    def tier_halted(self, topic: str, reason: str, resumable: bool) -> None:
        self.tier_halts.append((topic, reason, resumable))

    def indexed(self, topic: str) -> dict[int, IndexEntry]:
        """The topic's committed index entries in the metadata, by start offset."""
        prefix = layout.index_prefix(parse_topic(topic))
        found: dict[int, IndexEntry] = {}
        for path, value in self.metadata.items():
            start = layout.index_start(path) if path.startswith(prefix) else None
            if start is None:
                continue
            try:
                found[start] = IndexEntry.from_json(value)
            except IndexFormatError as error:
                self._violate(TIER, f"{topic}: index entry {path} is malformed: {error}")
        return found

    def _check_index(self, topic: str, *, everything: bool) -> None:
        """The index as committed now; the objects of entries not checked before (all of
        them with `everything`)."""
        name = parse_topic(topic)
        indexed = self.indexed(topic)
        entries = [indexed[start] for start in sorted(indexed)]
        for start, entry in indexed.items():
            if entry.start_offset != start:
                self._violate(TIER, f"{topic}: the entry at {start} starts at {entry.start_offset}")
        for problem in validate_index(entries):
            self._violate(TIER, f"{topic}: {problem}")
        seen = self._entries[topic]
        for start, before in seen.items():
            if indexed.get(start) != before:
                self._violate(TIER, f"{topic}: committed index entry {start} changed or vanished")
        if entries:
            current = self.metadata.get(layout.current_path(name))
            if current != layout.current_value(entries[-1].start_offset):
                self._violate(
                    TIER,
                    f"{topic}: cur is {current}, the newest entry starts at "
                    f"{entries[-1].start_offset}",
                )
        for entry in entries:
            if everything or entry.start_offset not in seen:
                self._check_object(topic, entry)
        seen.update(indexed)

    def _check_object(self, topic: str, entry: IndexEntry) -> None:
        assert self.objects is not None
        name = parse_topic(topic)
        where = f"{topic}: object {entry.key}"
        if layout.parse_object_key(name, entry.key) != (entry.start_offset, entry.next_offset):
            self._violate(TIER, f"{where} is not named after its offsets")
        stored = self.objects.objects.get(entry.key)
        if stored is None:
            self._violate(TIER, f"{where} is indexed but not in the store")
            return
        data = stored.data
        if (len(data), crc32c(data)) != (entry.size, entry.crc32c):
            self._violate(
                TIER,
                f"{where} has {len(data)} bytes with crc32c {crc32c(data)}, the index says "
                f"{entry.size} bytes with crc32c {entry.crc32c}",
            )
            return
        try:
            scan = format.scan_segment(data)
        except format.WalFormatError as error:
            self._violate(TIER, f"{where} is not a segment: {error}")
            return
        held = (scan.state, scan.header.base_offset, scan.next_offset)
        if held != (format.SegmentState.WHOLE, entry.start_offset, entry.next_offset):
            self._violate(
                TIER,
                f"{where} is {scan.state.value} with offsets {scan.header.base_offset}–"
                f"{scan.next_offset - 1}, indexed as {entry.start_offset}–{entry.end_offset}",
            )
            return
        frames = dict(zip(scan.positions, scan.base_offsets, strict=True))
        wrong = [pair for pair in entry.offset_index if frames.get(pair[1]) != pair[0]]
        if wrong:
            self._violate(TIER, f"{where}: offset_index pairs {wrong[:3]} name no frame start")
        held = self._held[topic]
        for offset, record in format.scanned_records(data, scan):
            held.add(stored_payload(record))
            if not self._same_record(topic, offset, record, where):
                return

    def _same_record(self, topic: str, offset: int, record: bytes, where: str) -> bool:
        """Whether `record`, found at `offset` in an object, is what the WAL wrote there."""
        written = self.wal_records[topic].get(offset)
        if written == record and records.decode(record).topic_offset == offset:
            return True
        payload = records.decode(record).payload
        if written is None:
            self._violate(TIER, f"{where} holds offset {offset} ({payload!r}), never written")
        else:
            self._violate(
                TIER,
                f"{where} holds {payload!r} at offset {offset}, where the WAL wrote "
                f"{records.decode(written).payload!r}",
            )
        return False

    # -- at the end -------------------------------------------------------------------------------

    def final(self, subscriptions: list[tuple[str, str]], stopped: dict[str, str]) -> None:
        """The records on disk and in objects, and what each subscription still owes (a
        count: whether the backlog drained is the drain's to judge, 4b). Invariant 4 at the
        end: every acknowledged message is still stored, on disk or in an indexed object."""
        for topic, reason in sorted(stopped.items()):
            if "cannot be read" in reason:  # flows.read_object: a store failure, not damage
                self._violate(TIER, f"{topic} stopped because the object store failed: {reason}")
            elif "is corrupt" in reason and topic not in self.disk.damaged:
                # what stopped it was no damage: the broker lost or overwrote its own data
                self._violate(SILENT_DAMAGE, f"{topic} stopped, no damage injected: {reason}")
        for topic, sub in subscriptions:
            if topic not in stopped and (owed := self.owed(topic, sub)):
                self.lost[(topic, sub)] = owed
        for topic in self.disk.topics:
            if topic not in stopped and self.offsets_judged:
                self._check_records(topic)
        topics = dict.fromkeys(topic for topic, _ in subscriptions)
        if self.objects is not None:
            for topic in topics:
                self._check_index(topic, everything=True)
        for topic in topics:
            if topic in stopped or not self.offsets_judged:
                continue
            held = self._held[topic]
            gone = [p for p in self.acknowledged_payloads[topic] if p not in held]
            if gone:
                self._violate(
                    SAFETY,
                    f"{topic}: {len(gone)} acknowledged message(s) are in no record on disk "
                    f"or in an indexed object at the end, e.g. {sorted(gone)[:3]}",
                )

    def _check_records(self, topic: str) -> None:
        expected: int | None = None
        held = self._held[topic]
        for base, data in self.disk.scans(topic):
            scan = format.scan_segment(data)
            if scan.state is not format.SegmentState.WHOLE and base != max(
                b for b, _ in self.disk.scans(topic)
            ):
                self._violate("2 one offset, one message", f"{topic} segment {base} is damaged")
            for position in scan.positions:
                frame = format.decode_frame(data, position)
                if expected is not None and frame.base_offset != expected:
                    self._violate(
                        "2 one offset, one message",
                        f"{topic}: offsets jump from {expected} to {frame.base_offset}",
                    )
                for index, record in enumerate(frame.records):
                    decoded = records.decode(record)
                    held.add(decoded.payload)
                    stamped = decoded.topic_offset
                    if stamped != frame.base_offset + index:
                        self._violate(
                            "2 one offset, one message",
                            f"{topic}: the record at offset {frame.base_offset + index} says "
                            f"it is offset {stamped}",
                        )
                expected = frame.base_offset + len(frame.records)

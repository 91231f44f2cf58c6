"""The invariants of spec/invariants.md, checked while a simulation runs and at its end.

The checker hears from the clients (what producers were told, what consumers received and
acknowledged) and from inside the broker (each acknowledgement to producers, each message a
stream writer sends, and, white-box, the dispatcher's in-flight sets). What it checks:

1. no acknowledged message lost: at the moment the broker acknowledges a publish in `fsync`
   mode its record is durable on the simulated disk; at the end every message a producer was
   told is stored has reached every subscription (at least once);
2. one offset names one message: every delivery of an offset carries the same payload, and
   the records on disk at the end have dense offsets, each stamped with its own offset;
3. order: Exclusive/Failover send in offset order, and a run that restarts begins at an offset
   below which everything is acknowledged; Key-Shared sends a key's messages in offset order;
5. exclusivity: an Exclusive/Failover subscription never has messages in flight to two
   consumers, and Key-Shared never has two messages of one key in flight.

`flush` durability gives up 1 and 2 on power failure (spec/durability.md): after one, the
checker stops judging offsets and reports the acknowledged messages lost instead. A topic the
broker stopped (a bit flip detected) is reported, not judged: its data is known bad.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from danube.dispatch.types import SubscriptionType
from danube.wal import format, records
from danube.wal.machine import Durability
from sim.broker import Observer, SubscriptionRecordView
from sim.disk import SimDisk
from sim.world import World

_SINGLE_ACTIVE = (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER)


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


class InvariantChecker(Observer):
    def __init__(self, world: World, disk: SimDisk, durability: Durability) -> None:
        self.world = world
        self.disk = disk
        self.durability = durability
        self.violations: list[Violation] = []
        self.acknowledged_payloads: dict[str, dict[bytes, str | None]] = defaultdict(dict)
        self.offsets: dict[str, dict[int, bytes]] = defaultdict(dict)
        self.keys: dict[str, dict[int, str]] = defaultdict(dict)
        self.subscriptions: dict[tuple[str, str], _Subscription] = defaultdict(_Subscription)
        self.offsets_judged = True
        """False once a power failure in `flush` mode made offset reuse legitimate."""
        self.duplicates = 0
        self.lost: dict[tuple[str, str], int] = {}

    def _violate(self, invariant: str, detail: str) -> None:
        self.world.log(f"VIOLATION {invariant}: {detail}")
        self.violations.append(Violation(invariant, detail, self.world.now))

    def restarted(self) -> None:
        for state in self.subscriptions.values():
            state.key_pending.clear()

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

    def sent(
        self, topic: str, sub: SubscriptionRecordView, consumer_id: int, offset: int, key: str
    ) -> None:
        state = self.subscriptions[(topic, sub.name)]
        if not self.offsets_judged:
            return
        if sub.sub_type is SubscriptionType.KEY_SHARED:
            self._sent_key(topic, sub.name, state, offset, key)
        elif sub.sub_type in _SINGLE_ACTIVE:
            if offset <= state.last_sent and state.acks.below < offset:
                self._violate(
                    "3 order",
                    f"{topic}/{sub.name} ({sub.sub_type.name}) went back to offset {offset} "
                    f"after {state.last_sent}, but offset {state.acks.below} is unacknowledged",
                )
            elif offset > state.last_sent + 1:
                skipped = [
                    o for o in range(state.last_sent + 1, offset) if o not in state.acks.offsets
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
        self.acknowledged_payloads[topic][payload] = key

    def received(self, topic: str, sub: str, consumer: str, offset: int, payload: bytes) -> None:
        state = self.subscriptions[(topic, sub)]
        state.received[payload] += 1
        if state.received[payload] > 1:
            self.duplicates += 1
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

    # -- at the end -------------------------------------------------------------------------------

    def final(self, subscriptions: list[tuple[str, str]], stopped: dict[str, str]) -> None:
        """At-least-once and the records on disk, once the run has drained."""
        for topic, sub in subscriptions:
            if topic in stopped:
                continue
            received = self.subscriptions[(topic, sub)].received
            missing = [p for p in self.acknowledged_payloads[topic] if not received[p]]
            if missing:
                self.lost[(topic, sub)] = len(missing)
                if self.offsets_judged:
                    self._violate(
                        "4 at-least-once",
                        f"{topic}/{sub} never received {len(missing)} acknowledged "
                        f"message(s), e.g. {sorted(missing)[:3]}",
                    )
        for topic in self.disk.topics:
            if topic not in stopped and self.offsets_judged:
                self._check_records(topic)

    def _check_records(self, topic: str) -> None:
        expected: int | None = None
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
                    stamped = records.decode(record).topic_offset
                    if stamped != frame.base_offset + index:
                        self._violate(
                            "2 one offset, one message",
                            f"{topic}: the record at offset {frame.base_offset + index} says "
                            f"it is offset {stamped}",
                        )
                expected = frame.base_offset + len(frame.records)

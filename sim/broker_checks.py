"""What the simulated broker judges inside the core after each tick (invariants 18 and 20):
held records, paused reads, the RSS squeeze's share of the publish pool, producers removed
for idleness. Split out of `sim.broker` (module size); read without touching the core."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from danube.machines.dispatch.reliable import ReliableSubscription
from danube.machines.memory.ledger import CacheLedger
from danube.machines.memory.publish import PublishPool
from danube.machines.node.core import BrokerCore
from danube.machines.node.departed_subscriptions import SWEEP_MS
from danube.machines.node.remembered_producers import Gone

if TYPE_CHECKING:
    from sim.broker import SimBroker


def expired_early(core: BrokerCore, before: set[int], broker: SimBroker) -> list[str]:
    """Invariant 20: producers the tick removed for idleness (`idle_producers`) that a
    publish, a health check or their creation reached less than `producer_idle_ms` ago."""
    idle_ms = core.producers.idle.idle_ms
    early = []
    for producer_id in before.difference(core.producers.by_id):
        seen = broker.producer_seen.get(producer_id)
        if (
            expired_for_idleness(core, producer_id)
            and seen is not None
            and broker.monotonic_ms - seen < idle_ms
        ):
            early.append(
                f"producer {producer_id} removed {broker.monotonic_ms - seen} ms after it was "
                f"last seen (timeout {idle_ms} ms)"
            )
    return early


def expired_for_idleness(core: BrokerCore, producer_id: int) -> bool:
    """The producer is remembered as removed for idleness (`RememberedProducers`)."""
    gone = core.producers.remembered.why(producer_id)
    return gone is not None and gone[0] is Gone.EXPIRED


def held_records(core: BrokerCore) -> tuple[int, list[str]]:
    """What reliable subscriptions hold, added up, and what is held in vain: offsets their
    dispatcher no longer waits on (a record kept after its acknowledgement), outboxes of
    consumers without a stream (kept after a disconnect), records of a subscription none of
    whose consumers has a stream (not let go when the last one left), unless an exhausted
    message is blocked or being dead-lettered there."""
    held, stray = 0, []
    for consumer_id, box in core.logs.outbox.items():
        consumer = core.consumer_record(consumer_id)
        if box and (consumer is None or not consumer.stream):
            stray.append(f"the outbox of consumer {consumer_id}, which has no stream")
    for record in core.catalogue.topics_by_name.values():
        for sub in record.subscriptions.values():
            if not record.reliable:
                continue
            held += getattr(sub.records, "held", 0)
            machine = cast(ReliableSubscription, sub.machine)
            for consumer_id in sub.consumers.values():
                consumer = core.consumer_record(consumer_id)
                if (
                    consumer is not None
                    and consumer.stream
                    and not machine.is_connected(consumer_id)
                ):
                    stray.append(f"consumer {consumer_id}'s stream, unknown to its dispatcher")
                elif consumer is not None and consumer.stream:
                    stray.extend(
                        f"{record.name.full}/{sub.name}@{o} in flight and not held"
                        for o in machine.in_flight(consumer_id)
                        if o not in sub.records
                    )
            stray.extend(
                f"{record.name.full}/{sub.name}@{o}"
                for o in sub.records
                if not sub.machine.is_pending(o)  # an observer: not a touch
            )
    return held, stray


def paused_in_vain(core: BrokerCore, only: tuple[str, str] | None = None) -> list[str]:
    """Reads the consumer pool keeps paused that should have gone on: every one whose room
    came (the pool's own room, or, for a subscription that holds nothing or is gone or
    rebuilt, what it may borrow of the cache pool). `only` (topic, subscription): judge that
    subscription's reads alone (after its acknowledgements; one emptied some other way,
    by a policy drop or a stored dead letter, goes on at the next tick)."""
    pool = core.logs.consumer_pool
    if pool is None or not pool.paused:
        return []
    topics = core.catalogue.topics_by_name
    waiting = []
    for paused in pool.paused:
        topic, name, epoch, _ = paused
        if only is not None and only != (topic, name):
            continue
        record = topics.get(topic)
        sub = record.subscriptions.get(name) if record is not None else None
        holding = sub is not None and sub.epoch == epoch and bool(sub.records)
        if pool.ready(paused, holding):
            which = "holds records" if holding else "holds nothing"
            waiting.append(f"{topic}/{name}, which {which}, while its room is free")
    return waiting


def squeezed_room(pool: PublishPool, ledger: CacheLedger) -> int:
    """What the RSS squeeze took of the publish pool's room to borrow (its capacity shrinks
    by it after admission, as by what held records borrow; `PublishPool.room_to_borrow`)."""
    if not ledger.squeeze:
        return 0
    kept = max(ledger.state, ledger.state_limit) + ledger.consumers
    whole = max(0, min(pool.borrowable, pool._cache_pool - kept))
    return whole - pool.room_to_borrow


def relieve_pool(pool: PublishPool) -> None:
    pool.relieve()


def held_past_grace(
    core: BrokerCore, since: dict[tuple[str, str, int], int], now_ms: int
) -> list[str]:
    """Invariant 18, departed subscriptions: a reliable subscription that has held records
    with no connected consumer for longer than the grace and two sweeps (the first sweep
    to see it may come a sweep late, the one that lets go a sweep after the grace) lets
    them go, unless a blocked message or a dead letter being stored keeps its window. A
    departure the sweep never hears of (its set not noting a disconnect) would hold them
    for ever. `since` ((topic, subscription, epoch) -> first seen so, monotonic ms) is kept
    by the caller across ticks of one core."""
    grace = core.departed.grace_ms
    if not grace:
        return []
    late = grace + 2 * SWEEP_MS + 100
    seen: dict[tuple[str, str, int], int] = {}
    kept = []
    for record in core.catalogue.topics_by_name.values():
        if not record.reliable:
            continue
        for sub in record.subscriptions.values():
            machine = cast(ReliableSubscription, sub.machine)
            if not sub.records or machine.connected_count or machine.held:
                continue
            key = (record.name.full, sub.name, sub.epoch)
            seen[key] = first = since.get(key, now_ms)
            if now_ms - first > late:
                kept.append(f"{record.name.full}/{sub.name} held {now_ms - first} ms unconnected")
    since.clear()
    since.update(seen)
    return kept


class HeldPastGrace:
    """`held_past_grace` across the ticks of a broker: what it has seen of the current core
    (a restart's new core starts afresh)."""

    __slots__ = ("_core", "_since")

    def __init__(self) -> None:
        self._core: BrokerCore | None = None
        self._since: dict[tuple[str, str, int], int] = {}

    def __call__(self, core: BrokerCore, now_ms: int) -> list[str]:
        if core is not self._core:
            self._core, self._since = core, {}
        return held_past_grace(core, self._since, now_ms)

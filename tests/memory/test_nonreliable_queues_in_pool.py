"""Non-reliable consumer queues in the consumer pool (spec/memory.md, "Consumer queues";
issue 28 review): before, they were bounded per consumer only (`dispatch.
consumer_queue_bytes`, 16 MiB each), so many non-reliable consumers with full queues held
many times the pool. Now every queue together takes only the pool's own room left by the
reliable subscriptions' held records; a message with no room is dropped and counted
(`DropReason.MEMORY_BUDGET`: at-most-once), the pool's room comes back as messages are sent,
moved or their subscription goes, and reliable reads see what the queues take."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.dispatch import NonReliableSubscription, QueueLimits, SubscriptionType
from danube.machines.dispatch.types import LATEST, DropReason
from danube.machines.memory.budget import MemoryPools
from danube.machines.memory.consumer import ConsumerPool
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.values.config import DispatchStrategy, Policies

URL = "http://127.0.0.1:6650"
TOPIC = "/default/nr"
KIB = 1024


def _core(consumer_pool: int) -> BrokerCore:
    core = BrokerCore(
        BrokerIdentity(URL, URL),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(),
        memory=MemoryPools(
            256 * KIB + 64 * KIB + consumer_pool, 256 * KIB, 64 * KIB, consumer_pool
        ),
    )
    core.bootstrap(["default"])
    return core


def test_queues_take_only_the_pools_room_and_drop_the_rest_counted() -> None:
    core = _core(16 * KIB)
    pool = core.logs.consumer_pool
    assert pool is not None
    pid = core.create_producer(
        TOPIC, "p", access_mode=0, strategy=DispatchStrategy.NON_RELIABLE
    ).value
    consumers = []
    for name in ("a", "b", "c"):  # three subscriptions, each with a consumer that never reads
        cid = core.subscribe(TOPIC, name, name, 0, (), LATEST, now_ms=1).value
        consumers.append((cid, core.open_stream(cid, now_ms=1).value))
    for _ in range(40):
        core.publish(pid, TOPIC, b"x" * 1000, 1000, None, now_ms=1)
    # each per-consumer queue (16 MiB) would have taken all 40: 120,000 bytes in all
    assert pool.queued <= pool.limit
    assert pool.queued > pool.limit - 3 * 1100  # filled up to about the last message
    subs = core.catalogue.topics_by_name[TOPIC].subscriptions
    dropped = sum(
        s.dispatcher.drop_counts().get(DropReason.MEMORY_BUDGET, 0) for s in subs.values()
    )
    assert dropped == pool.queue_refused > 0
    assert pool.queued == sum(s.dispatcher.queued_bytes for s in subs.values())
    before = pool.queued
    cid, generation = consumers[0]
    taken = core.take(cid, generation, 1000)
    assert taken and pool.queued < before, "sent messages give their room back"
    assert pool.queued == sum(s.dispatcher.queued_bytes for s in subs.values())
    core.close_stream(*consumers[1], now_ms=2)  # attached consumers must close first
    core.unsubscribe(TOPIC, "b")
    assert pool.queued == sum(s.dispatcher.queued_bytes for s in subs.values())
    core.delete_topic(TOPIC)
    assert pool.queued == 0, "a removed topic's queues give their room back"


def test_reliable_reads_see_the_room_queues_take() -> None:
    pool = ConsumerPool(10 * KIB)
    assert pool.own_room == 10 * KIB
    assert pool.enqueue(8 * KIB)
    assert pool.own_room == 2 * KIB and pool.borrowed == 0
    assert not pool.enqueue(4 * KIB) and pool.queue_refused == 1
    pool.took(4 * KIB)  # a reliable read of a subscription holding nothing borrows
    assert pool.borrowed == 2 * KIB
    pool.dequeue(8 * KIB)
    assert pool.borrowed == 0 and pool.own_room == 6 * KIB


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(list(SubscriptionType)),
    st.lists(
        st.tuples(st.sampled_from("ptcdr"), st.integers(0, 3), st.integers(1, 3000)),
        max_size=80,
    ),
)
def test_the_pool_counts_exactly_what_the_queues_hold(
    kind: SubscriptionType, ops: list[tuple[str, int, int]]
) -> None:
    """Under any publishes, takes, connects, disconnects and removals, the pool's count of
    queued bytes is what the queues hold, never past its share."""
    pool = ConsumerPool(8 * KIB)
    sub = NonReliableSubscription(kind, QueueLimits(max_messages=6, max_bytes=6_000))
    sub.pool = pool
    present: set[int] = set()
    for op, who, size in ops:
        if op == "p":
            sub.publish(b"m", size, bytes([who]))
        elif op == "t" and who in present:
            sub.take(who, 2)
        elif op == "c":
            if who not in present:
                sub.add_consumer(who, f"c{who}", ())
                present.add(who)
            sub.connect(who)
        elif op == "d" and who in present:
            sub.disconnect(who)
        elif op == "r" and who in present:
            sub.remove_consumer(who)
            present.discard(who)
        assert pool.queued == sub.queued_bytes <= pool.limit
    sub.release()
    assert pool.queued == 0

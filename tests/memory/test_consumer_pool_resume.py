"""Reads the consumer pool paused go on at the acknowledgement that lets them (spec/memory.md,
"Consumer queues"; issue 28): the one that makes room hands every paused read back, the one
that empties a subscription hands back its own even while others' consumers keep the pool
full (review finding: it waited for room, though a subscription holding nothing may always
read once). Before, both waited for the next tick (every 50 ms), and the second for the
whole pool to have room."""

from __future__ import annotations

from danube.machines.memory.budget import MemoryPools
from danube.machines.memory.consumer import HELD_PER_RECORD
from tests.node.test_core_reliable import Broker, payloads, record_of

HELD = len(record_of("m0")) + HELD_PER_RECORD
"""What one held record of these tests costs the consumer pool."""


def _broker() -> Broker:
    """A consumer pool with room for three held records (the other pools roomy)."""
    mib = 1 << 20
    return Broker(memory=MemoryPools(2 * mib + 3 * HELD, mib, mib, 3 * HELD))


def test_an_ack_that_empties_a_subscription_resumes_its_read_while_the_pool_stays_full() -> None:
    broker = _broker()
    pool = broker.core.logs.consumer_pool
    assert pool is not None
    pid = broker.producer()
    for i in range(3):
        broker.publish(pid, f"m{i}")
    # each reads the three at once: a subscription that holds nothing may always read once
    slow, busy = broker.consumer("slow", sub="slow"), broker.consumer("busy", sub="busy")
    assert payloads(broker.take(slow)) == payloads(broker.take(busy)) == ["m0", "m1", "m2"]
    assert pool.full
    broker.publish(pid, "m3")
    assert len(pool.paused) == 2, "both hold records: their reads of m3 wait for room"

    for offset in range(3):
        broker.ack(offset, sub="busy")
    assert pool.full, "the slow subscription's records still fill it"
    assert payloads(broker.take(busy)) == ["m3"], "at the ack, not at a tick"
    assert [p[1] for p in pool.paused] == ["slow"]

    for offset in range(3):
        broker.ack(offset, sub="slow")
    assert not pool.paused
    assert payloads(broker.take(slow)) == ["m3"], "the ack that made room resumed it"


def test_an_ack_that_frees_one_records_room_carries_out_one_read_not_every_paused_one() -> None:
    """Review finding: every acknowledgement that made room handed back all paused reads; the
    first filled the pool again and each of the others paused again (and counted as a new
    pause), so with n subscriptions paused each ack cost n reads: quadratic under memory
    pressure. Reads after the pool is full again keep their place, uncounted."""
    n = 15
    mib = 1 << 20
    broker = Broker(memory=MemoryPools(2 * mib + n * HELD, mib, mib, n * HELD))
    pool = broker.core.logs.consumer_pool
    assert pool is not None
    pid = broker.producer()
    broker.publish(pid, "m0")
    consumers = [broker.consumer(f"c{i}", sub=f"s{i}") for i in range(n)]
    for consumer in consumers:
        assert payloads(broker.take(consumer)) == ["m0"]
    assert pool.full
    broker.publish(pid, "m1")
    assert len(pool.paused) == n
    paused_before = pool.paused_reads
    for i in range(n):
        waiting = list(pool.paused)
        broker.ack(0, sub=f"s{i}")
        # s{i} holds nothing now: its own read goes on; nobody else's read pauses again
        assert pool.paused_reads == paused_before, f"ack of s{i} re-paused reads"
        assert list(pool.paused) == [p for p in waiting if p[1] != f"s{i}"]
        assert payloads(broker.take(consumers[i])) == ["m1"]

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

"""The consumer pool within the whole budget (spec/memory.md, "Consumer queues"; issue 28 point
2, "accounted memory never exceeds the budget"). Review finding: a subscription holding nothing
could always read once, up to a 4 MiB file read, also while the pool was full, so the pool
passed its share by that much per such subscription and nothing bounded it. Now such a read
borrows of the cache pool (the cache gives way: its ledger's pool shrinks at once), no more than
the cache pool has left after the state's room and what publishes borrow, and at most
`FREE_READ_BYTES` beyond the pool's own room (or its first record); with no room even for that,
it waits and goes on when the room comes."""

from __future__ import annotations

from danube.machines.memory.budget import MemoryPools
from danube.machines.memory.consumer import (
    FREE_READ_BYTES,
    HELD_PER_RECORD,
    MIN_READ_BYTES,
    HeldRecords,
)
from danube.machines.memory.pools import BrokerPools, broker_pools
from tests.node.test_core_reliable import Broker, payloads, record_of

KIB = 1024
RECORD = b"x" * 1000
SIZE = len(RECORD) + HELD_PER_RECORD


def _pools(
    cache: int = 256 * KIB, publish: int = 64 * KIB, consumer: int = 4 * SIZE
) -> BrokerPools:
    return broker_pools(MemoryPools(cache + publish + consumer, cache, publish, consumer))


def _accounted(pools: BrokerPools) -> int:
    ledger, publish, held = pools.cache_ledger, pools.publish_pool, pools.consumer_pool
    assert ledger is not None and publish is not None and held is not None
    return ledger.total + ledger.state + publish.used + held.used


def test_a_read_of_a_subscription_holding_nothing_borrows_of_the_cache_pool() -> None:
    pools = _pools()
    pool, ledger = pools.consumer_pool, pools.cache_ledger
    assert pool is not None and ledger is not None
    slow = HeldRecords(pool)
    for offset in range(4):
        slow[offset] = RECORD  # another subscription's slow consumer fills the pool
    assert pool.full and not pool.may_read(holding=True)
    assert pool.may_read(holding=False)
    # cut to FREE_READ_BYTES, not the 4 MiB a file read may ask for
    assert pool.allowance(holding=False) == FREE_READ_BYTES
    count = pool.admissible([len(RECORD)] * 100, holding=False)
    assert count == FREE_READ_BYTES // SIZE
    share = ledger.pool
    busy = HeldRecords(pool)
    for offset in range(count):
        busy[offset] = RECORD
    assert ledger.consumers == pool.borrowed == count * SIZE
    assert ledger.pool == share - count * SIZE, "the cache pool gave way at once"
    assert _accounted(pools) <= 256 * KIB + 64 * KIB + 4 * SIZE
    busy.clear()
    assert ledger.consumers == 0 and ledger.pool == share, "given back as it is let go"


def test_a_read_holding_records_takes_only_the_pools_own_room() -> None:
    pool = _pools().consumer_pool
    assert pool is not None
    held = HeldRecords(pool)
    held[0] = RECORD
    assert pool.admissible([len(RECORD)] * 10, holding=True) == 3
    held[1] = RECORD
    held[2] = RECORD
    held[3] = RECORD
    assert pool.admissible([len(RECORD)], holding=True) == 0


def test_a_large_first_record_is_taken_alone_when_it_fits_the_room() -> None:
    pool = _pools(cache=1024 * KIB).consumer_pool
    assert pool is not None
    large = 2 * FREE_READ_BYTES
    assert pool.admissible([large, 10], holding=False) == 1
    assert pool.admissible([large], holding=True) == 0


def test_without_room_to_borrow_a_free_read_waits_and_goes_on_when_room_comes() -> None:
    pools = _pools()
    pool, publish, ledger = pools.consumer_pool, pools.publish_pool, pools.cache_ledger
    assert pool is not None and publish is not None and ledger is not None
    slow = HeldRecords(pool)
    for offset in range(4):
        slow[offset] = RECORD
    borrowable = ledger.lendable()
    assert publish.reserve(publish.limit + borrowable)  # publishes borrowed all they may
    assert ledger.lendable() == 0
    assert not pool.may_read(holding=False), "no room: it waits rather than passing the budget"
    pool.pause("/t", "busy", 0, "read")
    assert pool.resume(lambda *paused: True) == [], "nothing holds it, but no room came yet"
    publish.release(publish.limit + borrowable)
    assert [p[3] for p in pool.resume(lambda *paused: True)] == ["read"]


def test_a_read_whose_first_record_did_not_fit_waits_for_that_much_room() -> None:
    pools = _pools()
    pool = pools.consumer_pool
    assert pool is not None
    slow = HeldRecords(pool)
    for offset in range(3):
        slow[offset] = RECORD
    need = 2 * SIZE
    assert pool.admissible([need - HELD_PER_RECORD], holding=True) == 0
    pool.pause("/t", "s", 0, "read", need)
    assert pool.own_room >= MIN_READ_BYTES and pool.resume() == [], "room for less than it needs"
    slow.pop(0)
    slow.pop(1)
    assert [p[3] for p in pool.resume()] == ["read"]


def test_publishes_do_not_borrow_what_held_records_borrowed() -> None:
    pools = _pools()
    pool, publish, ledger = pools.consumer_pool, pools.publish_pool, pools.cache_ledger
    assert pool is not None and publish is not None and ledger is not None
    lendable = ledger.lendable()
    held = HeldRecords(pool)
    for offset in range(4 + lendable // SIZE):
        held[offset] = RECORD
    left = ledger.lendable()
    assert left < SIZE
    assert not publish.reserve(publish.limit + left + 1)
    assert publish.reserve(publish.limit + left)
    assert ledger.pool >= 0 and _accounted(pools) <= 256 * KIB + 64 * KIB + 4 * SIZE


def test_a_broker_holds_its_budget_while_a_subscription_holding_nothing_reads() -> None:
    """Through the core: the slow subscription fills the pool; the busy one, holding nothing,
    reads what the cache pool lends it; with nothing to lend it waits, and goes on at the
    acknowledgements that make room."""
    held = len(record_of("m0")) + HELD_PER_RECORD
    mib = 1 << 20
    memory = MemoryPools(2 * mib + 3 * held, mib, mib, 3 * held)
    broker = Broker(memory=memory)
    pool, ledger = broker.core.logs.consumer_pool, broker.core.cache_ledger
    assert pool is not None and ledger is not None
    pid = broker.producer()
    for i in range(3):
        broker.publish(pid, f"m{i}")
    slow = broker.consumer("slow", sub="slow")
    assert payloads(broker.take(slow)) == ["m0", "m1", "m2"]
    assert pool.full
    busy = broker.consumer("busy", sub="busy")
    assert payloads(broker.take(busy)) == ["m0", "m1", "m2"], "it borrows of the cache pool"
    assert ledger.consumers == pool.borrowed == 3 * held
    assert ledger.total + ledger.state + pool.used <= memory.budget

    ledger.state_limit = ledger.share  # nothing left to lend from here on
    late = broker.consumer("late", sub="late")
    assert broker.take(late) == [], "no room to borrow: its read waits"
    assert [p[1] for p in pool.paused] == ["late"]
    for offset in range(3):
        broker.ack(offset, sub="slow")
    assert broker.take(late) == [], "the busy subscription's records still fill the pool"
    for offset in range(3):
        broker.ack(offset, sub="busy")
    assert payloads(broker.take(late)) == ["m0", "m1", "m2"], "the acks made room: it went on"
    assert ledger.total + ledger.state + pool.used <= memory.budget

"""The broker-wide cache ledger (spec/memory.md): pure, milliseconds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.memory.accounting import batch_cost
from danube.machines.memory.ledger import CacheLedger
from danube.machines.wal.cache import HotCache
from danube.machines.wal.machine import WalConfig, WalMachine, release

NOW = 1_700_000_000_000


def test_the_oldest_batch_of_the_broker_goes_whichever_topic_holds_it() -> None:
    ledger = CacheLedger(pool=300)
    a, b = HotCache(10_000, "a", ledger), HotCache(10_000, "b", ledger)
    a.put(0, [b"x"], 100)
    b.put(0, [b"y"], 100)
    a.put(1, [b"z"], 100)
    assert ledger.total == 300 and ledger.evicted_bytes == 0
    b.put(1, [b"w"], 100)  # over the pool: a's first batch is the broker's oldest
    assert (a.oldest, b.oldest) == (1, 0)
    assert ledger.by_topic() == {"a": 100, "b": 200}
    assert ledger.evicted_bytes == 100


def test_the_topic_bound_still_applies_and_is_not_counted_twice() -> None:
    ledger = CacheLedger(pool=10_000)
    cache = HotCache(150, "a", ledger)
    for offset in range(5):
        cache.put(offset, [b"x"], 100)
    assert cache.bytes == ledger.total == 100
    assert ledger.evicted_bytes == 0  # the topic's own bound dropped them, not the ledger


def test_a_released_cache_stops_counting_and_its_entries_are_skipped() -> None:
    ledger = CacheLedger(pool=250)
    a, b = HotCache(10_000, "a", ledger), HotCache(10_000, "b", ledger)
    a.put(0, [b"x"], 100)
    a.release()
    assert ledger.total == 0 and ledger.by_topic() == {}
    b.put(0, [b"y"], 100)
    b.put(1, [b"y"], 100)
    b.put(2, [b"y"], 100)
    assert b.oldest == 1 and ledger.total == 200


def test_a_batch_larger_than_the_pool_is_not_kept() -> None:
    ledger = CacheLedger(pool=50)
    cache = HotCache(10_000, "a", ledger)
    cache.put(0, [b"x"], 100)
    assert cache.bytes == ledger.total == 0 and cache.oldest is None


def test_stale_entries_do_not_pile_up() -> None:
    ledger = CacheLedger(pool=10**9)
    cache = HotCache(100, "a", ledger)  # the topic bound drops every batch but the newest
    for offset in range(10_000):
        cache.put(offset, [b"x"], 100)
    assert len(ledger._order) <= 2 * 1 + 64 + 1


def test_wal_machines_share_the_pool_and_release_on_drop() -> None:
    cost = batch_cost(4, 1)
    ledger = CacheLedger(pool=3 * cost)
    machines = [WalMachine(f"/default/t{i}", WalConfig(), cache_ledger=ledger) for i in range(2)]
    for i in range(4):
        machines[i % 2].append([b"abcd"], NOW)
    assert ledger.total == 3 * cost
    assert [m.cached_bytes for m in machines] == [cost, 2 * cost]
    release(machines[1])
    assert ledger.total == cost == machines[0].cached_bytes


@settings(max_examples=200, deadline=None)
@given(
    pool=st.integers(0, 2_000),
    limits=st.lists(st.integers(0, 1_000), min_size=1, max_size=4),
    steps=st.lists(
        st.tuples(
            st.integers(0, 3), st.sampled_from(["put", "retain", "release"]), st.integers(1, 400)
        ),
        max_size=60,
    ),
)
def test_the_ledger_adds_up_and_never_exceeds_the_pool(
    pool: int, limits: list[int], steps: list[tuple[int, str, int]]
) -> None:
    """Property: after every step the per-topic bytes sum to the total, the total equals what
    the caches hold, and it is within the pool."""
    ledger = CacheLedger(pool)
    caches = [HotCache(limit, f"t{i}", ledger) for i, limit in enumerate(limits)]
    next_offset = [0] * len(caches)
    for index, action, size in steps:
        i = index % len(caches)
        cache = caches[i]
        if action == "put":
            cache.put(next_offset[i], [b"r"], size)
            next_offset[i] += 1
        elif action == "retain":
            cache.evict_below(next_offset[i] - size % 3)
        else:
            cache.release()
        assert sum(ledger.by_topic().values()) == ledger.total
        assert ledger.total == sum(c.bytes for c in caches)
        assert ledger.total <= pool
        assert all(v > 0 for v in ledger.by_topic().values())

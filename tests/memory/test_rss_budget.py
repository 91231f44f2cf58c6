"""The budget held on the process's RSS (spec/memory.md, "The process's RSS"; issue 28 point
1): pure, RSS and times in, the squeeze and `ReturnMemory` out."""

from __future__ import annotations

import random

from danube.machines.dispatch import QueueLimits
from danube.machines.memory.budget import MIB, split
from danube.machines.memory.giveback import MIN_INTERVAL_MS, ReturnMemory
from danube.machines.memory.pools import broker_pools
from danube.machines.memory.rss import HIGH_WATER, RssGuard, baseline_warning
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.machines.node.stats import memory_use
from danube.machines.wal.cache import HotCache
from danube.values.config import Policies

BUDGET = 64 * MIB
HIGH = int(BUDGET * HIGH_WATER)


def test_the_squeeze_is_the_overshoot_of_the_last_sample_and_lifts_when_rss_falls() -> None:
    guard = RssGuard(BUDGET)
    assert guard.high == HIGH
    assert guard.sample(HIGH - 1, accounted=10 * MIB) is False
    assert guard.squeeze == 0 and guard.unaccounted == HIGH - 1 - 10 * MIB
    assert guard.sample(HIGH + 3 * MIB, accounted=10 * MIB) is True
    assert guard.squeeze == 3 * MIB
    assert guard.sample(HIGH + 1 * MIB, accounted=10 * MIB) is True
    assert guard.squeeze == 1 * MIB, "not the largest overshoot seen: the last one"
    assert guard.sample(HIGH, accounted=10 * MIB) is False and guard.squeeze == 0
    assert guard.squeezed_samples == 2
    assert guard.sample(None, accounted=10 * MIB) is False
    assert (guard.squeeze, guard.unaccounted, guard.rss) == (0, 0, None)


def _filled() -> tuple[object, HotCache]:
    """The pools of a 64 MiB budget with one topic's cache holding 8 MiB in 1 MiB batches."""
    pools = broker_pools(split(BUDGET))
    assert pools.cache_ledger is not None
    cache = HotCache(64 * MIB, "/default/t", pools.cache_ledger)
    for offset in range(8):
        cache.put(offset, [b"x"], MIB)
    return pools, cache


def test_rss_over_the_mark_evicts_the_oldest_batches_and_gives_memory_back() -> None:
    pools, cache = _filled()
    ledger, publish = pools.cache_ledger, pools.publish_pool
    assert ledger is not None and publish is not None
    room = publish.room_to_borrow
    over = ledger.pool - 5 * MIB  # the caches may keep 5 of their 8 MiB
    effects = pools.tick((0, 0, 0), 1_000, rss=HIGH + over)
    assert ledger.squeeze == over and ledger.limit == 5 * MIB
    assert ledger.total == cache.bytes == 5 * MIB and cache.oldest == 3, "the oldest went"
    assert ledger.evicted_bytes == 3 * MIB
    assert len(effects) == 1 and isinstance(effects[0], ReturnMemory)
    assert publish.room_to_borrow < room, "publishes may borrow less"
    # still over, but within the interval: no second return
    assert pools.tick((0, 0, 0), 2_000, rss=HIGH + over) == ()
    # after the interval, still over but nothing freed since: no return (a collection for
    # nothing each interval, for ever, when the baseline is over the mark; review finding)
    assert pools.tick((0, 0, 0), 1_000 + MIN_INTERVAL_MS, rss=HIGH + over) == ()
    # squeezed deeper, the caches free more: that goes back
    deeper = pools.tick((0, 0, 0), 1_001 + MIN_INTERVAL_MS, rss=HIGH + over + 3 * MIB)
    assert [type(e) for e in deeper] == [ReturnMemory] and ledger.total == 2 * MIB
    # RSS falls under the mark: the limit recovers whole
    assert pools.tick((0, 0, 0), 3_000 + MIN_INTERVAL_MS, rss=HIGH - MIB) == ()
    assert ledger.squeeze == 0 and ledger.limit == ledger.pool
    assert publish.room_to_borrow == room


def test_rss_under_the_mark_or_unknown_changes_nothing() -> None:
    pools, cache = _filled()
    ledger = pools.cache_ledger
    assert ledger is not None
    assert pools.tick((0, 0, 0), 1_000, rss=HIGH) == ()
    assert pools.tick((0, 0, 0), 2_000, rss=None) == ()
    assert ledger.total == cache.bytes == 8 * MIB and ledger.evicted_bytes == 0


def test_an_overshoot_beyond_the_caches_holds_publishes_back() -> None:
    """Caches empty and RSS still over: what publishes may borrow of the cache pool shrinks
    by the rest (they wait for room, then are refused: back-pressure)."""
    pools = broker_pools(split(BUDGET))
    ledger, publish = pools.cache_ledger, pools.publish_pool
    assert ledger is not None and publish is not None
    capacity = publish.capacity
    pools.tick((0, 0, 0), 1_000, rss=HIGH + ledger.share)
    assert ledger.limit == 0 and publish.room_to_borrow == 0
    assert publish.capacity == publish.limit < capacity


def test_the_core_takes_rss_at_its_tick_and_reports_what_the_pools_do_not_account() -> None:
    core = BrokerCore(
        BrokerIdentity("http://b:1", "http://b:1"),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(10, 1 << 20),
        memory=split(BUDGET),
    )
    core.bootstrap(["default"])
    core.tick(0, rss=40 * MIB)
    use = memory_use(core)
    assert use is not None and use.rss == 40 * MIB and use.rss_squeeze == 0
    assert use.unaccounted == 40 * MIB - (core.cache_ledger.state if core.cache_ledger else 0)
    core.tick(100, rss=HIGH + 2 * MIB)
    use = memory_use(core)
    assert use is not None and use.rss_squeeze == 2 * MIB
    assert core.cache_ledger is not None and core.cache_ledger.squeeze == 2 * MIB


def test_a_budget_under_the_process_baseline_is_warned_of() -> None:
    """A broker that starts over the mark keeps its caches empty for good; it says so at
    start with the least budget that would leave them room (review finding)."""
    assert baseline_warning(None, 64 * MIB) is None
    assert baseline_warning(50 * MIB, 256 * MIB) is None
    warning = baseline_warning(90 * MIB, 64 * MIB)
    assert warning is not None and "--memory-budget" in warning
    assert str(100 * MIB) in warning, warning  # 90 MiB / 0.9, rounded up to a MiB

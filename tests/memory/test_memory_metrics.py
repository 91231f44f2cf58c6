"""`danube_memory_*`: the budget, each pool's size and use, the cache pool's evictions."""

from __future__ import annotations

import random

from prometheus_client.parser import text_string_to_metric_families

from danube.machines.dispatch import QueueLimits
from danube.machines.memory.budget import MIB, MemoryPools, split
from danube.machines.node.core import BrokerCore, BrokerIdentity
from danube.machines.wal.machine import WalMachine
from danube.runtime.metrics import BrokerMetrics
from danube.values.config import Policies
from tests.node.test_core_reliable import Broker


def _core(memory: bool) -> BrokerCore:
    core = BrokerCore(
        BrokerIdentity("http://b:1", "http://b:1"),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(10, 1 << 20),
        memory=split(64 * MIB) if memory else None,
    )
    core.bootstrap(["default"])
    return core


def test_the_budget_and_each_pools_use_are_exported() -> None:
    core = _core(memory=True)
    assert core.cache_ledger is not None
    machine = WalMachine("/default/t", core.logs._wal_config, cache_ledger=core.cache_ledger)
    machine.append([b"x" * 100], 1)
    samples = _samples(BrokerMetrics(core, "7", "standalone").exposition().decode())
    assert samples[("danube_memory_budget_bytes", "")] == 64 * MIB
    assert samples[("danube_memory_pool_bytes", "cache")] == 32 * MIB
    pools = [(pool, v) for (name, pool), v in samples.items() if name == "danube_memory_pool_bytes"]
    assert sum(v for pool, v in pools if pool != "state") == 64 * MIB
    assert samples[("danube_memory_pool_bytes", "state")] == 24 * MIB  # 3/4 of the cache pool
    used = core.cache_ledger.total
    assert used > 100
    assert samples[("danube_memory_pool_used_bytes", "cache")] == used
    assert samples[("danube_memory_cache_evicted_bytes_total", "")] == 0


def _samples(text: str) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels.get("pool", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("danube_memory_")
    }


def test_a_core_without_a_budget_exports_none() -> None:
    text = BrokerMetrics(_core(memory=False), "7", "standalone").exposition().decode()
    assert "danube_memory_" not in text


def test_the_publish_pool_its_borrowing_and_the_time_producers_paused_are_exported() -> None:
    core = _core(memory=True)
    pool = core.publish_pool
    assert pool is not None and core.memory is not None
    held = core.memory.publish + 1_000  # over its own share: 1,000 bytes borrowed
    assert pool.reserve(held)
    pool.waited(1_500, refused=False)
    pool.waited(3_000, refused=True)
    samples = _samples(BrokerMetrics(core, "7", "standalone").exposition().decode())
    assert samples[("danube_memory_pool_used_bytes", "publish")] == held
    assert samples[("danube_memory_publish_borrowed_bytes", "")] == 1_000
    assert samples[("danube_memory_publish_paused_seconds_total", "")] == 4.5
    assert samples[("danube_memory_publish_refused_total", "")] == 1
    pool.release(held)
    samples = _samples(BrokerMetrics(core, "7", "standalone").exposition().decode())
    assert samples[("danube_memory_pool_used_bytes", "publish")] == 0


def test_what_each_subscription_holds_and_each_topic_caches_is_exported() -> None:
    """The soak tells a slow consumer's share of the consumer pool from the others' (issue 28
    point 3): held bytes by subscription, cached bytes by topic, only those holding some."""
    mib = 1 << 20
    broker = Broker(memory=MemoryPools(4 * mib, 2 * mib, mib, mib))
    pid = broker.producer()
    for i in range(3):
        broker.publish(pid, f"m{i}")
    slow, busy = broker.consumer("slow", sub="slow"), broker.consumer("busy", sub="busy")
    broker.take(slow), broker.take(busy)
    for offset in range(3):
        broker.ack(offset, sub="busy")
    text = BrokerMetrics(broker.core, "7", "standalone").exposition().decode()
    held = {
        (sample.labels["topic"], sample.labels["subscription"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "danube_memory_subscription_held_bytes"
    }
    pool = broker.core.logs.consumer_pool
    assert pool is not None and pool.used > 0
    assert list(held.values()) == [pool.used]  # the slow one holds all; "busy" is not listed
    assert [sub for _, sub in held] == ["slow"]
    cached = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "danube_memory_topic_cached_bytes"
    ]
    assert broker.core.cache_ledger is not None
    assert sum(cached) == broker.core.cache_ledger.total > 0


def test_the_rss_what_it_holds_unaccounted_and_the_squeeze_are_exported() -> None:
    """spec/memory.md, "The process's RSS": the last RSS the runtime gave the tick."""
    core = _core(memory=True)
    assert core.cache_ledger is not None
    before = _samples(BrokerMetrics(core, "7", "standalone").exposition().decode())
    assert ("danube_memory_rss_bytes", "") not in before, "not sampled yet"
    high = int(64 * MIB * 0.9)
    core.tick(0, rss=high + 2 * MIB)
    samples = _samples(BrokerMetrics(core, "7", "standalone").exposition().decode())
    assert samples[("danube_memory_rss_bytes", "")] == high + 2 * MIB
    accounted = core.cache_ledger.total + core.cache_ledger.state
    assert samples[("danube_memory_unaccounted_bytes", "")] == high + 2 * MIB - accounted
    assert samples[("danube_memory_rss_squeeze_bytes", "")] == 2 * MIB

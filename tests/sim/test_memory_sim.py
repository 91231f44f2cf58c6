"""Invariant 18 (spec/memory.md): the hot caches stay within the broker's cache pool and the
ledger counts what they hold; a cache that evicts behind the ledger's back is caught."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from unittest import mock

import pytest

from danube.machines.wal.cache import CachedBatch, HotCache
from sim.checker import MEMORY
from sim.cluster import ClusterSimulation, ClusterWorkload
from sim.cluster_faults import CLUSTER_PROFILES
from sim.faults import Faults
from sim.run import Simulation, Workload


@contextlib.contextmanager
def topic_bound_skips_the_ledger() -> Iterator[None]:
    """The planted bug: a cache applies its own bound without telling the ledger."""

    def put(self: HotCache, first: int, records: Sequence[bytes], size: int) -> None:
        self._batches.append(CachedBatch(first, records, size))
        self.bytes += size
        if self._ledger is not None:
            self._ledger.added(self, first, size)
        while self.bytes > self._limit and self._head < len(self._batches):
            self.bytes -= self._batches[self._head].size  # dropped, the ledger never told
            self._head += 1
        if self._ledger is not None:
            self._ledger.fit()

    with mock.patch.object(HotCache, "put", put):
        yield


def test_the_caches_keep_within_the_pool_across_topics() -> None:
    evictions: list[str] = []
    original = HotCache.drop_oldest_for_ledger

    def counted(self: HotCache) -> None:
        evictions.append(self.topic)
        original(self)

    with mock.patch.object(HotCache, "drop_oldest_for_ledger", counted):
        for seed in range(1, 4):
            workload = Workload(topics=3, cache_bytes=16 * 1024, cache_pool=12 * 1024)
            result = Simulation(seed, workload, Faults()).run(4)
            assert result.ok, result.violations
    assert len(set(evictions)) > 1  # the pool, not each topic's bound, evicted, in every topic


def test_eviction_that_skips_the_ledger_is_caught() -> None:
    with topic_bound_skips_the_ledger():
        for seed in range(1, 21):
            result = Simulation(seed, Workload(), Faults()).run(4)
            if not result.ok:
                assert result.violations[0].invariant == MEMORY, result.violations
                return
    raise AssertionError("the simulator did not catch a cache evicting behind the ledger")


def test_the_cluster_runs_check_the_ledger_too() -> None:
    """Replicas' WAL machines report to the ledger as well: the cluster data plane's brokers
    fail the event when it is out of step (`sim/cluster_data.py`)."""
    workload = ClusterWorkload(replicated=True)
    with topic_bound_skips_the_ledger(), pytest.raises(AssertionError, match="18 memory"):
        ClusterSimulation(1, workload, CLUSTER_PROFILES["default"]).run(15)

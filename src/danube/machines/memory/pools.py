"""The pools one broker core builds from its memory budget (spec/memory.md), made in one place
so the core only holds them: the cache ledger (every topic's hot cache together), the
publish pool lending to it, the state pool charged to it, the consumer pool, and the decision
to give memory back after a large drop (`MemoryReturn`)."""

from __future__ import annotations

from dataclasses import dataclass

from danube.machines.memory.budget import MemoryPools
from danube.machines.memory.consumer import ConsumerPool
from danube.machines.memory.giveback import MemoryReturn, ReturnMemory
from danube.machines.memory.ledger import CacheLedger
from danube.machines.memory.publish import PublishPool
from danube.machines.memory.rss import RssGuard
from danube.machines.memory.state import StatePool


@dataclass(frozen=True, slots=True)
class BrokerPools:
    cache_ledger: CacheLedger | None = None
    publish_pool: PublishPool | None = None
    state_pool: StatePool | None = None
    consumer_pool: ConsumerPool | None = None
    memory_return: MemoryReturn | None = None
    rss_guard: RssGuard | None = None

    def tick(
        self, counts: tuple[int, int, int], now_ms: int, rss: int | None = None
    ) -> tuple[ReturnMemory, ...]:
        """Time passes: state brought up to date with the core's `counts` (topics,
        subscriptions, consumers), idle caches emptied, the cache pool squeezed while the
        process's `rss` (sampled by the runtime; None: not known) is over its high-water
        mark (`RssGuard`), and memory given back after a large drop of what the pools
        account or while RSS is over the mark."""
        ledger, publish, state = self.cache_ledger, self.publish_pool, self.state_pool
        if state is not None:
            state.update(*counts)
        if ledger is None or publish is None or self.memory_return is None:
            return ()
        held = self.consumer_pool.used if self.consumer_pool is not None else 0
        before = ledger.total
        ledger.evict_idle(now_ms)
        accounted = ledger.total + ledger.state + publish.used + held
        over = False
        guard = self.rss_guard
        if guard is not None:
            over = guard.sample(rss, accounted)
            self.memory_return.seen(accounted)  # what the squeeze evicts now counts as freed
            if guard.squeeze != ledger.squeeze:
                ledger.squeeze = guard.squeeze
                publish.restate()  # the caches give way now; publishes served if it grew
                accounted = ledger.total + ledger.state + publish.used + held
        evicted = max(0, before - ledger.total)  # after `rss` was sampled
        return self.memory_return.observe(accounted, now_ms, over, rss, evicted)


def broker_pools(memory: MemoryPools | None) -> BrokerPools:
    """Every pool of `memory`'s split; none without a budget (each topic's cache is then
    bounded by its own `cache_bytes` alone)."""
    if memory is None:
        return BrokerPools()
    ledger = CacheLedger(memory.cache, memory.cache_idle_ms)
    publish = PublishPool(memory.publish, ledger=ledger, wait_ms=memory.publish_wait_ms)
    state = StatePool(
        ledger, memory.budget, publish.restate, memory.state_costs, memory.transport_costs
    )
    ledger.state_limit = state.limit
    # held records borrowing more or less of the cache pool: it shrinks or grows back, and
    # room given back goes to the publishes waiting for it, as when the state changes
    consumer = ConsumerPool(memory.consumer, ledger, publish.restate)
    return BrokerPools(
        ledger, publish, state, consumer, MemoryReturn(memory.budget), RssGuard(memory.budget)
    )

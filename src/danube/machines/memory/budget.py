"""The broker-wide memory budget and its split into pools (spec/memory.md).

Pure: the runtime reads the cgroup limit and /proc/meminfo (`danube.runtime.memory`) and hands
the text here; what the default is and how it is split is decided here, so tests and the
simulator use the very same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from danube.values.sizes import GIB, KIB, MIB
from danube.values.sizes import parse_size as parse_size

DEFAULT_FRACTION = 0.5
"""Without `--memory-budget`: this share of the machine's memory (or of the cgroup's limit).
The rest is the interpreter, code, gRPC buffers and what the pools do not account."""
FALLBACK_TOTAL = 1 * GIB
"""The memory assumed when neither the cgroup limit nor /proc/meminfo can be read."""
CACHE_SHARE = 0.5
"""The hot caches' share of the budget: the one pool that can shrink at any time (its
batches are on disk), so it gets the most and gives way first."""
PUBLISH_SHARE = 0.25
"""Publish buffers: publishes accepted and not yet answered (`machines/memory/publish.py`:
producers wait, then are refused, beyond it)."""
MINIMUM_BUDGET = 16 * MIB
"""Smaller budgets are refused: a broker could not hold one large batch in each pool."""


@dataclass(frozen=True, slots=True)
class MemoryPools:
    """The budget in bytes and its split; the three pools add up to `budget`."""

    budget: int
    cache: int
    """Hot caches of every topic together (`CacheLedger`)."""
    publish: int
    """Publish buffers (`PublishPool`: accounted, enforced by back-pressure)."""
    consumer: int
    """Consumer queues (accounted, bounded per consumer by `dispatch.consumer_queue_bytes`)."""
    publish_wait_ms: int = 3_000
    """How long a `SendMessage` waits for room in the publish pool (`broker.publish_wait_ms`;
    `danube.machines.memory.publish`)."""
    state_costs: tuple[int, int, int] | None = None
    """Accounted bytes of a topic, a subscription, a consumer (`danube.machines.memory.
    state`); None: the measured ones. The simulator's pools are tiny and scale them down."""
    transport_costs: tuple[int, int] | None = None
    """Accounted bytes of an open gRPC stream, a client connection (the same module); None:
    the measured ones. The simulator scales them down too."""
    cache_idle_ms: int = 0
    """A topic's hot cache with nothing added for this long is emptied (`broker.
    cache_idle_ms`; `CacheLedger.evict_idle`); 0: never."""


def split(budget: int, publish_wait_ms: int = 3_000) -> MemoryPools:
    """Cache half, publish buffers a quarter, consumer queues the rest (sums exactly)."""
    if budget < MINIMUM_BUDGET:
        raise ValueError(f"a memory budget needs at least {MINIMUM_BUDGET} bytes, got {budget}")
    cache = int(budget * CACHE_SHARE)
    publish = int(budget * PUBLISH_SHARE)
    return MemoryPools(budget, cache, publish, budget - cache - publish, publish_wait_ms)


def machine_memory(cgroup_max: str | None, meminfo: str | None) -> int:
    """The memory this process may use: the cgroup limit (v2's `memory.max` or v1's
    `memory.limit_in_bytes`) when set and smaller than the machine's `MemTotal`, else
    `MemTotal`, else `FALLBACK_TOTAL`."""
    total: int | None = None
    if meminfo:
        for line in meminfo.splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * KIB
                break
    limit: int | None = None
    if cgroup_max and cgroup_max.strip().isdigit():
        limit = int(cgroup_max.strip())
    candidates = [value for value in (total, limit) if value]
    return min(candidates) if candidates else FALLBACK_TOTAL


def default_budget(cgroup_max: str | None, meminfo: str | None) -> int:
    """`DEFAULT_FRACTION` of `machine_memory`, never below `MINIMUM_BUDGET`."""
    return max(MINIMUM_BUDGET, int(machine_memory(cgroup_max, meminfo) * DEFAULT_FRACTION))

"""The broker-wide memory budget and its split into pools (spec/memory.md).

Pure: the runtime reads the cgroup limit and /proc/meminfo (`danube.runtime.memory`) and hands
the text here; what the default is and how it is split is decided here, so tests and the
simulator use the very same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from danube.machines.memory.publish import (
    BORROWABLE_CACHE_SHARE,
    borrowable_at_most,
    send_cost,
)
from danube.machines.memory.state import STATE_SHARE
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
    """Records reliable subscriptions hold until acknowledged (`ConsumerPool`: their reads
    pause when it is full). Non-reliable consumer queues are reported with it in the metric
    but bounded per consumer only (`dispatch.consumer_queue_bytes`), not by this pool."""
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
    producer_idle_ms: int = 0
    """A producer with no publish nor health check for this long is removed (`broker.
    producer_idle_timeout_ms`; `danube.machines.node.idle_producers`); 0: never."""
    departed_grace_ms: int = 10_000
    """A reliable subscription with no connected consumer for this long lets go of the records
    it holds (`danube.machines.node.departed_subscriptions.DEPARTED_GRACE_MS`, why this long);
    0: never. Not configured: the simulator shortens it."""


def split(budget: int, publish_wait_ms: int = 3_000) -> MemoryPools:
    """Cache half, publish buffers a quarter, the consumer pool the rest (sums exactly)."""
    if budget < MINIMUM_BUDGET:
        raise ValueError(f"a memory budget needs at least {MINIMUM_BUDGET} bytes, got {budget}")
    cache = int(budget * CACHE_SHARE)
    publish = int(budget * PUBLISH_SHARE)
    return MemoryPools(budget, cache, publish, budget - cache - publish, publish_wait_ms)


@dataclass(frozen=True, slots=True)
class MachineMemory:
    """The memory this process may use and where that number came from (logged at start)."""

    bytes: int
    source: str


def memory_of(cgroup: tuple[int, str] | None, meminfo: str | None) -> MachineMemory:
    """The memory this process may use: the tightest cgroup limit (`cgroup`: the limit and
    the file it was read from, `danube.machines.memory.cgroup.tightest_limit`) when smaller
    than the machine's `MemTotal`, else `MemTotal`, else `FALLBACK_TOTAL`."""
    total: int | None = None
    if meminfo:
        for line in meminfo.splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * KIB
                break
    if cgroup is not None and (total is None or cgroup[0] < total):
        return MachineMemory(cgroup[0], f"cgroup limit {cgroup[1]}")
    if total is not None and total > 0:
        return MachineMemory(total, "MemTotal in /proc/meminfo")
    return MachineMemory(FALLBACK_TOTAL, "neither a cgroup limit nor /proc/meminfo readable")


def machine_memory(cgroup_max: str | None, meminfo: str | None) -> int:
    """`memory_of` with one cgroup limit file's text (v2's `memory.max` or v1's
    `memory.limit_in_bytes`; "max" or unreadable: no limit)."""
    value = (cgroup_max or "").strip()
    cgroup = (int(value), "memory.max") if value.isdigit() and int(value) > 0 else None
    return memory_of(cgroup, meminfo).bytes


def budget_of(memory: MachineMemory) -> int:
    """`DEFAULT_FRACTION` of the memory this process may use, never below `MINIMUM_BUDGET`."""
    return max(MINIMUM_BUDGET, int(memory.bytes * DEFAULT_FRACTION))


def default_budget(cgroup_max: str | None, meminfo: str | None) -> int:
    """`DEFAULT_FRACTION` of `machine_memory`, never below `MINIMUM_BUDGET`."""
    return max(MINIMUM_BUDGET, int(machine_memory(cgroup_max, meminfo) * DEFAULT_FRACTION))


def publish_room_warning(pools: MemoryPools, max_message_bytes: int) -> str | None:
    """Why this budget refuses legal messages for ever, or None: the publish pool, with all
    it may borrow of the cache pool, cannot hold one `SendMessage` of the largest size a
    producer may send (`send_cost`: twice the payload and its objects), so such a message is
    refused RESOURCE_EXHAUSTED however idle the broker is. Budgets under about 54 MiB, with
    the default 10 MiB `max_message_size`."""
    ceiling = publish_ceiling(pools)
    needed = send_cost(max_message_bytes)
    if needed <= ceiling:
        return None
    return (
        f"the memory budget of {pools.budget} bytes leaves its publish pool room for at most "
        f"{ceiling} bytes, and a message of the largest size producers may send "
        f"({max_message_bytes} bytes, max_message_size) needs {needed}: such messages will "
        "be refused. Give the broker a larger --memory-budget (at least "
        f"{_budget_for(needed)} bytes) or lower max_message_size"
    )


def publish_ceiling(pools: MemoryPools) -> int:
    """The most the publish pool of `pools` could ever hold (`PublishPool.ceiling`): its
    share and what it may ever borrow of the cache pool past the state's share."""
    return pools.publish + borrowable_at_most(pools.cache, int(pools.cache * STATE_SHARE))


def _budget_for(needed: int) -> int:
    """The smallest budget whose publish pool and borrowable cache hold `needed` bytes."""
    share = PUBLISH_SHARE + CACHE_SHARE * min(BORROWABLE_CACHE_SHARE, 1 - STATE_SHARE)
    budget = int(needed / share) + 1
    while True:
        pools = split(max(budget, MINIMUM_BUDGET))
        if publish_ceiling(pools) >= needed:
            return pools.budget
        budget += 1024

"""Reads what the broker's default memory budget is a share of (spec/memory.md): the cgroup
limit (v2's `memory.max`, else v1's `memory.limit_in_bytes`, whose "unlimited" is a number far
above the machine's memory and loses to it) and /proc/meminfo. The rule itself is pure
(`danube.machines.memory.budget`)."""

from __future__ import annotations

import dataclasses

from danube.machines.memory.budget import MemoryPools, default_budget, split

CGROUP_MAX = "/sys/fs/cgroup/memory.max"
CGROUP_V1_LIMIT = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
MEMINFO = "/proc/meminfo"


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def broker_pools(
    configured: int | None, publish_wait_ms: int = 3_000, cache_idle_ms: int = 0
) -> MemoryPools:
    """The configured budget (`--memory-budget`), else the default read from this machine,
    split into pools; caches idle for `cache_idle_ms` emptied (`broker.cache_idle_ms`)."""
    budget = configured
    if budget is None:
        budget = default_budget(cgroup_limit(), _read(MEMINFO))
    return dataclasses.replace(split(budget, publish_wait_ms), cache_idle_ms=cache_idle_ms)


def cgroup_limit() -> str | None:
    """The cgroup's memory limit as the kernel writes it: v2 first, else v1 (a container on
    a cgroup v1 host would otherwise get a budget sized for the host and meet the OOM
    killer instead of evicting)."""
    return _read(CGROUP_MAX) or _read(CGROUP_V1_LIMIT)

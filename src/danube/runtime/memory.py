"""Reads what the broker's default memory budget is a share of (spec/memory.md): the cgroup v2
limit and /proc/meminfo. The rule itself is pure (`danube.machines.memory.budget`)."""

from __future__ import annotations

from danube.machines.memory.budget import MemoryPools, default_budget, split

CGROUP_MAX = "/sys/fs/cgroup/memory.max"
MEMINFO = "/proc/meminfo"


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def broker_pools(configured: int | None) -> MemoryPools:
    """The configured budget (`--memory-budget`), else the default read from this machine,
    split into pools."""
    if configured is not None:
        return split(configured)
    return split(default_budget(_read(CGROUP_MAX), _read(MEMINFO)))

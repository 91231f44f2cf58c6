"""Reads what the broker's default memory budget is a share of (spec/memory.md): the cgroup
limits on the way from this process's own group up to its mount's root (the files
`danube.machines.memory.cgroup` names from /proc/self/cgroup and /proc/self/mountinfo) and
/proc/meminfo, and logs the budget chosen and where it came from. The rules are pure
(`danube.machines.memory.budget`, `danube.machines.memory.cgroup`)."""

from __future__ import annotations

import dataclasses
import logging

from danube.machines.memory.budget import (
    MachineMemory,
    MemoryPools,
    budget_of,
    memory_of,
    publish_room_warning,
    split,
)
from danube.machines.memory.cgroup import limit_files, tightest_limit
from danube.machines.memory.connections import (
    ConnectionGate,
    admin_connection_limits,
    connection_limits,
)
from danube.values.grpc_config import GrpcConfig

PROC_CGROUP = "/proc/self/cgroup"
MOUNTINFO = "/proc/self/mountinfo"
MEMINFO = "/proc/meminfo"

log = logging.getLogger("danube.runtime")


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def broker_pools(
    configured: int | None,
    publish_wait_ms: int = 3_000,
    max_message_bytes: int | None = None,
    cache_idle_ms: int = 0,
) -> MemoryPools:
    """The configured budget (`--memory-budget`), else the default read from this machine,
    split into pools; logged, with a warning when the budget refuses the largest legal
    message for ever; caches idle for `cache_idle_ms` emptied (`broker.cache_idle_ms`)."""
    if configured is not None:
        pools = split(configured, publish_wait_ms)
        log.info("event=memory_budget budget=%d source=--memory-budget", pools.budget)
    else:
        machine = machine_memory()
        pools = split(budget_of(machine), publish_wait_ms)
        log.info(
            "event=memory_budget budget=%d source=%r of=%d",
            pools.budget,
            machine.source,
            machine.bytes,
        )
    if max_message_bytes is not None:
        warning = publish_room_warning(pools, max_message_bytes)
        if warning is not None:
            log.warning("event=memory_budget_too_small %s", warning)
    return dataclasses.replace(pools, cache_idle_ms=cache_idle_ms)


def connection_gates(budget: int, grpc: GrpcConfig) -> dict[str, ConnectionGate]:
    """The broker's connection gates by port, `client` (its limits resolved from
    `broker.grpc` and the budget) and `admin` (`max_admin_connections`), logged at start
    (`danube.machines.memory.connections`)."""
    client = connection_limits(
        budget, grpc.max_connections, grpc.max_pending_connections, grpc.first_call_timeout_ms
    )
    admin = admin_connection_limits(client, grpc.max_admin_connections, grpc.first_call_timeout_ms)
    limits = {"client": client, "admin": admin}
    for port, port_limits in limits.items():
        log.info(
            "event=connection_limits port=%s max_connections=%d max_pending_connections=%d "
            "first_call_timeout_ms=%d",
            port, port_limits.max_connections, port_limits.max_pending,
            grpc.first_call_timeout_ms,
        )  # fmt: skip
    return {port: ConnectionGate(port_limits) for port, port_limits in limits.items()}


def machine_memory(root: str = "") -> MachineMemory:
    """The memory this process may use, read under `root` (tests: a fake /proc and /sys)."""
    files = limit_files(_read(root + PROC_CGROUP), _read(root + MOUNTINFO))
    cgroup = tightest_limit((path, _read(root + path)) for path in files)
    return memory_of(cgroup, _read(root + MEMINFO))

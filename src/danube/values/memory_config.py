"""The memory budget's keys of the broker's configuration (spec/memory.md, spec/configuration.md):
`broker.memory_budget`, `broker.publish_wait_ms`, `broker.cache_idle_ms`,
`broker.producer_idle_timeout_ms`. Kept apart from
`danube.values.config`, which is at its size limit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from danube.values.errors import ConfigError
from danube.values.sizes import parse_size
from danube.values.wal_config import MIB


def memory_budget(value: object, where: str) -> int:
    """A budget in bytes (`512MiB`, `2G`, `268435456`), at least 16 MiB."""
    try:
        size = parse_size(value, where)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if size < 16 * MIB:
        raise ConfigError(f"{where}: at least 16MiB, got {value!r}")
    return size


def memory_updates(broker: dict[str, Any], number: Callable[..., Any]) -> dict[str, Any]:
    """The `broker` section's memory keys that are set, as `BrokerConfig` fields; `number`
    is the loader's checked number reader (`config._number`)."""
    updates: dict[str, Any] = {}
    if broker.get("memory_budget") is not None:
        updates["memory_budget"] = memory_budget(broker["memory_budget"], "broker.memory_budget")
    for key in ("publish_wait_ms", "cache_idle_ms", "producer_idle_timeout_ms"):
        value = number(broker, key, "broker.", minimum=0)
        if value is not None:
            updates[key] = value
    return updates

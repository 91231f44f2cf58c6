"""The budget's default and split, the size syntax, the YAML key and the CLI flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.cli.broker import build_parser, load_config
from danube.machines.memory.budget import (
    FALLBACK_TOTAL,
    MIB,
    default_budget,
    machine_memory,
    split,
)
from danube.values.config import ConfigError, config_from_mapping
from danube.values.sizes import parse_size

MEMINFO = "MemTotal:       24576000 kB\nMemFree:         1000 kB\n"


def test_the_pools_add_up_to_the_budget() -> None:
    for budget in (16 * MIB, 256 * MIB + 3, 7 * 1024 * MIB + 1):
        pools = split(budget)
        assert pools.cache + pools.publish + pools.consumer == budget
        assert pools.cache >= pools.publish >= 0 and pools.consumer > 0
    with pytest.raises(ValueError):
        split(MIB)


def test_the_default_is_a_share_of_the_cgroup_limit_or_the_machine() -> None:
    assert machine_memory("max\n", MEMINFO) == 24576000 * 1024
    assert machine_memory("536870912\n", MEMINFO) == 512 * MIB
    assert machine_memory(None, None) == FALLBACK_TOTAL
    assert default_budget("536870912\n", MEMINFO) == 256 * MIB
    assert default_budget("1048576", None) == 16 * MIB  # never below the minimum
    # cgroup v1 says "unlimited" with a number far above the machine's memory
    assert machine_memory("9223372036854771712\n", MEMINFO) == 24576000 * 1024


def test_a_cgroup_v1_limit_counts_when_there_is_no_v2_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A container on a cgroup v1 host: without reading `memory.limit_in_bytes` the budget
    would be half of the host's memory, far above what the container may use."""
    from danube.runtime import memory

    v1 = tmp_path / "memory.limit_in_bytes"
    v1.write_text("536870912\n")
    monkeypatch.setattr(memory, "CGROUP_MAX", str(tmp_path / "absent"))
    monkeypatch.setattr(memory, "CGROUP_V1_LIMIT", str(v1))
    monkeypatch.setattr(memory, "MEMINFO", str(tmp_path / "absent"))
    assert memory.broker_pools(None).budget == 256 * MIB


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("256MiB", 256 * MIB),
        ("2G", 2048 * MIB),
        ("512k", 512 * 1024),
        (65536, 65536),
        ("1.5GiB", 1536 * MIB),
    ],
)
def test_sizes_take_binary_suffixes(text: object, size: int) -> None:
    assert parse_size(text, "x") == size


@pytest.mark.parametrize("text", ["12 parsecs", "-1", "0", True, "MiB"])
def test_bad_sizes_are_refused(text: object) -> None:
    with pytest.raises(ValueError):
        parse_size(text, "x")


def test_yaml_and_flag_set_the_budget() -> None:
    assert config_from_mapping({}).memory_budget is None
    config = config_from_mapping({"broker": {"memory_budget": "256MiB"}})
    assert config.memory_budget == 256 * MIB
    with pytest.raises(ConfigError, match="memory_budget"):
        config_from_mapping({"broker": {"memory_budget": "1MiB"}})
    args = build_parser().parse_args(["--memory-budget", "1G"])
    assert load_config(args).memory_budget == 1024 * MIB


def test_the_runtime_reads_this_machine_for_the_default() -> None:
    from danube.runtime.memory import broker_pools

    assert broker_pools(64 * MIB).budget == 64 * MIB
    pools = broker_pools(None)
    assert pools.budget >= 16 * MIB
    assert pools.cache + pools.publish + pools.consumer == pools.budget


def test_yaml_sets_how_long_a_send_waits_for_room() -> None:
    assert config_from_mapping({}).publish_wait_ms == 3_000
    config = config_from_mapping({"broker": {"publish_wait_ms": 0}})
    assert config.publish_wait_ms == 0
    assert split(16 * MIB, config.publish_wait_ms).publish_wait_ms == 0
    with pytest.raises(ConfigError, match="publish_wait_ms"):
        config_from_mapping({"broker": {"publish_wait_ms": -1}})


def test_yaml_sets_when_an_idle_cache_is_emptied() -> None:
    from danube.runtime.memory import broker_pools

    assert config_from_mapping({}).cache_idle_ms == 60_000
    config = config_from_mapping({"broker": {"cache_idle_ms": 0}})
    assert config.cache_idle_ms == 0
    assert broker_pools(64 * MIB, 3_000, 5_000).cache_idle_ms == 5_000
    with pytest.raises(ConfigError, match="cache_idle_ms"):
        config_from_mapping({"broker": {"cache_idle_ms": -1}})

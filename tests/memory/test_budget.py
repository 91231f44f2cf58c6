"""The budget's default and split, the size syntax, the YAML key and the CLI flag."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from danube.cli.broker import build_parser, load_config
from danube.machines.memory.budget import (
    FALLBACK_TOTAL,
    MIB,
    budget_of,
    default_budget,
    machine_memory,
    publish_room_warning,
    split,
)
from danube.machines.memory.cgroup import limit_files, tightest_limit
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


MEMINFO_16G = "MemTotal:       16777216 kB\n"
V1_MOUNTS = (
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "36 31 0:33 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
)
V2_MOUNTS = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def _tree(root: Path, files: dict[str, str]) -> str:
    """A fake /proc and /sys under `root`; returns the prefix `machine_memory` reads under."""
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return str(root)


def test_a_cgroup_v1_limit_counts_when_there_is_no_v2_file(tmp_path: Path) -> None:
    """A container on a cgroup v1 host: without reading `memory.limit_in_bytes` the budget
    would be half of the host's memory, far above what the container may use."""
    from danube.runtime.memory import machine_memory

    root = _tree(
        tmp_path,
        {
            "/proc/self/cgroup": "4:memory:/\n0::/\n",
            "/proc/self/mountinfo": V1_MOUNTS,
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": "536870912\n",
        },
    )
    machine = machine_memory(root)
    assert machine.bytes == 512 * MIB and budget_of(machine) == 256 * MIB
    assert machine.source == "cgroup limit /sys/fs/cgroup/memory/memory.limit_in_bytes"


def test_a_nested_v1_group_limit_is_found_by_following_proc_self_cgroup(tmp_path: Path) -> None:
    """Review finding: only the mount root was read (the host's "unlimited"), not the
    process's own group (this machine's /proc/self/cgroup shows `memory:/process_api/...`)."""
    from danube.runtime.memory import machine_memory

    root = _tree(
        tmp_path,
        {
            "/proc/self/cgroup": "4:memory:/process_api/b58c\n0::/\n",
            "/proc/self/mountinfo": V1_MOUNTS,
            "/proc/meminfo": MEMINFO_16G,
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
            "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes": "1073741824\n",
            "/sys/fs/cgroup/memory/process_api/b58c/memory.limit_in_bytes": (
                "9223372036854771712\n"
            ),
        },
    )
    machine = machine_memory(root)
    assert machine.bytes == 1024 * MIB  # the parent's limit, the tightest on the way up
    assert machine.source == "cgroup limit /sys/fs/cgroup/memory/process_api/memory.limit_in_bytes"


def test_a_systemd_memory_max_on_cgroup_v2_is_found(tmp_path: Path) -> None:
    """`MemoryMax=` in a unit is written to its group's `memory.max`, not the root's."""
    from danube.runtime.memory import machine_memory

    root = _tree(
        tmp_path,
        {
            "/proc/self/cgroup": "0::/system.slice/danube-broker.service\n",
            "/proc/self/mountinfo": V2_MOUNTS,
            "/proc/meminfo": MEMINFO_16G,
            "/sys/fs/cgroup/system.slice/danube-broker.service/memory.max": "805306368\n",
            "/sys/fs/cgroup/system.slice/memory.max": "max\n",
        },
    )
    machine = machine_memory(root)
    assert machine.bytes == 768 * MIB
    assert budget_of(machine) == 384 * MIB


def test_unlimited_groups_leave_the_machine_memory(tmp_path: Path) -> None:
    from danube.runtime.memory import machine_memory

    root = _tree(
        tmp_path,
        {
            "/proc/self/cgroup": "0::/user.slice/session-1.scope\n",
            "/proc/self/mountinfo": V2_MOUNTS,
            "/proc/meminfo": MEMINFO_16G,
            "/sys/fs/cgroup/user.slice/session-1.scope/memory.max": "max\n",
            "/sys/fs/cgroup/user.slice/memory.max": "max\n",
        },
    )
    machine = machine_memory(root)
    assert machine.bytes == 16 * 1024 * MIB and machine.source == "MemTotal in /proc/meminfo"
    assert machine_memory(str(tmp_path / "nothing")).bytes == 1024 * MIB  # nothing readable


def test_a_container_mount_of_part_of_the_hierarchy() -> None:
    """Without a cgroup namespace a container sees the host's path in /proc/self/cgroup
    while its mount's root is that very group: the path is taken relative to the mount."""
    mounts = "40 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
    files = limit_files("5:memory:/docker/abc\n", mounts)
    assert files == ["/sys/fs/cgroup/memory/memory.limit_in_bytes"]
    assert limit_files(None, None) == [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    assert tightest_limit([("a", "max\n"), ("b", None), ("c", "2048\n"), ("d", "4096")]) == (
        2048,
        "c",
    )


def test_a_budget_too_small_for_the_largest_message_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Review finding: under about 40 MiB the publish pool cannot hold one 10 MiB message,
    which is then refused for ever, silently until a producer tries."""
    from danube.runtime.memory import broker_pools

    assert publish_room_warning(split(64 * MIB), 10 * MIB) is None
    warning = publish_room_warning(split(32 * MIB), 10 * MIB)
    assert warning is not None and "at least" in warning and "max_message_size" in warning
    needed = int(warning.split("at least ")[1].split()[0])
    assert publish_room_warning(split(needed), 10 * MIB) is None
    assert publish_room_warning(split(needed - 1024), 10 * MIB) is not None
    with caplog.at_level(logging.INFO, logger="danube.runtime"):
        broker_pools(32 * MIB, max_message_bytes=10 * MIB)
    assert "event=memory_budget budget=33554432 source=--memory-budget" in caplog.text
    assert "event=memory_budget_too_small" in caplog.text


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
    assert broker_pools(64 * MIB, 3_000, cache_idle_ms=5_000).cache_idle_ms == 5_000
    with pytest.raises(ConfigError, match="cache_idle_ms"):
        config_from_mapping({"broker": {"cache_idle_ms": -1}})

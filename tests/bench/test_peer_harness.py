"""The peer benchmark's harness end to end on a tiny workload: real nats-server and
redis-server processes, every phase, and the chart, so a broken phase shows up in CI rather
than halfway through an hour-long benchmark run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.chart import write_chart
from bench.peer_servers import ensure_installed
from bench.peer_workloads import run_nats, run_redis
from bench.workload import SystemResult, Workload

pytestmark = pytest.mark.slow

TINY = Workload(
    publish_messages=2_000,
    latency_rate=500,
    latency_messages=500,
    consume_messages=2_000,
    idle_topics=100,
)
NUMBERS = (
    "publish_per_s",
    "ack_p50_ms",
    "ack_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "latency_achieved_per_s",
    "consume_per_s",
    "base_rss_mib",
    "idle_rss_mib",
)


def _assert_complete(result: SystemResult) -> None:
    numbers: dict[str, float] = {}
    for name in NUMBERS:
        value = getattr(result, name)
        assert value is not None and value > 0, (result.system, name, value)
        numbers[name] = value
    assert numbers["ack_p50_ms"] <= numbers["ack_p99_ms"]
    assert numbers["e2e_p50_ms"] <= numbers["e2e_p99_ms"]
    assert result.durability
    assert result.notes


def test_peer_harness_runs_every_phase_and_draws_the_chart(tmp_path: Path) -> None:
    ensure_installed()
    said: list[str] = []
    nats = asyncio.run(run_nats(TINY, said.append))
    redis = asyncio.run(run_redis(TINY, "everysec", said.append))

    assert nats.system.startswith("NATS JetStream ")
    assert redis.system.startswith("Redis Streams ")
    assert "everysec" in redis.durability
    for result in (nats, redis):
        _assert_complete(result)
    assert any(line.startswith("nats: latency") for line in said)
    assert any(line.startswith("redis everysec: consume") for line in said)

    chart = tmp_path / "peers.png"
    write_chart([nats, redis], chart, "1 KiB messages, one producer process, 2 vCPU loopback")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

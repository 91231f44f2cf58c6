"""Back-pressure on publishes with a real broker (spec/memory.md, "Back-pressure"): a broker
with the smallest budget (16 MiB: a 4 MiB publish pool that may borrow 4 MiB of the cache)
and a short `publish_wait_ms`, flooded by many concurrent `SendMessage`s of 256 KiB (far more
in flight than the pool holds, faster than the disk takes them), answers some of them
RESOURCE_EXHAUSTED with the pool's message, stays responsive meanwhile, never stores what it
refused, and every message it acknowledged is read back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from grpclib.const import Status

from danube.client import DanubeClient, DispatchStrategy, SubType
from danube.client.errors import DanubeClientError
from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as pb
from tests.support.aio import run
from tests.support.wire import channel_to

pytestmark = pytest.mark.slow

TOPIC = "/default/pressed"
PAYLOAD_BYTES = 256 * 1024
SENDERS = 400
"""Concurrent sends: 100 MiB at once against a pool of 8 MiB."""
CONNECTIONS = 4
WAVES = 8
"""Floods sent one after another until one had a publish refused (the first does, mostly)."""
HEALTH_LIMIT_S = 2.0
ADMIN = Path(sys.executable).parent / "danube-admin"


def _payload(index: int) -> bytes:
    head = f"{index:08d}".encode()
    return head + b"x" * (PAYLOAD_BYTES - len(head))


@pytest.fixture
def tiny_budget_broker(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> Iterator[BrokerProcess]:
    config = tmp_path / "broker.yaml"
    config.write_text("broker:\n  memory_budget: 16MiB\n  publish_wait_ms: 10\n")
    process = broker_factory(tmp_path / "data", config_file=config).start()
    yield process
    process.kill()


async def _health_latency(broker: BrokerProcess) -> float:
    """How long a health check takes (on a connection of its own; any answer will do)."""
    async with channel_to(broker.broker_addr) as channel:
        started = time.monotonic()
        await pb.HealthCheckStub(channel).health_check(
            pb.HealthCheckRequest(client=pb.HealthCheckRequestClientType.Producer, id=1)
        )
        return time.monotonic() - started


async def _flood(broker: BrokerProcess) -> tuple[set[int], dict[int, str], list[float], set[int]]:
    """SENDERS concurrent sends over CONNECTIONS clients (one connection's HTTP/2 window
    alone keeps fewer bytes in flight than the pool holds); then reads the topic back."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(DanubeClient(broker.url)) for _ in range(CONNECTIONS)
        ]
        producers = [
            client.producer(TOPIC, f"flood-{n}", dispatch=DispatchStrategy.RELIABLE, batching=None)
            for n, client in enumerate(clients)
        ]
        for producer in producers:
            await producer.create()
        acked: set[int] = set()
        refused: dict[int, str] = {}

        async def send(index: int) -> None:
            try:
                await producers[index % CONNECTIONS].send(_payload(index))
            except DanubeClientError as error:
                assert error.status is Status.RESOURCE_EXHAUSTED, error
                refused[index] = str(error)
            else:
                acked.add(index)

        latencies = []
        for wave in range(WAVES):  # how fast the disk is decides how many waves fill the pool
            first = wave * SENDERS
            sends = asyncio.gather(*(send(index) for index in range(first, first + SENDERS)))
            while not sends.done():
                latencies.append(await _health_latency(broker))
                await asyncio.sleep(0.05)
            await sends
            if refused:
                break
        consumer = clients[0].consumer(
            TOPIC, "reader", "check", sub_type=SubType.EXCLUSIVE, start="earliest"
        )
        await consumer.subscribe()
        read: set[int] = set()
        while len(read) < len(acked):
            message = await asyncio.wait_for(consumer.receive(), 20)
            read.add(int(message.payload[:8]))
            await consumer.ack(message)
    return acked, refused, latencies, read


def _admin_text(broker: BrokerProcess, *args: str) -> str:
    done = subprocess.run(
        [str(ADMIN), "--endpoint", f"http://{broker.admin_addr}", *args],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _admin(broker: BrokerProcess, *args: str) -> Any:
    return json.loads(_admin_text(broker, *args))


def _metric(broker: BrokerProcess, name: str, label: str = "") -> float:
    with urllib.request.urlopen(f"{broker.metrics_url}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(name + "{") and label in line:
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {label} in the metrics")


def test_a_flood_past_the_publish_pool_is_refused_in_part_and_loses_nothing_acknowledged(
    tiny_budget_broker: BrokerProcess,
) -> None:
    broker = tiny_budget_broker
    acked, refused, latencies, read = run(lambda: _flood(broker), 120)
    assert acked and refused, (len(acked), len(refused))
    assert len(acked) + len(refused) == SENDERS * (1 + max(refused) // SENDERS)
    message = next(iter(refused.values()))
    assert "publish pool is full" in message and "--memory-budget" in message, message
    assert "Nothing of it was stored" in message
    # Everything acknowledged is read back; nothing refused was stored.
    assert read == acked
    # The broker answered health checks promptly all through the flood.
    assert latencies and max(latencies) < HEALTH_LIMIT_S, latencies
    assert _metric(broker, "danube_memory_publish_refused_total") == len(refused)
    assert _metric(broker, "danube_memory_publish_paused_seconds_total") > 0
    assert _metric(broker, "danube_memory_pool_used_bytes", 'pool="publish"') == 0
    assert "Traceback" not in broker.log_text()
    # The operator sees the same with danube-admin.
    shown = _admin(broker, "brokers", "memory", "-o", "json")
    assert shown[0]["danube_memory_publish_refused_total"] == len(refused), shown
    assert shown[0]["danube_memory_budget_bytes"] == 16 * 2**20
    table = _admin_text(broker, "brokers", "memory")
    assert "PUBLISH_MIB" in table and "16.0" in table, table


async def _stream_flood(broker: BrokerProcess) -> tuple[int, float, set[int]]:
    """Batched producers (`PublishBatches` streams) on CONNECTIONS clients, wave after wave
    until the broker paused them; returns how many were sent, the seconds paused, what was
    read back."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(DanubeClient(broker.url)) for _ in range(CONNECTIONS)
        ]
        producers = [
            client.producer(TOPIC, f"stream-{n}", dispatch=DispatchStrategy.RELIABLE)
            for n, client in enumerate(clients)
        ]
        sent = 0
        paused = 0.0
        for _ in range(WAVES):
            await asyncio.gather(
                *(producers[i % CONNECTIONS].send(_payload(i)) for i in range(sent, sent + SENDERS))
            )
            sent += SENDERS
            paused = _metric(broker, "danube_memory_publish_paused_seconds_total")
            if paused:
                break
        consumer = clients[0].consumer(
            TOPIC, "reader", "check", sub_type=SubType.EXCLUSIVE, start="earliest"
        )
        await consumer.subscribe()
        read: set[int] = set()
        while len(read) < sent:
            message = await asyncio.wait_for(consumer.receive(), 20)
            read.add(int(message.payload[:8]))
            await consumer.ack(message)
    return sent, paused, read


def test_batched_streams_are_paused_not_refused(tiny_budget_broker: BrokerProcess) -> None:
    broker = tiny_budget_broker
    sent, paused, read = run(lambda: _stream_flood(broker), 180)
    assert paused > 0  # the streams waited for room (not read meanwhile)...
    assert _metric(broker, "danube_memory_publish_refused_total") == 0  # ...and none refused
    assert read == set(range(sent))
    assert "Traceback" not in broker.log_text()

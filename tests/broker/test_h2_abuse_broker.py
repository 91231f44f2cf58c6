"""HTTP/2 abuse against a real broker process: rapid reset (CVE-2023-44487) and a frozen
(SIGSTOPped) Exclusive consumer. The in-process versions of every guard are in
`test_h2_abuse.py`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from h2.errors import ErrorCodes

from danube.client import DanubeClient, DanubeClientError, SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as pb
from tests.broker.h2_raw import HEALTH_PATH, RawH2, rapid_reset
from tests.conformance.harness import ScenarioProcess, admin_create_topic, run_scenario
from tests.support.aio import receive_n, run, unique_topic

pytestmark = pytest.mark.slow


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _port(broker: BrokerProcess) -> int:
    return int(broker.broker_addr.rsplit(":", 1)[1])


async def _health_latencies(port: int, stop: asyncio.Event) -> list[float]:
    latencies: list[float] = []
    channel = Channel("127.0.0.1", port)
    try:
        stub = pb.HealthCheckStub(channel)
        while not stop.is_set():
            started = time.monotonic()
            await stub.health_check(pb.HealthCheckRequest(), timeout=20)
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.05)
    finally:
        channel.close()
    return latencies


def test_rapid_reset_is_cut_off_and_costs_the_broker_neither_latency_nor_memory(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """The issue's reproduction: 30,000 x (HEADERS + RST_STREAM) on one connection cost ~10 s
    of CPU, HealthCheck latencies up to 5.2 s and ~240 MB of RSS never released. Now the
    connection is closed (GOAWAY ENHANCE_YOUR_CALM) after the reset budget, and an attacker
    that reconnects gets no further on each new connection."""
    broker = broker_factory(tmp_path / "data").start()
    port = _port(broker)

    async def scenario() -> tuple[list[int], list[int | None], list[float], int, int]:
        stop = asyncio.Event()
        health = asyncio.create_task(_health_latencies(port, stop))
        await asyncio.sleep(0.5)
        before = rss_bytes(broker.pid)
        sent: list[int] = []
        codes: list[int | None] = []
        for attempt in range(6):
            attacker = await RawH2.open(port)
            sent.append(await rapid_reset(attacker, 30_000 if attempt == 0 else 5_000, HEALTH_PATH))
            await attacker.pump(3)
            goaway = attacker.goaway()
            codes.append(None if goaway is None else goaway.error_code)
            attacker.close()
        await asyncio.sleep(1.0)
        after = rss_bytes(broker.pid)
        stop.set()
        return sent, codes, await health, before, after

    sent, codes, latencies, before, after = run(scenario, timeout=180)
    assert codes == [ErrorCodes.ENHANCE_YOUR_CALM] * 6, (codes, sent)
    assert max(sent) < 5_000, sent
    assert latencies and max(latencies) < 2.0, max(latencies)
    assert after - before < 64 * 1024 * 1024, (before, after)
    assert "reason=too_many_resets" in broker.log_text()
    assert "Traceback" not in broker.log_text()


CONSUMER = textwrap.dedent(
    """
    import asyncio, sys
    from danube.client import DanubeClient, SubType

    async def main(url, topic):
        async with DanubeClient(url) as client:
            consumer = client.consumer(topic, "frozen", "excl", sub_type=SubType.EXCLUSIVE)
            await consumer.subscribe()
            print("subscribed", flush=True)
            await consumer.ack(await consumer.receive())
            print("receiving", flush=True)  # its receive stream is open
            while True:
                await consumer.ack(await consumer.receive())

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


def test_a_frozen_exclusive_consumer_loses_its_subscription_after_the_keepalive_timeout(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text(
        "broker:\n  grpc:\n    keepalive_time_ms: 500\n    keepalive_timeout_ms: 1000\n"
    )
    broker = broker_factory(tmp_path / "data", config_file=config).start()
    topic = unique_topic("frozen")

    async def publish(payload: bytes) -> None:
        async with DanubeClient(broker.url) as client:
            producer = await client.producer(topic, "p").create()
            await producer.send(payload)

    run(lambda: publish(b"create the topic"))
    frozen = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, broker.url, topic],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert frozen.stdout is not None
        assert frozen.stdout.readline().strip() == "subscribed"
        run(lambda: publish(b"for the consumer that will freeze"))
        assert frozen.stdout.readline().strip() == "receiving"
        os.kill(frozen.pid, signal.SIGSTOP)

        async def take_over() -> tuple[Status | None, float, list[bytes]]:
            """Also keeps a healthy consumer of our client on another subscription through
            many keepalive rounds: it answers the PINGs and keeps receiving."""
            async with DanubeClient(broker.url) as healthy_client:
                healthy = await healthy_client.consumer(topic, "healthy", "other").subscribe()
                result = await _take_over_frozen()
                await asyncio.sleep(2.0)  # four more keepalive rounds
                await publish(b"for the healthy consumer too")
                payloads = [m.payload for m in await receive_n(healthy, 2)]
                assert payloads == [b"for the new consumer", b"for the healthy consumer too"]
                return result

        async def _take_over_frozen() -> tuple[Status | None, float, list[bytes]]:
            first: Status | None = None
            stopped = time.monotonic()
            while time.monotonic() - stopped < 30:
                async with DanubeClient(broker.url) as client:
                    consumer = client.consumer(topic, "new", "excl", sub_type=SubType.EXCLUSIVE)
                    try:
                        await consumer.subscribe()
                    except DanubeClientError as error:
                        first = first or error.status
                        await asyncio.sleep(0.2)
                        continue
                    waited = time.monotonic() - stopped
                    producer = await client.producer(topic, "p").create()
                    await producer.send(b"for the new consumer")
                    received = await receive_n(consumer, 1)
                    return first, waited, [m.payload for m in received]
            raise AssertionError("the frozen consumer kept its Exclusive subscription")

        refused, waited, payloads = run(take_over, timeout=60)
    finally:
        frozen.kill()
        frozen.wait(10)
    assert refused is Status.PERMISSION_DENIED  # held while the keepalive had not expired
    assert payloads == [b"for the new consumer"]
    assert waited < 15, waited
    assert "reason=keepalive_timeout" in broker.log_text()


@pytest.mark.conformance
def test_the_official_client_answers_pings_and_keeps_its_subscription(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """grpcio (the official client's transport) answers the broker's PINGs: with a keepalive
    round every 0.6 s, an idle consumer still receives after many rounds."""
    config = tmp_path / "broker.yaml"
    config.write_text(
        "broker:\n  grpc:\n    keepalive_time_ms: 200\n    keepalive_timeout_ms: 400\n"
    )
    broker = broker_factory(tmp_path / "data", config_file=config).start()
    topic = unique_topic("pinged")
    admin_create_topic(broker, topic)
    with ScenarioProcess("consume", broker.url, topic, "s", "c", "exclusive", broker=broker) as c:
        c.wait_event("subscribed")
        time.sleep(3.0)
        run_scenario("produce", broker.url, topic, "p", "late", 3, broker=broker)
        assert [c.wait_event("message", 10)["payload"] for _ in range(3)] == [
            f"late-{i}" for i in range(3)
        ]
    assert "reason=keepalive_timeout" not in broker.log_text()

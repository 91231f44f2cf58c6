"""A consumer that stops reading must cost the broker bounded memory and cost the producer and
the other subscriptions nothing (spec/protocol.md, "Subscriptions on non-reliable topics").

The stuck consumer opens ReceiveMessages on its own raw grpclib connection and never reads:
HTTP/2 flow control fills its window (4 MiB), the broker's stream writer blocks, and the
consumer's bounded queue fills and then drops (`reason=queue_full`). The broker runs with a
small queue (200 messages / 4 MiB, from a YAML config file) so that the published volume
(50 MiB) is far larger than what bounded buffering may keep: an unbounded broker would fail the
RSS check, a bounded one passes it by a wide margin, and the test stays fast.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from danube.client import DanubeClient, SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as pb
from tests.support.aio import run
from tests.support.wire import channel_to, receive_stream

pytestmark = pytest.mark.slow

MESSAGES = 800
PAYLOAD_BYTES = 64 * 1024
QUEUE_MESSAGES = 200
QUEUE_BYTES = 4 * 1024 * 1024
RSS_GROWTH_LIMIT_MIB = 32
"""Well above the stuck consumer's queue (4 MiB) plus transport buffers, well below the
50 MiB published: only a broker that buffers for the stuck consumer exceeds it."""
SEND_ACK_LIMIT_S = 2.0
"""Generous on a loaded CI machine; a producer blocked by the stuck consumer waits forever."""


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc status")


def _payload(index: int) -> bytes:
    head = f"{index:08d}".encode()
    return head + b"x" * (PAYLOAD_BYTES - len(head))


@dataclass
class PublishRun:
    elapsed_s: float
    slowest_ack_s: float
    received: list[int]
    peak_rss_growth_mib: float


@asynccontextmanager
async def _stuck_stream(broker: BrokerProcess, topic: str) -> AsyncIterator[int]:
    """Subscribes `stuck` (Exclusive, subscription `stuck-sub`) and opens its receive stream
    on a connection of its own that never reads a message; yields the consumer id."""
    async with channel_to(broker.broker_addr) as channel:
        response = await pb.ConsumerServiceStub(channel).subscribe(
            pb.ConsumerRequest(
                request_id=1,
                topic_name=topic,
                consumer_name="stuck",
                subscription="stuck-sub",
                subscription_type=pb.ConsumerRequestSubscriptionType.Exclusive,
            )
        )
        async with receive_stream(channel, response.consumer_id):
            yield response.consumer_id


@asynccontextmanager
async def _maybe_stuck(broker: BrokerProcess, topic: str, stuck: bool) -> AsyncIterator[int | None]:
    """The stuck consumer's id for the block, or None for the baseline run."""
    if not stuck:
        yield None
        return
    async with _stuck_stream(broker, topic) as consumer_id:
        yield consumer_id


async def _consumer_connected(broker: BrokerProcess, consumer_id: int) -> bool:
    async with channel_to(broker.broker_addr) as channel:
        response = await pb.HealthCheckStub(channel).health_check(
            pb.HealthCheckRequest(client=pb.HealthCheckRequestClientType.Consumer, id=consumer_id)
        )
    return response.status == pb.HealthCheckResponseClientStatus.OK


async def _publish_and_receive(broker: BrokerProcess, topic: str, *, stuck: bool) -> PublishRun:
    """Publishes MESSAGES payloads one acknowledged send at a time while a normal consumer
    (subscription `fast-sub`) receives; with `stuck`, a second subscription never reads."""
    async with DanubeClient(broker.url) as client:
        await client.producer(topic, "creator").create()
        fast = client.consumer(topic, "fast", "fast-sub", sub_type=SubType.EXCLUSIVE)
        await fast.subscribe()
        async with _maybe_stuck(broker, topic, stuck) as stuck_id:
            producer = await client.producer(topic, "producer").create()

            async def receive_all() -> list[int]:
                got = []
                while len(got) < MESSAGES:
                    message = await fast.receive()
                    got.append(int(message.payload[:8]))
                return got

            receiver = asyncio.create_task(receive_all())
            start_rss = peak_rss = _rss_mib(broker.pid)
            slowest = 0.0
            started = time.monotonic()
            for index in range(MESSAGES):
                sent = time.monotonic()
                await producer.send(_payload(index))
                slowest = max(slowest, time.monotonic() - sent)
                if index % 20 == 0:
                    peak_rss = max(peak_rss, _rss_mib(broker.pid))
            elapsed = time.monotonic() - started
            received = await asyncio.wait_for(receiver, 30)
            peak_rss = max(peak_rss, _rss_mib(broker.pid))
            if stuck_id is not None:
                # Still connected: a full queue drops messages, it does not evict the consumer.
                assert await _consumer_connected(broker, stuck_id)
    return PublishRun(elapsed, slowest, received, peak_rss - start_rss)


@pytest.fixture
def small_queue_broker(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> Iterator[BrokerProcess]:
    config = tmp_path / "broker.yaml"
    config.write_text(
        "dispatch:\n"
        f"  consumer_queue_messages: {QUEUE_MESSAGES}\n"
        f"  consumer_queue_bytes: {QUEUE_BYTES}\n"
    )
    process = broker_factory(tmp_path / "data", config_file=config).start()
    yield process
    process.kill()


def test_stuck_consumer_costs_neither_producer_nor_memory_nor_other_subscriptions(
    small_queue_broker: BrokerProcess,
) -> None:
    broker = small_queue_broker
    baseline = run(lambda: _publish_and_receive(broker, "/default/baseline", stuck=False), 60)
    with_stuck = run(lambda: _publish_and_receive(broker, "/default/with-stuck", stuck=True), 60)

    # The fast subscription loses nothing, in order, with or without the stuck one.
    assert baseline.received == list(range(MESSAGES))
    assert with_stuck.received == list(range(MESSAGES))
    # Every publish is acknowledged promptly, and the whole run is not drastically slower.
    assert with_stuck.slowest_ack_s < SEND_ACK_LIMIT_S, with_stuck
    assert with_stuck.elapsed_s < 3 * baseline.elapsed_s + 2.0, (baseline, with_stuck)
    # Memory stays bounded although 50 MiB went past a consumer that reads nothing.
    published_mib = MESSAGES * PAYLOAD_BYTES / 2**20
    assert published_mib > RSS_GROWTH_LIMIT_MIB
    assert with_stuck.peak_rss_growth_mib < RSS_GROWTH_LIMIT_MIB, with_stuck
    # The overflow is reported (first report within ~1 s of the first drop) for the stuck
    # subscription only.
    line = broker.wait_for_log(
        r"event=messages_dropped topic=/default/with-stuck subscription=stuck-sub "
        r"reason=queue_full",
        timeout=12,
    )
    assert int(line.rsplit("total=", 1)[1]) > 0
    drops = [line for line in broker.log_lines if "event=messages_dropped" in line]
    assert not [line for line in drops if "subscription=fast-sub" in line], drops
    assert "Traceback" not in broker.log_text()

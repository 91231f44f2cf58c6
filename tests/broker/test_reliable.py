"""Reliable topics through a real broker process and our client: delivery from the WAL,
acks and nacks, redelivery to the next consumer, and a graceful restart that persists the
cursors so nothing acknowledged comes again (SIGKILL and damaged segments are in
test_reliable_durability.py)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from danube.client import DanubeClient, SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.machines.wal import format
from danube.values.config import DispatchStrategy
from tests.support.aio import receive_for, receive_n, run, unique_topic

pytestmark = pytest.mark.slow

RELIABLE = DispatchStrategy.RELIABLE


async def _produce(url: str, topic: str, payloads: list[str]) -> None:
    """Creates the topic (as a reliable one) if needed and publishes the payloads."""
    async with DanubeClient(url) as client:
        producer = await client.producer(topic, "p", dispatch=RELIABLE).create()
        for payload in payloads:
            await producer.send(payload.encode())


def test_messages_published_before_the_subscription_are_delivered_from_earliest(
    broker: BrokerProcess,
) -> None:
    topic = unique_topic("rel-earliest")

    async def scenario() -> None:
        await _produce(broker.url, topic, [f"m{i}" for i in range(30)])
        async with DanubeClient(broker.url) as client:
            consumer = client.consumer(
                topic, "c", "s", sub_type=SubType.EXCLUSIVE, start="earliest"
            )
            async with consumer:
                messages = await receive_n(consumer, 30)
        assert [m.payload for m in messages] == [f"m{i}".encode() for i in range(30)]
        assert [m.offset for m in messages] == list(range(30))

    run(scenario)


def test_nacked_and_unacked_messages_come_again(broker: BrokerProcess) -> None:
    topic = unique_topic("rel-redeliver")

    async def scenario() -> None:
        await _produce(broker.url, topic, [])
        async with DanubeClient(broker.url) as client:
            first = await client.consumer(topic, "c1", "s", sub_type=SubType.SHARED).subscribe()
            await _produce(broker.url, topic, ["a", "b", "c"])
            got = await receive_n(first, 3, ack=False)
            await first.ack(got[0])
            await first.nack(got[1], delay_ms=0)
            again = await receive_n(first, 1, timeout=5, ack=False)
            assert again[0].payload == b"b" and again[0].offset == 1
            await first.ack(again[0])
            await first.close()  # "c" was never acknowledged
            second = await client.consumer(topic, "c2", "s", sub_type=SubType.SHARED).subscribe()
            redelivered = await receive_n(second, 1, timeout=10)
            assert [m.payload for m in redelivered] == [b"c"]
            assert await receive_for(second, 0.5) == [], "acknowledged messages stay done"

    run(scenario)


def test_graceful_restart_persists_cursors_and_seals_the_wal(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    topic = unique_topic("rel-restart")
    process = broker_factory(tmp_path / "data").start()

    async def before() -> None:
        await _produce(process.url, topic, [])
        async with DanubeClient(process.url) as client:
            consumer = await client.consumer(
                topic, "c", "s", sub_type=SubType.EXCLUSIVE, start="earliest"
            ).subscribe()
            await _produce(process.url, topic, [f"m{i}" for i in range(10)])
            for message in await receive_n(consumer, 10, ack=False):
                if message.offset < 6:
                    await consumer.ack(message)

    run(before)
    assert process.stop(signal.SIGTERM) == 0
    wal_dir = tmp_path / "data" / "wal" / "default" / topic.split("/")[-1]
    assert [p.name for p in wal_dir.glob("*.wal")] == [format.segment_name(0)]
    restarted = broker_factory(tmp_path / "data", broker_port=0).start()

    async def after() -> None:
        await _produce(restarted.url, topic, ["m10"])
        async with DanubeClient(restarted.url) as client:
            consumer = await client.consumer(
                topic, "c", "s", sub_type=SubType.EXCLUSIVE
            ).subscribe()
            messages = await receive_n(consumer, 5, ack=False)
            # the cursor written at shutdown says 0..5 are done; 6..9 were never acked
            assert [m.offset for m in messages] == [6, 7, 8, 9, 10]
            assert [m.payload for m in messages][-1] == b"m10"

    run(after)
    segments = sorted(p.name for p in wal_dir.glob("*.wal"))
    assert segments == [format.segment_name(0), format.segment_name(10)], (
        "a restart never appends to a sealed segment"
    )

"""Our Python client's recovery rules against a real broker: what it retries, what it
surfaces."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from grpclib.client import Channel
from grpclib.const import Status

from danube.client import DanubeClient, DanubeClientError, SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube_admin as admin_pb
from tests.support.aio import receive_n, run, unique_topic

pytestmark = pytest.mark.slow


async def _delete_topic(broker: BrokerProcess, topic: str) -> None:
    host, port = broker.admin_addr.rsplit(":", 1)
    channel = Channel(host, int(port))
    try:
        await admin_pb.TopicAdminStub(channel).delete_topic(admin_pb.TopicRequest(name=topic))
    finally:
        channel.close()


def test_consumer_of_a_deleted_topic_gets_not_found(broker: BrokerProcess) -> None:
    topic = unique_topic()

    async def scenario() -> DanubeClientError:
        async with DanubeClient(broker.url) as client:
            await client.producer(topic, "p").create()
            consumer = await client.consumer(topic, "c", "s").subscribe()
            await _delete_topic(broker, topic)
            with pytest.raises(DanubeClientError) as raised:
                await asyncio.wait_for(consumer.receive(), 10)
            return raised.value

    error = run(scenario)
    assert error.status is Status.NOT_FOUND
    assert topic in str(error)


def test_second_session_with_the_same_consumer_name_takes_over(broker: BrokerProcess) -> None:
    """Danube's clients steal the stream back and forth forever; ours tells the first session
    what happened and stops."""
    topic = unique_topic()

    async def scenario() -> None:
        async with DanubeClient(broker.url) as first, DanubeClient(broker.url) as second:
            await first.producer(topic, "p").create()
            old = await first.consumer(topic, "same", "s", sub_type=SubType.EXCLUSIVE).subscribe()
            new = await second.consumer(topic, "same", "s", sub_type=SubType.EXCLUSIVE).subscribe()
            with pytest.raises(DanubeClientError, match="taken over"):
                await asyncio.wait_for(old.receive(), 10)
            producer = await first.producer(topic, "p").create()
            await producer.send(b"for the new session")
            assert [m.payload for m in await receive_n(new, 1)] == [b"for the new session"]

    run(scenario)


def test_producer_recreates_itself_after_its_topic_was_deleted(broker: BrokerProcess) -> None:
    topic = unique_topic()

    async def scenario() -> list[str]:
        async with DanubeClient(broker.url) as client:
            producer = await client.producer(topic, "p").create()
            await producer.send(b"one")
            await _delete_topic(broker, topic)
            assert await client.partitions(topic) == []
            await producer.send(b"two")
            return await client.partitions(topic)

    assert run(scenario) == [topic]


def test_consumer_and_producer_continue_after_the_broker_is_killed(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """SIGKILL breaks the connection mid-stream; the same client objects carry on once the
    broker is back on the same address, because producer and consumer ids survive it."""
    broker = broker_factory(tmp_path / "data").start()
    topic = "/default/killed"

    async def scenario() -> list[bytes]:
        async with DanubeClient(broker.url) as client:
            producer = await client.producer(topic, "p").create()
            consumer = client.consumer(topic, "c", "s", sub_type=SubType.EXCLUSIVE)
            await consumer.subscribe()
            await producer.send(b"before")
            assert [m.payload for m in await receive_n(consumer, 1)] == [b"before"]
            await asyncio.to_thread(broker.stop, signal.SIGKILL)
            await asyncio.to_thread(broker.start)
            # The consumer reconnects with backoff; publish until its stream is back.
            for attempt in range(50):
                await producer.send(f"after-{attempt}".encode())
                try:
                    first = await asyncio.wait_for(consumer.receive(), 0.2)
                    return [first.payload]
                except TimeoutError:
                    continue
            raise AssertionError("the consumer never came back")

    assert run(scenario)[0].startswith(b"after-")

"""End-to-end data plane through a real broker process and our client."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from grpclib.const import Status

from danube.client import DanubeClient, DanubeClientError, SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as pb
from danube.values.hashing import partition_for_key
from tests.support.aio import receive_for, receive_n, run, unique_topic
from tests.support.wire import channel_to, receive_stream

pytestmark = pytest.mark.slow


async def _create_topic(client: DanubeClient, topic: str, partitions: int = 0) -> None:
    await client.producer(topic, "creator", partitions=partitions).create()


def test_exclusive_receives_everything_in_order(broker: BrokerProcess) -> None:
    topic = unique_topic()

    async def scenario() -> list[bytes]:
        async with DanubeClient(broker.url) as client:
            await _create_topic(client, topic)
            async with client.consumer(topic, "c1", "sub", sub_type=SubType.EXCLUSIVE) as cons:
                async with client.producer(topic, "p1") as producer:
                    for i in range(100):
                        await producer.send(f"m{i}".encode(), attributes={"i": str(i)})
                received = await receive_n(cons, 100)
                assert [m.attributes["i"] for m in received] == [str(i) for i in range(100)]
                # Non-reliable offsets are the topic's publish sequence (gaps show drops).
                assert [m.offset for m in received] == list(range(100))
                return [m.payload for m in received]

    assert run(scenario) == [f"m{i}".encode() for i in range(100)]


def test_shared_splits_round_robin_exactly_once(broker: BrokerProcess) -> None:
    topic = unique_topic()

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        async with DanubeClient(broker.url) as client:
            await _create_topic(client, topic)
            async with (
                client.consumer(topic, "a", "work", sub_type=SubType.SHARED) as first,
                client.consumer(topic, "b", "work", sub_type=SubType.SHARED) as second,
            ):
                async with client.producer(topic, "p") as producer:
                    for i in range(60):
                        await producer.send(f"{i}".encode())
                got_first = await receive_for(first, 1.0)
                got_second = await receive_for(second, 0.2)
                return [m.payload for m in got_first], [m.payload for m in got_second]

    first, second = run(scenario)
    assert sorted(first + second, key=int) == [f"{i}".encode() for i in range(60)]
    assert len(first) == len(second) == 30


def test_partitioned_topic_routes_round_robin_and_by_key(broker: BrokerProcess) -> None:
    topic = unique_topic("parts")

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            assert await client.partitions(topic) == []
            await _create_topic(client, topic, partitions=3)
            assert await client.partitions(topic) == [f"{topic}-part-{i}" for i in range(3)]
            async with client.consumer(topic, "c", "sub", sub_type=SubType.EXCLUSIVE) as cons:
                producer = await client.producer(topic, "p", partitions=3).create()
                for i in range(30):
                    await producer.send(f"{i}".encode())
                received = await receive_n(cons, 30)
                assert Counter(m.topic for m in received) == {
                    f"{topic}-part-{i}": 10 for i in range(3)
                }
                for key in ("alpha", "beta", "gamma", "delta"):
                    await producer.send(key.encode(), key=key)
                keyed = await receive_n(cons, 4)
                for message in keyed:
                    index = partition_for_key(message.payload.decode(), 3)
                    assert message.topic == f"{topic}-part-{index}"

    run(scenario)


def test_failover_promotes_standby_when_active_leaves(broker: BrokerProcess) -> None:
    topic = unique_topic()

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            await _create_topic(client, topic)
            active = await client.consumer(topic, "a", "fo", sub_type=SubType.FAILOVER).subscribe()
            standby = client.consumer(topic, "b", "fo", sub_type=SubType.FAILOVER)
            await standby.subscribe()
            producer = await client.producer(topic, "p").create()
            for i in range(5):
                await producer.send(f"before-{i}".encode())
            assert len(await receive_n(active, 5)) == 5
            assert await receive_for(standby, 0.3) == []
            await active.close()
            await asyncio.sleep(0.3)
            for i in range(5):
                await producer.send(f"after-{i}".encode())
            after = await receive_n(standby, 5)
            assert [m.payload for m in after] == [f"after-{i}".encode() for i in range(5)]
            await standby.close()

    run(scenario)


def test_key_shared_keeps_keys_on_one_consumer_and_honours_filters(broker: BrokerProcess) -> None:
    topic = unique_topic()

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            await _create_topic(client, topic)
            async with (
                client.consumer(topic, "eu", "ks", sub_type=SubType.KEY_SHARED,
                                key_filters=("eu-*",)) as eu,
                client.consumer(topic, "any1", "ks", sub_type=SubType.KEY_SHARED) as any1,
                client.consumer(topic, "any2", "ks", sub_type=SubType.KEY_SHARED) as any2,
            ):  # fmt: skip
                producer = await client.producer(topic, "p").create()
                keys = ["eu-1", "eu-2", "us-1", "us-2", "ap-1", "ap-2"]
                for round_ in range(5):
                    for key in keys:
                        await producer.send(f"{key}/{round_}".encode(), key=key)
                owners: dict[str, set[str]] = {}
                total = 0
                for name, consumer in (("eu", eu), ("any1", any1), ("any2", any2)):
                    for message in await receive_for(consumer, 0.7):
                        owners.setdefault(message.routing_key or "", set()).add(name)
                        total += 1
                assert total == 30
                assert all(len(names) == 1 for names in owners.values()), owners
                assert all(key.startswith("eu-") for key, names in owners.items() if "eu" in names)

    run(scenario)


@pytest.mark.parametrize("takeover", ["second_stream", "resubscribe"])
def test_takeover_ends_the_previous_stream(broker: BrokerProcess, takeover: str) -> None:
    """A newer stream (or a Subscribe with the same consumer name) ends the older stream with
    status OK, and messages flow to the newer one."""
    topic = unique_topic()

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            await _create_topic(client, topic)
        async with channel_to(broker.broker_addr) as channel:
            consumers = pb.ConsumerServiceStub(channel)
            request = pb.ConsumerRequest(
                request_id=1, topic_name=topic, consumer_name="same", subscription="s",
                subscription_type=0,
            )  # fmt: skip
            consumer_id = (await consumers.subscribe(request)).consumer_id
            async with receive_stream(channel, consumer_id) as old:
                if takeover == "resubscribe":
                    assert (await consumers.subscribe(request)).consumer_id == consumer_id
                async with receive_stream(channel, consumer_id) as new:
                    async with asyncio.timeout(5):
                        assert await old.recv_message() is None
                        await old.recv_trailing_metadata()  # raises unless status OK
                    producers = pb.ProducerServiceStub(channel)
                    producer_id = (
                        await producers.create_producer(
                            pb.ProducerRequest(request_id=1, producer_name="p", topic_name=topic)
                        )
                    ).producer_id
                    await producers.send_message(
                        pb.StreamMessage(
                            request_id=2,
                            msg_id=pb.MsgId(producer_id=producer_id, topic_name=topic),
                            payload=b"to-new",
                            producer_name="p",
                        )
                    )
                    async with asyncio.timeout(5):
                        message = await new.recv_message()
                    assert message.payload == b"to-new"

    run(scenario)


def test_start_positions_through_the_extension_service(broker: BrokerProcess) -> None:
    """`danube_ext.ConsumerExt/SubscribeAt`: latest works everywhere; earliest and offsets need
    history, which non-reliable topics do not keep."""
    topic = unique_topic()

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            await _create_topic(client, topic)
            with pytest.raises(DanubeClientError, match="keeps no history") as raised:
                await client.consumer(topic, "c", "early", start="earliest").subscribe()
            assert raised.value.status is Status.FAILED_PRECONDITION
            async with client.consumer(topic, "c", "late", start="latest") as consumer:
                producer = await client.producer(topic, "p").create()
                await producer.send(b"after")
                assert [m.payload for m in await receive_n(consumer, 1)] == [b"after"]

    run(scenario)

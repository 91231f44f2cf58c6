"""The batched data path against a real broker (spec/protocol.md, "Batched data path"), and
the client's fallback to Danube's RPCs against a broker without it."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import grpclib.const
import grpclib.server
import pytest
from grpclib.client import Channel
from grpclib.const import Status

from danube.client import Batching, Consumer, DanubeClient, DispatchStrategy, Message
from danube.localcluster.broker_process import BrokerProcess
from danube.machines.wal import format, records
from danube.proto import danube as pb
from danube.proto import danube_ext as ext_pb
from danube.runtime.grpc_util import Unimplemented
from tests.support.aio import receive_n, run, unique_topic

pytestmark = pytest.mark.slow
RELIABLE = DispatchStrategy.RELIABLE
ACK_TIMEOUT_S = 30.0
"""The broker's default `ack_timeout_ms` (spec/failure-policies.md)."""
STALL_S = ACK_TIMEOUT_S / 3
"""Longest wait for the next message of a reliable topic being drained: a lost ack keeps a
window slot until the ack timeout redelivers, so a stall a third as long fails first and says
so (at load 6-7 on two cores the slowest ack round trip measured 136 ms)."""


async def receive_n_acking_behind(consumer: Consumer, count: int) -> list[Message]:
    """`count` messages, each acknowledged as it arrives without waiting for the broker's
    answer before the next `receive` (as a consumer that acks from a task of its own): the
    client sends the acks gathered meanwhile in one `AckBatch`, so the reliable window (10 by
    default) refills per batch, not per round trip. Every acknowledgement must be taken.

    Awaiting each ack in turn made this 2,990 sequential round trips, each two process
    wake-ups: at load 4-6 on two cores 15-20 ms each (the broker's own work per ack is the
    RPC's: the ack itself was 3 % of its samples), so the test timed the scheduler. What
    fails it now is a stall (`STALL_S`), not the speed of the machine."""
    received: list[Message] = []
    acks: list[asyncio.Future[bool]] = []
    while len(received) < count:
        async with asyncio.timeout(STALL_S):
            message = await consumer.receive()
        acks.append(asyncio.ensure_future(consumer.ack(message)))
        received.append(message)
    assert all(await asyncio.gather(*acks))
    return received


def test_enqueued_messages_arrive_once_in_order_on_a_reliable_topic(
    broker: BrokerProcess,
) -> None:
    topic = unique_topic()
    count = 3000

    async def scenario() -> list[int]:
        async with DanubeClient(broker.url) as client:
            batching = Batching(max_messages=100, max_in_flight=2)
            producer = client.producer(topic, "p", dispatch=RELIABLE, batching=batching)
            async with producer:
                answers = [producer.enqueue(i.to_bytes(4, "big")) for i in range(count)]
                for answer in answers:
                    await answer
            consumer = await client.consumer(topic, "c", "s", start="earliest").subscribe()
            received = await receive_n_acking_behind(consumer, count - 10)
            rest = await receive_n(consumer, 10, ack=False)
            assert await consumer.ack_many(rest)
            received += rest
            assert [m.offset for m in received] == list(range(count))
            return [int.from_bytes(m.payload, "big") for m in received]

    assert run(scenario) == list(range(count))


def test_partitioned_and_keyed_messages_travel_batched(broker: BrokerProcess) -> None:
    topic = unique_topic()

    async def scenario() -> list[tuple[str, str, bytes]]:
        async with DanubeClient(broker.url) as client:
            producer = await client.producer(topic, "p", partitions=2).create()
            consumer = await client.consumer(topic, "c", "s").subscribe()
            async with producer:
                for i in range(20):
                    await producer.send(b"m%d" % i, key=f"k{i % 3}", attributes={"i": str(i)})
            received = await receive_n(consumer, 20)
            return sorted((m.routing_key or "", m.attributes["i"], m.payload) for m in received)

    received = run(scenario)
    assert len(received) == 20
    assert all(payload == b"m" + index.encode() for _, index, payload in received)


async def _publish_raw(broker: BrokerProcess, topic: str, frames: list[bytes]) -> list[object]:
    async with DanubeClient(broker.url) as client:
        await client.producer(topic, "raw", dispatch=RELIABLE).create()
    host, port = broker.broker_addr.rsplit(":", 1)
    with contextlib.closing(Channel(host, int(port))) as channel:
        created = await pb.ProducerServiceStub(channel).create_producer(
            pb.ProducerRequest(
                producer_name="raw", topic_name=topic, dispatch_strategy=pb.DispatchStrategy(1)
            )
        )
        answers = []
        async with channel.request(
            "/danube_ext.ProducerExt/PublishBatches",
            grpclib.const.Cardinality.STREAM_STREAM,
            ext_pb.PublishBatch,
            ext_pb.BatchAck,
        ) as stream:
            for sequence, frame in enumerate(frames, 1):
                await stream.send_message(
                    ext_pb.PublishBatch(created.producer_id, topic, sequence, frame)
                )
                answers.append(await stream.recv_message())
            await stream.end()
        return answers


def test_a_refused_batch_stores_nothing_and_the_stream_goes_on(broker: BrokerProcess) -> None:
    topic = unique_topic()
    good = format.encode_frame(
        0, 0, [records.encode(records.Record(payload=b"ok", has_msg_id=False))]
    )
    bad_utf8 = format.encode_frame(0, 0, [b"\x1a\x01a", b"\x2a\x01\xff"])
    damaged = good[:-1] + bytes([good[-1] ^ 1])

    answers = run(lambda: _publish_raw(broker, topic, [good, bad_utf8, damaged, good]))
    statuses = [a.status for a in answers]  # type: ignore[attr-defined]
    assert statuses == [0, Status.INVALID_ARGUMENT.value, Status.INVALID_ARGUMENT.value, 0]
    assert "message 1 of the batch" in answers[1].error  # type: ignore[attr-defined]
    assert "CRC32C mismatch" in answers[2].error  # type: ignore[attr-defined]
    assert [a.first_offset for a in answers if a.status == 0] == [0, 1]  # type: ignore[attr-defined]


class _DanubeWithoutBatches:
    """What a Danube broker offers: its own RPCs, and UNIMPLEMENTED for `danube_ext`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sent: list[bytes] = []
        self.acked: list[int] = []

    async def subscribe(self, stream: grpclib.server.Stream) -> None:
        request = await stream.recv_message()
        await stream.send_message(pb.ConsumerResponse(request.request_id, 9, request.consumer_name))

    async def receive_messages(self, stream: grpclib.server.Stream) -> None:
        await stream.recv_message()
        for offset, payload in enumerate(self.sent):
            msg_id = pb.MsgId(producer_id=7, topic_name="/default/t", topic_offset=offset)
            await stream.send_message(pb.StreamMessage(msg_id=msg_id, payload=payload))
        await asyncio.Event().wait()  # the stream stays open, as a broker's does

    async def ack(self, stream: grpclib.server.Stream) -> None:
        request = await stream.recv_message()
        self.acked.append(request.msg_id.topic_offset)
        await stream.send_message(pb.AckResponse(request.request_id))

    async def create_producer(self, stream: grpclib.server.Stream) -> None:
        request = await stream.recv_message()
        await stream.send_message(pb.ProducerResponse(request.request_id, 7, request.producer_name))

    async def send_message(self, stream: grpclib.server.Stream) -> None:
        request = await stream.recv_message()
        self.sent.append(request.payload)
        await stream.send_message(pb.MessageResponse(request.request_id))

    async def topic_lookup(self, stream: grpclib.server.Stream) -> None:
        request = await stream.recv_message()
        url = f"http://127.0.0.1:{self.port}"
        await stream.send_message(
            pb.TopicLookupResponse(
                request.request_id, pb.TopicLookupResponseLookupType.Connect, url, url
            )
        )

    async def topic_partitions(self, stream: grpclib.server.Stream) -> None:
        request = await stream.recv_message()
        await stream.send_message(pb.TopicPartitionsResponse(request.request_id, [request.topic]))

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        unary = grpclib.const.Cardinality.UNARY_UNARY

        def handler(call: object, request: type, reply: type) -> grpclib.const.Handler:
            return grpclib.const.Handler(call, unary, request, reply)

        return {
            "/danube.ProducerService/CreateProducer": handler(
                self.create_producer, pb.ProducerRequest, pb.ProducerResponse
            ),
            "/danube.ProducerService/SendMessage": handler(
                self.send_message, pb.StreamMessage, pb.MessageResponse
            ),
            "/danube.ConsumerService/Subscribe": handler(
                self.subscribe, pb.ConsumerRequest, pb.ConsumerResponse
            ),
            "/danube.ConsumerService/ReceiveMessages": grpclib.const.Handler(
                self.receive_messages,
                grpclib.const.Cardinality.UNARY_STREAM,
                pb.ReceiveRequest,
                pb.StreamMessage,
            ),
            "/danube.ConsumerService/Ack": handler(self.ack, pb.AckRequest, pb.AckResponse),
            "/danube.Discovery/TopicLookup": handler(
                self.topic_lookup, pb.TopicLookupRequest, pb.TopicLookupResponse
            ),
            "/danube.Discovery/TopicPartitions": handler(
                self.topic_partitions, pb.TopicLookupRequest, pb.TopicPartitionsResponse
            ),
        }


def test_the_client_falls_back_to_danubes_rpcs_without_the_batched_path() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fake = _DanubeWithoutBatches(port)

    async def scenario() -> None:
        server = grpclib.server.Server(
            [
                fake,
                Unimplemented(
                    [ext_pb.ProducerExtBase, ext_pb.ConsumerExtBase], [fake], "not Danube's"
                ),
            ]
        )
        await server.start("127.0.0.1", port)
        try:
            async with (
                DanubeClient(f"http://127.0.0.1:{port}") as client,
                client.producer("/default/t", "p") as producer,
            ):
                await producer.send(b"first")
                await asyncio.gather(*[producer.enqueue(b"m%d" % i) for i in range(5)])
                consumer = await client.consumer("/default/t", "c", "s").subscribe()
                received = await receive_n(consumer, 6, ack=False)
                assert [m.payload for m in received] == fake.sent
                assert await consumer.ack(received[0])
                assert await consumer.ack_many(received[1:])
                await consumer.close()
        finally:
            server.close()
            await server.wait_closed()

    run(scenario)
    assert fake.sent == [b"first", *(b"m%d" % i for i in range(5))]
    assert fake.acked == list(range(6))


def test_a_producer_that_leaves_mid_stream_leaves_nothing_dangling(
    broker: BrokerProcess,
) -> None:
    """The batches were handed to the core (stored); the answers nobody reads are dropped
    cleanly, not left as coroutines never awaited."""
    topic = unique_topic()
    frame = format.encode_frame(
        0, 0, [records.encode(records.Record(payload=b"x", has_msg_id=False))]
    )

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            await client.producer(topic, "raw", dispatch=RELIABLE).create()
        host, port = broker.broker_addr.rsplit(":", 1)
        channel = Channel(host, int(port))
        created = await pb.ProducerServiceStub(channel).create_producer(
            pb.ProducerRequest(
                producer_name="raw", topic_name=topic, dispatch_strategy=pb.DispatchStrategy(1)
            )
        )
        stream = channel.request(
            "/danube_ext.ProducerExt/PublishBatches",
            grpclib.const.Cardinality.STREAM_STREAM,
            ext_pb.PublishBatch,
            ext_pb.BatchAck,
        )
        await stream.__aenter__()
        for sequence in range(1, 20):
            await stream.send_message(
                ext_pb.PublishBatch(created.producer_id, topic, sequence, frame)
            )
        channel.close()
        await asyncio.sleep(1.0)

    run(scenario)
    assert not [line for line in broker.log_lines if "never awaited" in line]

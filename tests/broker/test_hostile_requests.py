"""Hostile requests (issue 20): raw bytes no honest client sends. Each is refused at once with
INVALID_ARGUMENT and a short message, other clients are served meanwhile, and the broker logs
no traceback (spec/protocol.md, "Limits on requests").

The bytes go through a pass-through codec, so neither a client library nor betterproto can
clean them up on the way."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Cardinality, Status

from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as pb
from danube.proto import danube_admin as admin_pb
from danube.proto import danube_ext as ext_pb
from danube.runtime.server import ADMIN_PORT_BASES, CLIENT_PORT_BASES
from tests.support.aio import run, unique_topic
from tests.support.wire import host_port

pytestmark = pytest.mark.slow

MESSAGE_BOUND = 1024
"""Bytes a refusal's message may take (the broker cuts any status message to this)."""


class Raw:
    """A message that is exactly the bytes given (and decodes to them)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data

    @classmethod
    def FromString(cls, data: bytes) -> Raw:
        return cls(data)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string_field(number: int, text: str) -> bytes:
    data = text.encode()
    return _varint(number << 3 | 2) + _varint(len(data)) + data


async def _call(channel: Channel, path: str, *messages: bytes) -> bytes:
    """Sends `messages` (each its own gRPC message) on one call to `path`; the answer's bytes."""
    async with asyncio.timeout(60):
        async with channel.request(path, Cardinality.STREAM_STREAM, Raw, Raw) as stream:
            for i, message in enumerate(messages):
                await stream.send_message(Raw(message), end=i == len(messages) - 1)
            reply = await stream.recv_message()
            await stream.recv_trailing_metadata()
            assert reply is not None
            return reply.data


async def _refused(channel: Channel, path: str, *messages: bytes) -> str:
    """The call must end with INVALID_ARGUMENT and a short message, which is returned."""
    try:
        answer = await _call(channel, path, *messages)
    except GRPCError as error:
        assert error.status is Status.INVALID_ARGUMENT, f"{path}: {error.status} {error.message}"
        assert error.message and len(error.message.encode()) < MESSAGE_BOUND
        assert "Traceback" not in error.message
        return error.message
    raise AssertionError(f"{path} answered {answer!r}")


def _channel(address: str) -> Channel:
    return Channel(*host_port(address))


@pytest.fixture(scope="module")
def hostile_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker of its own: the log of this module's requests is checked at the end."""
    with BrokerProcess(tmp_path_factory.mktemp("hostile")) as process:
        yield process


async def _health_latency_while(broker: BrokerProcess, work: Any) -> tuple[Any, float]:
    """Runs `work` while another connection asks HealthCheck over and over; returns the
    work's result and the slowest HealthCheck answer in seconds."""
    done = asyncio.Event()
    worst = 0.0
    watcher = _channel(broker.broker_addr)

    async def probe() -> None:
        nonlocal worst
        stub = pb.HealthCheckStub(watcher)
        while not done.is_set():
            started = time.monotonic()
            await stub.health_check(pb.HealthCheckRequest(client=0, id=1), timeout=60)
            worst = max(worst, time.monotonic() - started)
            await asyncio.sleep(0.02)

    prober = asyncio.ensure_future(probe())
    try:
        await asyncio.sleep(0.1)
        result = await work
    finally:
        done.set()
        await prober
        watcher.close()
    return result, worst


def test_a_huge_topic_name_is_refused_at_once_and_stalls_nobody(
    hostile_broker: BrokerProcess,
) -> None:
    """`TopicLookup{topic: "q" * 400_000}` stalled every client for 25 s while the broker
    HPACK-encoded the name it quoted; now it is refused with a short message that gives the
    length, and HealthCheck on another connection stays prompt (the bound is generous)."""

    async def scenario() -> None:
        channel = _channel(hostile_broker.broker_addr)
        try:
            lookup = pb.TopicLookupRequest(request_id=1, topic="q" * 400_000)
            started = time.monotonic()
            message, worst = await _health_latency_while(
                hostile_broker,
                _refused(channel, "/danube.Discovery/TopicLookup", bytes(lookup)),
            )
            assert time.monotonic() - started < 10
            assert "400000" in message
            assert worst < 5, f"HealthCheck waited {worst:.1f} s"
            producer = pb.ProducerRequest(
                request_id=2, producer_name="p" * 400_000, topic_name=unique_topic()
            )
            message, worst = await _health_latency_while(
                hostile_broker,
                _refused(channel, "/danube.ProducerService/CreateProducer", bytes(producer)),
            )
            assert worst < 5, f"HealthCheck waited {worst:.1f} s"
        finally:
            channel.close()

    run(scenario)


def test_a_megabyte_of_unknown_fields_is_refused_at_once(hostile_broker: BrokerProcess) -> None:
    """1 MB of unknown varint fields in `CreateProducer` kept betterproto busy for 28 s."""
    flood = b"\xf8\x07\x01" * 330_000  # field 127, varint 1, 330,000 times

    async def scenario() -> None:
        channel = _channel(hostile_broker.broker_addr)
        try:
            started = time.monotonic()
            message, worst = await _health_latency_while(
                hostile_broker,
                _refused(channel, "/danube.ProducerService/CreateProducer", flood),
            )
            assert time.monotonic() - started < 10
            assert "fields" in message
            assert worst < 5, f"HealthCheck waited {worst:.1f} s"
        finally:
            channel.close()

    run(scenario)


@pytest.mark.parametrize(
    ("path", "data", "expected"),
    [
        # wrong wire types for known fields: handlers got an int for a str (INTERNAL)
        ("/danube.Discovery/TopicLookup", bytes.fromhex("08011005"), "topic"),
        ("/danube.HealthCheck/HealthCheck", bytes.fromhex("120101"), "client"),
        ("/danube.ProducerService/CreateProducer", bytes.fromhex("1005"), "producer_name"),
        # a field number of 2^29 (invalid to every protobuf parser)
        ("/danube.Discovery/TopicLookup", bytes.fromhex("808080801001"), "field number"),
        # varints: an 11-byte one, and a 10-byte one over 64 bits
        ("/danube.Discovery/TopicLookup", b"\x08" + b"\xff" * 10 + b"\x01", "varint"),
        ("/danube.Discovery/TopicLookup", b"\x08" + b"\xff" * 9 + b"\x02", "64 bits"),
        # a string that is not UTF-8, a group wire type, a length past the end
        ("/danube.Discovery/TopicLookup", bytes.fromhex("1202c328"), "UTF-8"),
        ("/danube.Discovery/TopicLookup", bytes.fromhex("0b"), "wire type"),
        ("/danube.Discovery/TopicLookup", bytes.fromhex("1205612f62"), "past its end"),
        # packed offsets that end inside a varint
        ("/danube_ext.ConsumerExt/AckBatch", bytes.fromhex("2202ffff"), "offsets"),
    ],
)
def test_malformed_bytes_are_invalid_argument_naming_the_problem(
    hostile_broker: BrokerProcess, path: str, data: bytes, expected: str
) -> None:
    async def scenario() -> None:
        channel = _channel(hostile_broker.broker_addr)
        try:
            message = await _refused(channel, path, data)
            assert expected in message, message
        finally:
            channel.close()

    run(scenario)


def test_publish_batches_with_frame_as_a_varint_is_invalid_argument(
    hostile_broker: BrokerProcess,
) -> None:
    """It ended the stream with UNKNOWN and a traceback in the log."""
    batch = _string_field(2, "/default/t") + bytes.fromhex("2005")  # frame (4) as a varint
    sequence_over_64_bits = b"\x18" + b"\xff" * 9 + b"\x02"  # sequence (3)

    async def scenario() -> None:
        channel = _channel(hostile_broker.broker_addr)
        try:
            path = "/danube_ext.ProducerExt/PublishBatches"
            assert "frame" in await _refused(channel, path, batch)
            assert "64 bits" in await _refused(channel, path, sequence_over_64_bits)
        finally:
            channel.close()

    run(scenario)


def test_a_batch_ack_echoes_the_largest_sequence_exactly(hostile_broker: BrokerProcess) -> None:
    """A sequence is a uint64: the largest one comes back as it was sent (the batch itself is
    refused, for an unknown producer)."""
    largest = (1 << 64) - 1

    async def scenario() -> None:
        channel = _channel(hostile_broker.broker_addr)
        try:
            batch = ext_pb.PublishBatch(topic_name=unique_topic(), producer_id=1, sequence=largest)
            answer = ext_pb.BatchAck.FromString(
                await _call(channel, "/danube_ext.ProducerExt/PublishBatches", bytes(batch))
            )
            assert answer.sequence == largest
            assert answer.status != 0
        finally:
            channel.close()

    run(scenario)


def test_a_unary_call_with_two_messages_is_refused(hostile_broker: BrokerProcess) -> None:
    """It was answered OK, for the first message, the second ignored."""
    health = bytes(pb.HealthCheckRequest(client=0, id=1))

    async def scenario() -> None:
        channel = _channel(hostile_broker.broker_addr)
        try:
            assert await _call(channel, "/danube.HealthCheck/HealthCheck", health) is not None
            message = await _refused(channel, "/danube.HealthCheck/HealthCheck", health, health)
            assert "one message" in message
            receive = bytes(pb.ReceiveRequest(consumer_id=1))
            path = "/danube.ConsumerService/ReceiveMessages"
            assert "one message" in await _refused(channel, path, receive, receive)
        finally:
            channel.close()

    run(scenario)


def test_deeply_nested_policies_are_invalid_argument(hostile_broker: BrokerProcess) -> None:
    """`"[" * 5000` raised RecursionError out of `json.loads`."""

    async def scenario() -> None:
        channel = _channel(hostile_broker.admin_addr)
        try:
            for text in ("[" * 5000, "[" * 5000 + "]" * 5000, '{"a":' * 100 + "1" + "}" * 100):
                request = ext_pb.SetPoliciesRequest(name="default", policies=text)
                path = "/danube_ext.PolicyAdmin/SetNamespacePolicies"
                assert "nest deeper" in await _refused(channel, path, bytes(request))
        finally:
            channel.close()

    run(scenario)


def test_names_are_limited_in_bytes_before_anything_is_created(
    hostile_broker: BrokerProcess,
) -> None:
    """`/default/` + "é" * 200 is 209 characters but 409 bytes: it was accepted, then the
    topic stopped with `File name too long` and stayed broken in the metadata."""
    wide = "/default/" + "é" * 200
    at_limit = "/default/" + "é" * 123  # 255 bytes

    async def scenario() -> None:
        admin = _channel(hostile_broker.admin_addr)
        client = _channel(hostile_broker.broker_addr)
        try:
            topics = admin_pb.TopicAdminStub(admin)
            for path, request in [
                ("/danube_admin.TopicAdmin/CreateTopic", admin_pb.NewTopicRequest(name=wide)),
                (
                    "/danube.ProducerService/CreateProducer",
                    pb.ProducerRequest(request_id=1, producer_name="p", topic_name=wide),
                ),
                (
                    "/danube_admin.TopicAdmin/CreatePartitionedTopic",
                    admin_pb.PartitionedTopicRequest(base_name=at_limit, partitions=2),
                ),
                (
                    "/danube_admin.NamespaceAdmin/CreateNamespace",
                    admin_pb.NamespaceRequest(name="é" * 128),
                ),
            ]:
                channel = client if path.startswith("/danube.") else admin
                assert "bytes" in await _refused(channel, path, bytes(request)), path
            listed = await topics.list_namespace_topics(admin_pb.NamespaceRequest(name="default"))
            assert not [t for t in listed.topics if "é" in t]
            # the longest name that fits works end to end (its directory is created)
            await topics.create_topic(admin_pb.NewTopicRequest(name=at_limit))
            producer = await pb.ProducerServiceStub(client).create_producer(
                pb.ProducerRequest(request_id=2, producer_name="p", topic_name=at_limit)
            )
            assert producer.producer_id
            subscribe = pb.ConsumerRequest(
                request_id=3, topic_name=at_limit, consumer_name="c", subscription="é" * 128
            )
            path = "/danube.ConsumerService/Subscribe"
            assert "bytes" in await _refused(client, path, bytes(subscribe))
        finally:
            admin.close()
            client.close()

    run(scenario)


def _paths(bases: list[type]) -> list[str]:
    return [path for base in bases for path in base().__mapping__()]


CLIENT_PATHS = _paths(
    [*CLIENT_PORT_BASES, ext_pb.ConsumerExtBase, ext_pb.ProducerExtBase]  # type: ignore[list-item]
)
ADMIN_PATHS = _paths(
    [
        *ADMIN_PORT_BASES,
        admin_pb.ClusterAdminBase,
        admin_pb.SecurityAdminBase,
        ext_pb.PolicyAdminBase,
    ]  # type: ignore[list-item]
)


def test_every_method_refuses_malformed_bytes_cleanly(hostile_broker: BrokerProcess) -> None:
    """Each method of both ports, sent bytes no protobuf parser accepts (a group's start tag
    with nothing after it): INVALID_ARGUMENT, or UNIMPLEMENTED for a method the broker does not
    offer; never INTERNAL or UNKNOWN."""

    async def scenario() -> dict[str, str]:
        answers: dict[str, str] = {}
        for address, paths in [
            (hostile_broker.broker_addr, CLIENT_PATHS),
            (hostile_broker.admin_addr, ADMIN_PATHS),
        ]:
            channel = _channel(address)
            try:
                for path in paths:
                    try:
                        await _call(channel, path, b"\x0b")
                        answers[path] = "OK"
                    except GRPCError as error:
                        answers[path] = error.status.name
            finally:
                channel.close()
        return answers

    answers = run(scenario, timeout=120)
    assert len(answers) >= 60
    unclean = {p: s for p, s in answers.items() if s not in ("INVALID_ARGUMENT", "UNIMPLEMENTED")}
    assert not unclean
    assert sum(s == "INVALID_ARGUMENT" for s in answers.values()) >= 45


def test_the_broker_logged_no_traceback(hostile_broker: BrokerProcess) -> None:
    """The module's last word: every refusal above cost at most a line of log, none a
    traceback, and the broker still answers."""

    async def scenario() -> None:
        channel = _channel(hostile_broker.broker_addr)
        try:
            await pb.HealthCheckStub(channel).health_check(pb.HealthCheckRequest(client=0, id=1))
        finally:
            channel.close()

    run(scenario)
    text = hostile_broker.log_text()
    assert "Traceback" not in text
    assert "internal_error" not in text
    assert "Application error" not in text

"""The plain data path's hand codecs (`danube.runtime.wire_codec`) against betterproto: whatever
betterproto encodes decodes to the same values, so does any other valid encoding (fields in any
order, repeated, unknown ones mixed in), malformed bytes are refused, and a broker answers them
with INVALID_ARGUMENT."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from grpclib import GRPCError
from grpclib.client import Channel, UnaryStreamMethod, UnaryUnaryMethod
from grpclib.const import Status
from grpclib.encoding.base import CodecBase
from grpclib.encoding.proto import ProtoCodec
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.localcluster.broker_process import BrokerProcess
from danube.machines.node.requests import Acknowledgement, acknowledgement
from danube.machines.wal import records
from danube.proto import danube as pb
from danube.runtime.wire_codec import (
    AckRequestWire,
    NackRequestWire,
    RequestIdReply,
    StreamMessageWire,
    decode_ack,
    decode_nack,
)
from tests.kernels.upb_oracle import (
    STRINGS,
    every_client_accepts,
    msg_id_contents,
    mutated,
    simple_fields,
    upb_fields,
    varint,
)
from tests.support.aio import run, unique_topic
from tests.wal.test_records import messages

U64 = st.integers(0, 2**64 - 1)
TEXT = st.text(max_size=20)
Decoder = Callable[[bytes], Acknowledgement]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


@st.composite
def unknown_fields(draw: st.DrawFn, known: frozenset[int]) -> bytes:
    """One field of a number the message does not define, of any wire type."""
    number = draw(st.integers(1, 2**29 - 1).filter(lambda n: n not in known))
    wire = draw(st.sampled_from([0, 1, 2, 5]))
    tag = _varint(number << 3 | wire)
    if wire == 0:
        return tag + _varint(draw(U64))
    if wire == 1:
        return tag + draw(st.binary(min_size=8, max_size=8))
    if wire == 5:
        return tag + draw(st.binary(min_size=4, max_size=4))
    return _length_delimited(number, draw(st.binary(max_size=20)))


@st.composite
def reencoded(
    draw: st.DrawFn,
    chunks: list[bytes],
    msg_id: pb.MsgId,
    known: frozenset[int],
) -> bytes:
    """Another valid encoding of a message given as one encoded field per chunk (its msg_id
    apart): the fields shuffled, unknown ones mixed in, the msg_id's own fields shuffled and
    split over one or two occurrences (a parser merges them)."""
    msg_id_chunks = [
        bytes(pb.MsgId(**{name: getattr(msg_id, name)}))
        for name in ("producer_id", "topic_name", "broker_addr", "topic_offset")
    ]
    msg_id_chunks += draw(st.lists(unknown_fields(frozenset({1, 2, 3, 5})), max_size=2))
    msg_id_chunks = draw(st.permutations(msg_id_chunks))
    split = draw(st.integers(0, len(msg_id_chunks)))
    parts = (
        [msg_id_chunks[:split], msg_id_chunks[split:]] if draw(st.booleans()) else [msg_id_chunks]
    )
    fields = list(chunks)
    fields += [_length_delimited(2, b"".join(part)) for part in parts]
    fields += draw(st.lists(unknown_fields(known), max_size=3))
    return b"".join(draw(st.permutations(fields)))


@st.composite
def acks(draw: st.DrawFn, nack: bool) -> pb.AckRequest | pb.NackRequest:
    msg_id = pb.MsgId(
        producer_id=draw(U64),
        topic_name=draw(TEXT),
        broker_addr=draw(TEXT),
        topic_offset=draw(U64),
    )
    common = {
        "request_id": draw(U64),
        "msg_id": msg_id,
        "subscription_name": draw(TEXT),
    }
    if nack:
        return pb.NackRequest(
            **common, delay_ms=draw(st.none() | U64), reason=draw(st.none() | TEXT)
        )
    return pb.AckRequest(**common)


ACK_CASES = [
    pytest.param(False, decode_ack, pb.AckRequest, id="ack"),
    pytest.param(True, decode_nack, pb.NackRequest, id="nack"),
]


@pytest.mark.parametrize(("nack", "decode", "kind"), ACK_CASES)
@settings(max_examples=200)
@given(data=st.data())
def test_acks_decode_as_betterproto_parses_them(
    nack: bool, decode: Decoder, kind: type[pb.AckRequest], data: st.DataObject
) -> None:
    wire = bytes(data.draw(acks(nack)))
    assert decode(wire) == acknowledgement(kind().parse(wire))


@pytest.mark.parametrize(("nack", "decode", "kind"), ACK_CASES)
@settings(max_examples=200)
@given(data=st.data())
def test_acks_decode_from_any_valid_encoding(
    nack: bool, decode: Decoder, kind: type[pb.AckRequest], data: st.DataObject
) -> None:
    request = data.draw(acks(nack))
    names = ["request_id", "subscription_name"] + (["delay_ms", "reason"] if nack else [])
    chunks = [bytes(kind(**{name: getattr(request, name)})) for name in names]
    known = frozenset({1, 2, 3, 4, 5} if nack else {1, 2, 3})
    wire = data.draw(reencoded(chunks, request.msg_id, known))
    # an earlier occurrence of a set scalar field is overridden by the later one
    stale = [
        bytes(kind(**{name: data.draw(values)}))
        for name, values in (("request_id", U64), ("subscription_name", TEXT))
        if getattr(request, name)
    ]
    assert decode(b"".join(stale) + wire) == decode(bytes(request))


@settings(max_examples=200)
@given(data=st.data())
def test_stream_messages_decode_from_any_valid_encoding(data: st.DataObject) -> None:
    message = data.draw(messages())
    names = [
        "request_id", "payload", "publish_time", "producer_name", "subscription_name",
        "schema_id", "schema_version", "routing_key",
    ]  # fmt: skip
    chunks = [bytes(pb.StreamMessage(**{name: getattr(message, name)})) for name in names]
    chunks += [bytes(pb.StreamMessage(attributes={k: v})) for k, v in message.attributes.items()]
    known = frozenset(range(1, 11))
    wire = data.draw(reencoded(chunks, message.msg_id, known))
    assert StreamMessageWire.FromString(wire) == StreamMessageWire.FromString(bytes(message))


@given(U64)
def test_replies_encode_as_betterproto(request_id: int) -> None:
    wire = RequestIdReply(request_id).SerializeToString()
    for kind in (pb.MessageResponse, pb.AckResponse, pb.NackResponse):
        assert wire == bytes(kind(request_id=request_id))


def test_a_request_id_past_64_bits_is_refused_not_reencoded() -> None:
    """A 10-byte varint can carry 70 bits; prost and Go refuse one whose last byte is above 1,
    and the reply re-encoded it unmasked (issue 20): such a request is now refused."""
    too_long = b"\x08" + b"\xff" * 9 + b"\x7f"
    for decode in (decode_ack, decode_nack, StreamMessageWire.FromString):
        with pytest.raises(records.RecordError, match="10th byte is above 1"):
            decode(too_long)
    largest = decode_ack(b"\x08" + b"\xff" * 9 + b"\x01").request_id
    assert RequestIdReply(largest).SerializeToString() == bytes(pb.AckResponse(request_id=largest))


def _ack_fields(nack: bool) -> st.SearchStrategy[bytes]:
    """Fields of an AckRequest (a NackRequest adds 4 and 5), and any other field."""
    integers = st.sampled_from([1, 4] if nack else [1])
    strings = st.sampled_from([3, 5] if nack else [3])
    return st.one_of(
        st.builds(lambda n, v: varint(n << 3) + varint(v), integers, st.integers(0, 2**64 - 1)),
        st.builds(lambda n, t: varint(n << 3 | 2) + varint(len(t)) + t, strings, STRINGS),
        st.builds(lambda m: b"\x12" + varint(len(m)) + m, msg_id_contents()),
        simple_fields(),
    )


@pytest.mark.parametrize(
    ("decode", "name"),
    [
        pytest.param(decode_ack, "AckRequest", id="ack"),
        pytest.param(decode_nack, "NackRequest", id="nack"),
    ],
)
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_acks_accept_exactly_what_every_client_parses(
    decode: Decoder, name: str, data: st.DataObject
) -> None:
    """Against google.protobuf's own parser (upb), narrowed where Danube's other clients'
    parsers are stricter (spec/record-validity.md)."""
    wire = data.draw(mutated(_ack_fields(name == "NackRequest")) | st.binary(max_size=30))
    try:
        decoded = decode(wire)
    except records.RecordError:
        decoded = None
    assert (decoded is not None) == every_client_accepts(name, wire)
    if decoded is not None:
        fields = upb_fields(name, wire)
        assert fields is not None
        msg_id = fields["msg_id"] or {}
        expected = Acknowledgement(
            fields["request_id"],
            fields["msg_id"] is not None,
            msg_id.get("topic_name", ""),
            msg_id.get("topic_offset", 0),
            fields["subscription_name"],
            fields.get("delay_ms"),
            fields.get("reason") if name == "NackRequest" else None,
        )
        assert decoded == expected


STRUCTURE = [
    pytest.param(b"\x08", id="truncated-varint"),
    pytest.param(b"\x08\x80", id="truncated-varint-continuation"),
    pytest.param(b"\x08" + b"\xff" * 10 + b"\x01", id="varint-over-10-bytes"),
    pytest.param(b"\x1a\x05ab", id="length-past-end"),
    pytest.param(b"\x09\x01\x02", id="fixed64-past-end"),
    pytest.param(b"\x0d\x01", id="fixed32-past-end"),
    pytest.param(b"\x0b", id="group-start"),
    pytest.param(b"\x0c", id="group-end"),
    pytest.param(b"\x0e\x00", id="wire-type-6"),
    pytest.param(b"\x12\x01\x08", id="msg-id-truncated"),
    pytest.param(b"\x12\x03\x12\x01\xff", id="topic-not-utf8"),
    pytest.param(b"\x12\x03\x1a\x01\xff", id="broker-addr-not-utf8"),
    pytest.param(b"\x80\x80\x80\x80\x10\x01", id="field-2**29"),
    pytest.param(b"\x08" + b"\xff" * 9 + b"\x02", id="varint-past-64-bits"),
    pytest.param(b"\x0a\x00", id="request-id-as-bytes"),
    pytest.param(b"\x12\x02\x2a\x00", id="msg-id-offset-as-bytes"),
    pytest.param(b"\x5b\x5c", id="empty-group"),
    pytest.param(b"\x1a\x81\x80\x80\x80\x80\x00x", id="6-byte-length"),
]
DECODERS = [
    pytest.param(decode_ack, id="ack"),
    pytest.param(decode_nack, id="nack"),
    pytest.param(StreamMessageWire.FromString, id="stream-message"),
]


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize("data", STRUCTURE)
def test_malformed_bytes_are_refused(decode: Callable[[bytes], object], data: bytes) -> None:
    with pytest.raises(records.RecordError):
        decode(data)


@pytest.mark.parametrize(
    ("decode", "data"),
    [
        pytest.param(decode_ack, b"\x1a\x01\xff", id="ack-subscription"),
        pytest.param(decode_nack, b"\x1a\x01\xff", id="nack-subscription"),
        pytest.param(StreamMessageWire.FromString, b"\x2a\x01\xff", id="producer-name"),
        pytest.param(StreamMessageWire.FromString, b"\x52\x01\xff", id="routing-key"),
    ],
)
def test_string_fields_must_be_utf8(decode: Callable[[bytes], object], data: bytes) -> None:
    with pytest.raises(records.RecordError):
        decode(data)


def test_a_nack_reason_must_be_text_but_an_ack_skips_field_five() -> None:
    reason = b"\x12\x00\x2a\x01\xff"
    assert decode_ack(reason) == Acknowledgement(has_msg_id=True)
    with pytest.raises(records.RecordError):
        decode_nack(reason)


@pytest.mark.parametrize("decode", DECODERS)
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_record_error(
    decode: Callable[[bytes], object], data: bytes
) -> None:
    with contextlib.suppress(records.RecordError):
        decode(data)


# -- against a broker -------------------------------------------------------------------------


class _RawCodec(CodecBase):
    __content_subtype__ = "proto"

    def encode(self, message: bytes, message_type: object) -> bytes:
        return message

    def decode(self, data: bytes, message_type: object) -> bytes:
        return data


def _raw_channel(broker: BrokerProcess) -> Channel:
    host, _, port = broker.broker_addr.rpartition(":")
    return Channel(host, int(port), codec=_RawCodec())


def _call(channel: Channel, path: str) -> UnaryUnaryMethod[bytes, bytes]:
    return UnaryUnaryMethod(channel, path, bytes, bytes)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("/danube.ProducerService/SendMessage", b"\x2a\x01\xff"),
        ("/danube.ProducerService/SendMessage", b"\x12\x05ab"),
        ("/danube.ConsumerService/Ack", b"\x08\x80"),
        ("/danube.ConsumerService/Nack", b"\x12\x00\x2a\x01\xff"),
    ],
)
def test_a_broker_refuses_malformed_requests(broker: BrokerProcess, path: str, data: bytes) -> None:
    async def scenario() -> None:
        channel = _raw_channel(broker)
        try:
            with pytest.raises(GRPCError) as refused:
                await _call(channel, path)(data)
            assert refused.value.status is Status.INVALID_ARGUMENT
            assert "undecodable request" in (refused.value.message or "")
        finally:
            channel.close()

    run(scenario)


@pytest.mark.slow
def test_a_broker_refuses_a_million_attributes_naming_the_limit(broker: BrokerProcess) -> None:
    """Decoding them cost the event loop 2.5-4.6 s (issue 20); the decoder stops at 1,000."""
    entry = _length_delimited(7, _length_delimited(1, b"k") + _length_delimited(2, b"v"))
    message = bytes(pb.StreamMessage(msg_id=pb.MsgId(topic_name="/default/t"))) + entry * 10**6

    async def scenario() -> None:
        channel = _raw_channel(broker)
        try:
            with pytest.raises(GRPCError) as refused:
                await _call(channel, "/danube.ProducerService/SendMessage")(message)
            assert refused.value.status is Status.INVALID_ARGUMENT
            assert "more than 1000 attributes, the limit" in (refused.value.message or "")
        finally:
            channel.close()

    run(scenario)


async def _producer_and_consumer(
    channel: Channel, topic: str
) -> tuple[pb.ProducerResponse, pb.ConsumerResponse]:
    """A producer "p" and a consumer "c" of subscription "s" on `topic`, over raw calls."""
    producer = pb.ProducerRequest(request_id=1, producer_name="p", topic_name=topic)
    created = pb.ProducerResponse().parse(
        await _call(channel, "/danube.ProducerService/CreateProducer")(bytes(producer))
    )
    subscribe = pb.ConsumerRequest(
        request_id=2, topic_name=topic, consumer_name="c", subscription="s"
    )
    subscribed = pb.ConsumerResponse().parse(
        await _call(channel, "/danube.ConsumerService/Subscribe")(bytes(subscribe))
    )
    return created, subscribed


@pytest.mark.slow
def test_a_broker_takes_any_valid_encoding_and_delivers_the_stamped_record(
    broker: BrokerProcess,
) -> None:
    """Non-reliable: the record goes out stamped with its sequence number, in the canonical
    encoding; an unknown field in an Ack is skipped, whatever its bytes."""
    topic = unique_topic("codec")

    async def scenario() -> None:
        channel = _raw_channel(broker)
        try:
            created, subscribed = await _producer_and_consumer(channel, topic)
            receive = UnaryStreamMethod(
                channel, "/danube.ConsumerService/ReceiveMessages", bytes, bytes
            )
            async with receive.open() as stream:
                request = pb.ReceiveRequest(request_id=3, consumer_id=subscribed.consumer_id)
                await stream.send_message(bytes(request), end=True)
                await stream.recv_initial_metadata()
                msg_id = pb.MsgId(producer_id=created.producer_id, topic_name=topic)
                sent = []
                for request_id in (11, 12):
                    unknown = _length_delimited(99, b"\xff\xfe")
                    # fields out of order, an unknown one first
                    wire = unknown + bytes(
                        pb.StreamMessage(payload=b"hello", request_id=request_id)
                    )
                    wire += _length_delimited(2, bytes(msg_id))
                    reply = await _call(channel, "/danube.ProducerService/SendMessage")(wire)
                    assert pb.MessageResponse().parse(reply).request_id == request_id
                    sent.append(records.decode(wire))
                offsets = []
                for expected in sent:
                    delivered = await stream.recv_message()
                    assert delivered is not None
                    record = records.decode(delivered)
                    assert delivered == records.encode(record), "the canonical encoding"
                    expected.topic_offset = record.topic_offset
                    assert record == expected
                    offsets.append(record.topic_offset)
                assert offsets[1] == offsets[0] + 1, "numbered by the publish sequence"
                ack = pb.AckRequest(
                    request_id=21,
                    msg_id=pb.MsgId(topic_name=topic, topic_offset=offsets[1]),
                    subscription_name="s",
                )
                wire = bytes(ack) + b"\x2a\x01\xff"
                reply = await _call(channel, "/danube.ConsumerService/Ack")(wire)
                assert pb.AckResponse().parse(reply).request_id == 21
                await stream.cancel()
        finally:
            channel.close()

    run(scenario)


@pytest.mark.slow
def test_a_backlog_goes_out_whole_and_in_order(broker: BrokerProcess) -> None:
    """A backlog (non-reliable: queued for the subscribed consumer before its stream opens)
    leaves in batches of many messages per HTTP/2 send, more than one flow-control window's
    worth: each still arrives as its own message, in order."""
    topic = unique_topic("backlog")
    count, payload_size = 150, 1000

    async def scenario() -> None:
        channel = _raw_channel(broker)
        try:
            created, subscribed = await _producer_and_consumer(channel, topic)
            send = _call(channel, "/danube.ProducerService/SendMessage")
            msg_id = pb.MsgId(producer_id=created.producer_id, topic_name=topic)
            for index in range(count):
                payload = index.to_bytes(4, "big") * (payload_size // 4)
                await send(bytes(pb.StreamMessage(msg_id=msg_id, payload=payload)))
            receive = UnaryStreamMethod(
                channel, "/danube.ConsumerService/ReceiveMessages", bytes, bytes
            )
            async with receive.open() as stream:
                request = pb.ReceiveRequest(request_id=3, consumer_id=subscribed.consumer_id)
                await stream.send_message(bytes(request), end=True)
                first = None
                for index in range(count):
                    delivered = await stream.recv_message()
                    assert delivered is not None
                    record = records.decode(delivered)
                    first = record.topic_offset if first is None else first
                    assert record.topic_offset == first + index
                    assert record.payload == index.to_bytes(4, "big") * (payload_size // 4)
                await stream.cancel()
        finally:
            channel.close()

    run(scenario)


def test_the_wire_types_are_what_grpclib_calls() -> None:
    """grpclib's ProtoCodec decodes with `FromString` and encodes with `SerializeToString`
    after an isinstance check against the handler's reply type."""
    codec = ProtoCodec()
    assert codec.decode(b"\x08\x07", AckRequestWire).request_id == 7
    assert codec.decode(b"\x08\x07\x20\x05", NackRequestWire).delay_ms == 5
    assert codec.encode(RequestIdReply(7), RequestIdReply) == b"\x08\x07"

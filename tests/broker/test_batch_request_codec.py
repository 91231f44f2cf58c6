"""The batched path's hand decoders (issue 23, points 1–2, round 3) keep `request_check`'s
guarantees: for any bytes, `decode_publish_batch` / `decode_ack_batch` give what
`request_check.check` + betterproto give, or refuse where `check` refuses. Checked with
hypothesis on arbitrary bytes and on structured encodings (known and unknown fields, every
wire type, padded varints, repeated fields, packed and unpacked offsets) cut and flipped."""

from __future__ import annotations

from typing import Any

import betterproto
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube.proto import danube_ext as ext_pb
from danube.runtime import request_check
from danube.runtime.batch_request_codec import (
    AckBatchRequestWire,
    PublishBatchWire,
    decode_ack_batch,
    decode_publish_batch,
)
from danube.runtime.grpc_util import decode_request
from danube.runtime.request_check import RequestRejected

REFUSED = "refused"


def _by_betterproto(data: bytes, cls: type) -> Any:
    """What the broker did before: `check`, then betterproto, then `narrow` if asked."""
    try:
        wide = request_check.check(data, cls)
    except RequestRejected:
        return REFUSED
    message = cls.FromString(data)
    if wide:
        request_check.narrow(message)
    if cls is ext_pb.PublishBatch:
        return (message.producer_id, message.topic_name, message.sequence, message.frame)
    # betterproto replaces the list with each packed occurrence of `offsets` (an empty one
    # too) where protobuf concatenates them all: the offsets are betterproto's decode of each
    # occurrence alone, concatenated, which is protobuf's meaning (test below).
    offsets = [
        int(offset)
        for parsed in betterproto.parse_fields(data)
        if parsed.number == 4
        for offset in cls.FromString(parsed.raw).offsets
    ]
    return (message.request_id, message.topic_name, message.subscription_name, offsets)


def _by_hand(data: bytes, cls: type) -> Any:
    try:
        if cls is ext_pb.PublishBatch:
            p = decode_publish_batch(data)
            return (p.producer_id, p.topic_name, p.sequence, p.frame)
        a = decode_ack_batch(data)
        return (a.request_id, a.topic_name, a.subscription_name, a.offsets)
    except RequestRejected:
        return REFUSED


def _varint(value: int, padding: int = 0) -> bytes:
    """`value` as a varint, with `padding` extra zero groups (non-canonical, still valid
    while the whole stays within 10 bytes)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            break
        out.append(byte | 0x80)
    if not padding:
        return bytes(out + bytes([byte]))
    out.append(byte | 0x80)
    out += b"\x80" * (padding - 1) + b"\x00"
    return bytes(out)


_NUMBERS = st.one_of(
    st.sampled_from([1, 2, 3, 4]),
    st.sampled_from([0, 5, 15, 16, 2047, (1 << 29) - 1, 1 << 29]),
    st.integers(min_value=0, max_value=(1 << 32)),
)
_VALUES = st.one_of(
    st.integers(min_value=0, max_value=(1 << 64) - 1),
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=(1 << 64) - 4, max_value=(1 << 64) + 4),
)
_PAYLOADS = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20).map(str.encode),
    st.lists(_VALUES.filter(lambda v: v < 1 << 64), max_size=12).map(
        lambda values: b"".join(_varint(v) for v in values)
    ),
)


@st.composite
def _field(draw: st.DrawFn) -> bytes:
    number = draw(_NUMBERS)
    wire = draw(st.sampled_from([0, 0, 2, 2, 2, 1, 5, 3, 4, 6, 7]))
    tag = _varint((number << 3) | wire, draw(st.sampled_from([0, 0, 0, 1, 5, 6])))
    if wire == 0:
        return tag + _varint(draw(_VALUES) % (1 << 70), draw(st.sampled_from([0, 0, 1, 3])))
    if wire == 2:
        payload = draw(_PAYLOADS)
        return tag + _varint(len(payload), draw(st.sampled_from([0, 0, 2]))) + payload
    if wire in (1, 5):
        return tag + draw(st.binary(min_size=4 if wire == 5 else 8, max_size=8))
    return tag + draw(st.binary(max_size=3))


@st.composite
def _message(draw: st.DrawFn) -> bytes:
    data = b"".join(draw(st.lists(_field(), max_size=10)))
    cut = draw(st.sampled_from(["none", "none", "none", "truncate", "flip", "append"]))
    if cut == "truncate" and data:
        data = data[: draw(st.integers(min_value=0, max_value=len(data) - 1))]
    elif cut == "flip" and data:
        at = draw(st.integers(min_value=0, max_value=len(data) - 1))
        data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
    elif cut == "append":
        data += draw(st.binary(max_size=6))
    return data


_CLASSES = st.sampled_from([ext_pb.PublishBatch, ext_pb.AckBatchRequest])


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(_CLASSES, _message())
def test_structured_bytes_decode_as_betterproto_or_are_refused_alike(
    cls: type, data: bytes
) -> None:
    assert _by_hand(data, cls) == _by_betterproto(data, cls)


@settings(max_examples=1000)
@given(_CLASSES, st.binary(max_size=64))
def test_arbitrary_bytes_decode_as_betterproto_or_are_refused_alike(cls: type, data: bytes) -> None:
    assert _by_hand(data, cls) == _by_betterproto(data, cls)


U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)


@given(U64, st.text(max_size=50), U64, st.binary(max_size=2000))
def test_a_client_publish_batch_decodes_to_its_fields(
    producer_id: int, topic: str, sequence: int, frame: bytes
) -> None:
    wire = bytes(ext_pb.PublishBatch(producer_id, topic, sequence, frame))
    assert _by_hand(wire, ext_pb.PublishBatch) == (producer_id, topic, sequence, frame)


@given(U64, st.text(max_size=50), st.text(max_size=50), st.lists(U64, max_size=300))
def test_a_client_ack_batch_decodes_to_its_fields(
    request_id: int, topic: str, subscription: str, offsets: list[int]
) -> None:
    wire = bytes(ext_pb.AckBatchRequest(request_id, topic, subscription, offsets))
    assert _by_hand(wire, ext_pb.AckBatchRequest) == (request_id, topic, subscription, offsets)


def test_offsets_in_several_packed_chunks_are_all_acknowledged() -> None:
    """Protobuf concatenates every occurrence of a repeated field, packed or not; betterproto
    kept only the last packed chunk (and an empty chunk emptied the list), so the broker
    acknowledged only part of such a batch and redelivered the rest."""
    chunks = [
        _varint(4 << 3) + _varint(7),
        _varint(4 << 3 | 2) + _varint(2) + b"\x01\x02",
        _varint(4 << 3 | 2) + _varint(0),
        _varint(4 << 3 | 2) + _varint(2) + _varint(300),
    ]
    data = b"".join(chunks)
    assert decode_ack_batch(data).offsets == [7, 1, 2, 300]
    assert ext_pb.AckBatchRequest.FromString(data).offsets == [300]  # betterproto's


def test_the_limits_are_request_checks() -> None:
    """`MAX_FIELDS` fields (unknown ones too) and `MAX_PACKED` offsets, then one more."""
    unknown = _varint(9 << 3) + _varint(1)
    at_limit = unknown * request_check.MAX_FIELDS
    assert _by_hand(at_limit, ext_pb.PublishBatch) == _by_betterproto(at_limit, ext_pb.PublishBatch)
    assert _by_hand(at_limit + unknown, ext_pb.PublishBatch) == REFUSED
    offsets = b"\x01" * request_check.MAX_PACKED
    packed = _varint(4 << 3 | 2) + _varint(len(offsets)) + offsets
    assert _by_hand(packed, ext_pb.AckBatchRequest)[3] == [1] * request_check.MAX_PACKED
    assert _by_hand(packed + _varint(4 << 3) + b"\x01", ext_pb.AckBatchRequest) == REFUSED
    assert _by_betterproto(packed + _varint(4 << 3) + b"\x01", ext_pb.AckBatchRequest) == REFUSED


@pytest.mark.parametrize(
    ("wire_type", "data"),
    [
        (PublishBatchWire, b"\x12\x02\xff\xfe"),  # topic_name not UTF-8
        (PublishBatchWire, b"\x22\x05ab"),  # frame runs past the end
        (AckBatchRequestWire, b"\x22\x02\x80\x80"),  # a packed offset never ends
        (AckBatchRequestWire, b"\x0b"),  # a group (wire type 3)
    ],
)
def test_a_refusal_is_invalid_argument_not_an_internal_error(wire_type: type, data: bytes) -> None:
    from grpclib.const import Status
    from grpclib.encoding.proto import ProtoCodec
    from grpclib.exceptions import GRPCError

    with pytest.raises(GRPCError) as refused:
        decode_request(data, wire_type, ProtoCodec())
    assert refused.value.status is Status.INVALID_ARGUMENT
    assert "undecodable request" in str(refused.value.message)

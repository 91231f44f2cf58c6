"""The wire codec of replication (`danube.runtime.replication_codec`): every well-formed message
survives encoding to protobuf bytes and back unchanged, and anything malformed is refused with
`ReplicaCodecError`, on both sides and from raw bytes, never another exception."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.replication.messages import (
    FollowerAnswer,
    Mismatch,
    Replicate,
    Replicated,
    StaleEpoch,
)
from danube.proto import danube_ext as ext_pb
from danube.runtime import replication_codec as codec
from danube.runtime.replication_codec import MAX_OFFSET, ReplicaCodecError

LIMIT = 4096
topics = st.text(min_size=1, max_size=40)
counts = st.integers(0, MAX_OFFSET)


@st.composite
def replicates(draw: st.DrawFn) -> Replicate:
    record_count = draw(st.integers(0, 1 << 20))
    prev_end = draw(st.integers(0, MAX_OFFSET - record_count))
    frames = b"" if record_count == 0 else draw(st.binary(min_size=1, max_size=LIMIT))
    return Replicate(draw(topics), draw(counts), prev_end, frames, record_count, draw(counts))


answers = st.one_of(
    st.builds(Replicated, topics, counts, counts),
    st.builds(Mismatch, topics, counts, counts),
    st.builds(StaleEpoch, topics, counts),
)


@given(replicates())
def test_replicate_round_trip(msg: Replicate) -> None:
    """The hand codec writes exactly betterproto's bytes, and both read them back."""
    body = codec.request_bytes(msg, LIMIT)
    assert body == bytes(codec.encode_replicate(msg, LIMIT))
    assert codec.request_from_bytes(body, LIMIT) == msg
    assert codec.decode_replicate(ext_pb.ReplicaRequest().parse(body), LIMIT) == msg


@given(answers)
def test_answer_round_trip(answer: FollowerAnswer) -> None:
    body = codec.answer_bytes(answer)
    assert body == bytes(codec.encode_answer(answer))
    assert codec.answer_from_bytes(body) == answer
    assert codec.decode_answer(ext_pb.ReplicaAnswer().parse(body)) == answer


@given(replicates(), st.randoms())
def test_fields_in_any_order_and_repeated_read_as_protobuf_reads_them(
    msg: Replicate, rng: Any
) -> None:
    """Any order; a repeated field's last value wins; unknown fields are skipped."""
    fields = _split(codec.request_bytes(msg, LIMIT))
    rng.shuffle(fields)
    # An earlier value for every field the message sets (a zero value is not on the wire).
    stale = b"".join(f[:1] + (b"\x03old" if f[0] & 7 == 2 else b"\x07") for f in fields)
    unknown = b"\x78\x05"  # field 15, varint 5
    body = stale + unknown + b"".join(fields)
    assert codec.request_from_bytes(body, LIMIT) == msg
    assert codec.decode_replicate(ext_pb.ReplicaRequest().parse(body), LIMIT) == msg


@given(topics, counts, counts)
def test_epoch_end_round_trip(topic: str, epoch: int, end: int) -> None:
    request = ext_pb.EpochEndRequest().parse(bytes(codec.encode_epoch_end_request(topic, epoch)))
    assert codec.decode_epoch_end_request(request) == (topic, epoch)
    response = ext_pb.EpochEndResponse().parse(bytes(codec.encode_epoch_end_response(end, epoch)))
    assert codec.decode_epoch_end_response(response) == (end, epoch)


MALFORMED = [
    (Replicate("t", -1, 0, b"", 0, 0), "epoch -1"),
    (Replicate("t", 0, -5, b"x", 1, 0), "prev_end -5"),
    (Replicate("t", 0, 0, b"x", -1, 0), "record_count -1"),
    (Replicate("t", 0, 0, b"", 0, -1), "commit -1"),
    (Replicate("t", 0, MAX_OFFSET, b"x", 1, 0), "exceeds 2^63-1"),
    (Replicate("t", 0, 0, b"", 3, 0), "frames must be empty exactly when record_count is 0"),
    (Replicate("t", 0, 0, b"x", 0, 0), "frames must be empty exactly when record_count is 0"),
    (Replicate("t", 0, 0, b"x" * (LIMIT + 1), 1, 0), f"exceed the limit of {LIMIT} bytes"),
    (Replicate("", 0, 0, b"", 0, 0), "topic must be a non-empty string"),
    (Replicate("t" * 300, 0, 0, b"", 0, 0), "topic longer than 255 bytes"),
    (Replicate("t", True, 0, b"", 0, 0), "epoch must be an integer"),
]


@pytest.mark.parametrize(("msg", "reason"), MALFORMED)
def test_malformed_replicate_is_refused_on_both_sides(msg: Replicate, reason: str) -> None:
    with pytest.raises(ReplicaCodecError, match=reason.replace("^", r"\^")):
        codec.encode_replicate(msg, LIMIT)
    if isinstance(msg.epoch, bool) or min(msg.epoch, msg.prev_end, msg.record_count) < 0:
        return  # uint64 on the wire: a negative value cannot be written at all
    if msg.commit < 0:
        return
    wire = ext_pb.ReplicaRequest(
        topic=msg.topic,
        epoch=msg.epoch,
        prev_end=msg.prev_end,
        record_count=msg.record_count,
        commit=msg.commit,
        frames=msg.frames,
    )
    with pytest.raises(ReplicaCodecError, match=reason.replace("^", r"\^")):
        codec.request_from_bytes(bytes(wire), LIMIT)


def test_values_beyond_63_bits_on_the_wire_are_refused() -> None:
    wire = ext_pb.ReplicaRequest(topic="t", epoch=1 << 63)
    with pytest.raises(ReplicaCodecError, match=r"epoch .* is outside"):
        codec.request_from_bytes(bytes(wire))
    answer = ext_pb.ReplicaAnswer(
        kind=ext_pb.ReplicaAnswerKind.REPLICATED, topic="t", end=(1 << 64) - 1
    )
    with pytest.raises(ReplicaCodecError, match=r"end .* is outside"):
        codec.answer_from_bytes(bytes(answer))


@pytest.mark.parametrize("kind", [0, 4, 99, 0xFFFF_FFFF])
def test_unknown_answer_kind_is_refused(kind: int) -> None:
    body = b"\x08" + _varint(kind) + bytes(ext_pb.ReplicaAnswer(topic="t", end=3))
    with pytest.raises(ReplicaCodecError, match="unknown answer kind"):
        codec.answer_from_bytes(body)


def test_encoding_refuses_what_is_not_an_answer() -> None:
    with pytest.raises(ReplicaCodecError, match="not a follower answer"):
        codec.encode_answer(Replicate("t", 0, 0, b"", 0, 0))  # type: ignore[arg-type]


def test_oversize_request_bytes_are_refused_before_parsing() -> None:
    with pytest.raises(ReplicaCodecError, match="exceeds the limit"):
        codec.request_from_bytes(b"\x00" * (codec.request_limit(LIMIT) + 1), LIMIT)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_codec_error(body: bytes) -> None:
    for decode in (codec.answer_from_bytes, codec.request_from_bytes):
        with contextlib.suppress(ReplicaCodecError):
            decode(body)


@pytest.mark.parametrize("bad", ["", "a\nb", "é", "x" * 257, 7])
def test_broker_ids_must_fit_a_header(bad: object) -> None:
    with pytest.raises(ReplicaCodecError):
        codec.check_broker_id(bad)
    assert codec.check_broker_id("broker-7") == "broker-7"


def _split(body: bytes) -> list[bytes]:
    """The encoded fields of a message, each with its tag."""
    out, pos = [], 0
    while pos < len(body):
        start = pos
        tag, pos = _read_varint(body, pos)
        if tag & 7 == 2:
            size, pos = _read_varint(body, pos)
            pos += size
        else:
            _, pos = _read_varint(body, pos)
        out.append(body[start:pos])
    return out


def _read_varint(body: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = body[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)

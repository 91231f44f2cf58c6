"""The batch kernels against their oracle: the WAL's frame encoder and the record codec.

A stamped frame must be exactly `encode_frame(base, publish, [record + msg_id field])`, and
the check must refuse every record a protobuf parser (betterproto here, prost in Danube's
clients) would refuse or that names its own msg_id; tests/kernels/test_record_validity.py
checks it against google.protobuf (upb) and the kernel's twin."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.kernels import scan_frames
from danube.machines.wal import format, records
from danube.machines.wal.batches import PackedRecords, check_batch, stamp
from danube.proto import danube as pb
from danube.values.errors import DanubeError, ErrorCode

pytestmark = pytest.mark.usefixtures("kernel_build")
"""Every test over both builds of the kernels (`conftest.kernel_build`)."""

texts = st.text(max_size=12)
record_values = st.builds(
    records.Record,
    request_id=st.integers(0, 2**64 - 1),
    payload=st.binary(max_size=300),
    publish_time=st.integers(0, 2**64 - 1),
    producer_name=texts,
    attributes=st.dictionaries(texts, texts, max_size=3),
    schema_id=st.none() | st.integers(0, 2**64 - 1),
    schema_version=st.none() | st.integers(0, 2**32 - 1),
    routing_key=st.none() | texts,
    has_msg_id=st.just(False),
)


def _msg_id_field(producer_id: int, topic: str, broker: str, offset: int) -> bytes:
    # a Record holding only a msg_id encodes as exactly its msg_id field
    return records.encode(
        records.Record(
            producer_id=producer_id, topic_name=topic, broker_addr=broker, topic_offset=offset
        )
    )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(record_values, min_size=1, max_size=20),
    st.integers(0, 2**62),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**64 - 1),
    texts,
)
def test_stamping_equals_the_frame_encoder(
    values: list[records.Record], base: int, publish: int, producer: int, broker: str
) -> None:
    encoded = [records.encode(value) for value in values]
    batch = check_batch(format.encode_frame(0, 0, encoded))
    assert batch.count == len(values)
    assert batch.payload_sizes.tolist() == [len(v.payload) for v in values]
    packed = stamp(batch, base, publish, producer, "/default/t", broker)
    expected = [
        record + _msg_id_field(producer, "/default/t", broker, base + i)
        for i, record in enumerate(encoded)
    ]
    assert packed.frame == format.encode_frame(base, publish, expected)
    assert list(packed) == expected
    for i, value in enumerate(values):
        parsed = pb.StreamMessage().parse(packed[i])
        assert parsed.payload == value.payload
        assert parsed.msg_id.topic_offset == base + i
        assert parsed.msg_id.producer_id == producer
        assert parsed.msg_id.broker_addr == broker
        assert dict(parsed.attributes) == value.attributes


def test_a_stamped_frame_continues_the_topics_offsets() -> None:
    batch = check_batch(format.encode_frame(0, 0, [b"\x1a\x01a", b"\x1a\x01b"]))
    packed = stamp(batch, 41, 5, 1, "/default/t", "b")
    scan = scan_frames(packed.frame, 0, len(packed.frame), 41)
    assert scan.valid_end == len(packed.frame) and scan.next_offset == 43
    assert isinstance(packed, PackedRecords) and packed[-1] == packed[1]
    with pytest.raises(IndexError):
        packed[2]


def _refusal(frame: bytes) -> str:
    with pytest.raises(DanubeError) as caught:
        check_batch(frame)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    return caught.value.message


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (b"\x12\x00", "carries a msg_id"),
        (b"\x1a\x05ab", "not a valid StreamMessage"),  # payload runs past the record
        (b"\x18\x01", "not a valid StreamMessage"),  # payload (3) sent as a varint
        (b"\x2a\x02\xff\xfe", "not a valid StreamMessage"),  # producer_name not UTF-8
        (b"\x3a\x04\x0a\x02\xc3\x28", "not a valid StreamMessage"),  # attribute key not UTF-8
        (b"\x08", "not a valid StreamMessage"),  # a varint cut short
        (b"\x00\x01", "not a valid StreamMessage"),  # field number 0
        (b"\x0b", "not a valid StreamMessage"),  # a group (wire type 3)
        # issue 20: field 2**29 (a 5-byte tag above 2**32-1) was acknowledged and stored
        (b"\x1a\x01x\x80\x80\x80\x80\x10\x01", "not a valid StreamMessage"),
        # issue 20: a 10-byte varint whose last byte is above 1 (past 64 bits)
        (b"\x1a\x01x\xa0\x06" + b"\xff" * 9 + b"\x02", "not a valid StreamMessage"),
        (b"\x1a\x81\x80\x80\x80\x80\x00x", "not a valid StreamMessage"),  # a 6-byte length
        (b"\x5b\x5c", "not a valid StreamMessage"),  # an empty group, which upb would skip
        (b"\x3a\x05\x0a\x01a\x18\x01", "not a valid StreamMessage"),  # entry with a field 3
        (b"\x3a\x00" * 1001, "more than 1000 attributes"),  # past the limit
    ],
)
def test_records_no_parser_would_take_are_refused(record: bytes, reason: str) -> None:
    good = records.encode(records.Record(payload=b"x", has_msg_id=False))
    message = _refusal(format.encode_frame(0, 0, [good, record]))
    assert reason in message and "message 1 " in message


def test_unknown_fields_are_kept() -> None:
    unknown = b"\x1a\x01x" + b"\xa0\x06\x07" + b"\xad\x06\x01\x02\x03\x04"  # fields 100, 101
    batch = check_batch(format.encode_frame(0, 0, [unknown]))
    assert stamp(batch, 0, 0, 1, "/default/t", "b")[0].startswith(unknown)


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"short", "shorter than a frame header"),
        (format.encode_frame(3, 0, [b"\x1a\x00"]), "base offset is 3"),
        (format.encode_frame(0, 0, [b"\x1a\x00"])[:-1], "length field says"),
        (format.encode_frame(0, 0, [b"\x1a\x00"]) * 2, "length field says"),
        (bytes([0]) + format.encode_frame(0, 0, [b"\x1a\x00"])[1:], "CRC32C mismatch"),
    ],
)
def test_frames_that_do_not_verify_say_why(frame: bytes, reason: str) -> None:
    assert reason in _refusal(frame)

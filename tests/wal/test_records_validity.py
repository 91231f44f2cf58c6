"""The record codec (`danube.machines.wal.records.decode`) accepts exactly the `StreamMessage`s
every Danube client parses, checked against google.protobuf's own parser (upb), and reads what upb
reads; decoding is bounded (spec/record-validity.md)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings

from danube.machines.wal import records
from tests.kernels.upb_oracle import (
    every_client_accepts,
    record_of_upb,
    stream_messages,
    upb_fields,
)


def _decoded(data: bytes) -> records.Record | None:
    try:
        return records.decode(data)
    except records.RecordError:
        return None


@settings(max_examples=1500, deadline=None)
@given(stream_messages(msg_id=True))
@example(b"\x80\x80\x80\x80\x10\x01")  # field 2**29 (issue 20)
@example(b"\x08" + b"\xff" * 9 + b"\x02")  # a 10-byte varint whose last byte is 2 (issue 20)
@example(b"\x08" + b"\xff" * 9 + b"\x01")  # the largest uint64: taken
@example(b"\x88\x80\x80\x80\x00\x01")  # a 5-byte tag: taken
@example(b"\x1a\x81\x80\x80\x80\x80\x00x")  # a 6-byte length: upb refuses it
@example(b"\x5b\x5c")  # an empty group (field 11): upb skips it
@example(b"\x3a\x05\x0a\x01a\x18\x01")  # an attributes entry with a field 3
@example(b"\x18\x01")  # payload as a varint: upb keeps it as unknown, prost refuses it
@example(b"\x12\x02\x0a\x00")  # msg_id.producer_id as bytes
def test_decode_accepts_exactly_what_every_client_parses(data: bytes) -> None:
    decoded = _decoded(data)
    assert (decoded is not None) == every_client_accepts("StreamMessage", data)
    if decoded is not None:
        fields = upb_fields("StreamMessage", data)
        assert fields is not None and decoded == record_of_upb(fields)


@settings(max_examples=300, deadline=None)
@given(stream_messages(msg_id=True))
def test_what_decode_takes_reencodes_to_what_upb_reads(data: bytes) -> None:
    """The plain path stores `encode(decode(request))`: upb reads back the same message."""
    decoded = _decoded(data)
    if decoded is not None:
        stored = records.encode(decoded)
        assert every_client_accepts("StreamMessage", stored)
        fields = upb_fields("StreamMessage", stored)
        assert fields is not None and record_of_upb(fields) == decoded


@settings(max_examples=300, deadline=None)
@given(stream_messages(msg_id=True))
def test_fields_raises_only_record_errors(data: bytes) -> None:
    try:
        list(records.fields(data))
    except records.RecordError as error:
        assert str(error) == records.REASONS[error.reason]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"\x80\x80\x80\x80\x10\x01", "BAD_TAG", id="field-2**29"),
        pytest.param(b"\x88\x80\x80\x80\x80\x00\x01", "BAD_TAG", id="6-byte-tag"),
        pytest.param(b"\x00\x01", "BAD_TAG", id="field-0"),
        pytest.param(b"\x08" + b"\xff" * 9 + b"\x02", "BAD_VARINT", id="varint-past-64-bits"),
        pytest.param(b"\x08" + b"\xff" * 10 + b"\x01", "BAD_VARINT", id="11-byte-varint"),
        pytest.param(b"\x1a\x81\x80\x80\x80\x80\x00x", "BAD_VARINT", id="6-byte-length"),
        pytest.param(b"\x5b\x5c", "BAD_WIRE_TYPE", id="group"),
        pytest.param(b"\x5e", "BAD_WIRE_TYPE", id="wire-type-6"),
        pytest.param(b"\x18\x01", "WRONG_WIRE_TYPE", id="payload-as-varint"),
        pytest.param(b"\x12\x02\x0a\x00", "WRONG_WIRE_TYPE", id="msg-id-field-as-bytes"),
        pytest.param(b"\x3a\x05\x0a\x01a\x18\x01", "BAD_ENTRY", id="entry-extra-field"),
        pytest.param(b"\x3a\x02\x08\x01", "BAD_ENTRY", id="entry-key-as-varint"),
        pytest.param(b"\x52\x01\xff", "BAD_UTF8", id="routing-key-not-utf8"),
        pytest.param(b"\x1a\x05ab", "TRUNCATED", id="payload-past-end"),
    ],
)
def test_each_refusal_says_why(data: bytes, reason: str) -> None:
    with pytest.raises(records.RecordError) as refused:
        records.decode(data)
    code = getattr(records, reason)  # read here: the module loads on code without the codes
    assert refused.value.reason == code
    assert str(refused.value) == records.REASONS[code]


def test_a_uint32_keeps_the_low_bits_of_a_64_bit_varint_as_protobuf_does() -> None:
    data = b"\x48" + b"\xff" * 9 + b"\x01"  # schema_version = 2**64 - 1
    assert records.decode(data).schema_version == 0xFFFFFFFF
    fields = upb_fields("StreamMessage", data)
    assert fields is not None and fields["schema_version"] == 0xFFFFFFFF


ENTRY = b"\x3a\x06\x0a\x01a\x12\x01b"
EMPTY_ENTRIES = b"\x3a\x00" * 990  # 990 attributes, 990 fields
ONE_ENTRY_OF_MANY_FIELDS = b"\x3a\x80\x80\x01" + b"\x0a\x00" * 8192  # key (1) 8,192 times


class _CountedBytes(bytes):
    """Bytes that count how many single bytes a decoder reads."""

    reads = 0

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, int):
            type(self).reads += 1
        return super().__getitem__(index)


@pytest.mark.parametrize(
    ("data", "limit"),
    [
        pytest.param(ENTRY * 200_000, "more than 1000 attributes, the limit", id="attributes"),
        pytest.param(b"\x08\x01" * 200_000, "more than 4096 fields", id="fields"),
        pytest.param(EMPTY_ENTRIES + ONE_ENTRY_OF_MANY_FIELDS, "more than 4096", id="entry-fields"),
    ],
)  # fmt: skip
def test_decoding_stops_at_its_limits(data: bytes, limit: str) -> None:
    """A SendMessage of a million attributes cost 2.5-4.6 s of the event loop (issue 20): the
    decoder now refuses at the limit, having read a bounded part of the message."""
    counted = _CountedBytes(data)
    _CountedBytes.reads = 0
    with pytest.raises(records.RecordError) as refused:
        records.decode(counted)
    assert limit in str(refused.value)
    assert _CountedBytes.reads < 40_000


def test_the_most_attributes_decode() -> None:
    data = b"".join(
        b"\x3a" + bytes([4 + len(str(i))]) + b"\x0a" + bytes([len(str(i))]) + str(i).encode()
        + b"\x12\x00" for i in range(records.MAX_ATTRIBUTES)
    )  # fmt: skip
    assert len(records.decode(data).attributes) == records.MAX_ATTRIBUTES


def test_a_record_stored_before_the_strict_rules_routes_by_the_empty_key() -> None:
    """A record the old batch check let through (a field numbered 2^29) may still sit in a
    WAL after an upgrade: Key-Shared routing of it must not raise inside the core."""
    good = records.encode(records.Record(payload=b"x", producer_name="p", routing_key="k"))
    assert records.routing_key(good) == b"k"
    legacy = good + b"\x80\x80\x80\x80\x10\x01"  # field 2^29, varint 1
    with pytest.raises(records.RecordError):
        records.decode(legacy)
    assert records.routing_key(legacy) == b""

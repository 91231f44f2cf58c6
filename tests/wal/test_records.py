"""The hand-written record codec against betterproto: the same bytes for the same message
(but for an attribute "" = "", which betterproto drops and protobuf keeps), and any betterproto
encoding decodes to the same fields. tests/wal/test_records_validity.py checks it against
google.protobuf (upb)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import example, given, settings
from hypothesis import strategies as st

from danube.machines.node.requests import record_of
from danube.machines.wal import records
from danube.proto import danube as pb

U64 = st.integers(0, 2**64 - 1)
TEXT = st.text(max_size=20)


@st.composite
def messages(draw: st.DrawFn) -> pb.StreamMessage:
    msg_id = pb.MsgId(
        producer_id=draw(U64),
        topic_name=draw(st.text(min_size=1, max_size=30)),
        broker_addr=draw(TEXT),
        topic_offset=draw(U64),
    )
    return pb.StreamMessage(
        request_id=draw(U64),
        msg_id=msg_id,
        payload=draw(st.binary(max_size=300)),
        publish_time=draw(U64),
        producer_name=draw(TEXT),
        subscription_name=draw(TEXT),
        attributes=draw(st.dictionaries(TEXT, TEXT, max_size=4)),
        schema_id=draw(st.none() | U64),
        schema_version=draw(st.none() | st.integers(0, 2**32 - 1)),
        routing_key=draw(st.none() | TEXT),
    )


@settings(max_examples=300)
@given(messages())
def test_encode_equals_betterproto_and_decode_inverts_it(message: pb.StreamMessage) -> None:
    record = record_of(message)
    encoded = records.encode(record)
    assert records.decode(encoded) == record
    # betterproto leaves out an attribute whose key and value are both empty; we keep it
    message.attributes = {k: v for k, v in message.attributes.items() if k or v}
    wire = bytes(message)
    if len(message.attributes) == len(record.attributes):
        assert encoded == wire
    decoded = records.decode(wire)
    assert decoded.attributes == message.attributes
    decoded.attributes = record.attributes = {}
    assert decoded == record
    key = message.routing_key if message.routing_key is not None else message.producer_name
    assert decoded.key == key.encode()


@given(st.binary(max_size=64))
def test_any_bytes_decode_to_a_stable_record_or_raise_record_error(data: bytes) -> None:
    """Never an IndexError or a UnicodeDecodeError: a damaged record is reported as one."""
    try:
        record = records.decode(data)
    except records.RecordError:
        return
    assert records.decode(records.encode(record)) == record


def test_an_empty_attribute_is_kept() -> None:
    """A client's attribute "" = "" was decoded, then dropped when the record was stored."""
    record = records.decode(b"\x3a\x00")
    assert record.attributes == {"": ""}
    assert records.decode(records.encode(record)).attributes == {"": ""}


def _either(decode: Callable[[bytes], records.Record | None], data: bytes) -> object:
    try:
        return decode(data)
    except records.RecordError as error:
        return error.reason


@settings(max_examples=500)
@given(messages())
def test_the_one_pass_decoder_reads_what_the_field_reader_reads(message: pb.StreamMessage) -> None:
    """`decode` reads plain encodings in one pass (`_decode_plain`), everything else field by
    field (`_decode_fields`): both give the same record where the first answers at all, and
    it answers for every message without attributes that this codec or betterproto encodes
    (their varints take up to 10 bytes: producer ids are random 64-bit numbers)."""
    for data in (records.encode(record_of(message)), bytes(message)):
        plain = records._decode_plain(data)
        if plain is not None:
            assert plain == records._decode_fields(data)
        else:
            assert message.attributes or len(data) >= 2**28


def _mutated(data: bytes) -> st.SearchStrategy[bytes]:
    """`data` cut short, with a byte changed, or with bytes put in (refused or odd encodings
    near valid ones)."""
    size = len(data)
    return st.one_of(
        st.integers(0, size).map(lambda cut: data[:cut]),
        st.tuples(st.integers(0, max(size - 1, 0)), st.integers(0, 255)).map(
            lambda change: data[: change[0]] + bytes([change[1]]) + data[change[0] + 1 :]
        ),
        st.tuples(st.integers(0, size), st.binary(min_size=1, max_size=4)).map(
            lambda put: data[: put[0]] + put[1] + data[put[0] :]
        ),
    )


@settings(max_examples=2000)
@given(st.binary(max_size=80) | messages().map(bytes).flatmap(_mutated))
@example(b"\x48" + b"\xff" * 8 + b"\x7f")  # schema_version keeps its low 32 bits
@example(b"\x08" + b"\xff" * 9 + b"\x01")  # the largest uint64
@example(b"\x08" + b"\xff" * 9 + b"\x02")  # a 10th varint byte above 1: refused
@example(b"\x12\x0b\x08" + b"\xff" * 9 + b"\x02")  # the same in the msg_id
@example(b"\x12\x0b\x08" + b"\xff" * 9 + b"\x01")
@example(b"\x12\x02\x28\x80")  # msg_id's offset runs past the msg_id
@example(b"\x12\x01\x28\x08\x01")  # msg_id ends before its offset's value
@example(b"\x12\x01\x12\x01")  # msg_id's topic length runs past the msg_id
@example(b"\x12\x03\x12\x02a\x1a\x00")  # msg_id's topic runs past the msg_id
def test_the_one_pass_decoder_never_takes_what_the_field_reader_refuses(data: bytes) -> None:
    """On any bytes, `_decode_plain` returns None or exactly the record `_decode_fields`
    returns (never a record for bytes refused with a `RecordError`, never another error)."""
    plain = records._decode_plain(data)
    if plain is not None:
        assert _either(records._decode_fields, data) == plain

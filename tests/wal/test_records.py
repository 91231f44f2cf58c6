"""The hand-written record codec against betterproto: the same bytes for the same message
(but for an attribute "" = "", which betterproto drops and protobuf keeps), and any betterproto
encoding decodes to the same fields. tests/wal/test_records_validity.py checks it against
google.protobuf (upb)."""

from __future__ import annotations

from hypothesis import given, settings
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

"""The batched path's hand-encoded replies (issue 23, point 2: betterproto's encode was most of
a reply's CPU): `BatchAckWire`, `MessageBatchWire` and `RequestIdReply` (as AckBatchResponse)
write exactly the bytes betterproto writes for the same values, and decode back to them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from danube.proto import danube_ext as ext_pb
from danube.runtime.wire_codec import BatchAckWire, MessageBatchWire, RequestIdReply

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
U32 = st.integers(min_value=0, max_value=(1 << 32) - 1)


@given(U64, U64, U32, U32, st.text(max_size=300))
def test_batch_acks_encode_as_betterproto(
    sequence: int, first_offset: int, count: int, status: int, error: str
) -> None:
    fields = {
        "sequence": sequence,
        "first_offset": first_offset,
        "count": count,
        "status": status,
        "error": error,
    }
    wire = BatchAckWire(**fields).SerializeToString()
    assert wire == bytes(ext_pb.BatchAck(**fields))
    assert ext_pb.BatchAck.FromString(wire) == ext_pb.BatchAck(**fields)


@given(st.binary(max_size=3000), U32)
def test_message_batches_encode_as_betterproto(records: bytes, count: int) -> None:
    wire = MessageBatchWire(records, count).SerializeToString()
    assert wire == bytes(ext_pb.MessageBatch(records=records, count=count))


@given(U64)
def test_ack_batch_replies_encode_as_betterproto(request_id: int) -> None:
    wire = RequestIdReply(request_id).SerializeToString()
    assert wire == bytes(ext_pb.AckBatchResponse(request_id=request_id))


def test_a_refused_batch_carries_its_status_and_reason() -> None:
    wire = BatchAckWire(sequence=7, status=8, error="publish pool full: é").SerializeToString()
    answer = ext_pb.BatchAck.FromString(wire)
    assert (answer.sequence, answer.status, answer.error) == (7, 8, "publish pool full: é")
    assert answer.first_offset == answer.count == 0

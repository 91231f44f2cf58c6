"""Hand codecs for Danube's per-message calls (SendMessage, Ack, Nack), plugged into grpclib.

grpclib's `ProtoCodec` decodes a request with `request_type.FromString(body)` and encodes a
reply with `reply.SerializeToString()` once it is an instance of the handler's reply type; the
types here answer those two calls without building a betterproto message, whose parse or
encode costs more CPU than the gRPC call itself on this machine (bench/plain_path.py). A
`StreamMessage` goes through `danube.machines.wal.records`, the codec reliable topics store with;
the small messages are read here. Every decoder accepts any encoding every Danube client's parser
reads alike (fields in any order, repeated, unknown ones skipped; spec/record-validity.md) and
raises `records.RecordError` for anything else or beyond the codec's limits, which
`grpc_util.recv_bounded` answers with INVALID_ARGUMENT."""

from __future__ import annotations

from danube.machines.node.requests import Acknowledgement
from danube.machines.wal import records
from danube.values.varint import varint

_VARINT, _LEN = 0, 2
_UINT64 = (1 << 64) - 1


class StreamMessageWire:
    """Request type of SendMessage: the body decodes to a `records.Record`."""

    @staticmethod
    def FromString(data: bytes) -> records.Record:  # the protobuf API grpclib calls
        return records.decode(data)


def decode_ack(data: bytes) -> Acknowledgement:
    """A `danube.AckRequest`."""
    return _acknowledgement(data, nack=False)


def decode_nack(data: bytes) -> Acknowledgement:
    """A `danube.NackRequest`: an `AckRequest` plus `delay_ms` (4) and `reason` (5)."""
    return _acknowledgement(data, nack=True)


_ACK = records.Schema({1: _VARINT, 2: _LEN, 3: _LEN}, frozenset({3}))
_NACK = records.Schema({1: _VARINT, 2: _LEN, 3: _LEN, 4: _VARINT, 5: _LEN}, frozenset({3, 5}))
"""`reason` (5): the text a dead letter carries as `x-failure-reason` (spec/failure-policies.md)."""


def _acknowledgement(data: bytes, *, nack: bool) -> Acknowledgement:
    request = Acknowledgement()
    found, count = records.read(data, _NACK if nack else _ACK)
    for number, _, value in found:
        if number == 1:
            request.request_id = value
        elif number == 2:
            request.has_msg_id = True
            count = _msg_id(value, request, count)
        elif number == 3:
            request.subscription_name = value
        elif number == 4 and nack:
            request.delay_ms = value
        elif number == 5 and nack:
            request.reason = value
    return request


def _msg_id(data: bytes, request: Acknowledgement, count: int) -> int:
    """Fields 1 (producer_id) and 3 (broker_addr) matter to no acknowledgement; they are still
    checked, as any field."""
    found, count = records.read(data, records.MSG_ID, count)
    for number, _, value in found:
        if number == 5:
            request.topic_offset = value
        elif number == 2:
            request.topic_name = value
    return count


class AckRequestWire:
    """Request type of Ack."""

    FromString = staticmethod(decode_ack)


class NackRequestWire:
    """Request type of Nack."""

    FromString = staticmethod(decode_nack)


class RequestIdReply:
    """`MessageResponse`, `AckResponse` and `NackResponse` alike: each is only `request_id`
    (field 1), so one reply type encodes all three."""

    __slots__ = ("request_id",)

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id

    def SerializeToString(self) -> bytes:  # the protobuf API grpclib calls
        # Field 1 alone, as proto3 writes it (nothing for 0). The decoders refuse a varint
        # past 64 bits; the mask keeps a uint64's bits for any other caller. Not through
        # `records.encode`, which builds a `Record` per reply (1.3 -> 0.8 us a reply).
        return _field_varint(1, self.request_id)


def _field_varint(number: int, value: int) -> bytes:
    """Field `number` as proto3 writes a varint (nothing for 0, its default)."""
    return varint(number << 3) + varint(value & _UINT64) if value else b""


def _field_bytes(number: int, value: bytes) -> bytes:
    """Field `number` as proto3 writes a length-delimited field (nothing when empty)."""
    return varint((number << 3) | _LEN) + varint(len(value)) + value if value else b""


class BatchAckWire:
    """`danube_ext.BatchAck`, encoded by hand: one per stored batch on the batched path, where
    betterproto's encode was most of the reply's CPU (bench/RESULTS.md, issue 23 points 1–2,
    round 2). The same bytes as betterproto's (fields in order, defaults left out)."""

    __slots__ = ("count", "error", "first_offset", "sequence", "status")

    def __init__(
        self,
        sequence: int = 0,
        first_offset: int = 0,
        count: int = 0,
        status: int = 0,
        error: str = "",
    ) -> None:
        self.sequence = sequence
        self.first_offset = first_offset
        self.count = count
        self.status = status
        self.error = error

    def SerializeToString(self) -> bytes:  # the protobuf API grpclib calls
        return b"".join(
            (
                _field_varint(1, self.sequence),
                _field_varint(2, self.first_offset),
                _field_varint(3, self.count),
                _field_varint(4, self.status),
                _field_bytes(5, self.error.encode()),
            )
        )


class MessageBatchWire:
    """`danube_ext.MessageBatch` (a consumer stream's turn on the batched path), by hand."""

    __slots__ = ("count", "records")

    def __init__(self, records: bytes, count: int) -> None:
        self.records = records
        self.count = count

    def SerializeToString(self) -> bytes:  # the protobuf API grpclib calls
        return _field_bytes(1, self.records) + _field_varint(2, self.count)

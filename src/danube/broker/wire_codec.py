"""Hand codecs for Danube's per-message calls (SendMessage, Ack, Nack), plugged into grpclib.

grpclib's `ProtoCodec` decodes a request with `request_type.FromString(body)` and encodes a
reply with `reply.SerializeToString()` once it is an instance of the handler's reply type; the
types here answer those two calls without building a betterproto message, whose parse or
encode costs more CPU than the gRPC call itself on this machine (bench/plain_path.py). A
`StreamMessage` goes through `danube.wal.records`, the codec reliable topics store with; the
small messages are read here. Every decoder accepts any valid encoding (fields in any order,
repeated, unknown ones skipped) and raises `records.RecordError` for malformed bytes, which
`grpc_util.recv_bounded` answers with INVALID_ARGUMENT."""

from __future__ import annotations

from danube.node.requests import Acknowledgement
from danube.wal import records

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


def _acknowledgement(data: bytes, *, nack: bool) -> Acknowledgement:
    request = Acknowledgement()
    try:
        for number, wire, value in records.fields(data):
            if wire == _VARINT:
                if number == 1:
                    request.request_id = value
                elif number == 4 and nack:
                    request.delay_ms = value
            elif wire == _LEN:
                if number == 2:
                    request.has_msg_id = True
                    _msg_id(value, request)
                elif number == 3:
                    request.subscription_name = value.decode()
                elif number == 5 and nack:
                    value.decode()  # unused, but a string field must be UTF-8 to be valid
    except UnicodeDecodeError as error:
        raise records.RecordError(f"a string field is not UTF-8: {error}") from None
    return request


def _msg_id(data: bytes, request: Acknowledgement) -> None:
    """Fields 1 (producer_id) and 3 (broker_addr) matter to no acknowledgement; the latter is
    still checked, as any string field."""
    for number, wire, value in records.fields(data):
        if wire == _VARINT and number == 5:
            request.topic_offset = value
        elif wire == _LEN and number == 2:
            request.topic_name = value.decode()
        elif wire == _LEN and number == 3:
            value.decode()


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
        # A record holding only request_id encodes as exactly field 1; keep a uint64's bits,
        # whatever varint the request carried.
        only_id = records.Record(request_id=self.request_id & _UINT64, has_msg_id=False)
        return records.encode(only_id)

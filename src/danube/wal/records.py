"""The records a reliable topic stores: `danube.StreamMessage` in protobuf wire format
(spec/wal-format.md), encoded and decoded by hand.

betterproto needs hundreds of microseconds to encode or parse one message on this machine;
the WAL and dispatch paths touch every record, and the simulator every message, so they use
this codec instead. It produces exactly the bytes betterproto produces for the same message
(tests/wal/test_records.py checks that with hypothesis) and reads any valid encoding, skipping
fields it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


@dataclass(slots=True)
class Record:
    """The fields of a `danube.StreamMessage` (with its `MsgId` flattened)."""

    request_id: int = 0
    producer_id: int = 0
    topic_name: str = ""
    broker_addr: str = ""
    topic_offset: int = 0
    payload: bytes = b""
    publish_time: int = 0
    producer_name: str = ""
    subscription_name: str = ""
    attributes: dict[str, str] = field(default_factory=dict)
    schema_id: int | None = None
    schema_version: int | None = None
    routing_key: str | None = None
    has_msg_id: bool = True
    """Whether the message carried a `msg_id` at all (every stored record does)."""

    @property
    def key(self) -> bytes:
        """Key-Shared routing: the routing key, else the producer's name (as Danube)."""
        return (self.routing_key if self.routing_key is not None else self.producer_name).encode()


def _varint(value: int, out: bytearray) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _bytes_field(number: int, data: bytes, out: bytearray) -> None:
    out.append((number << 3) | _LEN)
    _varint(len(data), out)
    out += data


def encode(record: Record) -> bytes:
    out = bytearray()
    if record.request_id:
        out.append(1 << 3)
        _varint(record.request_id, out)
    if record.has_msg_id:
        msg_id = bytearray()
        if record.producer_id:
            msg_id.append(1 << 3)
            _varint(record.producer_id, msg_id)
        if record.topic_name:
            _bytes_field(2, record.topic_name.encode(), msg_id)
        if record.broker_addr:
            _bytes_field(3, record.broker_addr.encode(), msg_id)
        if record.topic_offset:
            msg_id.append(5 << 3)
            _varint(record.topic_offset, msg_id)
        _bytes_field(2, bytes(msg_id), out)
    if record.payload:
        _bytes_field(3, record.payload, out)
    if record.publish_time:
        out.append(4 << 3)
        _varint(record.publish_time, out)
    if record.producer_name:
        _bytes_field(5, record.producer_name.encode(), out)
    if record.subscription_name:
        _bytes_field(6, record.subscription_name.encode(), out)
    for key, value in record.attributes.items():
        entry = bytearray()
        if key:
            _bytes_field(1, key.encode(), entry)
        if value:
            _bytes_field(2, value.encode(), entry)
        if entry:  # as betterproto: an all-default entry is left out
            _bytes_field(7, bytes(entry), out)
    if record.schema_id is not None:
        out.append(8 << 3)
        _varint(record.schema_id, out)
    if record.schema_version is not None:
        out.append(9 << 3)
        _varint(record.schema_version, out)
    if record.routing_key is not None:
        _bytes_field(10, record.routing_key.encode(), out)
    return bytes(out)


class RecordError(ValueError):
    """Bytes that are not a valid `danube.StreamMessage`."""


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(data):
            raise RecordError("truncated varint")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise RecordError("varint longer than 10 bytes")


def fields(data: bytes):  # type: ignore[no-untyped-def]
    """(field number, wire type, value) for each field: ints for varints and fixed widths,
    bytes for length-delimited ones. For readers that want a few fields of many messages
    (the audit) without building a `Record`."""
    position, end = 0, len(data)
    while position < end:
        tag, position = _read_varint(data, position)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value, position = _read_varint(data, position)
        elif wire == _LEN:
            size, position = _read_varint(data, position)
            if position + size > end:
                raise RecordError("length-delimited field runs past the end")
            value = data[position : position + size]
            position += size
        elif wire == _I64:
            value = int.from_bytes(data[position : position + 8], "little")
            position += 8
        elif wire == _I32:
            value = int.from_bytes(data[position : position + 4], "little")
            position += 4
        else:
            raise RecordError(f"unsupported wire type {wire}")
        if position > end:
            raise RecordError("field runs past the end")
        yield number, wire, value


def decode(data: bytes) -> Record:
    record = Record(has_msg_id=False)
    try:
        for number, wire, value in fields(data):
            if wire == _VARINT:
                if number == 1:
                    record.request_id = value
                elif number == 4:
                    record.publish_time = value
                elif number == 8:
                    record.schema_id = value
                elif number == 9:
                    record.schema_version = value & 0xFFFFFFFF
            elif wire == _LEN:
                if number == 2:
                    record.has_msg_id = True
                    _decode_msg_id(value, record)
                elif number == 3:
                    record.payload = bytes(value)
                elif number == 5:
                    record.producer_name = value.decode()
                elif number == 6:
                    record.subscription_name = value.decode()
                elif number == 7:
                    key = text = ""
                    for entry_number, entry_wire, entry_value in fields(value):
                        if entry_wire == _LEN and entry_number == 1:
                            key = entry_value.decode()
                        elif entry_wire == _LEN and entry_number == 2:
                            text = entry_value.decode()
                    record.attributes[key] = text
                elif number == 10:
                    record.routing_key = value.decode()
    except UnicodeDecodeError as error:
        raise RecordError(f"a string field is not UTF-8: {error}") from None
    return record


def _decode_msg_id(data: bytes, record: Record) -> None:
    for number, wire, value in fields(data):
        if wire == _VARINT and number == 1:
            record.producer_id = value
        elif wire == _VARINT and number == 5:
            record.topic_offset = value
        elif wire == _LEN and number == 2:
            record.topic_name = value.decode()
        elif wire == _LEN and number == 3:
            record.broker_addr = value.decode()


def msg_id_fields(producer_id: int, topic_name: str, broker_addr: str) -> bytes:
    """The encoded fields of a `MsgID` other than its offset (which each record adds)."""
    out = bytearray()
    if producer_id:
        out.append(1 << 3)
        _varint(producer_id, out)
    if topic_name:
        _bytes_field(2, topic_name.encode(), out)
    if broker_addr:
        _bytes_field(3, broker_addr.encode(), out)
    return bytes(out)

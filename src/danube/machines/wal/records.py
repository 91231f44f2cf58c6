"""The records a reliable topic stores: `danube.StreamMessage` in protobuf wire format
(spec/wal-format.md), encoded and decoded by hand.

betterproto needs hundreds of microseconds to encode or parse one message on this machine;
the WAL and dispatch paths touch every record, and the simulator every message, so they use
this codec instead. It produces exactly the bytes betterproto produces for the same message
(tests/wal/test_records.py checks that with hypothesis), but for an attribute whose key and
value are both empty, which betterproto drops, and reads any encoding that every
Danube client's protobuf parser reads alike, skipping fields it does not know: the rules, and
where they are stricter than one parser, are in spec/record-validity.md. Decoding is bounded
(`MAX_FIELDS`, `MAX_ATTRIBUTES`): it runs on the event loop.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from danube.values.varint import append_varint

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_WIRE_TYPES = frozenset({_VARINT, _I64, _LEN, _I32})


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


def _bytes_field(number: int, data: bytes, out: bytearray) -> None:
    out.append((number << 3) | _LEN)
    append_varint(len(data), out)
    out += data


def encode(record: Record) -> bytes:
    out = bytearray()
    if record.request_id:
        out.append(1 << 3)
        append_varint(record.request_id, out)
    if record.has_msg_id:
        msg_id = bytearray()
        if record.producer_id:
            msg_id.append(1 << 3)
            append_varint(record.producer_id, msg_id)
        if record.topic_name:
            _bytes_field(2, record.topic_name.encode(), msg_id)
        if record.broker_addr:
            _bytes_field(3, record.broker_addr.encode(), msg_id)
        if record.topic_offset:
            msg_id.append(5 << 3)
            append_varint(record.topic_offset, msg_id)
        _bytes_field(2, bytes(msg_id), out)
    if record.payload:
        _bytes_field(3, record.payload, out)
    if record.publish_time:
        out.append(4 << 3)
        append_varint(record.publish_time, out)
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
        # Even an all-default entry: the attribute "" = "" is one (prost and upb keep it;
        # betterproto alone leaves it out, so its bytes differ from ours there).
        _bytes_field(7, bytes(entry), out)
    if record.schema_id is not None:
        out.append(8 << 3)
        append_varint(record.schema_id, out)
    if record.schema_version is not None:
        out.append(9 << 3)
        append_varint(record.schema_version, out)
    if record.routing_key is not None:
        _bytes_field(10, record.routing_key.encode(), out)
    return bytes(out)


# Why bytes are not a record every Danube client can parse: the reason codes of
# `RecordError` and of the batch kernel (`danube.kernels.batches`), spec/record-validity.md.
OK = 0
TRUNCATED = 1
HAS_MSG_ID = 2
BAD_VARINT = 3
BAD_TAG = 4
BAD_WIRE_TYPE = 5
WRONG_WIRE_TYPE = 6
BAD_UTF8 = 7
BAD_ENTRY = 8
TOO_MANY_FIELDS = 9
TOO_MANY_ATTRIBUTES = 10

MAX_ATTRIBUTES = 1000
"""Most attribute entries a record may carry. Decoding one costs about 2 µs of the event loop
here, so 1,000 bound a SendMessage's decoding to a few milliseconds (a million took 2.5–4.6 s,
issue 20); Danube's clients attach a handful."""
MAX_FIELDS = 4096
"""Most fields a record may hold, counted at every level (its own, its msg_id's, its attribute
entries'): repeated and unknown fields cost decoding time too. 1,000 attributes use at most
3,000 of them."""
MSG_ID_FIELDS = 5
"""Most fields the broker's `msg_id` adds to a record (the field and its four), which a batch's
records must leave room for under `MAX_FIELDS`."""

REASONS = {
    TRUNCATED: "a field runs past the end of its message",
    HAS_MSG_ID: "it carries a msg_id; the broker sets it",
    BAD_VARINT: (
        "a varint is longer than 10 bytes or its 10th byte is above 1, "
        "or a length prefix is longer than 5 bytes"
    ),
    BAD_TAG: "a field number is 0 or above 2**29-1, or a tag is longer than 5 bytes",
    BAD_WIRE_TYPE: "a wire type is 3 or 4 (groups, refused) or 6 or 7 (invalid)",
    WRONG_WIRE_TYPE: "a known field has another wire type than its declared type's",
    BAD_UTF8: "a string field is not valid UTF-8",
    BAD_ENTRY: "an attributes entry holds a field other than its key (1) and value (2) strings",
    TOO_MANY_FIELDS: f"more than {MAX_FIELDS} fields (msg_id's and attribute entries' included)",
    TOO_MANY_ATTRIBUTES: f"more than {MAX_ATTRIBUTES} attributes, the limit",
}


class RecordError(ValueError):
    """Bytes that are not a `danube.StreamMessage` (or another message read here) that every
    Danube client's protobuf parser accepts; `reason` is one of the codes above."""

    def __init__(self, reason: int) -> None:
        super().__init__(REASONS[reason])
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Schema:
    """What a decoder knows of a message: the wire type of each known field (a parser such as
    prost refuses another), which of them are strings (UTF-8), how often a field may repeat,
    and whether fields it does not know are refused (attribute entries) or skipped."""

    wires: dict[int, int]
    strings: frozenset[int] = frozenset()
    repeat_limits: dict[int, tuple[int, int]] = field(default_factory=dict)
    """field number: (most occurrences, reason code beyond)."""
    closed: bool = False
    """Any other field, or a known one of another wire type, is `BAD_ENTRY`."""


STREAM_MESSAGE = Schema(
    {1: _VARINT, 2: _LEN, 3: _LEN, 4: _VARINT, 5: _LEN, 6: _LEN, 7: _LEN, 8: _VARINT, 9: _VARINT,
     10: _LEN},
    frozenset({5, 6, 10}),
    {7: (MAX_ATTRIBUTES, TOO_MANY_ATTRIBUTES)},
)  # fmt: skip
MSG_ID = Schema({1: _VARINT, 2: _LEN, 3: _LEN, 5: _VARINT}, frozenset({2, 3}))
ATTRIBUTE_ENTRY = Schema({1: _LEN, 2: _LEN}, frozenset({1, 2}), closed=True)
ANY = Schema({})
"""Every field skipped, as far as types go: wire-level checks only."""


def _read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """A value varint as every parser reads one: at most 10 bytes, the 10th 0 or 1, so the
    value fits 64 bits (upb takes a larger 10th byte and drops its bits; prost and Go refuse
    it)."""
    if pos >= end:
        raise RecordError(TRUNCATED)
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value, shift = byte & 0x7F, 7
    pos += 1
    while True:
        if pos >= end:
            raise RecordError(TRUNCATED)
        byte = data[pos]
        pos += 1
        if shift == 63:
            if byte > 1:
                raise RecordError(BAD_VARINT)
            return value | byte << 63, pos
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _short_varint(data: bytes, pos: int, end: int, too_long: int) -> tuple[int, int]:
    """A tag or a length: upb refuses either when longer than 5 bytes."""
    value = shift = 0
    while shift < 35:
        if pos >= end:
            raise RecordError(TRUNCATED)
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise RecordError(too_long)


def _read(data: bytes, schema: Schema, count: int) -> tuple[list[tuple[int, int, Any]], int]:
    """The fields of one message in order, as (number, wire type, value): ints for varints and
    fixed widths, bytes for length-delimited fields, str for the schema's strings; and `count`
    plus the number of fields read. Raises `RecordError` at the first problem: a bad tag, more
    than `MAX_FIELDS` in all, a known field of another wire type, a repeat limit, a value cut
    short or overlong, a string that is not UTF-8."""
    found: list[tuple[int, int, Any]] = []
    wires, strings, limits = schema.wires, schema.strings, schema.repeat_limits
    repeats: dict[int, int] = {}
    pos, end = 0, len(data)
    while pos < end:
        tag = data[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _short_varint(data, pos, end, BAD_TAG)
            if tag > 0xFFFFFFFF:
                raise RecordError(BAD_TAG)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise RecordError(BAD_TAG)
        if wire not in _WIRE_TYPES:
            raise RecordError(BAD_WIRE_TYPE)
        count += 1
        if count > MAX_FIELDS:
            raise RecordError(TOO_MANY_FIELDS)
        expected = wires.get(number)
        if expected != wire and (expected is not None or schema.closed):
            raise RecordError(BAD_ENTRY if schema.closed else WRONG_WIRE_TYPE)
        if number in limits:
            seen = repeats[number] = repeats.get(number, 0) + 1
            if seen > limits[number][0]:
                raise RecordError(limits[number][1])
        value: Any
        if wire == _VARINT:
            value, pos = _read_varint(data, pos, end)
        elif wire == _LEN:
            size, pos = _short_varint(data, pos, end, BAD_VARINT)
            if size > end - pos:
                raise RecordError(TRUNCATED)
            value = data[pos : pos + size]
            pos += size
            if number in strings:
                try:
                    value = value.decode()
                except UnicodeDecodeError:
                    raise RecordError(BAD_UTF8) from None
        else:
            width = 8 if wire == _I64 else 4
            if width > end - pos:
                raise RecordError(TRUNCATED)
            value = int.from_bytes(data[pos : pos + width], "little")
            pos += width
        found.append((number, wire, value))
    return found, count


def read(data: bytes, schema: Schema, count: int = 0) -> tuple[list[tuple[int, int, Any]], int]:
    """`_read`, for the other hand codecs (`danube.runtime.wire_codec`)."""
    return _read(data, schema, count)


def fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) for each field: ints for varints and fixed widths,
    bytes for length-delimited ones. For readers that want a few fields of many messages
    (the audit) without building a `Record`; refuses what no client could parse (groups,
    overlong varints, bad tags, more than `MAX_FIELDS`) but knows no field's type."""
    return iter(_read(data, ANY, 0)[0])


def decode(data: bytes) -> Record:
    """The record of an encoded `danube.StreamMessage`; raises `RecordError` unless every
    Danube client's parser takes the bytes as they are (spec/record-validity.md): uint64
    values fit 64 bits by then, and `schema_version` keeps its low 32 bits, as protobuf's."""
    record = _decode_plain(data)
    return record if record is not None else _decode_fields(data)


def _decode_fields(data: bytes) -> Record:
    """`decode` of any encoding: reads every field (`_read`) and checks each, then sets them."""
    record = Record(has_msg_id=False)
    found, count = _read(data, STREAM_MESSAGE, 0)
    for number, _, value in found:
        if number == 1:
            record.request_id = value
        elif number == 2:
            record.has_msg_id = True
            count = _decode_msg_id(value, record, count)
        elif number == 3:
            record.payload = value
        elif number == 4:
            record.publish_time = value
        elif number == 5:
            record.producer_name = value
        elif number == 6:
            record.subscription_name = value
        elif number == 7:
            entry, count = _read(value, ATTRIBUTE_ENTRY, count)
            key = text = ""
            for entry_number, _, entry_value in entry:
                if entry_number == 1:
                    key = entry_value
                else:
                    text = entry_value
            record.attributes[key] = text
        elif number == 8:
            record.schema_id = value
        elif number == 9:
            record.schema_version = value & 0xFFFFFFFF
        elif number == 10:
            record.routing_key = value
    return record


_PLAIN_FIELDS = 256
"""Most fields `_decode_plain` reads (far below `MAX_FIELDS`, so it never needs the count)."""


def _decode_plain(data: bytes) -> Record | None:
    """`decode` in one pass for the encodings clients and this codec produce: each field a
    known one with its declared wire type, lengths of at most 4 bytes,
    no attributes (field 7), at most `_PLAIN_FIELDS` fields. None for anything else, refused
    bytes included: `decode` then reads them field by field, which decides and explains.
    What this returns is what that returns (tests/wal/test_records.py compares them)."""
    request_id = producer_id = topic_offset = publish_time = 0
    topic_name = broker_addr = producer_name = subscription_name = ""
    payload = b""
    schema_id: int | None = None
    schema_version: int | None = None
    routing_key: str | None = None
    has_msg_id = False
    pos, end, count = 0, len(data), 0
    try:
        while pos < end:
            tag = data[pos]
            pos += 1
            count += 1
            if count > _PLAIN_FIELDS:  # bounded, as `_read`: hand it the rest
                return None
            if tag & 7 == _LEN:
                size = data[pos]
                pos += 1
                if size > 0x7F:
                    size &= 0x7F
                    shift = 7
                    while True:
                        byte = data[pos]
                        pos += 1
                        size |= (byte & 0x7F) << shift
                        if byte < 0x80:
                            break
                        shift += 7
                        if shift == 28:
                            return None
                stop = pos + size
                if stop > end:
                    return None
                if tag == 26:
                    payload = data[pos:stop]
                elif tag == 18:
                    has_msg_id = True
                    while pos < stop:  # the msg_id's fields
                        tag = data[pos]
                        pos += 1
                        count += 1
                        if count > _PLAIN_FIELDS:
                            return None
                        if tag == 18 or tag == 26:
                            size = shift = 0
                            while True:
                                if pos >= stop or shift == 28:
                                    return None
                                byte = data[pos]
                                pos += 1
                                size |= (byte & 0x7F) << shift
                                if byte < 0x80:
                                    break
                                shift += 7
                            if pos + size > stop:
                                return None
                            if tag == 18:
                                topic_name = data[pos : pos + size].decode()
                            else:
                                broker_addr = data[pos : pos + size].decode()
                            pos += size
                        elif tag == 8 or tag == 40:
                            value = shift = 0
                            while True:
                                if pos >= stop:
                                    return None
                                byte = data[pos]
                                pos += 1
                                if shift == 63:  # the 10th byte: 0 or 1, as `_read_varint`
                                    if byte > 1:
                                        return None
                                    value |= byte << 63
                                    break
                                value |= (byte & 0x7F) << shift
                                if byte < 0x80:
                                    break
                                shift += 7
                            if tag == 8:
                                producer_id = value
                            else:
                                topic_offset = value
                        else:
                            return None
                elif tag == 42:
                    producer_name = data[pos:stop].decode()
                elif tag == 50:
                    subscription_name = data[pos:stop].decode()
                elif tag == 82:
                    routing_key = data[pos:stop].decode()
                else:
                    return None
                pos = stop
            else:
                value = data[pos]
                pos += 1
                if value > 0x7F:
                    value &= 0x7F
                    shift = 7
                    while True:
                        byte = data[pos]
                        pos += 1
                        if shift == 63:  # the 10th byte: 0 or 1, as `_read_varint`
                            if byte > 1:
                                return None
                            value |= byte << 63
                            break
                        value |= (byte & 0x7F) << shift
                        if byte < 0x80:
                            break
                        shift += 7
                if tag == 8:
                    request_id = value
                elif tag == 32:
                    publish_time = value
                elif tag == 64:
                    schema_id = value
                elif tag == 72:
                    schema_version = value & 0xFFFFFFFF
                else:
                    return None
    except (IndexError, UnicodeDecodeError):
        return None
    return Record(
        request_id,
        producer_id,
        topic_name,
        broker_addr,
        topic_offset,
        payload,
        publish_time,
        producer_name,
        subscription_name,
        {},
        schema_id,
        schema_version,
        routing_key,
        has_msg_id,
    )


def routing_key(record: bytes) -> bytes:
    """Key-Shared routing of a stored record (`Record.key`). A record this codec no longer
    accepts, stored by a broker before the stricter rules of spec/record-validity.md (a
    field numbered 2^29 or more, say), routes by the empty key instead of failing the
    dispatch step that reads it."""
    try:
        return decode(record).key
    except RecordError:
        return b""


def _decode_msg_id(data: bytes, record: Record, count: int) -> int:
    found, count = _read(data, MSG_ID, count)
    for number, _, value in found:
        if number == 1:
            record.producer_id = value
        elif number == 2:
            record.topic_name = value
        elif number == 3:
            record.broker_addr = value
        elif number == 5:
            record.topic_offset = value
    return count


@functools.lru_cache(maxsize=4096)
def msg_id_fields(producer_id: int, topic_name: str, broker_addr: str) -> bytes:
    """The encoded fields of a `MsgID` other than its offset (which each record adds).

    Kept per (producer, topic, broker): every batch a producer publishes stamps the same
    fields, and encoding them was a tenth of `batches.stamp` (a pure function of its
    arguments returning immutable bytes; at most 4,096 producers' entries, a few hundred
    bytes each: an estimate, not measured)."""
    out = bytearray()
    if producer_id:
        out.append(1 << 3)
        append_varint(producer_id, out)
    if topic_name:
        _bytes_field(2, topic_name.encode(), out)
    if broker_addr:
        _bytes_field(3, broker_addr.encode(), out)
    return bytes(out)

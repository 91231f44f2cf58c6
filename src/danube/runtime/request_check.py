"""A strict, bounded check of a request's protobuf bytes before betterproto builds objects.

betterproto decodes in pure Python and trusts the bytes: a known field sent with the wrong
wire type reaches a handler as the wrong Python type (an int where a str was declared, an
INTERNAL with a traceback), and a megabyte of unknown fields took it 28 s (issue 20). This
module walks the bytes once, in linear time, driven by the message classes' own field
metadata, so it knows every request type of every service without a list of its own. It
refuses what the strictest conforming parsers (upb, prost, Go) refuse, plus what no Danube
request needs (spec/protocol.md, "Limits on requests"):

- field numbers 1 … 2^29-1, varints of at most 10 bytes whose 10th byte is 0 or 1;
- wire types 0, 1, 2 and 5 only (groups are not proto3), and for a known field the wire type
  its declared type has (a packed repeated scalar may also come length-delimited);
- length-delimited values inside their message, strings valid UTF-8;
- nested messages at most `MAX_DEPTH` deep, at most `MAX_FIELDS` fields in all (nested
  fields and map entries count; unknown fields are accepted, as protobuf does, but count
  too) and at most `MAX_PACKED` elements of packed repeated fields.

It also says whether a 32-bit field carries a wider varint, which protobuf truncates and
betterproto does not: `narrow` then cuts such values as protobuf would, so a request means
the same to us as to every other parser."""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any

import betterproto

MAX_DEPTH = 32
"""Nesting of messages in one request; Danube's deepest request nests 3."""
MAX_FIELDS = 4096
"""Fields (tags) in one request, nested ones, map entries and unknown fields included. A
Danube request has tens. betterproto decodes about 80,000 fields a second on the reference
machine, so this bounds a request's decoding to some 50 ms; 1 MB of unknown varint fields
took it 28 s (issue 20)."""
MAX_PACKED = 65_536
"""Elements of packed repeated fields in one request (an `AckBatch`'s offsets), which cost
betterproto about 5 µs each: a batch acknowledgement of 65,536 offsets decodes in 0.3 s."""
MAX_FIELD_NUMBER = (1 << 29) - 1

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
_WIRE_OF: dict[str, int] = {
    **{t: VARINT for t in betterproto.WIRE_VARINT_TYPES},
    **{t: FIXED32 for t in betterproto.WIRE_FIXED_32_TYPES},
    **{t: FIXED64 for t in betterproto.WIRE_FIXED_64_TYPES},
    **{t: LEN for t in betterproto.WIRE_LEN_DELIM_TYPES},
}
_NARROW = frozenset({betterproto.TYPE_UINT32, betterproto.TYPE_ENUM})
"""32-bit varint types protobuf cuts to their low 32 bits and betterproto does not (it cuts
int32 itself; no request has a sint32 field)."""
_FIXED_SIZE = {FIXED64: 8, FIXED32: 4}
_PACKED_VARINTS = re.compile(rb"(?:[\x80-\xff]{0,8}[\x00-\x7f]|[\x80-\xff]{9}[\x00\x01])*")
"""Canonical varints back to back: up to 9 continuation bytes, a 10th byte 0 or 1."""
_CONTINUATION = bytes(range(0x80, 0x100))


class RequestRejected(ValueError):
    """The bytes are not a valid request of the expected type; the message is short and
    quotes nothing the client sent."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    proto_type: str
    wire: int
    repeated: bool
    message: type | None  # the class of a message or map-entry field


@dataclass(frozen=True, slots=True)
class _Shape:
    name: str
    fields: dict[int, _Field]


@cache
def shape_of(cls: type) -> _Shape:
    """The fields of a betterproto message class, as the check needs them (cached)."""
    meta = cls._betterproto  # type: ignore[attr-defined]
    hints = typing.get_type_hints(cls)
    fields: dict[int, _Field] = {}
    for field in dataclasses.fields(cls):
        info: betterproto.FieldMetadata | None = field.metadata.get("betterproto")
        if info is None:
            continue
        proto_type = info.proto_type
        nested = meta.cls_by_field.get(field.name)
        is_message = proto_type in (betterproto.TYPE_MESSAGE, betterproto.TYPE_MAP)
        fields[info.number] = _Field(
            name=field.name,
            proto_type=proto_type,
            wire=_WIRE_OF[proto_type],
            repeated=typing.get_origin(hints.get(field.name)) in (list, typing.List),  # noqa: UP006
            message=nested if is_message else None,
        )
    return _Shape(cls.__name__, fields)


def check(data: bytes, cls: type) -> bool:
    """Refuses `data` unless it is a valid, bounded encoding of message `cls` (see the
    module's docstring); returns whether a 32-bit field carried a wider value (`narrow`)."""
    walk = _Walk(data)
    walk.message(0, len(data), shape_of(cls), 1)
    return walk.wide


def varint_at(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it: at most 10 bytes, the 10th 0 or 1 (the
    value fits 64 bits), all before `end`. Shared with the batched path's hand decoders
    (`batch_request_codec`), which must refuse exactly what this check refuses."""
    value = shift = 0
    for i in range(pos, min(pos + 10, end)):
        byte = data[i]
        if i == pos + 9 and byte > 1:
            raise RequestRejected("a varint overflows 64 bits")
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    if pos + 10 <= end:
        raise RequestRejected("a varint is longer than 10 bytes")
    raise RequestRejected("the request ends inside a varint")


class _Walk:
    __slots__ = ("data", "fields", "packed_elements", "wide")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.fields = 0
        self.packed_elements = 0
        self.wide = False

    def count(self) -> None:
        self.fields += 1
        if self.fields > MAX_FIELDS:
            raise RequestRejected(f"the request has more than {MAX_FIELDS} fields")

    def count_packed(self, n: int) -> None:
        self.packed_elements += n
        if self.packed_elements > MAX_PACKED:
            raise RequestRejected(f"the request has more than {MAX_PACKED} packed elements")

    def varint(self, pos: int, end: int) -> tuple[int, int]:
        return varint_at(self.data, pos, end)

    def message(self, pos: int, end: int, shape: _Shape, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise RequestRejected(f"messages are nested more than {MAX_DEPTH} deep")
        while pos < end:
            key, pos = self.varint(pos, end)
            number, wire = key >> 3, key & 7
            if not 1 <= number <= MAX_FIELD_NUMBER:
                raise RequestRejected(f"invalid field number {number}")
            field = shape.fields.get(number)
            if field is not None and field.repeated and field.wire == wire != LEN:
                # An element of a repeated number sent unpacked: protobuf parsers must take
                # both encodings, so both count against the same limit.
                self.count_packed(1)
            else:
                self.count()
            if wire == VARINT:
                value, pos = self.varint(pos, end)
                if field is not None and field.proto_type in _NARROW and value >> 32:
                    self.wide = True
            elif wire == LEN:
                length, pos = self.varint(pos, end)
                start, pos = pos, pos + length
                if pos > end:
                    raise RequestRejected(f"a field of {shape.name} runs past its end")
                if field is not None and field.wire != LEN:
                    self.packed(start, pos, shape, field)
                elif field is not None:
                    self.value(start, pos, shape, field, depth)
                continue
            elif wire in _FIXED_SIZE:
                pos += _FIXED_SIZE[wire]
                if pos > end:
                    raise RequestRejected(f"a field of {shape.name} runs past its end")
            else:
                raise RequestRejected(f"invalid wire type {wire} (field {number})")
            if field is not None and field.wire != wire:
                raise _wrong_wire(shape, field, wire)

    def value(self, start: int, end: int, shape: _Shape, field: _Field, depth: int) -> None:
        if field.message is not None:
            self.message(start, end, shape_of(field.message), depth + 1)
        elif field.proto_type == betterproto.TYPE_STRING:
            try:
                self.data[start:end].decode()
            except UnicodeDecodeError:
                raise RequestRejected(
                    f"field {field.name} of {shape.name} is not valid UTF-8"
                ) from None

    def packed(self, start: int, end: int, shape: _Shape, field: _Field) -> None:
        """A packed repeated scalar: only a repeated numeric field may come length-delimited."""
        if not field.repeated:
            raise _wrong_wire(shape, field, LEN)
        if field.wire == VARINT and field.proto_type not in _NARROW:
            # An AckBatch's offsets: checked by one regular expression and counted by their
            # last bytes, at C speed (a Python loop per varint cost a fifth of the decoding).
            values = self.data[start:end]
            self.count_packed(len(values.translate(None, _CONTINUATION)))  # before the match
            if _PACKED_VARINTS.fullmatch(values) is None:
                raise RequestRejected(f"packed field {field.name} of {shape.name} is malformed")
        elif field.wire == VARINT:
            pos = start
            while pos < end:
                value, pos = self.varint(pos, end)
                self.count_packed(1)
                if field.proto_type in _NARROW and value >> 32:
                    self.wide = True
        else:
            size = _FIXED_SIZE[field.wire]
            if (end - start) % size:
                raise RequestRejected(f"packed field {field.name} of {shape.name} is cut short")
            self.count_packed((end - start) // size)


def _wrong_wire(shape: _Shape, field: _Field, wire: int) -> RequestRejected:
    return RequestRejected(
        f"field {field.name} of {shape.name} has wire type {wire}, "
        f"not {field.wire} as its type {field.proto_type} needs"
    )


def narrow(message: Any) -> None:
    """Cuts the 32-bit fields of a decoded message (and its nested ones) to 32 bits, as
    protobuf does when a client sends a wider varint; called only when `check` said so."""
    for field in shape_of(type(message)).fields.values():
        value = getattr(message, field.name, None)
        if field.message is not None:
            items = value.values() if isinstance(value, dict) else value
            for item in items if isinstance(value, list | dict) else [value]:
                if isinstance(item, betterproto.Message):
                    narrow(item)
        elif field.proto_type in _NARROW:
            if isinstance(value, list):
                setattr(message, field.name, [_cut(v, field.proto_type) for v in value])
            elif isinstance(value, int):
                setattr(message, field.name, _cut(value, field.proto_type))


def _cut(value: int, proto_type: str) -> Any:
    low = int(value) & 0xFFFF_FFFF
    if proto_type == betterproto.TYPE_UINT32:
        return low
    signed = low - (1 << 32) if low >> 31 else low  # an enum is an int32
    enum = type(value)
    return enum.try_value(signed) if issubclass(enum, betterproto.Enum) else signed

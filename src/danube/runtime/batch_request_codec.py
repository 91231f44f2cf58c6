"""Hand decoders for the batched path's two requests, `PublishBatch` and `AckBatchRequest`.

Issue 23, points 1–2, round 3. At 1,000 msg/s on the batched path, betterproto's decode of
these two messages (after `request_check` walked the same bytes once) was about 9 % of the
broker's GIL-holding samples (bench/RESULTS.md). Both are flat messages of a few scalars, a
string or two and (for the ack) packed offsets, so one walk can check and decode at once.

The guarantee is `request_check`'s, exactly: for any bytes, the decoder returns what
`check` + betterproto (+ `narrow`, which changes nothing here: no 32-bit field) would, or
refuses (`RequestRejected`, answered INVALID_ARGUMENT by `grpc_util.decode_request`) where
`check` would refuse. So the same varint rules (at most 10 bytes, the 10th 0 or 1; tags and
lengths too), field numbers 1 … 2^29-1, wire types 0, 1, 2, 5, a known field only in its
declared wire type (the offsets also packed), strings valid UTF-8, unknown fields skipped but
counted against `MAX_FIELDS`, offsets (packed or not) counted against `MAX_PACKED`. For
scalars the last occurrence wins, as in protobuf and betterproto. Offsets concatenate over
every occurrence, packed or not, as protobuf's parsers do; betterproto replaced the list with
each packed chunk (an empty one emptied it), so a batch sent in several chunks was only partly
acknowledged: there the decoder follows protobuf, not betterproto.
`tests/broker/test_batch_request_codec.py` checks the equivalence with hypothesis on arbitrary
and on structured, mutated bytes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from danube.runtime.request_check import (
    _CONTINUATION,
    _PACKED_VARINTS,
    MAX_FIELD_NUMBER,
    MAX_FIELDS,
    MAX_PACKED,
    RequestRejected,
    varint_at,
)

_VARINT, _LEN = 0, 2
_FIXED_SIZE = {1: 8, 5: 4}


@dataclass(slots=True)
class PublishBatchRequest:
    """A decoded `danube_ext.PublishBatch` (the attributes the handler and `auth` read)."""

    producer_id: int = 0
    topic_name: str = ""
    sequence: int = 0
    frame: bytes = b""


@dataclass(slots=True)
class AckBatchRequestDecoded:
    """A decoded `danube_ext.AckBatchRequest`."""

    request_id: int = 0
    topic_name: str = ""
    subscription_name: str = ""
    offsets: list[int] = field(default_factory=list)


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """As `request_check` (`varint_at`), with the one-byte varint, the common case, inline."""
    if pos < end:
        byte = data[pos]
        if byte < 0x80:
            return byte, pos + 1
    return varint_at(data, pos, end)


def _packed_varints(chunk: bytes) -> list[int]:
    """Canonical varints back to back (`_PACKED_VARINTS` matched them already)."""
    if chunk.isascii():  # every offset below 128: one byte each
        return list(chunk)
    values: list[int] = []
    value = shift = 0
    for byte in chunk:
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            values.append(value)
            value = shift = 0
        else:
            shift += 7
    return values


def _walk(
    data: bytes, name: str, wires: dict[int, int], strings: frozenset[int], repeated: int
) -> tuple[dict[int, Any], list[int]]:
    """The last value of each known field, and the values of the repeated varint field
    `repeated` (0: none) in order; refuses as `request_check.check` does."""
    values: dict[int, Any] = {}
    items: list[int] = []
    fields = packed = 0
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if not 1 <= number <= MAX_FIELD_NUMBER:
            raise RequestRejected(f"invalid field number {number}")
        expected = wires.get(number)
        if number == repeated and wire == _VARINT:
            packed += 1
            if packed > MAX_PACKED:
                raise RequestRejected(f"the request has more than {MAX_PACKED} packed elements")
        else:
            fields += 1
            if fields > MAX_FIELDS:
                raise RequestRejected(f"the request has more than {MAX_FIELDS} fields")
        if wire == _VARINT:
            value, pos = _varint(data, pos, end)
            if expected is None:
                continue
            if expected != _VARINT:
                raise _wrong_wire(name, number, wire)
            if number == repeated:
                items.append(value)
            else:
                values[number] = value
        elif wire == _LEN:
            length, pos = _varint(data, pos, end)
            start, pos = pos, pos + length
            if pos > end:
                raise RequestRejected(f"a field of {name} runs past its end")
            if expected is None:
                continue
            if expected != _LEN:
                if number != repeated:
                    raise _wrong_wire(name, number, wire)
                chunk = data[start:pos]
                packed += len(chunk.translate(None, _CONTINUATION))
                if packed > MAX_PACKED:
                    raise RequestRejected(f"the request has more than {MAX_PACKED} packed elements")
                if _PACKED_VARINTS.fullmatch(chunk) is None:
                    raise RequestRejected(
                        f"packed field {_NAMES[name, number]} of {name} is malformed"
                    )
                items += _packed_varints(chunk)
            elif number in strings:
                try:
                    values[number] = data[start:pos].decode()
                except UnicodeDecodeError:
                    raise _not_utf8(name, number) from None
            else:
                values[number] = data[start:pos]
        elif wire in _FIXED_SIZE:
            pos += _FIXED_SIZE[wire]
            if pos > end:
                raise RequestRejected(f"a field of {name} runs past its end")
            if expected is not None:
                raise _wrong_wire(name, number, wire)
        else:
            raise RequestRejected(f"invalid wire type {wire} (field {number})")
    return values, items


def _wrong_wire(name: str, number: int, wire: int) -> RequestRejected:
    field_name = _NAMES[name, number]
    return RequestRejected(f"field {field_name} of {name} has wire type {wire}, not its type's")


def _not_utf8(name: str, number: int) -> RequestRejected:
    return RequestRejected(f"field {_NAMES[name, number]} of {name} is not valid UTF-8")


_NAMES = {
    **{
        ("PublishBatch", number): field_name
        for number, field_name in enumerate(("producer_id", "topic_name", "sequence", "frame"), 1)
    },
    **{
        ("AckBatchRequest", number): field_name
        for number, field_name in enumerate(
            ("request_id", "topic_name", "subscription_name", "offsets"), 1
        )
    },
}
"""Field names for refusals, which name the field as `request_check`'s do."""

_PUBLISH_WIRES = {1: _VARINT, 2: _LEN, 3: _VARINT, 4: _LEN}
_PUBLISH_STRINGS = frozenset({2})
_ACK_WIRES = {1: _VARINT, 2: _LEN, 3: _LEN, 4: _VARINT}
_ACK_STRINGS = frozenset({2, 3})


def decode_publish_batch(data: bytes) -> PublishBatchRequest:
    """A `danube_ext.PublishBatch`: producer_id (1), topic_name (2), sequence (3), frame (4)."""
    values, _ = _walk(data, "PublishBatch", _PUBLISH_WIRES, _PUBLISH_STRINGS, 0)
    return PublishBatchRequest(
        values.get(1, 0), values.get(2, ""), values.get(3, 0), values.get(4, b"")
    )


def decode_ack_batch(data: bytes) -> AckBatchRequestDecoded:
    """A `danube_ext.AckBatchRequest`: request_id (1), topic_name (2), subscription_name (3),
    offsets (4, repeated uint64, packed or not)."""
    values, offsets = _walk(data, "AckBatchRequest", _ACK_WIRES, _ACK_STRINGS, 4)
    return AckBatchRequestDecoded(values.get(1, 0), values.get(2, ""), values.get(3, ""), offsets)


class PublishBatchWire:
    """Request type of `PublishBatches` for grpclib (`FromString`, the protobuf API it
    calls); `grpc_util.decode_request` answers a refusal INVALID_ARGUMENT."""

    FromString = staticmethod(decode_publish_batch)


class AckBatchRequestWire:
    """Request type of `AckBatch` for grpclib."""

    FromString = staticmethod(decode_ack_batch)

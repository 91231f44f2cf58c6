"""Published batches (spec/protocol.md, "Batched data path"): the numba source of the kernels
(`batches.py` holds their Python entry points): the check of every record of a client's
frame, and the stamping that turns it into the WAL frame the broker appends. Their oracles in
tests/kernels/ are the WAL's own frame encoder, the record codec
(`danube.machines.wal.format`, `danube.machines.wal.records`), the twin and google.protobuf's own
parser.

A batch is one WAL frame whose records are `danube.StreamMessage`s without `msg_id`. The
broker must know, without building a Python object per message, that each record is one every
Danube client's parser reads alike (spec/record-validity.md: the rules, the reason codes of
`danube.machines.wal.records`, the limits; `twins.check_records_py` is the plain-Python twin of the
check, `records.decode` accepts the same records), how large each payload is
(the namespace's `max_message_size`), and then append to each record the `msg_id` field that
names its producer, topic, broker and offset. A protobuf parser merges fields in any order, so
appending a field at a record's end is a valid encoding of the stamped message.

Both kernels take the frame as `bytes` (as the other kernels do); `stamp_frame` writes into a
fresh numpy array, so the one copy of the batch is the one that produces the stored frame.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from danube.kernels.jit_crc32c import _load_u32
from danube.kernels.record_fields import (
    _BAD_ENTRY,
    _BAD_TAG,
    _BAD_UTF8,
    _BAD_VARINT,
    _BAD_WIRE_TYPE,
    _MAX_ATTRIBUTES,
    _TOO_MANY_ATTRIBUTES,
    _TOO_MANY_FIELDS,
    _TRUNCATED,
    _WRONG_WIRE_TYPE,
    ATTRIBUTES_FIELD,
    BAD_MSG_ID,
    BAD_NONE,
    BATCH_FIELDS,
    MSG_ID_FIELD,
    PAYLOAD_FIELD,
)
from danube.kernels.twins import FRAME_HEADER, FRAME_MAGIC


@njit(cache=True, nogil=True, inline="always")
def _skip_varint(buf: memoryview, pos: int, end: int) -> int:
    """The position after a value varint; -TRUNCATED when cut short, -BAD_VARINT when it is
    not one every parser reads (over 10 bytes, or a 10th byte above 1: prost and Go refuse
    those, upb drops the bits)."""
    if pos < end and buf[pos] < 0x80:  # the common one-byte varint
        return pos + 1
    for size in range(10):
        if pos >= end:
            return -_TRUNCATED
        byte = buf[pos]
        pos += 1
        if size == 9:
            return pos if byte <= 1 else -_BAD_VARINT
        if byte < 0x80:
            return pos
    return -_BAD_VARINT  # unreachable: the 10th byte returns


@njit(cache=True, nogil=True, inline="always")
def _short_varint(buf: memoryview, pos: int, end: int, too_long: int) -> tuple[int, int]:
    """(value, next position) of a tag or a length, which upb refuses beyond 5 bytes; next
    position -TRUNCATED when cut short, -too_long when longer."""
    if pos < end and buf[pos] < 0x80:  # the common one-byte length
        return buf[pos], pos + 1
    value = 0
    for shift in range(0, 35, 7):
        if pos >= end:
            return 0, -_TRUNCATED
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
    return 0, -too_long


@njit(cache=True, nogil=True, inline="always")
def _tag(buf: memoryview, pos: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, next position) as upb reads a tag: at most 5 bytes, below
    2**32, a field number from 1; next position -reason otherwise, or for a wire type that is
    a group's (3, 4: refused) or none (6, 7)."""
    tag = buf[pos]  # callers call with pos < end
    if tag < 0x80:
        pos += 1
    else:
        tag, pos = _short_varint(buf, pos, end, _BAD_TAG)
        if pos < 0:
            return 0, 0, pos
    if tag > 0xFFFFFFFF or tag < 8:
        return 0, 0, -_BAD_TAG
    wire = tag & 7
    if wire != 0 and wire != 1 and wire != 2 and wire != 5:
        return 0, 0, -_BAD_WIRE_TYPE
    return tag >> 3, wire, pos


@njit(cache=True, nogil=True)
def _utf8_ok(buf: memoryview, pos: int, end: int) -> bool:
    """Whether bytes pos..end are UTF-8 (no overlongs, surrogates or values past U+10FFFF):
    a string field that is not would make every consumer's protobuf parser refuse the
    message, so it must never be stored."""
    while pos < end:
        byte = buf[pos]
        if byte < 0x80:
            pos += 1
            continue
        if 0xC2 <= byte <= 0xDF:
            size, low, high = 2, 0x80, 0xBF
        elif 0xE0 <= byte <= 0xEF:
            size = 3
            low = 0xA0 if byte == 0xE0 else 0x80
            high = 0x9F if byte == 0xED else 0xBF
        elif 0xF0 <= byte <= 0xF4:
            size = 4
            low = 0x90 if byte == 0xF0 else 0x80
            high = 0x8F if byte == 0xF4 else 0xBF
        else:
            return False
        if pos + size > end or not low <= buf[pos + 1] <= high:
            return False
        for i in range(2, size):
            if not 0x80 <= buf[pos + i] <= 0xBF:
                return False
        pos += size
    return True


_ANY_WIRE = -1


@njit(cache=True, nogil=True, inline="always")
def _wire_of(field: int) -> int:
    """The wire type a known `StreamMessage` field must have (prost refuses another; upb and
    Go would keep it as an unknown field); `_ANY_WIRE` for unknown fields."""
    if field == 1 or field == 4 or field == 8 or field == 9:
        return 0
    if field == 3 or field == 5 or field == 6 or field == 7 or field == 10:
        return 2
    return _ANY_WIRE


@njit(cache=True, nogil=True, inline="always")
def _skip(buf: memoryview, pos: int, end: int, wire: int) -> tuple[int, int]:
    """(position after the value, start of a length-delimited value); the position is
    -reason when the value is malformed or runs past `end`."""
    if wire == 0:
        return _skip_varint(buf, pos, end), pos
    if wire == 2:
        length, start = _short_varint(buf, pos, end, _BAD_VARINT)
        if start < 0:
            return start, pos
        if length > end - start:
            return -_TRUNCATED, pos
        return start + length, start
    width = 8 if wire == 1 else 4
    return (pos + width if pos + width <= end else -_TRUNCATED), pos


@njit(cache=True, nogil=True, inline="always")
def _entry_ok(buf: memoryview, pos: int, end: int, count: int) -> tuple[int, int]:
    """(BAD_* , fields counted) for an `attributes` map entry: only its key (1) and value (2),
    as UTF-8 strings. upb files an entry with any other field under the message's unknown
    fields (the attribute vanishes) where prost and Go keep it, so none is stored."""
    while pos < end:
        field, wire, pos = _tag(buf, pos, end)
        if pos < 0:
            return -pos, count
        count += 1
        if count > BATCH_FIELDS:
            return _TOO_MANY_FIELDS, count
        if (field != 1 and field != 2) or wire != 2:
            return _BAD_ENTRY, count
        after, start = _skip(buf, pos, end, wire)
        if after < 0:
            return -after, count
        if not _utf8_ok(buf, start, after):
            return _BAD_UTF8, count
        pos = after
    return BAD_NONE, count


@njit(cache=True, nogil=True)
def _record_ok(buf: memoryview, pos: int, end: int, payloads: np.ndarray, index: int) -> int:
    """BAD_* for one record (its first problem in byte order, each field checked whole: tag,
    field count, msg_id, wire type, attribute count, extent, contents); its payload size goes
    to `payloads[index]` (the last field 3 wins, as in protobuf)."""
    payloads[index] = 0
    count = 0
    attributes = 0
    while pos < end:
        field, wire, pos = _tag(buf, pos, end)
        if pos < 0:
            return -pos
        count += 1
        if count > BATCH_FIELDS:
            return _TOO_MANY_FIELDS
        if field == MSG_ID_FIELD:
            return BAD_MSG_ID
        expected = _wire_of(field)
        if expected != _ANY_WIRE and wire != expected:
            return _WRONG_WIRE_TYPE
        if field == ATTRIBUTES_FIELD:
            attributes += 1
            if attributes > _MAX_ATTRIBUTES:
                return _TOO_MANY_ATTRIBUTES
        after, start = _skip(buf, pos, end, wire)
        if after < 0:
            return -after
        if field == 5 or field == 6 or field == 10:
            if not _utf8_ok(buf, start, after):
                return _BAD_UTF8
        elif field == ATTRIBUTES_FIELD:
            bad, count = _entry_ok(buf, start, after, count)
            if bad != BAD_NONE:
                return bad
        elif field == PAYLOAD_FIELD:
            payloads[index] = after - start
        pos = after
    return BAD_NONE


@njit(cache=True, nogil=True)
def _check(
    buf: memoryview, count: int, payloads: np.ndarray, positions: np.ndarray
) -> tuple[int, int]:
    """Walks every record, noting where each starts (its length prefix). Returns (BAD_*,
    index of the first bad record)."""
    cursor = FRAME_HEADER
    for index in range(count):
        positions[index] = cursor
        size = _load_u32(buf, cursor)
        bad = _record_ok(buf, cursor + 4, cursor + 4 + size, payloads, index)
        if bad != BAD_NONE:
            return bad, index
        cursor += 4 + size
    return BAD_NONE, 0


@njit(cache=True, nogil=True, inline="always")
def _varint_size(value: int) -> int:
    size = 1
    while value > 0x7F or value < 0:
        value = (value >> 7) & 0x1FFFFFFFFFFFFFF
        size += 1
    return size


@njit(cache=True, nogil=True, inline="always")
def _put_varint(out: np.ndarray, pos: int, value: int) -> int:
    while value > 0x7F or value < 0:
        out[pos] = (value & 0x7F) | 0x80
        value = (value >> 7) & 0x1FFFFFFFFFFFFFF
        pos += 1
    out[pos] = value
    return pos + 1


@njit(cache=True, nogil=True, inline="always")
def _put_u32(out: np.ndarray, pos: int, value: int) -> None:
    out[pos] = value & 0xFF
    out[pos + 1] = (value >> 8) & 0xFF
    out[pos + 2] = (value >> 16) & 0xFF
    out[pos + 3] = (value >> 24) & 0xFF


@njit(cache=True, nogil=True, inline="always")
def _put_u64(out: np.ndarray, pos: int, value: int) -> None:
    for i in range(8):
        out[pos + i] = (value >> (8 * i)) & 0xFF


@njit(cache=True, nogil=True)
def _stamp(
    buf: np.ndarray,
    count: int,
    msg_id: memoryview,
    base: int,
    publish_ms: int,
    out: np.ndarray,
    positions: np.ndarray,
) -> int:
    """Writes the stamped frame into `out` (large enough: see `stamp_frame`); returns its
    length. `positions[i]` is where record i (its length prefix) starts in `out`."""
    fields = len(msg_id)
    src = FRAME_HEADER
    dst = FRAME_HEADER
    for index in range(count):
        size = _load_u32(buf, src)
        offset = base + index
        inner = fields + (1 + _varint_size(offset) if offset != 0 else 0)
        stamped = size + 1 + _varint_size(inner) + inner
        positions[index] = dst
        _put_u32(out, dst, stamped)
        out[dst + 4 : dst + 4 + size] = buf[src + 4 : src + 4 + size]
        pos = dst + 4 + size
        out[pos] = (MSG_ID_FIELD << 3) | 2
        pos = _put_varint(out, pos + 1, inner)
        for i in range(fields):
            out[pos + i] = msg_id[i]
        pos += fields
        if offset != 0:
            out[pos] = 5 << 3
            pos = _put_varint(out, pos + 1, offset)
        src += 4 + size
        dst = pos
    _put_u32(out, 4, dst)
    _put_u32(out, 8, FRAME_MAGIC)
    out[12] = 0
    out[13] = 0
    out[14] = count & 0xFF
    out[15] = (count >> 8) & 0xFF
    _put_u64(out, 16, base)
    _put_u64(out, 24, publish_ms)
    return dst

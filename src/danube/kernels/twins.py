"""Plain-Python versions of the kernels: the specification the numba kernels are tested
against (spec/wal-format.md), and a fallback that needs nothing compiled."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from danube.machines.wal import records as r
from danube.machines.wal.layout import (  # re-exported: the kernels' names for the layout
    CRC32C_POLY,
    FRAME_HEADER,
    FRAME_MAGIC,
    MAX_FRAME,
    MIN_FRAME,
)
from danube.values.frozen import fast_init

_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<IIIHHQQ")


def _table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ CRC32C_POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _table()


def crc32c_py(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C of `data`, continuing from a previous result `crc` (0 to start)."""
    crc ^= 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@fast_init
@dataclass(frozen=True, slots=True)
class FrameScan:
    """The valid prefix of a frame region and where each frame in it starts."""

    valid_end: int
    """Byte position just past the last valid frame (the scan's start if none)."""
    next_offset: int
    """One past the last valid record's offset (the expected base if no frame)."""
    positions: list[int]
    base_offsets: list[int]
    record_counts: list[int]


def frame_ok(buf: bytes | memoryview, pos: int, end: int) -> int:
    """The length of a frame at `pos` that passes every check but offset continuity, or 0."""
    if end - pos < FRAME_HEADER:
        return 0
    crc, length, magic, _flags, count, _base, _time = _HEAD.unpack_from(buf, pos)
    if magic != FRAME_MAGIC or not MIN_FRAME <= length <= MAX_FRAME or pos + length > end:
        return 0
    if count == 0 or crc32c_py(buf[pos + 4 : pos + length]) != crc:
        return 0
    cursor = pos + FRAME_HEADER
    for _ in range(count):
        if cursor + 4 > pos + length:
            return 0
        (size,) = _U32.unpack_from(buf, cursor)
        cursor += 4 + size
    return length if cursor == pos + length else 0


def scan_frames_py(buf: bytes | memoryview, start: int, end: int, expected_base: int) -> FrameScan:
    """Walks frames from `start` while each is valid and continues the offsets."""
    pos, next_offset = start, expected_base
    positions: list[int] = []
    bases: list[int] = []
    counts: list[int] = []
    while True:
        length = frame_ok(buf, pos, end)
        if not length:
            break
        _, _, _, _, count, base, _ = _HEAD.unpack_from(buf, pos)
        if base != next_offset:
            break
        positions.append(pos)
        bases.append(base)
        counts.append(count)
        next_offset = base + count
        pos += length
    return FrameScan(pos, next_offset, positions, bases, counts)


def find_frame_py(buf: bytes | memoryview, start: int, end: int) -> int:
    """The first position ≥ `start` where a valid frame starts, or -1: the torn-tail test."""
    for pos in range(start, end - FRAME_HEADER + 1):
        if frame_ok(buf, pos, end):
            return pos
    return -1


# -- the batch check (`danube.kernels.batches.check_records`) -----------------------------------


def _twin_varint(data: bytes, pos: int, end: int, most: int) -> tuple[int, int, int]:
    """(value, next position, bytes read) of a varint of at most `most` bytes; next position
    -1 when it is cut short, -2 when it goes on past `most` bytes."""
    value = 0
    for size in range(most):
        if pos >= end:
            return 0, -1, size
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << (7 * size)
        if byte < 0x80:
            return value, pos, size + 1
    return value, -2, most


def _twin_field(data: bytes, pos: int, end: int) -> tuple[int, int, int, int, int]:
    """(reason, field number, wire type, value start, value end) of the field at `pos`."""
    tag, pos, _ = _twin_varint(data, pos, end, 5)
    if pos == -1:
        return r.TRUNCATED, 0, 0, 0, 0
    if pos == -2 or tag > 0xFFFFFFFF or tag >> 3 == 0:
        return r.BAD_TAG, 0, 0, 0, 0
    number, wire = tag >> 3, tag & 7
    if wire not in (0, 1, 2, 5):
        return r.BAD_WIRE_TYPE, 0, 0, 0, 0
    if wire == 0:
        last = data[pos + 9] if pos + 9 < end else 0
        _, after, size = _twin_varint(data, pos, end, 10)
        if after == -1:
            return r.TRUNCATED, number, wire, 0, 0
        if size == 10 and (after == -2 or last > 1):
            return r.BAD_VARINT, number, wire, 0, 0
        return r.OK, number, wire, pos, after
    if wire == 2:
        length, start, _ = _twin_varint(data, pos, end, 5)
        if start == -1:
            return r.TRUNCATED, number, wire, 0, 0
        if start == -2:
            return r.BAD_VARINT, number, wire, 0, 0
        return (r.TRUNCATED if start + length > end else r.OK), number, wire, start, start + length
    after = pos + (8 if wire == 1 else 4)
    return (r.TRUNCATED if after > end else r.OK), number, wire, pos, after


def _twin_entry(record: bytes, pos: int, end: int, count: int, max_fields: int) -> tuple[int, int]:
    """(reason, fields counted) of an attributes entry: key (1) and value (2) strings only."""
    while pos < end:
        bad, number, wire, start, after = _twin_field(record, pos, end)
        if number == 0:  # the tag itself is bad
            return bad, count
        count += 1
        if count > max_fields:
            return r.TOO_MANY_FIELDS, count
        if number not in (1, 2) or wire != 2:
            return r.BAD_ENTRY, count
        if bad != r.OK:
            return bad, count
        try:
            record[start:after].decode()
        except UnicodeDecodeError:
            return r.BAD_UTF8, count
        pos = after
    return r.OK, count


def record_ok_py(record: bytes, max_fields: int) -> tuple[int, int]:
    """(reason, payload size) of one batch record: the spec of `kernels.batches._record_ok`,
    with the same first problem (fields in byte order, each checked whole: tag, field count,
    msg_id, wire type, attribute count, extent, contents)."""
    wires = {1: 0, 4: 0, 8: 0, 9: 0, 3: 2, 5: 2, 6: 2, 7: 2, 10: 2}
    pos, end, count, attributes, payload = 0, len(record), 0, 0, 0
    while pos < end:
        bad, number, wire, start, after = _twin_field(record, pos, end)
        if number == 0:  # the tag itself is bad
            return bad, 0
        count += 1
        if count > max_fields:
            return r.TOO_MANY_FIELDS, 0
        if number == 2:
            return r.HAS_MSG_ID, 0
        if wires.get(number, wire) != wire:
            return r.WRONG_WIRE_TYPE, 0
        if number == 7:
            attributes += 1
            if attributes > r.MAX_ATTRIBUTES:
                return r.TOO_MANY_ATTRIBUTES, 0
        if bad != r.OK:
            return bad, 0
        if number in (5, 6, 10):
            try:
                record[start:after].decode()
            except UnicodeDecodeError:
                return r.BAD_UTF8, 0
        elif number == 7:
            bad, count = _twin_entry(record, start, after, count, max_fields)
            if bad != r.OK:
                return bad, 0
        elif number == 3:
            payload = after - start
        pos = after
    return r.OK, payload


def check_records_py(frame: bytes, max_fields: int) -> tuple[int, int, list[int], list[int]]:
    """(reason, index of the first bad record, payload sizes, record positions) of a frame
    that passed `scan_frames`: the spec of `kernels.batches.check_records`, which stops at the
    first bad record (its payload size is then 0, the later ones unset: here absent)."""
    (count,) = struct.unpack_from("<H", frame, 14)
    cursor, payloads, positions = FRAME_HEADER, [], []
    for index in range(count):
        positions.append(cursor)
        (size,) = _U32.unpack_from(frame, cursor)
        bad, payload = record_ok_py(frame[cursor + 4 : cursor + 4 + size], max_fields)
        payloads.append(payload)
        if bad:
            return bad, index, payloads, positions
        cursor += 4 + size
    return 0, 0, payloads, positions

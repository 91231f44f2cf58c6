"""Plain-Python versions of the kernels: the specification the numba kernels are tested
against (spec/wal-format.md), and a fallback that needs nothing compiled."""

from __future__ import annotations

import struct
from dataclasses import dataclass

CRC32C_POLY = 0x82F63B78
FRAME_HEADER = 32
FRAME_MAGIC = 0x46574E44
MIN_FRAME = FRAME_HEADER + 4
MAX_FRAME = 64 * 1024 * 1024

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

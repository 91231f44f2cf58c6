"""The WAL frame scan, compiled with numba; twins: `twins.scan_frames_py`, `twins.find_frame_py`.

Recovery reads every byte of the newest segment (spec/wal-format.md, "Reading and recovery"):
`scan_frames` verifies the frames and builds the segment's offset index in one pass, computing
each frame's CRC32C inside the loop with `crc32c_update`, and `find_frame` is the torn-tail test
that looks for any valid frame after the first bad byte. The results equal the twins' for every
input the twins accept with `0 <= start` and `end <= len(buf)`; outside that the wrappers raise
ValueError instead of reading past the buffer.

Caching note: numba checks a cached kernel only against its own source file, so the cached frame
kernels keep the CRC32C code and loaders of `crc32c.py` they were compiled with. After editing
`crc32c.py`, delete `src/danube/kernels/__pycache__/frames.*.nb[ic]` (or touch this file).
"""

from __future__ import annotations

import struct

import numpy as np
from numba import njit

from danube.kernels.crc32c import (
    _load_u16,
    _load_u32,
    _load_u64,
    byte_view,
    crc32c,
    crc32c_update,
)
from danube.kernels.twins import FRAME_HEADER, FRAME_MAGIC, MAX_FRAME, MIN_FRAME, FrameScan

_U64 = 1 << 64
_I64_MIN = 1 << 63


@njit(cache=True, nogil=True, inline="always")
def _frame_ok(buf: memoryview, pos: int, end: int) -> int:
    """`twins.frame_ok`, in the spec's order. The CRC pass runs before the record-length walk
    on purpose: the walk is a chain of dependent loads one record apart, which misses the cache
    on every record of a cold frame (measured on a 64 MiB segment of 16-record frames of 1 KiB
    records: 8.5 GB/s walk first, ~10 GB/s CRC first); after the CRC pass, it hits the cache."""
    if end - pos < FRAME_HEADER:
        return 0
    if _load_u32(buf, pos + 8) != FRAME_MAGIC:
        return 0
    length = _load_u32(buf, pos + 4)
    if length < MIN_FRAME or length > MAX_FRAME or length > end - pos:
        return 0
    count = _load_u16(buf, pos + 14)
    if count == 0:
        return 0
    frame_end = pos + length
    if crc32c_update(buf, pos + 4, frame_end, 0) != _load_u32(buf, pos):
        return 0
    cursor = pos + FRAME_HEADER
    for _ in range(count):
        if cursor + 4 > frame_end:
            return 0
        cursor += 4 + _load_u32(buf, cursor)
    return length if cursor == frame_end else 0


@njit(cache=True, nogil=True)
def _scan(buf: memoryview, start: int, end: int, expected_bits: int) -> tuple[int, np.ndarray]:
    """Returns (valid_end, rows): one row (position, base offset as int64 bits, record count) per
    valid frame.

    Offsets are u64 on disk and compared as int64 bit patterns. A frame whose last offset is
    2**64 - 1 is the last one that can continue (Python's next offset, 2**64, matches no u64), so
    the walk stops after it. One 2-d array grown by an explicit loop, not three arrays grown by
    slice assignment: the same work then compiles in ~2 s instead of ~6 s."""
    capacity = 1024
    rows = np.empty((capacity, 3), dtype=np.int64)
    pos = start
    expected = expected_bits
    n = 0
    while True:
        length = _frame_ok(buf, pos, end)
        if length == 0:
            break
        base = _load_u64(buf, pos + 16)
        if base != expected:
            break
        count = _load_u16(buf, pos + 14)
        if n == capacity:
            capacity *= 2
            rows = _grow(rows, capacity)
        rows[n, 0] = pos
        rows[n, 1] = base
        rows[n, 2] = count
        n += 1
        pos += length
        expected = base + count
        if base < 0 <= expected:  # the u64 offset wrapped past 2**64 - 1
            break
    return pos, rows[:n]


@njit(cache=True, nogil=True)
def _grow(rows: np.ndarray, capacity: int) -> np.ndarray:
    bigger = np.empty((capacity, 3), dtype=np.int64)
    for i in range(rows.shape[0]):
        bigger[i, 0] = rows[i, 0]
        bigger[i, 1] = rows[i, 1]
        bigger[i, 2] = rows[i, 2]
    return bigger


_ONES = np.int64(0x0101010101010101)
_HIGHS = np.int64(-0x7F7F7F7F7F7F7F80)  # 0x8080808080808080 as int64 bits
_MAGIC_FIRST = np.int64(0x4444444444444444)  # FRAME_MAGIC's first byte, b"D", in every lane


@njit(cache=True, nogil=True)
def _find(buf: memoryview, start: int, end: int) -> int:
    """Tests 8 positions at a time for the frame magic's first byte (the SWAR zero-byte test on
    the bytes where their magic would be) and runs the full check only where it occurs: random
    or zeroed tails skip ~8 bytes per step instead of testing each position."""
    last = end - FRAME_HEADER
    pos = start
    while pos <= last:
        if pos + 7 <= last:
            lanes = _load_u64(buf, pos + 8) ^ _MAGIC_FIRST
            if (lanes - _ONES) & ~lanes & _HIGHS == 0:
                pos += 8
                continue
        stop = min(pos + 8, last + 1)
        while pos < stop:
            # The magic test again before the call: each call of an inlined function that takes
            # the array costs an atomic NRT incref/decref pair (measured 0.22 GB/s without it on
            # a tail of b"D" bytes).
            if _load_u32(buf, pos + 8) == FRAME_MAGIC and _frame_ok(buf, pos, end):
                return pos
            pos += 1
    return -1


def _bounds(view: memoryview, start: int, end: int) -> None:
    if start < 0 or end > len(view):
        raise ValueError(f"range {start}..{end} is outside the buffer of {len(view)} bytes")


SMALL_SCAN_BYTES = 1024
SMALL_FRAMES = 4
"""`scan_frames` walks a region of a `bytes` buffer of at most `SMALL_SCAN_BYTES` in Python,
up to `SMALL_FRAMES` frames, before it calls the kernel: a kernel call costs ~6 µs of
dispatch whatever the size, a frame walked here ~1.5 µs (its CRC by the `crc32c` kernel,
0.45 µs for bytes), so the objects and small segments of a simulated cluster (one to three
frames) scan in half the time. Larger regions (a WAL read of a lagging subscription: 9 and
more frames in 4 KiB and more) go to the kernel at once: a walk of their first frames was
pure overhead (measured 2-4 % of `python -m sim --seed 7 --rate 100`)."""
_HEAD = struct.Struct("<IIIHHQQ")
_U32 = struct.Struct("<I")


def scan_frames(
    buf: bytes | bytearray | memoryview, start: int, end: int, expected_base: int
) -> FrameScan:
    """Walks frames from `start` while each is valid and continues the offsets (one pass)."""
    if (
        end - start > SMALL_SCAN_BYTES
        or type(buf) is not bytes
        or start < 0
        or end > len(buf)
        or not 0 <= expected_base < _U64
    ):
        return scan_frames_compiled(buf, start, end, expected_base)
    pos, expected = start, expected_base
    positions: list[int] = []
    bases: list[int] = []
    counts: list[int] = []
    unpack, size_of = _HEAD.unpack_from, _U32.unpack_from
    for _ in range(SMALL_FRAMES):  # `twins.frame_ok`, in the kernel's order, with the CRC kernel
        if end - pos < FRAME_HEADER:
            return FrameScan(pos, expected, positions, bases, counts)
        crc, length, magic, _, count, base, _ = unpack(buf, pos)
        frame_end = pos + length
        if (
            magic != FRAME_MAGIC
            or not MIN_FRAME <= length <= MAX_FRAME
            or frame_end > end
            or count == 0
            or crc32c(buf[pos + 4 : frame_end]) != crc
        ):
            return FrameScan(pos, expected, positions, bases, counts)
        cursor = pos + FRAME_HEADER
        for _ in range(count):
            if cursor + 4 > frame_end:
                cursor = -1  # the records do not fit the frame
                break
            cursor += 4 + size_of(buf, cursor)[0]
        if cursor != frame_end or base != expected:
            return FrameScan(pos, expected, positions, bases, counts)
        positions.append(pos)
        bases.append(base)
        counts.append(count)
        pos, expected = frame_end, base + count
        if expected >= _U64:  # the u64 offsets end here: no frame can continue them
            return FrameScan(pos, expected, positions, bases, counts)
    rest = scan_frames_compiled(buf, pos, end, expected)
    return FrameScan(
        rest.valid_end,
        rest.next_offset,
        positions + rest.positions,
        bases + rest.base_offsets,
        counts + rest.record_counts,
    )


def scan_frames_compiled(
    buf: bytes | bytearray | memoryview, start: int, end: int, expected_base: int
) -> FrameScan:
    """`scan_frames` by the kernel alone, from the first frame (tested against the twin and
    against `scan_frames`)."""
    view = byte_view(buf)
    _bounds(view, start, end)
    if start >= end or not 0 <= expected_base < _U64:
        return FrameScan(start, expected_base, [], [], [])
    bits = expected_base - _U64 if expected_base >= _I64_MIN else expected_base
    valid_end, rows = _scan(view, start, end, bits)
    if not len(rows):
        return FrameScan(valid_end, expected_base, [], [], [])
    bases = rows[:, 1].astype(np.uint64).tolist()
    counts = rows[:, 2].tolist()
    return FrameScan(valid_end, bases[-1] + counts[-1], rows[:, 0].tolist(), bases, counts)


def find_frame(buf: bytes | bytearray | memoryview, start: int, end: int) -> int:
    """The first position ≥ `start` where a valid frame starts, or -1: the torn-tail test.

    Garbage is skipped 8 bytes at a time (see `_find`): several GB/s on random or zeroed tails,
    ~1 GB/s when nearly every byte is b"D", the magic's first one."""
    view = byte_view(buf)
    _bounds(view, start, end)
    if start >= end:
        return -1
    return int(_find(view, start, end))

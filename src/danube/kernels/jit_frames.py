"""The WAL frame scan: the numba source of the kernels (`frames.py` holds their Python entry
points); twins: `twins.scan_frames_py`, `twins.find_frame_py`.

Recovery reads every byte of the newest segment (spec/wal-format.md, "Reading and recovery"):
`_scan` verifies the frames and builds the segment's offset index in one pass, computing each
frame's CRC32C inside the loop with `crc32c_update`, and `_find` is the torn-tail test that looks
for any valid frame after the first bad byte. They check no bounds: the wrappers in `frames.py`
do.

Caching note: numba checks a cached kernel only against its own source file, so the cached frame
kernels keep the CRC32C code and loaders of `crc32c.py` they were compiled with. After editing
`jit_crc32c.py`, delete `src/danube/kernels/__pycache__/jit_frames.*.nb[ic]` (or touch this
file). The ahead-of-time build has no such gap: its key hashes every kernel source.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from danube.kernels.jit_crc32c import _load_u16, _load_u32, _load_u64, crc32c_update
from danube.kernels.twins import FRAME_HEADER, FRAME_MAGIC, MAX_FRAME, MIN_FRAME


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

"""The WAL frame scan's entry points (spec/wal-format.md, "Reading and recovery"): `scan_frames`
verifies the frames and builds the segment's offset index in one pass, `find_frame` is the
torn-tail test. The kernels are `jit_frames._scan` and `_find`, run from the build
`danube.kernels.loaded` chose (ahead of time, or numba's JIT); twins: `twins.scan_frames_py`,
`twins.find_frame_py`. The results equal the twins' for every input the twins accept with
`0 <= start` and `end <= len(buf)`; outside that these wrappers raise ValueError instead of
letting a kernel read past the buffer. This module imports no numba."""

from __future__ import annotations

import struct

import numpy as np

from danube.kernels import loaded
from danube.kernels.crc32c import byte_view, crc32c
from danube.kernels.twins import FRAME_HEADER, FRAME_MAGIC, MAX_FRAME, MIN_FRAME, FrameScan

_U64 = 1 << 64
_I64_MIN = 1 << 63


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
    valid_end, rows = loaded.ACTIVE.scan(view, start, end, bits)
    if not len(rows):
        return FrameScan(valid_end, expected_base, [], [], [])
    bases = rows[:, 1].astype(np.uint64).tolist()
    counts = rows[:, 2].tolist()
    return FrameScan(valid_end, bases[-1] + counts[-1], rows[:, 0].tolist(), bases, counts)


def find_frame(buf: bytes | bytearray | memoryview, start: int, end: int) -> int:
    """The first position ≥ `start` where a valid frame starts, or -1: the torn-tail test.

    Garbage is skipped 8 bytes at a time (see `jit_frames._find`): several GB/s on random or
    zeroed tails, ~1 GB/s when nearly every byte is b"D", the magic's first one."""
    view = byte_view(buf)
    _bounds(view, start, end)
    if start >= end:
        return -1
    return int(loaded.ACTIVE.find(view, start, end))

"""The numba frame scan and torn-tail search against their plain-Python twins (the oracle), on
valid segments built with `danube.machines.wal.format.encode_frame` and on damaged ones."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.kernels import crc32c, find_frame, find_frame_py, scan_frames, scan_frames_py
from danube.kernels.frames import scan_frames_compiled
from danube.kernels.twins import FRAME_MAGIC, MAX_FRAME, crc32c_py
from danube.machines.wal.format import encode_frame

pytestmark = pytest.mark.usefixtures("kernel_build")
"""Every test over both builds of the kernels (`conftest.kernel_build`)."""

U64 = 1 << 64
RECORDS = st.lists(st.binary(max_size=200), min_size=1, max_size=5)
FRAMES = st.lists(RECORDS, max_size=8)
PREFIX = st.binary(max_size=48)
"""Stands in for the segment header: frames start at an arbitrary position."""
BASES = st.integers(0, 2**40) | st.integers(2**63 - 10, 2**63 + 10) | st.just(U64 - 40)


def build(prefix: bytes, frames: list[list[bytes]], base: int) -> bytes:
    out = bytearray(prefix)
    for records in frames:
        out += encode_frame(base, 1_700_000_000_000, records)
        base += len(records)
    return bytes(out)


def check(buf: bytes | bytearray | memoryview, start: int, end: int, base: int) -> None:
    """Both kernels equal their twins, including find_frame from where the scan stopped."""
    got = scan_frames(buf, start, end, base)
    assert got == scan_frames_py(buf, start, end, base)
    assert got == scan_frames_compiled(buf, start, end, base)  # the kernel from the start
    if isinstance(buf, memoryview | bytearray):  # and the small-buffer walk of `bytes`
        assert scan_frames(bytes(buf), start, end, base) == got
    assert find_frame(buf, start, end) == find_frame_py(buf, start, end)
    assert find_frame(buf, got.valid_end, end) == find_frame_py(buf, got.valid_end, end)
    if got.valid_end < end:
        after = got.valid_end + 1
        assert find_frame(buf, after, end) == find_frame_py(buf, after, end)


def forged(count: int, sizes: list[int], body: bytes, length: int | None, base: int) -> bytes:
    """A frame with a correct CRC whose other fields need not agree: the checks after the CRC
    (records fill the frame, count ≥ 1, length bounds) are only reachable this way."""
    records = b"".join(struct.pack("<I", size) for size in sizes) + body
    frame_length = 32 + len(records) if length is None else length
    tail = struct.pack("<IIHHQQ", frame_length, FRAME_MAGIC, 0, count, base, 0) + records
    return struct.pack("<I", crc32c_py(tail)) + tail


@settings(max_examples=150, deadline=None)
@given(prefix=PREFIX, frames=FRAMES, base=BASES, kind=st.sampled_from(["bytes", "ba", "mv"]))
def test_valid_segments(prefix: bytes, frames: list[list[bytes]], base: int, kind: str) -> None:
    buf = build(prefix, frames, base)
    typed = {"bytes": buf, "ba": bytearray(buf), "mv": memoryview(buf)}[kind]
    scan = scan_frames(typed, len(prefix), len(buf), base)
    assert scan.valid_end == len(buf)
    assert scan.record_counts == [len(records) for records in frames]
    check(typed, len(prefix), len(buf), base)


@settings(max_examples=40, deadline=None)
@given(frames=st.lists(RECORDS, min_size=1, max_size=4), base=BASES)
def test_truncation_at_every_position(frames: list[list[bytes]], base: int) -> None:
    buf = build(b"H" * 8, frames, base)
    for cut in range(8, len(buf) + 1):
        check(buf[:cut], 8, cut, base)
        check(buf, 8, cut, base)  # the same through `end` instead of a shorter buffer


@settings(max_examples=150, deadline=None)
@given(prefix=PREFIX, frames=st.lists(RECORDS, min_size=1, max_size=5), base=BASES, data=st.data())
def test_single_bit_flips(
    prefix: bytes, frames: list[list[bytes]], base: int, data: st.DataObject
) -> None:
    buf = bytearray(build(prefix, frames, base))
    bit = data.draw(st.integers(0, 8 * len(buf) - 1))
    buf[bit // 8] ^= 1 << (bit % 8)
    check(buf, len(prefix), len(buf), base)


@settings(max_examples=150, deadline=None)
@given(
    frames=FRAMES,
    base=BASES,
    tail=st.binary(max_size=300)
    | st.integers(0, 300).map(bytes)
    | st.binary(max_size=64).map(lambda b: b + struct.pack("<II", 100, FRAME_MAGIC) + b"\0" * 40),
    then_valid=st.booleans(),
)
def test_garbage_and_zero_tails(
    frames: list[list[bytes]], base: int, tail: bytes, then_valid: bool
) -> None:
    """A torn tail, and (then_valid) a valid frame after it: the corruption case."""
    buf = build(b"", frames, base) + tail
    if then_valid:
        buf += encode_frame((base + 1000) % U64, 0, [b"after"])
    check(buf, 0, len(buf), base)


@settings(max_examples=100, deadline=None)
@given(frames=st.lists(RECORDS, min_size=2, max_size=6), base=BASES, data=st.data())
def test_frames_with_wrong_base_offsets(
    frames: list[list[bytes]], base: int, data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, len(frames) - 1))
    wrong = data.draw(st.integers(0, U64 - 1))
    buf = bytearray()
    offset = base
    for i, records in enumerate(frames):
        buf += encode_frame(wrong if i == index else offset, 0, records)
        offset += len(records)
    check(buf, 0, len(buf), base)
    check(buf, 0, len(buf), data.draw(st.integers(0, U64 - 1)))


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(0, 4),
    sizes=st.lists(st.integers(0, 40) | st.integers(0, 2**32 - 1), max_size=4),
    body=st.binary(max_size=80),
    length=st.none() | st.integers(0, 200) | st.just(MAX_FRAME + 1),
    base=st.integers(0, 3),
)
def test_forged_frames_with_valid_crc(
    count: int, sizes: list[int], body: bytes, length: int | None, base: int
) -> None:
    frame = forged(count, sizes, body, length, base)
    buf = encode_frame(0, 0, [b"first"]) + frame + b"\0" * 16 + frame
    check(buf, 0, len(buf), 0)


def test_offsets_at_the_top_of_u64() -> None:
    """Python offsets do not wrap: after a frame ending at 2**64 - 1 nothing continues, even a
    frame with base 0 (which a wrapping u64 counter would accept)."""
    top = build(b"", [[b"a", b"b"], [b"c"]], U64 - 3) + encode_frame(0, 0, [b"d"])
    scan = scan_frames(top, 0, len(top), U64 - 3)
    assert scan == scan_frames_py(top, 0, len(top), U64 - 3)
    assert scan.next_offset == U64
    assert scan.base_offsets == [U64 - 3, U64 - 1]
    check(top, 0, len(top), U64 - 3)


@pytest.mark.parametrize("expected", [-1, U64, U64 + 5])
def test_expected_base_outside_u64_matches_nothing(expected: int) -> None:
    buf = build(b"", [[b"a"]], 0)
    assert scan_frames(buf, 0, len(buf), expected) == scan_frames_py(buf, 0, len(buf), expected)


@pytest.mark.parametrize(("start", "end"), [(5, 5), (9, 3), (30, 31)])
def test_empty_and_inverted_ranges(start: int, end: int) -> None:
    buf = build(b"", [[b"abc"]], 0)
    check(buf, start, end, 0)


@pytest.mark.parametrize(("start", "end"), [(-1, 10), (0, 10_000)])
def test_ranges_outside_the_buffer_raise(start: int, end: int) -> None:
    buf = build(b"", [[b"abc"]], 0)
    with pytest.raises(ValueError):
        scan_frames(buf, start, end, 0)
    with pytest.raises(ValueError):
        find_frame(buf, start, end)


def test_a_larger_segment_with_damage_in_the_middle() -> None:
    """Past the scan's first index capacity (1,024 frames), then a flipped bit halfway."""
    rng = random.Random(11)
    frames = [[rng.randbytes(rng.randrange(0, 3000)) for _ in range(rng.randrange(1, 9))]]
    frames += [[rng.randbytes(rng.randrange(0, 3000))] for _ in range(300)]
    frames += [[rng.randbytes(rng.randrange(0, 20))] * rng.randrange(1, 4) for _ in range(2500)]
    buf = bytearray(build(b"", frames, 77))
    whole = scan_frames(buf, 0, len(buf), 77)
    assert whole == scan_frames_py(buf, 0, len(buf), 77)
    assert len(whole.positions) == len(frames)
    buf[len(buf) // 2] ^= 0x10
    check(buf, 0, len(buf), 77)
    assert find_frame(buf, scan_frames(buf, 0, len(buf), 77).valid_end, len(buf)) > 0


def test_a_frame_one_byte_over_the_limit_is_rejected_despite_a_valid_crc() -> None:
    """64 MiB + 1 byte, records filling it, CRC right: only the length bound rejects it. (The
    twin's find_frame would take minutes here, so the search result is asserted directly.)"""
    length = MAX_FRAME + 1
    tail = bytearray(struct.pack("<IIHHQQ", length, FRAME_MAGIC, 0, 1, 0, 0))
    tail += struct.pack("<I", length - 36) + bytes(length - 36)
    buf = struct.pack("<I", crc32c(tail)) + bytes(tail)
    assert scan_frames(buf, 0, len(buf), 0) == scan_frames_py(buf, 0, len(buf), 0)
    assert scan_frames(buf, 0, len(buf), 0).valid_end == 0
    assert find_frame(buf, 0, len(buf)) == -1

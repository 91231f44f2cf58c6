"""Published batches: from the frame a client sends to the frame the WAL appends
(spec/protocol.md, "Batched data path"). Pure: bytes in, bytes and numbers out.

A batch costs the broker a fixed number of kernel calls, whatever its size: `check_batch`
verifies the frame's CRC and structure (`scan_frames`) and walks every record's fields
(`check_records`); `stamp` writes the stored frame. Records become Python objects only when a
reader asks for one (`PackedRecords.__getitem__`), never on the way to the disk.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from danube.kernels import crc32c, scan_frames
from danube.kernels.batches import (
    BAD_NONE,
    STAMP_ROOM,
    check_records,
    refusal,
    stamp_frame,
)
from danube.kernels.twins import FRAME_HEADER, FRAME_MAGIC, MAX_FRAME
from danube.machines.wal.records import msg_id_fields
from danube.values.errors import invalid
from danube.values.frozen import fast_init

_HEAD = struct.Struct("<IIIHHQQ")
_U32 = struct.Struct("<I")


@fast_init
@dataclass(frozen=True, slots=True)
class ClientBatch:
    """A client's frame that passed every check: safe to stamp and store."""

    frame: bytes
    count: int
    payload_sizes: np.ndarray
    positions: np.ndarray
    """Where each record (its length prefix) starts in `frame`."""

    @property
    def payload_bytes(self) -> int:
        # A batch holds a few sizes: numpy's `sum` costs its call layers (2-3 µs) on them,
        # Python's on the list a tenth of that (every batch published pays it).
        return sum(self.payload_sizes.tolist())

    def largest_payload(self) -> tuple[int, int]:
        """(index, size) of the largest payload: the first of equals, as `argmax` gives."""
        sizes = self.payload_sizes.tolist()
        size = max(sizes)
        return sizes.index(size), size


def check_batch(frame: bytes) -> ClientBatch:
    """Raises INVALID_ARGUMENT, saying what is wrong, unless `frame` is exactly one valid WAL
    frame with base offset 0 whose records are `StreamMessage`s without a `msg_id` that every
    Danube client parses (spec/record-validity.md)."""
    scan = scan_frames(frame, 0, len(frame), 0)
    if len(scan.positions) != 1 or scan.valid_end != len(frame):
        raise invalid(f"the batch is not one valid frame: {_diagnose(frame)}")
    bad, index, payloads, positions = check_records(frame)
    if bad != BAD_NONE:
        raise invalid(f"message {index} of the batch {refusal(bad)}")
    return ClientBatch(frame, len(payloads), payloads, positions)


def _diagnose(frame: bytes) -> str:
    """Why `scan_frames` refused a frame, for the error a client sees (off the hot path)."""
    if len(frame) < FRAME_HEADER:
        return f"{len(frame)} bytes is shorter than a frame header ({FRAME_HEADER})"
    crc, length, magic, _, count, base, _ = _HEAD.unpack_from(frame)
    if magic != FRAME_MAGIC:
        return "bad frame magic"
    if length != len(frame):
        return f"its length field says {length} bytes but the batch has {len(frame)}"
    if count == 0:
        return "it holds no records"
    if crc32c(memoryview(frame)[4:]) != crc:
        return "CRC32C mismatch (damaged, or not computed over bytes 4 to the end)"
    if base != 0:
        return f"its base offset is {base}, not 0"
    return "its record lengths do not fill the frame exactly"


class PackedRecords(Sequence[bytes]):
    """A stored frame's records, read on demand from the frame and an index of positions."""

    __slots__ = ("count", "first_offset", "frame", "positions", "record_bytes")

    def __init__(self, frame: bytes, positions: np.ndarray, first_offset: int) -> None:
        self.frame = frame
        self.positions = positions
        self.first_offset = first_offset
        self.count = len(positions)
        self.record_bytes = len(frame) - FRAME_HEADER - 4 * self.count

    def __len__(self) -> int:
        return self.count

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(index)
        start = int(self.positions[index])
        (size,) = _U32.unpack_from(self.frame, start)
        return self.frame[start + 4 : start + 4 + size]

    def __iter__(self) -> Iterator[bytes]:
        return (self[i] for i in range(self.count))


def stamp(
    batch: ClientBatch,
    first_offset: int,
    publish_ms: int,
    producer_id: int,
    topic: str,
    broker_addr: str,
) -> PackedRecords:
    """The frame to append at `first_offset`: each record with its msg_id, as delivered.
    Raises INVALID_ARGUMENT when the stamped frame would exceed the largest frame."""
    fields = msg_id_fields(producer_id, topic, broker_addr)
    if len(batch.frame) + batch.count * (STAMP_ROOM + len(fields)) > MAX_FRAME:
        raise invalid(f"the batch would exceed the largest frame ({MAX_FRAME} bytes) once stored")
    frame, positions = stamp_frame(batch.frame, fields, first_offset, publish_ms)
    return PackedRecords(frame, positions, first_offset)

"""The WAL's durable high-water mark: one small file per topic directory, `wal.checkpoint`
(spec/wal-format.md "Checkpoint"). Pure encoding and decoding; the drivers write it.

It answers the question a damaged newest segment raises at recovery: were the offsets of the
frame that fails its checks ever durable (and so perhaps acknowledged)? A torn write after a
crash was never fsynced, so it lies beyond the checkpoint; a frame the checkpoint covers was
durable, and its damage is loss of data, not a torn tail.

Two 32-byte slots, written alternately (the slot is `sequence % 2`) with one pwrite and one
fdatasync each, never renamed: a write torn by a crash spoils only the slot it wrote, and the
other still holds the previous mark. A reader takes the valid slot with the highest sequence.
A mark only ever says "at least this much was durable", so an older mark is safe, only
weaker evidence.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from danube.kernels import crc32c

CHECKPOINT_NAME = "wal.checkpoint"
CHECKPOINT_MAGIC = b"DWCK"
CHECKPOINT_VERSION = 1
SLOT = struct.Struct("<4sHHQQI4x")
"""magic, version, reserved, sequence, durable end (one past the last durable offset), CRC32C
of the 24 bytes before it, padding."""
SLOT_SIZE = SLOT.size
SLOTS = 2


@dataclass(frozen=True, slots=True)
class Checkpoint:
    sequence: int
    """Counts the marks written to this file; the higher of two valid slots wins."""
    durable_end: int
    """Every offset below this was covered by a completed fsync when the mark was written."""

    @property
    def slot(self) -> int:
        return self.sequence % SLOTS

    @property
    def position(self) -> int:
        """Byte position of the slot this mark is written to."""
        return self.slot * SLOT_SIZE


def encode_checkpoint(mark: Checkpoint) -> bytes:
    """The 32 bytes of `mark`'s slot."""
    head = SLOT.pack(CHECKPOINT_MAGIC, CHECKPOINT_VERSION, 0, mark.sequence, mark.durable_end, 0)
    crc = crc32c(head[:24])
    return head[:24] + struct.pack("<I", crc) + head[28:]


def _decode_slot(data: bytes | memoryview, position: int) -> Checkpoint | None:
    if len(data) < position + SLOT_SIZE:
        return None
    magic, version, _, sequence, end, crc = SLOT.unpack_from(data, position)
    if magic != CHECKPOINT_MAGIC or version != CHECKPOINT_VERSION:
        return None
    if crc32c(bytes(data[position : position + 24])) != crc:
        return None
    if sequence % SLOTS != position // SLOT_SIZE:
        return None
    return Checkpoint(sequence, end)


def decode_checkpoint(data: bytes | memoryview) -> Checkpoint | None:
    """The newest valid mark in the file's bytes, or None when no slot is valid (a file whose
    first write was torn by a crash: nothing was marked yet)."""
    marks = [_decode_slot(data, slot * SLOT_SIZE) for slot in range(SLOTS)]
    valid = [mark for mark in marks if mark is not None]
    return max(valid, key=lambda mark: mark.sequence, default=None)


def next_mark(previous: Checkpoint | None, durable_end: int) -> Checkpoint:
    """The mark that records `durable_end` after `previous` (into the other slot)."""
    return Checkpoint(0 if previous is None else previous.sequence + 1, durable_end)

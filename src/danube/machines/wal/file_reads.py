"""Reading records back from a WAL segment's bytes: the plan `WalMachine.read` or
`plan_frames` returns for a file range (`FileRead`) and the decoders that verify what the
driver read (`decode_file_read`, `frames_of_file_read`). Apart from the machine because they
run in the driver's worker, on bytes, without the machine's state (and to keep the machine's
module within the size cap); `danube.machines.wal.machine` re-exports all three."""

from __future__ import annotations

from dataclasses import dataclass

from danube.kernels import scan_frames
from danube.machines.wal import format


@dataclass(frozen=True, slots=True)
class FileRead:
    """Read bytes [`start`, `end`) of the segment and pass them to `decode_file_read`.

    `start` is the frame boundary of a sparse-index entry whose frame begins at
    `start_offset` ≤ `from_offset`; `end` is a frame boundary within readable data. The
    records wanted are `from_offset` up to (not including) `end_offset`. `end` honours the
    read's `max_bytes` only at index granularity: the range may exceed it by up to
    `index_interval_bytes` plus one frame. If the file is gone (retention deleted it
    meanwhile), call `read` again."""

    segment_base: int
    start: int
    end: int
    start_offset: int
    from_offset: int
    end_offset: int


def decode_file_read(plan: FileRead, data: bytes | memoryview) -> tuple[bytes, ...]:
    """The records a `FileRead` asked for, from the bytes it named; verifies every frame's CRC
    and offsets on the way, so a segment damaged after recovery is reported, not served."""
    scan = scan_frames(data, 0, len(data), plan.start_offset)
    if scan.valid_end != len(data) or scan.next_offset < plan.end_offset:
        raise format.WalFormatError(
            f"segment {format.segment_name(plan.segment_base)} is damaged at byte "
            f"{plan.start + scan.valid_end}: a frame read back does not verify"
        )
    records: list[bytes] = []
    for position, base, count in zip(
        scan.positions, scan.base_offsets, scan.record_counts, strict=True
    ):
        first, last = max(plan.from_offset - base, 0), min(plan.end_offset - base, count)
        if first < last:
            records.extend(format.decode_frame(data, position).records[first:last])
    return tuple(records)


def frames_of_file_read(plan: FileRead, data: bytes | memoryview) -> tuple[bytes, int]:
    """The whole frames of a `WalMachine.plan_frames` read, from the one starting at
    `plan.from_offset` on, unchanged (replication resends the owner's bytes), with the end of
    the records they hold. Verifies every frame like `decode_file_read`; a `from_offset` that
    is not a frame's first offset is a caller's bug."""
    scan = scan_frames(data, 0, len(data), plan.start_offset)
    if scan.valid_end != len(data) or scan.next_offset < plan.end_offset:
        raise format.WalFormatError(
            f"segment {format.segment_name(plan.segment_base)} is damaged at byte "
            f"{plan.start + scan.valid_end}: a frame read back does not verify"
        )
    for position, base in zip(scan.positions, scan.base_offsets, strict=True):
        if base == plan.from_offset:
            return bytes(data[position:]), scan.next_offset
        if base > plan.from_offset:
            break
    raise ValueError(f"offset {plan.from_offset} does not start a frame of the range read")

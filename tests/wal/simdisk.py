"""A simulated disk for the WAL tests, and a driver that runs a `WalMachine` on it.

Each segment file has two layers: `cache`, what a process reads (the OS page cache), and
`durable`, what survives a power failure. `Write` appends to the cache, `Fsync` copies the
cache to the durable layer. A process crash keeps both; a power failure keeps the durable
bytes plus any prefix of the unsynced ones (a torn tail). Creating, deleting and truncating
files are durable at once (the real driver fsyncs the directory where it matters).

The disk also checks the driver contract the machine relies on: writes are sequential, no
write reaches a closed segment, and a segment is closed only when all of it is durable.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

from danube.kernels import scan_frames
from danube.machines.wal import format
from danube.machines.wal.machine import (
    CloseSegment,
    CreateSegment,
    DeleteSegment,
    Effect,
    FileRead,
    Fsync,
    WalMachine,
    Write,
    decode_file_read,
)
from danube.machines.wal.recovery import (
    RecoveryAction,
    SyncSegment,
    TruncateSegment,
    UnreadableSegment,
)
from spec.models.wal_model import Crash

TOPIC = "/default/wal-test"
_U64 = struct.Struct("<Q")


def frame_offsets(data: bytes, position: int) -> list[tuple[int, range]]:
    """(end position, offsets) of each frame in `data`, written at `position` of a file."""
    if not data:
        return []
    scan = scan_frames(data, 0, len(data), _U64.unpack_from(data, 16)[0])
    assert scan.valid_end == len(data), "a Write must carry whole, valid frames"
    ends = [*scan.positions[1:], len(data)]
    return [
        (position + end, range(base, base + count))
        for end, base, count in zip(ends, scan.base_offsets, scan.record_counts, strict=True)
    ]


@dataclass
class SimFile:
    cache: bytearray
    durable: bytearray
    closed: bool = False
    frames: list[tuple[int, range]] = field(default_factory=list)
    """Frames whose write completed: (end position, offsets)."""

    def offsets_within(self, size: int) -> list[int]:
        return [o for end, offsets in self.frames if end <= size for o in offsets]


class SimDisk:
    def __init__(self) -> None:
        self.files: dict[int, SimFile] = {}

    def create(self, base: int, header: bytes) -> None:
        """Create-or-replace; only a file that recovery found without frames is replaced."""
        assert base not in self.files or not self.frames_of(base), f"{base} created twice"
        self.files[base] = SimFile(bytearray(header), bytearray(header))

    def create_torn(self, base: int, header: bytes, keep: int) -> None:
        """The process died inside CreateSegment. A driver that creates the file in place
        (no rename) leaves part of the header; a replacement leaves the old file."""
        if base not in self.files:
            self.files[base] = SimFile(bytearray(header[:keep]), bytearray(header[:keep]))

    def frames_of(self, base: int) -> list[int]:
        """Positions of the valid frames of a file ([] for an unreadable header)."""
        try:
            return format.scan_segment(bytes(self.files[base].cache)).positions
        except format.WalFormatError:
            return []

    def write(self, effect: Write) -> list[int]:
        """Applies a completed write; returns the offsets it holds."""
        file = self._writable(effect)
        file.cache += effect.data
        frames = frame_offsets(effect.data, effect.position)
        file.frames += frames
        return [o for _, offsets in frames for o in offsets]

    def write_prefix(self, effect: Write, keep: int) -> None:
        """An interrupted or failed write: only its first `keep` bytes reached the cache."""
        self._writable(effect).cache += effect.data[:keep]

    def _writable(self, effect: Write) -> SimFile:
        file = self.files[effect.segment_base]
        assert not file.closed, f"write to closed segment {effect.segment_base}"
        assert effect.position == len(file.cache), "writes must be sequential"
        return file

    def fsync(self, base: int) -> list[int]:
        """Makes the segment durable; returns every offset now on disk in it."""
        file = self.files[base]
        file.durable = bytearray(file.cache)
        return file.offsets_within(len(file.durable))

    def close(self, base: int) -> None:
        file = self.files[base]
        assert file.durable == file.cache, f"segment {base} closed before it was durable"
        file.closed = True

    def delete(self, base: int) -> None:
        del self.files[base]

    def truncate(self, base: int, size: int) -> None:
        file = self.files[base]
        del file.cache[size:], file.durable[size:]
        file.frames = [(end, offsets) for end, offsets in file.frames if end <= size]

    def crash(self, crash: Crash, rng: random.Random) -> None:
        """The broker dies. Every file is closed; after a power failure each keeps its durable
        bytes and a random prefix of the rest."""
        for file in self.files.values():
            if crash is Crash.POWER:
                assert file.cache.startswith(file.durable)
                extra = len(file.cache) - len(file.durable)
                file.durable = file.cache[: len(file.durable) + rng.randint(0, extra)]
                file.cache = bytearray(file.durable)
            file.closed = True
            file.frames = []

    # -- recovery -------------------------------------------------------------------------------

    def scans(self) -> list[tuple[int, format.SegmentScan | UnreadableSegment]]:
        found: list[tuple[int, format.SegmentScan | UnreadableSegment]] = []
        for base, file in self.files.items():
            try:
                found.append((base, format.scan_segment(bytes(file.cache))))
            except format.WalFormatError as exc:
                found.append((base, UnreadableSegment(len(file.cache), str(exc))))
        return found

    def apply(self, action: RecoveryAction) -> None:
        match action:
            case TruncateSegment(segment_base=base, size=size):
                self.truncate(base, size)
            case SyncSegment(segment_base=base):
                self.fsync(base)

    def records(self) -> tuple[int | None, list[bytes]]:
        """Every record in the files after recovery, in order, with the first offset (None if
        there is no file). Only the newest file may be without frames (and then torn)."""
        records: list[bytes] = []
        newest = max(self.files, default=None)
        for base in sorted(self.files):
            positions = self.frames_of(base)
            if not positions:
                assert base == newest, f"segment {base} holds no frame"
                continue
            data = bytes(self.files[base].cache)
            assert format.scan_segment(data).state is format.SegmentState.WHOLE
            for position in positions:
                records.extend(format.decode_frame(data, position).records)
        return (min(self.files) if self.files else None), records

    def read(self, plan: FileRead) -> tuple[bytes, ...]:
        data = bytes(self.files[plan.segment_base].cache[plan.start : plan.end])
        assert len(data) == plan.end - plan.start, "a FileRead reached past the file"
        return decode_file_read(plan, data)


def perform(disk: SimDisk, effect: Effect) -> None:
    """Executes a file effect that has no completion."""
    match effect:
        case CreateSegment(base_offset=base, header=header):
            disk.create(base, header)
        case CloseSegment(segment_base=base):
            disk.close(base)
        case DeleteSegment(segment_base=base):
            disk.delete(base)


def drain(machine: WalMachine, disk: SimDisk, effects: list[Effect], now_ms: int) -> list[Effect]:
    """Runs the effects like a sequential driver with instant I/O, feeding completions back
    until nothing is left; returns every non-file effect seen (acknowledgements and such)."""
    seen: list[Effect] = []
    queue = list(effects)
    while queue:
        effect = queue.pop(0)
        match effect:
            case Write():
                disk.write(effect)
                queue += machine.write_done(effect.write_id, now_ms)
            case Fsync():
                disk.fsync(effect.segment_base)
                queue += machine.fsync_done(effect.fsync_id, now_ms)
            case CreateSegment() | CloseSegment() | DeleteSegment():
                perform(disk, effect)
            case _:
                seen.append(effect)
    return seen

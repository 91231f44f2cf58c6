"""The per-topic write-ahead log as a pure state machine (spec/durability.md).

Appends go in, effects come out: `CreateSegment`, `Write`, `Fsync`, `CloseSegment` and
`DeleteSegment` for the driver's files; `Acknowledge` for the producers waiting on appends;
`Readable` for dispatch; `Failed` when an I/O error makes the on-disk state unknown. The driver
performs the file effects and feeds completions back (`write_done`, `fsync_done`,
`write_failed`, `fsync_failed`), so the simulator can run the very same decisions against a
simulated disk, crash it at any point and check what survives.

Decisions a driver relies on (each explained in spec/durability.md):

- Offsets are assigned at `append`, dense, and continue after recovery.
- Group commit: at most one write cycle is in flight. Appends that arrive meanwhile are
  queued; the next cycle writes all of them (up to `max_write_bytes`) as one `Write`.
- `FSYNC`: a cycle is `Write` → `write_done` → `Fsync` → `fsync_done` → `Acknowledge` and
  `Readable`. `FLUSH`: `Acknowledge` and `Readable` at `write_done`; an `Fsync` at most every
  `flush_interval_ms` and before a segment is closed.
- A segment is closed only once all of it is durable, and nothing is written to the next one
  before that, so the segments on disk after any crash are a durable prefix plus at most one
  torn tail.
- A failed write or fsync is final for this machine: the page cache no longer tells what is
  on disk. `Failed` says which bytes to truncate before the topic is recovered again.
- Nothing beyond `Readable` is ever returned by `read`: a record delivered before it is
  durable (in `FSYNC` mode) could vanish in a crash and its offset be reused.
- Every segment found at recovery is treated as closed: the first append after a restart
  starts a new segment, so a closed segment (which tiering may have uploaded) never changes.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from danube.kernels import scan_frames
from danube.machines.memory.accounting import batch_cost
from danube.machines.wal import format
from danube.machines.wal.batches import PackedRecords
from danube.machines.wal.cache import HotCache
from danube.machines.wal.file_reads import FileRead as FileRead
from danube.machines.wal.file_reads import decode_file_read as decode_file_read
from danube.machines.wal.file_reads import frames_of_file_read as frames_of_file_read
from danube.machines.wal.layout import FRAME_HEADER
from danube.values.errors import DanubeError, ErrorCode
from danube.values.frozen import fast_init
from danube.values.wal_config import MIB as MIB
from danube.values.wal_config import Durability, WalConfig

if TYPE_CHECKING:
    from danube.machines.memory.ledger import CacheLedger
    from danube.machines.wal.recovery import RecoveryPlan

_FSYNC = Durability.FSYNC
_COUNT_BASE = struct.Struct("<HQ")
"""A frame header's record count and base offset (spec/wal-format.md)."""
_COUNT_AT = 14

# -- effects --------------------------------------------------------------------------------------


@fast_init
@dataclass(frozen=True, slots=True)
class CreateSegment:
    """Create `format.segment_name(base_offset)` holding `header`, durably, before the next
    effect: write the header to a temporary file, fsync it, rename it to the segment's name
    and fsync the directory. The rename replaces a frameless file of that name that recovery
    left in place (`RecoveryPlan.replaced`); it never replaces one with frames."""

    base_offset: int
    header: bytes


@fast_init
@dataclass(frozen=True, slots=True)
class Write:
    """Write `data` (whole frames) at `position` of the segment, then call `write_done` (or
    `write_failed`). Writes are sequential: `position` is always the file's current end."""

    write_id: int
    segment_base: int
    position: int
    data: bytes


@fast_init
@dataclass(frozen=True, slots=True)
class Fsync:
    """fsync (fdatasync suffices) the segment, then call `fsync_done` (or `fsync_failed`).
    It must cover every `Write` whose `write_done` was delivered before it was emitted."""

    fsync_id: int
    segment_base: int


@fast_init
@dataclass(frozen=True, slots=True)
class CloseSegment:
    """The segment is complete and durable; close its file. It never changes again (until
    retention deletes it): from here on tiering may upload it."""

    segment_base: int


@fast_init
@dataclass(frozen=True, slots=True)
class DeleteSegment:
    """Remove the segment's file (retention)."""

    segment_base: int


@fast_init
@dataclass(frozen=True, slots=True)
class Acknowledge:
    """Every append whose last offset ≤ `through_offset` is acknowledged at the topic's
    durability level: reply success to its producer."""

    through_offset: int


@fast_init
@dataclass(frozen=True, slots=True)
class Readable:
    """Dispatch may deliver offsets ≤ `through_offset` (`read` serves them)."""

    through_offset: int


@fast_init
@dataclass(frozen=True, slots=True)
class Failed:
    """A write or fsync failed; this machine acknowledges nothing more and rejects appends.

    The driver replies an error to every append with offsets ≥ `unacknowledged_from`,
    truncates the segment to `truncate_to` bytes and fsyncs it (bytes past it may exist only
    in the page cache, which after a failed fsync no longer matches the disk), then recovers
    the topic as after a restart. Offsets from `next_offset` on will be assigned again; when
    `next_offset < unacknowledged_from` (`FLUSH` mode only) the acknowledged records in
    between are lost, as in a power failure, and `read` no longer serves them. Effects of
    this machine not yet started are discarded; completions of those under way are ignored.
    If the truncate or its fsync fails too, the disk is unusable: keep the topic stopped."""

    reason: str
    segment_base: int
    truncate_to: int
    next_offset: int
    unacknowledged_from: int


Effect = (
    CreateSegment | Write | Fsync | CloseSegment | DeleteSegment | Acknowledge | Readable | Failed
)


# -- reads ----------------------------------------------------------------------------------------


@fast_init
@dataclass(frozen=True, slots=True)
class CachedRecords:
    """Records `offset`, `offset + 1`, ... served from memory; empty when `offset` is not
    readable yet (the reader is caught up)."""

    offset: int
    records: tuple[bytes, ...]


@fast_init
@dataclass(frozen=True, slots=True)
class NotRetained:
    """Offsets below `first_offset` are no longer in the local WAL (retention)."""

    first_offset: int


ReadResult = CachedRecords | FileRead | NotRetained


class WalUnavailable(DanubeError):
    """An append refused because the WAL stopped after an I/O failure."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNAVAILABLE, message)


# -- state ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Segment:
    base: int
    created_ms: int
    size: int
    """Bytes including writes in flight: where the next write goes."""
    written: int
    """Bytes whose write completed (in the OS page cache)."""
    durable: int
    """Bytes covered by a completed fsync."""
    next_offset: int
    """One past the last record placed in this segment (in-flight writes included)."""
    is_open: bool
    sealing: bool = False
    """Close once everything written is durable; write nothing more to it."""
    index_offsets: list[int] = field(default_factory=list)
    index_positions: list[int] = field(default_factory=list)

    def add_index(self, offset: int, position: int, interval: int) -> None:
        """Keeps an entry for the first frame and then one at least every `interval` bytes."""
        if not self.index_positions or position - self.index_positions[-1] >= interval:
            self.index_offsets.append(offset)
            self.index_positions.append(position)


@fast_init
@dataclass(frozen=True, slots=True)
class _Pending:
    first_offset: int
    count: int
    frame: bytes


@fast_init
@dataclass(frozen=True, slots=True)
class _InFlightWrite:
    write_id: int
    segment: _Segment
    end_position: int
    end_offset: int


@fast_init
@dataclass(frozen=True, slots=True)
class _InFlightFsync:
    fsync_id: int
    segment: _Segment
    position: int
    end_offset: int


def release(machine: WalMachine | None) -> None:
    """`machine.release_cache()` for a machine about to be dropped (or None): call it at
    every place that forgets a machine, or the broker's cache ledger counts a cache nobody
    holds (the simulator checks it: spec/memory.md)."""
    if machine is not None:
        machine.release_cache()


class WalMachine:
    """One topic's WAL. Single-threaded by contract; `now_ms` is the wall clock in ms since
    the epoch (it is written into frames and segment headers as publish and creation time)."""

    def __init__(
        self,
        topic: str,
        config: WalConfig,
        recovered: RecoveryPlan | None = None,
        *,
        tiered: bool = False,
        start_offset: int = 0,
        cache_ledger: CacheLedger | None = None,
    ) -> None:
        """`tiered`: local retention may delete only segments `allow_delete` released (their
        objects are indexed). `start_offset`: where offsets continue when the local segments
        end earlier (a broker on an empty disk whose history is in object storage).
        `cache_ledger`: the broker's, whose pool bounds every topic's cache together; call
        `release_cache` when dropping a machine so that it stops counting this one."""
        self.topic = topic
        self.config = config
        self._segments: list[_Segment] = []
        self._segment_bytes = 0
        """The sizes of `_segments` added up, for size retention at every tick."""
        self._next_offset = 0
        if recovered is not None:
            if recovered.topic != topic:
                raise ValueError(f"recovery plan for {recovered.topic}, not {topic}")
            for found in recovered.segments:
                segment = _Segment(
                    base=found.base_offset,
                    created_ms=found.created_ms,
                    size=found.size,
                    written=found.size,
                    durable=found.size,
                    next_offset=found.next_offset,
                    is_open=False,
                )
                for offset, position in zip(found.base_offsets, found.positions, strict=True):
                    segment.add_index(offset, position, config.index_interval_bytes)
                self._segments.append(segment)
                self._segment_bytes += found.size
            self._next_offset = recovered.next_offset
        self._next_offset = max(self._next_offset, start_offset)
        self._deletable: set[int] | None = set() if tiered else None
        """Tiered: bases of the segments whose objects are indexed (only these may go)."""
        self._written = self._durable = self._readable = self._next_offset
        self._pending: deque[_Pending] | None = None
        """Frames queued for the next write; None while none is (an empty deque is 600 bytes
        that each of 100,000 idle topics would hold, issue 23)."""
        self._pending_bytes = 0
        self._write: _InFlightWrite | None = None
        self._fsync: _InFlightFsync | None = None
        self._next_io_id = 1
        self._unsynced_since_ms: int | None = None
        self._cache = HotCache(config.cache_bytes, topic, cache_ledger)
        self._failure: str | None = None

    # -- properties -------------------------------------------------------------------------------

    @property
    def first_offset(self) -> int:
        """The oldest retained offset (equal to `next_offset` when nothing is retained)."""
        return self._segments[0].base if self._segments else self._next_offset

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._next_offset

    @property
    def durable_offset(self) -> int:
        """Every record below this offset is covered by a completed fsync."""
        return self._durable

    @property
    def readable_offset(self) -> int:
        """Every record below this offset may be delivered (`Readable` through it minus 1)."""
        return self._readable

    @property
    def queued_bytes(self) -> int:
        """Frame bytes appended but not yet handed to a `Write`: the core's backpressure
        signal (the machine itself never refuses an append for being busy)."""
        return self._pending_bytes

    @property
    def cached_bytes(self) -> int:
        return self._cache.bytes

    def release_cache(self) -> None:
        """Empties the hot cache and takes it off the broker's ledger (the machine is being
        dropped); reads go to the files from here on."""
        self._cache.release()

    @property
    def failure(self) -> str | None:
        """Why the machine stopped, or None while it works."""
        return self._failure

    @property
    def idle(self) -> bool:
        """No queued append, no I/O in flight and no open segment: after `seal`, the point
        where a graceful shutdown or topic unload may stop the driver."""
        return (
            not self._pending
            and self._write is None
            and self._fsync is None
            and not (self._segments and self._segments[-1].is_open)
        )

    # -- inputs -----------------------------------------------------------------------------------

    def append(self, records: Sequence[bytes], now_ms: int) -> tuple[int, list[Effect]]:
        """Assigns offsets to one batch (one frame) and returns the first of them with the
        effects; the batch is acknowledged by a later `Acknowledge` covering its last offset.
        Raises `DanubeError` (and changes nothing) for a batch no frame can hold or when the
        machine has failed."""
        if self._failure is not None:
            raise WalUnavailable(self._failure)
        first = self._next_offset
        try:
            frame = format.encode_frame(first, now_ms, records)
        except ValueError as exc:
            raise DanubeError(ErrorCode.INVALID_ARGUMENT, f"{self.topic}: {exc}") from exc
        count = len(records)
        cost = batch_cost(len(frame) - FRAME_HEADER - 4 * count, count)
        self._queue(first, frame, count, cost)
        return first, self._pump(now_ms)

    def append_packed(self, packed: PackedRecords, now_ms: int) -> tuple[int, list[Effect]]:
        """`append` for a frame stamped already (`danube.machines.wal.batches.stamp`, which took its
        offsets from `next_offset`): queued and cached as it is, without a Python object per
        record."""
        if self._failure is not None:
            raise WalUnavailable(self._failure)
        if packed.first_offset != self._next_offset:
            raise ValueError(
                f"{self.topic}: a frame stamped at {packed.first_offset} cannot be appended at "
                f"{self._next_offset}"
            )
        cost = batch_cost(packed.record_bytes, packed.count)
        self._queue(packed.first_offset, packed.frame, packed.count, cost, packed.positions)
        return packed.first_offset, self._pump(now_ms)

    def append_frames(self, frames: bytes, now_ms: int) -> tuple[int, list[Effect]]:
        """A follower's append (spec/replication.md): whole frames another broker's WAL
        wrote, starting at `next_offset`, queued unchanged. Every frame is verified (CRC,
        dense offsets from `next_offset`) before anything changes: frames that do not verify
        raise `DanubeError` (INVALID_ARGUMENT), so a damaged or misaddressed send is refused,
        never stored. Returns the end of the records appended with the effects."""
        if self._failure is not None:
            raise WalUnavailable(self._failure)
        first = self._next_offset
        scan = scan_frames(frames, 0, len(frames), first)
        if scan.valid_end != len(frames):
            raise DanubeError(
                ErrorCode.INVALID_ARGUMENT,
                f"{self.topic}: replicated frames do not verify at byte {scan.valid_end} "
                f"(expected offsets from {first})",
            )
        view = memoryview(frames)
        ends = [*scan.positions[1:], len(frames)]
        for position, end in zip(scan.positions, ends, strict=True):
            frame = bytes(view[position:end])
            count, base = _COUNT_BASE.unpack_from(frame, _COUNT_AT)
            cost = batch_cost(len(frame) - FRAME_HEADER - 4 * count, count)
            self._queue(base, frame, count, cost)
        return self._next_offset, self._pump(now_ms)

    def _queue(
        self, first: int, frame: bytes, count: int, size: int, positions: np.ndarray | None = None
    ) -> None:
        self._next_offset += count
        if self._pending is None:
            self._pending = deque()
        self._pending.append(_Pending(first, count, frame))
        self._pending_bytes += len(frame)
        self._cache.put_frame(first, frame, size, count, positions)

    def io_done(self, effect: Effect, error: str | None, now_ms: int) -> list[Effect]:
        """A file effect finished (`error` None) or failed: `write_done` / `write_failed`
        or `fsync_done` / `fsync_failed`. A failed `CreateSegment` fails the segment's first
        `Write`; a failed close or delete of a closed segment leaves its data intact (the
        driver logs it): neither is an input."""
        if isinstance(effect, Write):
            if error is None:
                return self.write_done(effect.write_id, now_ms)
            return self.write_failed(effect.write_id, error)
        if isinstance(effect, Fsync):
            if error is None:
                return self.fsync_done(effect.fsync_id, now_ms)
            return self.fsync_failed(effect.fsync_id, error)
        return []

    def write_done(self, write_id: int, now_ms: int) -> list[Effect]:
        write = self._write
        if write is None or write.write_id != write_id:
            return self._stale(f"write {write_id}")
        self._write = None
        write.segment.written = write.end_position
        self._written = write.end_offset
        if self.config.durability is Durability.FSYNC:
            if self.config.synced_writes:
                segment, position = write.segment, write.end_position
                return self._durable_through(segment, position, write.end_offset, now_ms)
            return [self._start_fsync(write.segment)]
        if self._unsynced_since_ms is None:
            self._unsynced_since_ms = now_ms
        self._readable = write.end_offset
        through = write.end_offset - 1
        return [Acknowledge(through), Readable(through), *self._pump(now_ms)]

    def fsync_done(self, fsync_id: int, now_ms: int) -> list[Effect]:
        fsync = self._fsync
        if fsync is None or fsync.fsync_id != fsync_id:
            return self._stale(f"fsync {fsync_id}")
        self._fsync = None
        return self._durable_through(fsync.segment, fsync.position, fsync.end_offset, now_ms)

    def _durable_through(
        self, segment: _Segment, position: int, end_offset: int, now_ms: int
    ) -> list[Effect]:
        """The segment is on disk up to `position`, the topic below `end_offset`."""
        segment.durable = max(segment.durable, position)
        effects: list[Effect] = []
        if end_offset > self._durable:
            self._durable = end_offset
            if self.config.durability is Durability.FSYNC:
                self._readable = end_offset
                through = end_offset - 1
                effects += [Acknowledge(through), Readable(through)]
        return effects + self._pump(now_ms)

    def write_failed(self, write_id: int, error: str) -> list[Effect]:
        """The write's bytes may be partly on disk; which part is unknown."""
        write = self._write
        if write is None or write.write_id != write_id:
            return self._stale(f"write {write_id}")
        self._write = None
        segment = write.segment
        if self.config.durability is Durability.FSYNC:
            keep, keep_offset = segment.durable, self._durable
        else:
            keep, keep_offset = segment.written, self._written
        reason = f"write of segment {format.segment_name(segment.base)} failed ({error})"
        return self._fail(reason, segment, keep, keep_offset)

    def fsync_failed(self, fsync_id: int, error: str) -> list[Effect]:
        """Never retried: after a failed fsync Linux may mark the unwritten pages clean, so a
        second fsync can succeed without the data ever reaching the disk (PostgreSQL's
        "fsyncgate", 2018). Only what an earlier fsync covered is known to be on disk."""
        fsync = self._fsync
        if fsync is None or fsync.fsync_id != fsync_id:
            return self._stale(f"fsync {fsync_id}")
        self._fsync = None
        segment = fsync.segment
        reason = (
            f"fsync of segment {format.segment_name(segment.base)} failed ({error}); after a "
            "failed fsync the page cache no longer tells what reached the disk"
        )
        return self._fail(reason, segment, segment.durable, self._durable)

    def tick(self, now_ms: int) -> list[Effect]:
        """Time passes: age rotation, the `FLUSH`-mode periodic fsync, retention."""
        if self._failure is not None:
            return []
        age = self.config.segment_age_ms
        active = self._active()
        if age is not None and active is not None and now_ms - active.created_ms >= age:
            active.sealing = True
        return self._pump(now_ms) + self._retain(now_ms)

    def seal(self, now_ms: int) -> list[Effect]:
        """Closes the active segment once everything written to it is durable (graceful
        shutdown, topic unload, handing a segment to tiering early). Later appends go to a
        new segment. Wait for `idle` before stopping the driver."""
        if self._failure is not None:
            return []
        active = self._active()
        if active is not None:
            active.sealing = True
        return self._pump(now_ms)

    def allow_delete(self, segment_base: int) -> None:
        """Tiering indexed this segment's object: retention may delete it (within its size
        and age limits) from the next `tick` on. Per segment, not a floor: an index that
        starts above the oldest local segment must not release it."""
        if self._deletable is not None:
            self._deletable.add(segment_base)

    def tick_due(self, now_ms: int) -> bool:
        """Whether `tick(now_ms)` would do anything: return an effect or change the state.
        Every other input moves the machine as far as it can go, so only time (and released
        or grown segments, for retention) gives a tick work; a driver with many topics asks
        this first and skips the idle ones (issue 22). Must stay in step with `tick`."""
        if self._failure is not None:
            return False
        due = self._rotation_due(now_ms) or self._interval_due(now_ms)
        return due or self._retention_due(now_ms)

    def _rotation_due(self, now_ms: int) -> bool:
        """Whether the active segment reached `segment_age_ms` and is not sealing yet."""
        age, active = self.config.segment_age_ms, self._active()
        if age is None or active is None or active.sealing:
            return False
        return now_ms - active.created_ms >= age

    def _interval_due(self, now_ms: int) -> bool:
        """`FLUSH`: whether the periodic fsync is due, or the clock stepped back (which
        restarts its wait, `_flush_due`: a change of state too)."""
        since = self._unsynced_since_ms
        if since is None or self._fsync is not None or self.config.durability is _FSYNC:
            return False
        return now_ms < since or now_ms - since >= self.config.flush_interval_ms

    def _retention_due(self, now_ms: int) -> bool:
        """Whether retention deletes the oldest segment now."""
        max_bytes, max_age = self.config.retention_bytes, self.config.retention_ms
        segments = self._segments
        if (max_bytes is None and max_age is None) or len(segments) < 2:
            return False
        if self._deletable is not None and segments[0].base not in self._deletable:
            return False  # not in object storage yet
        if max_bytes is not None and self._segment_bytes > max_bytes:
            return True
        return max_age is not None and now_ms - segments[1].created_ms >= max_age

    def segment_extent(self, segment_base: int) -> tuple[int, int]:
        """(next offset, size in bytes) of a segment this machine knows. From the newest:
        the one asked for is nearly always the segment just closed, and a topic whose
        segments are not deleted (no retention) keeps thousands."""
        for segment in reversed(self._segments):
            if segment.base == segment_base:
                return segment.next_offset, segment.size
        raise KeyError(f"{self.topic}: no segment {format.segment_name(segment_base)}")

    # -- reads ------------------------------------------------------------------------------------

    def read(self, from_offset: int, max_records: int, max_bytes: int) -> ReadResult:
        """Where records `from_offset`, ... are: memory, a file range, or gone. At least one
        record is returned (or planned) whenever one is readable, however large, so a reader
        always progresses; never anything at or past `readable_offset`."""
        if max_records < 1:
            raise ValueError("max_records must be at least 1")
        if from_offset < self.first_offset:
            return NotRetained(self.first_offset)
        limit = min(self._readable, from_offset + max_records)
        if from_offset >= limit:
            return CachedRecords(from_offset, ())
        if self._cache.holds(from_offset):
            return CachedRecords(from_offset, self._cache.read(from_offset, limit, max_bytes))
        return self._plan_file_read(from_offset, limit, max_bytes)

    def plan_frames(self, from_offset: int, max_bytes: int) -> FileRead | NotRetained | None:
        """Where the frames from `from_offset` on that are durable at the topic's level lie on
        disk, for a replication resend (`frames_of_file_read`): always a file range, since the
        owner's window holds the recent frames already; None when nothing acknowledged locally
        lies at or after `from_offset`."""
        if from_offset < self.first_offset:
            return NotRetained(self.first_offset)
        if from_offset >= self._readable:
            return None
        return self._plan_file_read(from_offset, self._readable, max_bytes)

    def _plan_file_read(self, from_offset: int, limit: int, max_bytes: int) -> FileRead:
        segment = self._segments[
            bisect_right(self._segments, from_offset, key=lambda s: s.base) - 1
        ]
        offsets, positions = segment.index_offsets, segment.index_positions
        entry = bisect_right(offsets, from_offset) - 1
        start = positions[entry]
        end, end_offset = self._readable_end(segment), min(limit, segment.next_offset)
        after = entry + 1  # entries from here on begin after the frame holding from_offset
        by_offset = bisect_left(offsets, end_offset, lo=after)
        by_bytes = bisect_left(positions, start + max_bytes, lo=after)
        for candidate in (by_offset, by_bytes):
            if candidate < len(positions) and positions[candidate] < end:
                end, end_offset = positions[candidate], min(end_offset, offsets[candidate])
        return FileRead(segment.base, start, end, offsets[entry], from_offset, end_offset)

    def _readable_end(self, segment: _Segment) -> int:
        if not segment.is_open:
            return segment.size
        if self.config.durability is Durability.FSYNC:
            return segment.durable
        return segment.written

    # -- the engine -------------------------------------------------------------------------------

    def _active(self) -> _Segment | None:
        if self._segments and self._segments[-1].is_open:
            return self._segments[-1]
        return None

    def _pump(self, now_ms: int) -> list[Effect]:
        """Moves queued work forward as far as the in-flight I/O allows."""
        effects: list[Effect] = []
        fsync_mode = self.config.durability is Durability.FSYNC
        while self._failure is None:
            active = self._active()
            if active is not None and active.sealing:
                if self._write is not None or self._fsync is not None:
                    break
                if active.durable < active.written:
                    effects.append(self._start_fsync(active))
                    break
                active.is_open = active.sealing = False
                effects.append(CloseSegment(active.base))
                continue
            if not self._pending or self._write is not None:
                break
            if fsync_mode and self._fsync is not None:
                break
            first = self._pending[0]
            # An open segment always holds a frame: it is created with its first write.
            if active is not None and active.size + len(first.frame) > self.config.segment_bytes:
                active.sealing = True
                continue
            if active is None:
                header = format.encode_segment_header(self.topic, first.first_offset, now_ms)
                size = len(header)
                active = _Segment(
                    base=first.first_offset,
                    created_ms=now_ms,
                    size=size,
                    written=size,
                    durable=size,
                    next_offset=first.first_offset,
                    is_open=True,
                )
                self._segments.append(active)
                self._segment_bytes += size
                effects.append(CreateSegment(active.base, header))
            effects.append(self._start_write(active))
        if not fsync_mode and self._flush_due(now_ms):
            active = self._active()
            assert active is not None
            effects.append(self._start_fsync(active))
        return effects

    def _flush_due(self, now_ms: int) -> bool:
        since = self._unsynced_since_ms
        if self._failure is not None or since is None or self._fsync is not None:
            return False
        if now_ms < since:  # the wall clock stepped back: wait one interval from now
            self._unsynced_since_ms = since = now_ms
        return now_ms - since >= self.config.flush_interval_ms

    def _start_write(self, segment: _Segment) -> Write:
        """One group-commit write: queued frames while they fit the write and the segment."""
        frames: list[bytes] = []
        size = 0
        queue = self._pending
        while queue:
            pending = queue[0]
            grown = size + len(pending.frame)
            if frames and (
                grown > self.config.max_write_bytes
                or segment.size + grown > self.config.segment_bytes
            ):
                break
            queue.popleft()
            segment.add_index(
                pending.first_offset, segment.size + size, self.config.index_interval_bytes
            )
            frames.append(pending.frame)
            size = grown
            segment.next_offset = pending.first_offset + pending.count
        if not queue:
            self._pending = None
        self._pending_bytes -= size
        write = Write(self._io_id(), segment.base, segment.size, b"".join(frames))
        segment.size += size
        self._segment_bytes += size
        self._write = _InFlightWrite(write.write_id, segment, segment.size, segment.next_offset)
        return write

    def _start_fsync(self, segment: _Segment) -> Fsync:
        self._fsync = _InFlightFsync(self._io_id(), segment, segment.written, self._written)
        self._unsynced_since_ms = None
        return Fsync(self._fsync.fsync_id, segment.base)

    def _io_id(self) -> int:
        io_id = self._next_io_id
        self._next_io_id += 1
        return io_id

    def _fail(self, reason: str, segment: _Segment, keep: int, keep_offset: int) -> list[Effect]:
        acknowledged = self._readable
        self._failure = f"{self.topic}: {reason}; the topic must be recovered from disk"
        self._write = self._fsync = None
        # The driver cuts the segment at `keep`: reads must stay below it.
        self._readable = min(self._readable, keep_offset)
        self._segment_bytes += keep - segment.size
        segment.size = segment.written = keep
        segment.next_offset = keep_offset
        return [Failed(self._failure, segment.base, keep, keep_offset, acknowledged)]

    def _stale(self, what: str) -> list[Effect]:
        """A completion for I/O this machine no longer waits for: expected after a failure
        (the driver may finish effects it had started), a driver bug otherwise."""
        if self._failure is not None:
            return []
        raise ValueError(f"{self.topic}: completion for unknown {what}")

    # -- retention --------------------------------------------------------------------------------

    def _retain(self, now_ms: int) -> list[Effect]:
        """Deletes the oldest closed segments beyond the limits; never the newest segment,
        whose successor's creation time is what dates the end of a segment. The cache then
        drops what went with them (nothing else in it is ever below the first offset)."""
        effects: list[Effect] = []
        deletable = self._deletable
        while self._retention_due(now_ms):
            oldest = self._segments.pop(0)
            if deletable is not None:
                deletable.discard(oldest.base)
            self._segment_bytes -= oldest.size
            effects.append(DeleteSegment(oldest.base))
        if effects:
            self._cache.evict_below(self.first_offset)
        return effects

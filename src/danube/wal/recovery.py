"""What to do with a topic's segment files at start (spec/wal-format.md "Reading and recovery",
spec/durability.md "Recovery"). Pure: the driver lists the directory, reads each segment,
calls `format.scan_segment` (or, when the header does not decode, describes the file with
`UnreadableSegment`), calls `plan_recovery`, performs `RecoveryPlan.actions` in order and then
builds `WalMachine(topic, config, plan)`.

What the machine guarantees on the way in (a segment is closed only once it is durable,
nothing is written to the next segment before that, and `CreateSegment` makes a whole header
durable) leaves exactly these honest end states after a crash: the newest segment has a torn
tail, or holds no whole frame, or its header is cut short because the process died inside
`CreateSegment`. Anything else means bytes that were durable changed, and recovery stops the
topic with `CorruptSegment` instead of guessing.

A newest segment without a frame is left on disk, never deleted: its name is the only record
of where offsets continue once retention has deleted the segments before it. The next
`CreateSegment` (create-or-replace) takes its place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from danube.core.errors import DanubeError, ErrorCode
from danube.wal import format


@dataclass(frozen=True, slots=True)
class UnreadableSegment:
    """A segment file whose header failed to decode (`format.WalFormatError`)."""

    size: int
    """The file's length in bytes."""
    reason: str
    """The error's message."""


@dataclass(frozen=True, slots=True)
class RecoveredSegment:
    """A segment that survives recovery, as the machine needs it."""

    base_offset: int
    next_offset: int
    size: int
    """Bytes after recovery (after truncation of a torn tail)."""
    created_ms: int
    positions: tuple[int, ...]
    """Byte position of every frame, from the scan; the machine keeps a sparse subset."""
    base_offsets: tuple[int, ...]
    """Base offset of the frame at the same index of `positions`."""


@dataclass(frozen=True, slots=True)
class TruncateSegment:
    """Cut the segment file to `size` bytes: its valid prefix, dropping a torn tail."""

    segment_base: int
    size: int


@dataclass(frozen=True, slots=True)
class SyncSegment:
    """fsync the segment. The newest surviving segment may hold bytes that reached only the
    page cache (the process died between a write and its fsync); they are about to become
    readable, so they must be durable first."""

    segment_base: int


RecoveryAction = TruncateSegment | SyncSegment


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    topic: str
    actions: tuple[RecoveryAction, ...]
    """Perform in order before building the machine."""
    segments: tuple[RecoveredSegment, ...]
    """The segments holding frames, oldest first; all are closed (the next append starts a
    new segment)."""
    next_offset: int
    """One past the last surviving record: where offsets continue."""
    replaced: int | None
    """Base offset of a newest segment file without a frame (empty, torn before its first
    frame ended, or with a short header): it stays until `CreateSegment` replaces it."""


class CorruptSegment(DanubeError):
    """Durable WAL data changed or is missing. The topic stays stopped until an operator acts;
    other topics are unaffected. FAILED_PRECONDITION: retrying cannot help."""

    def __init__(
        self,
        topic: str,
        segment_base: int,
        position: int,
        lost_from: int,
        lost_through: int | None,
        problem: str,
        remedy: str,
    ) -> None:
        self.topic = topic
        self.segment = format.segment_name(segment_base)
        self.position = position
        self.lost_from = lost_from
        self.lost_through = lost_through
        """The last offset known to lie after the damage, or None when only the damaged
        segment's own unreadable frames lie there (their offsets are unknown)."""
        through = "" if lost_through is None else f" through {lost_through}"
        super().__init__(
            ErrorCode.FAILED_PRECONDITION,
            f"WAL of {topic} is corrupt: segment {self.segment}, byte {position}: {problem}. "
            f"Recovering past this point would lose offsets from {lost_from}{through}. "
            f"The topic stays stopped until an operator acts: {remedy}",
        )


def _corrupt(
    topic: str,
    base: int,
    position: int,
    lost_from: int,
    problem: str,
    later: Sequence[tuple[int, format.SegmentScan | UnreadableSegment]],
) -> CorruptSegment:
    known = [scan.next_offset - 1 for _, scan in later if isinstance(scan, format.SegmentScan)]
    name = format.segment_name(base)
    later_text = f" and the {len(later)} newer segment file(s)" if later else ""
    remedy = (
        f"restore {name}{later_text} from object storage if they were uploaded; or accept the "
        f"loss: move {name}{later_text} out of the topic's directory (keep the copies: any "
        f"decoder of spec/wal-format.md can read them), optionally put back {name} truncated "
        f"to {position} bytes, and restart the broker. Offsets from {lost_from} on are then "
        "assigned again: consumers that saw them may see other messages under the same offsets"
    )
    return CorruptSegment(
        topic, base, position, lost_from, max(known, default=None), problem, remedy
    )


def plan_recovery(
    topic: str, scans: Sequence[tuple[int, format.SegmentScan | UnreadableSegment]]
) -> RecoveryPlan:
    """Decides, from every segment file's scan, what to truncate and delete, and where
    offsets continue. Raises `CorruptSegment` instead of dropping anything that could have
    been acknowledged.

    Stricter than the general rule of spec/wal-format.md, because the machine closes (and
    makes durable) a segment before it writes the next one: only the newest segment may be
    torn, hold no frame, or have a header cut short. The same damage in an older segment
    hit data that was durable."""
    entries = sorted(scans, key=lambda entry: entry[0])
    kept: list[RecoveredSegment] = []
    actions: list[RecoveryAction] = []
    replaced: int | None = None
    next_offset = entries[0][0] if entries else 0
    for index, (base, scan) in enumerate(entries):
        later = entries[index + 1 :]
        newest = not later
        if index and base != next_offset:
            low, high = sorted((base, next_offset))
            what = "missing" if base > next_offset else "claimed by two segments"
            problem = (
                f"the previous segment ends before offset {next_offset} but this one starts "
                f"at {base}: offsets {low}–{high - 1} are {what}"
            )
            raise _corrupt(topic, base, 0, low, problem, later)
        if isinstance(scan, UnreadableSegment):
            header_size = len(format.encode_segment_header(topic, base, 0))
            if not newest or scan.size > header_size:
                problem = f"the segment header does not decode ({scan.reason})"
                raise _corrupt(topic, base, 0, base, problem, later)
            replaced = next_offset = base  # the process died inside CreateSegment
            break
        if scan.header.base_offset != base or scan.header.topic != topic:
            problem = f"the header names offset {scan.header.base_offset} of {scan.header.topic!r}"
            raise _corrupt(topic, base, 0, base, problem, later)
        if scan.state is format.SegmentState.CORRUPT:
            problem = (
                f"a frame fails its checks but a valid frame follows at byte "
                f"{scan.valid_after}, so this is not a torn tail: bytes that were durable "
                "changed"
            )
            raise _corrupt(topic, base, scan.valid_end, scan.next_offset, problem, later)
        if not newest and scan.state is format.SegmentState.TORN:
            problem = (
                "the segment ends in a damaged frame, but a newer segment exists, so this one "
                "was durable and closed: bytes that were durable changed"
            )
            raise _corrupt(topic, base, scan.valid_end, scan.next_offset, problem, later)
        if not scan.positions:
            if not newest:
                problem = "a segment older than the newest holds no frame"
                raise _corrupt(topic, base, scan.valid_end, base, problem, later)
            replaced = next_offset = base
            break
        next_offset = scan.next_offset
        found = RecoveredSegment(
            base,
            scan.next_offset,
            scan.valid_end,
            scan.header.created_ms,
            tuple(scan.positions),
            tuple(scan.base_offsets),
        )
        kept.append(found)
        if scan.state is format.SegmentState.TORN:
            actions.append(TruncateSegment(base, scan.valid_end))
    if kept:
        actions.append(SyncSegment(kept[-1].base_offset))
    return RecoveryPlan(topic, tuple(actions), tuple(kept), next_offset, replaced)

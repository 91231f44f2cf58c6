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

A damaged last frame, a missing newest segment or one zeroed look exactly like the honest end
states above. What tells them apart is `RecoveryEvidence`: durable records outside the segment
files of how far the log reached (the WAL's own checkpoint, `danube.machines.wal.checkpoint`; the
subscriptions' acknowledged cursors; the object tier's index). A log that recovers to an end
below any of them lost offsets that were durable, and the topic stops with `CorruptSegment`
instead of assigning those offsets again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from danube.machines.wal import format
from danube.machines.wal.machine import DeleteSegment
from danube.values.errors import DanubeError, ErrorCode


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


@dataclass(frozen=True, slots=True)
class PlaceSegment:
    """Create a segment file holding only a header (as `CreateSegment` does: temporary file,
    fsync, rename, fsync of the directory). After an accepted loss it is the only record in the
    directory of where offsets continue, as a frameless newest segment is after a crash; the
    first append's `CreateSegment` replaces it."""

    segment_base: int


@dataclass(frozen=True, slots=True)
class ForgetCheckpoint:
    """Delete the topic's checkpoint file (and fsync the directory): a follower's log was cut
    below the end it marked (`plan_cut`), so the mark no longer tells a durable end; the load
    that follows marks the new one."""


@dataclass(frozen=True, slots=True)
class RebaseSegment:
    """Replace segment `segment_base` by one starting at `new_base`: a new segment file
    (header, then the old file's bytes from `position` on, where the frame of `new_base`
    starts), made durable as `CreateSegment` makes one, then the old file deleted
    (`plan_align`)."""

    segment_base: int
    position: int
    new_base: int


RecoveryAction = TruncateSegment | SyncSegment | PlaceSegment | ForgetCheckpoint | RebaseSegment


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
    epochs: Any = None
    """The directory's replication epochs (`danube.effects.EpochHistory`), None without."""


LOSS_ACCEPTED_NAME = "accept-loss"
"""The file an operator creates in a topic's WAL directory, after moving every segment file
out, to let a stopped topic continue (the remedy `CorruptSegment` names). It may hold a decimal
offset; the log continues at the highest of it and the evidence. The driver deletes it once
the new checkpoint is durable."""


@dataclass(frozen=True, slots=True)
class RecoveryEvidence:
    """What durable records outside the segment files say about where the log ended."""

    checkpoint_end: int | None = None
    """The WAL checkpoint's durable end: every offset below it was fsynced. None: no file,
    or no valid slot in it (its first write was torn)."""
    acknowledged_end: int = 0
    """One past the highest subscription cursor (each cursor is an offset a consumer
    acknowledged). Only for topics whose records become readable once durable (`fsync`
    levels) on a single broker: in `flush` mode a consumer may acknowledge a record a power
    failure then loses, and in a cluster a failover gives up what the index lacks, as
    spec/durability.md says."""
    indexed_end: int = 0
    """One past the last offset of the object tier's index (0 without a tier)."""
    loss_accepted_at: int | None = None
    """The operator's `LOSS_ACCEPTED_NAME` file: None when absent, else the offset written in
    it (0 when empty)."""

    @property
    def claimed_end(self) -> int:
        """The end anything durable has seen: offsets below it must never be assigned again."""
        return max(self.checkpoint_end or 0, self.acknowledged_end, self.indexed_end)

    def sources(self, below: int) -> str:
        """Which records say offsets at or above `below` existed, for an error message."""
        parts = []
        if self.checkpoint_end is not None and self.checkpoint_end > below:
            parts.append(f"the WAL checkpoint says offsets through {self.checkpoint_end - 1} "
                         "were fsynced")  # fmt: skip
        if self.acknowledged_end > below:
            parts.append(f"a subscription cursor acknowledged offset {self.acknowledged_end - 1}")
        if self.indexed_end > below:
            parts.append(f"the object index holds offsets through {self.indexed_end - 1}")
        return "; ".join(parts)


NO_EVIDENCE = RecoveryEvidence()


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
    evidence: RecoveryEvidence,
    claimed_through: int | None = None,
) -> CorruptSegment:
    known = [scan.next_offset - 1 for _, scan in later if isinstance(scan, format.SegmentScan)]
    if claimed_through is not None:
        known.append(claimed_through)
    lost_through = max(known, default=None)
    resume = max(lost_through + 1 if lost_through is not None else lost_from,
                 evidence.claimed_end, lost_from)  # fmt: skip
    name = format.segment_name(base)
    later_text = f" and the {len(later)} newer segment file(s)" if later else ""
    remedy = (
        f"restore {name}{later_text} from object storage if they were uploaded; or accept the "
        "loss: move every segment file of the topic out of its directory (keep the copies: any "
        f"decoder of spec/wal-format.md can read them), write {resume} into a new file named "
        f"{LOSS_ACCEPTED_NAME} there and restart the broker. The topic then continues at "
        f"offset {resume} or after the highest offset anything durable has seen, whichever is "
        "higher, so no offset is assigned twice; the moved records are no longer served"
    )
    return CorruptSegment(topic, base, position, lost_from, lost_through, problem, remedy)


def plan_recovery(
    topic: str,
    scans: Sequence[tuple[int, format.SegmentScan | UnreadableSegment]],
    evidence: RecoveryEvidence = NO_EVIDENCE,
) -> RecoveryPlan:
    """Decides, from every segment file's scan and the durable evidence of where the log
    ended, what to truncate and delete, and where offsets continue. Raises `CorruptSegment`
    instead of dropping anything that could have been acknowledged.

    Stricter than the general rule of spec/wal-format.md, because the machine closes (and
    makes durable) a segment before it writes the next one: only the newest segment may be
    torn, hold no frame, or have a header cut short. The same damage in an older segment
    hit data that was durable. And the newest segment's end counts as honest only when it
    reaches every durable claim in `evidence` (`check_evidence`)."""
    plan = _plan_segments(topic, scans, evidence)
    return check_evidence(plan, scans, evidence)


def _plan_segments(
    topic: str,
    scans: Sequence[tuple[int, format.SegmentScan | UnreadableSegment]],
    evidence: RecoveryEvidence,
) -> RecoveryPlan:
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
            raise _corrupt(topic, base, 0, low, problem, later, evidence)
        if isinstance(scan, UnreadableSegment):
            header_size = len(format.encode_segment_header(topic, base, 0))
            if not newest or scan.size > header_size:
                problem = f"the segment header does not decode ({scan.reason})"
                raise _corrupt(topic, base, 0, base, problem, later, evidence)
            replaced = next_offset = base  # the process died inside CreateSegment
            break
        if scan.header.base_offset != base or scan.header.topic != topic:
            problem = f"the header names offset {scan.header.base_offset} of {scan.header.topic!r}"
            raise _corrupt(topic, base, 0, base, problem, later, evidence)
        if scan.state is format.SegmentState.CORRUPT:
            problem = (
                f"a frame fails its checks but a valid frame follows at byte "
                f"{scan.valid_after}, so this is not a torn tail: bytes that were durable "
                "changed"
            )
            raise _corrupt(topic, base, scan.valid_end, scan.next_offset, problem, later, evidence)
        if not newest and scan.state is format.SegmentState.TORN:
            problem = (
                "the segment ends in a damaged frame, but a newer segment exists, so this one "
                "was durable and closed: bytes that were durable changed"
            )
            raise _corrupt(topic, base, scan.valid_end, scan.next_offset, problem, later, evidence)
        if not scan.positions:
            if not newest:
                problem = "a segment older than the newest holds no frame"
                raise _corrupt(topic, base, scan.valid_end, base, problem, later, evidence)
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


def check_evidence(
    plan: RecoveryPlan,
    scans: Sequence[tuple[int, format.SegmentScan | UnreadableSegment]],
    evidence: RecoveryEvidence,
) -> RecoveryPlan:
    """The rule for the newest segment's end (spec/wal-format.md "Reading and recovery"):
    the recovered log must reach every offset durable evidence has seen, or durable data was
    lost (a damaged last frame, a deleted or zeroed newest segment) and the topic stops.

    The recovered end is the newest segment's or, with no segment file, the object index's
    (a new topic; a broker on an empty disk whose history is in object storage; in a cluster,
    the new owner after a failover), and it must reach every claim. The operator's accepted
    loss (every segment file moved out, `LOSS_ACCEPTED_NAME` written) continues after
    everything the evidence has seen instead, and leaves a frameless segment there
    (`PlaceSegment`) so that a restart before the first append finds where offsets go on."""
    claimed = evidence.claimed_end
    if not scans:
        if evidence.loss_accepted_at is not None:
            resume = max(claimed, evidence.loss_accepted_at)
            return dataclasses.replace(
                plan, actions=(PlaceSegment(resume),), next_offset=resume, replaced=resume
            )
        if evidence.indexed_end < claimed:
            what = (
                "no segment file is left (the newest segment was deleted)"
                if evidence.checkpoint_end is not None
                else "the WAL directory holds no segment file"
            )
            problem = f"{what}, but {evidence.sources(evidence.indexed_end)}"
            raise _corrupt(
                plan.topic, evidence.indexed_end, 0, evidence.indexed_end, problem, (),
                evidence, claimed - 1,
            )  # fmt: skip
        return dataclasses.replace(plan, next_offset=max(plan.next_offset, evidence.indexed_end))
    if plan.next_offset >= claimed:
        return plan
    base, scan = max(scans, key=lambda entry: entry[0])
    if isinstance(scan, UnreadableSegment):
        position, what = 0, f"its header does not decode ({scan.reason})"
    elif scan.state is format.SegmentState.TORN:
        position = scan.valid_end
        what = f"the frame at byte {position} fails its checks (it is not a torn write)"
    elif not scan.positions:
        position, what = scan.valid_end, "it holds no frame"
    else:
        position, what = scan.valid_end, "it ends there (a newer segment file is missing)"
    problem = (
        f"the log recovers to offset {plan.next_offset} at byte {position} of the newest "
        f"segment, where {what}; but {evidence.sources(plan.next_offset)}"
    )
    raise _corrupt(plan.topic, base, position, plan.next_offset, problem, (), evidence, claimed - 1)


def plan_cut(
    topic: str, scans: Sequence[tuple[int, format.SegmentScan | UnreadableSegment]], end: int
) -> tuple[Any, ...]:
    """The actions that cut a follower's log to offsets < `end` (reconciliation by epoch,
    spec/replication.md): delete every segment that starts at or after `end`, cut the one
    holding `end` at the frame that starts there, and forget the checkpoint, whose mark may
    lie beyond the cut. `end` must start a frame (the owner's epochs start at frame
    boundaries); a log that does not reach `end` is left as it is. Raises `CorruptSegment`
    when `end` falls inside a frame: the log is not a copy of the owner's."""
    actions: list[Any] = []
    for base, scan in sorted(scans, key=lambda entry: entry[0]):
        if base >= end:
            actions.append(DeleteSegment(base))
            continue
        if isinstance(scan, UnreadableSegment) or scan.next_offset <= end:
            continue
        cut = [p for p, b in zip(scan.positions, scan.base_offsets, strict=True) if b == end]
        if not cut:
            problem = f"offset {end}, where the owner's epoch ends, is inside a frame"
            raise CorruptSegment(topic, base, 0, end, scan.next_offset - 1, problem,
                                 "remove the topic's directory on this follower")  # fmt: skip
        actions.append(TruncateSegment(base, cut[0]))
    if actions:
        actions.append(ForgetCheckpoint())
    return tuple(actions)


def plan_align(
    scans: Sequence[tuple[int, format.SegmentScan | UnreadableSegment]], indexed_end: int
) -> tuple[Any, ...]:
    """A local log that overlaps the object index without following its segments (a
    promoted follower's: its segments are its own, not the owner's it replicated) is cut to
    what the index lacks, so that the uploader finds it continuing the index: segments
    wholly below `indexed_end` go (their records are in objects), and the one holding
    `indexed_end` inside is rebased to start there. A segment where `indexed_end` falls
    inside a frame is left alone (the uploader then reports the overlap, as before). Cluster
    mode only (`BrokerCore.aligns_to_index`): a standalone broker's segments are the index's
    and stay for local reads."""
    actions: list[Any] = []
    for base, scan in sorted(scans, key=lambda entry: entry[0]):
        if base >= indexed_end or isinstance(scan, UnreadableSegment) or not scan.positions:
            continue
        if scan.next_offset <= indexed_end:
            actions.append(DeleteSegment(base))
            continue
        starts = [p for p, b in zip(scan.positions, scan.base_offsets, strict=True)
                  if b == indexed_end]  # fmt: skip
        if starts:
            actions.append(RebaseSegment(base, starts[0], indexed_end))
    return tuple(actions)

"""The object index: one entry per segment object, kept in the metadata store
(spec/object-layout.md, "The object index").

Readers find history only through the index, so everything a reader trusts is checked here:
`validate_index` names every broken invariant (an entry inconsistent with itself, a gap or an
overlap between entries) instead of stopping at the first, so an operator sees the whole
damage at once. `describe_object` derives an entry's facts from the segment bytes after
verifying every frame, so a segment damaged on the local disk is never published as history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from danube.kernels import crc32c
from danube.kernels.twins import MIN_FRAME
from danube.keys import parse_object_name
from danube.machines.wal import format
from danube.values.frozen import fast_init

MIN_HEADER = 40
"""The smallest segment header (spec/wal-format.md): the first frame starts at or after it."""
U32 = 1 << 32
_FIELDS = ("start_offset", "end_offset", "size", "crc32c", "key", "created_ms", "offset_index")
_INT_FIELDS = ("start_offset", "end_offset", "size", "crc32c", "created_ms")


class IndexFormatError(ValueError):
    """A stored index entry that is not the JSON shape of spec/object-layout.md."""


@fast_init
@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One committed segment object. Never changes once committed."""

    start_offset: int
    end_offset: int
    """The last offset in the object (inclusive, as in Danube's catalog)."""
    size: int
    """Bytes of the object (= of the sealed segment file)."""
    crc32c: int
    """CRC32C of the whole object: a full download is checked against it."""
    key: str
    """Object key relative to `durable.root`."""
    created_ms: int
    """Wall clock when the entry was made (informational: not part of the object's identity)."""
    offset_index: tuple[tuple[int, int], ...]
    """Sparse (offset, byte position) pairs: the first frame, then at least one every
    `index_interval_bytes`; a range read starts at the last pair at or before its offset."""

    @property
    def next_offset(self) -> int:
        return self.end_offset + 1

    def same_object(self, other: IndexEntry) -> bool:
        """Whether both describe the same bytes under the same key. `created_ms` and the
        index density may differ between two uploads of one segment and do not count."""
        return (self.start_offset, self.end_offset, self.size, self.crc32c, self.key) == (
            other.start_offset,
            other.end_offset,
            other.size,
            other.crc32c,
            other.key,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "size": self.size,
            "crc32c": self.crc32c,
            "key": self.key,
            "created_ms": self.created_ms,
            "offset_index": [[offset, position] for offset, position in self.offset_index],
        }

    @classmethod
    def from_json(cls, value: Any) -> IndexEntry:
        """Checks the shape only (`validate_index` checks the meaning). Unknown fields are
        ignored, so a later version may add some without breaking older readers."""
        if not isinstance(value, dict):
            raise IndexFormatError(f"an index entry must be a JSON object, got {value!r}")
        missing = [name for name in _FIELDS if name not in value]
        if missing:
            raise IndexFormatError(f"index entry lacks {', '.join(missing)}")
        # One pass of exact type tests (every reader of a watch decodes each entry; bool is
        # a subclass of int, which `type(...) is int` refuses as `_is_int` does).
        for name in _INT_FIELDS:
            if type(value[name]) is not int and not _is_int(value[name]):
                raise IndexFormatError(f"index entry field {name} must be an integer")
        key = value["key"]
        if not isinstance(key, str):
            raise IndexFormatError("index entry field key must be a string")
        pairs = value["offset_index"]
        offset_index: list[tuple[int, int]] = []
        if not isinstance(pairs, list):
            pairs = None
        else:
            for pair in pairs:
                if not isinstance(pair, list) or len(pair) != 2:
                    pairs = None
                    break
                offset, position = pair
                if not (_is_int(offset) and _is_int(position)):
                    pairs = None
                    break
                offset_index.append((offset, position))
        if pairs is None:
            raise IndexFormatError("index entry field offset_index must be [[offset, byte], ...]")
        return cls(
            value["start_offset"],
            value["end_offset"],
            value["size"],
            value["crc32c"],
            key,
            value["created_ms"],
            tuple(offset_index),
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def entry_problems(entry: IndexEntry) -> list[str]:
    """What is wrong with one entry on its own, in words an operator can act on. (Each
    problem is named with the entry's start once found: every load checks every entry of
    the topic's index, and nearly all have none.)"""
    problems: list[str] = []
    if entry.start_offset < 0 or entry.end_offset < entry.start_offset:
        problems.append(f"offsets {entry.start_offset}–{entry.end_offset} are empty")
    if not 0 <= entry.crc32c < U32:
        problems.append(f"crc32c {entry.crc32c} is not a 32-bit value")
    # Only the object's name is checked: an entry does not say its topic, and whether its key
    # is the topic's is the uploader's check ("names key ..."). `keys.parse_any_object_key`
    # would also refuse keys outside `storage/topics/<ns>/<t>/segments/`, which this never has.
    if parse_object_name(entry.key.rpartition("/")[2]) != (entry.start_offset, entry.next_offset):
        problems.append(
            f"key {entry.key!r} does not name offsets {entry.start_offset}–{entry.end_offset}"
        )
    index = entry.offset_index
    if not index:
        problems.append("offset_index is empty")
        return _where(entry, problems)
    (first_offset, first_position), (last_offset, last_position) = index[0], index[-1]
    if first_offset != entry.start_offset:
        problems.append(f"offset_index starts at offset {first_offset}")
    if first_position < MIN_HEADER:
        problems.append(f"offset_index starts inside the header (byte {first_position})")
    if len(index) > 1 and any(b[0] <= a[0] or b[1] <= a[1] for a, b in pairwise(index)):
        problems.append("offset_index is not strictly increasing")
    if last_offset > entry.end_offset:
        problems.append(f"offset_index names offset {last_offset} past the end")
    if last_position + MIN_FRAME > entry.size:
        problems.append(f"offset_index names byte {last_position} past the last frame")
    return _where(entry, problems)


def _where(entry: IndexEntry, problems: list[str]) -> list[str]:
    if not problems:
        return problems
    where = f"index entry {entry.start_offset:020d}"
    return [f"{where}: {problem}" for problem in problems]


def validate_index(entries: Sequence[IndexEntry]) -> list[str]:
    """Every broken invariant of a topic's index, oldest entry first; empty when it is sound.
    Sound means: each entry is consistent with itself, entries are sorted, and each starts
    right after the previous one ends (no gap, no overlap)."""
    problems: list[str] = []
    for index, entry in enumerate(entries):
        problems += entry_problems(entry)
        if index:
            previous = entries[index - 1]
            if entry.start_offset != previous.next_offset:
                low, high = sorted((entry.start_offset, previous.next_offset))
                what = "missing" if entry.start_offset > previous.next_offset else "in two entries"
                problems.append(
                    f"index entry {entry.start_offset:020d} does not continue the previous one "
                    f"(which ends at {previous.end_offset}): offsets {low}–{high - 1} are {what}"
                )
    return problems


def sparse_offset_index(
    positions: Sequence[int], base_offsets: Sequence[int], interval_bytes: int
) -> tuple[tuple[int, int], ...]:
    """The first frame and then the first frame at least `interval_bytes` past the last kept
    one (the WAL's own rule, at a coarser density: the index lives in the metadata store)."""
    kept: list[tuple[int, int]] = []
    for position, offset in zip(positions, base_offsets, strict=True):
        if not kept or position - kept[-1][1] >= interval_bytes:
            kept.append((offset, position))
    return tuple(kept)


@fast_init
@dataclass(frozen=True, slots=True)
class ObjectFacts:
    """What the uploader reports (`Uploader.upload_done`) about an object it wrote."""

    size: int
    crc32c: int
    offset_index: tuple[tuple[int, int], ...]


def describe_object(
    data: bytes | memoryview, start_offset: int, next_offset: int, interval_bytes: int
) -> ObjectFacts:
    """The facts of the object that `data` (a sealed segment file, read whole) becomes.
    Raises `format.WalFormatError` unless every frame verifies and the frames hold exactly
    `start_offset` … `next_offset - 1`: a damaged segment must not become history."""
    scan = format.scan_segment(data)
    name = format.segment_name(start_offset)
    if scan.state is not format.SegmentState.WHOLE:
        raise format.WalFormatError(
            f"segment {name} does not verify at byte {scan.bad_at}; it is not uploaded"
        )
    first, end = scan.header.base_offset, scan.next_offset
    if not scan.positions or (first, end) != (start_offset, next_offset):
        held = f"offsets {first}–{end - 1}" if scan.positions else "no frame"
        raise format.WalFormatError(
            f"segment {name} holds {held}, not offsets {start_offset}–{next_offset - 1}; "
            "it is not uploaded"
        )
    index = sparse_offset_index(scan.positions, scan.base_offsets, interval_bytes)
    return ObjectFacts(len(data), crc32c(data), index)

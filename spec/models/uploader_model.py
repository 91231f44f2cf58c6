"""Reference model of the object tier's promises (spec/object-layout.md): the oracle of
tests/tiering/test_uploader_properties.py.

It knows nothing of phases, retries, backoff or throttling. A topic is a sequence of sealed
segments (offset ranges with their bytes), and the durable world is three things: the local
disk (segments not yet deleted), the object store (key → bytes) and the committed index
(start offset → entry). The test harness reports each claim the uploader makes and each change
its effects cause; the model says whether it was allowed. A crash changes nothing here: all of
it is durable, which is exactly why the uploader can be rebuilt from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from danube.kernels.twins import crc32c_py


@dataclass(frozen=True, slots=True)
class Segment:
    base: int
    next_offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Entry:
    """What the model needs of a committed index entry."""

    start: int
    next_offset: int
    key: str
    size: int
    crc32c: int


class TieringModel:
    """One topic's segments, objects and index, and what the uploader may claim about them."""

    def __init__(self, key_of: Callable[[int, int], str], max_in_flight: int) -> None:
        self.key_of = key_of
        self.max_in_flight = max_in_flight
        self.segments: dict[int, Segment] = {}
        self.local: set[int] = set()
        self.deletable: set[int] = set()
        self.objects: dict[str, bytes] = {}
        self.index: dict[int, Entry] = {}
        self._started: set[int] = set()
        """Segments whose upload started in this incarnation of the uploader: first starts
        go in offset order, retries may repeat any of them."""

    @property
    def indexed_next(self) -> int | None:
        return max((e.next_offset for e in self.index.values()), default=None)

    @property
    def indexed_keys(self) -> set[str]:
        return {entry.key for entry in self.index.values()}

    # -- what happened --------------------------------------------------------------------------

    def seal(self, segment: Segment) -> None:
        """The WAL closed a segment; segments are dense from the first one."""
        if self.segments:
            last = max(self.segments.values(), key=lambda s: s.base)
            assert segment.base == last.next_offset, "the harness sealed a gap"
        self.segments[segment.base] = segment
        self.local.add(segment.base)

    def write_object(self, key: str, data: bytes) -> None:
        assert key not in self.indexed_keys or self.objects[key] == data, (
            f"indexed object {key} overwritten with other bytes"
        )
        self.objects[key] = data

    def delete_local(self, base: int) -> None:
        """Local retention deleted a segment file."""
        assert base in self.deletable, f"segment {base} deleted locally before it was indexed"
        self.local.discard(base)

    def crash(self) -> None:
        self._started.clear()

    # -- what the uploader claims ---------------------------------------------------------------

    def upload_started(self, base: int, key: str) -> None:
        segment = self.segments.get(base)
        assert segment is not None, f"upload of unknown segment {base}"
        assert key == self.key_of(base, segment.next_offset), f"segment {base} uploaded to {key}"
        assert base in self.local, f"upload of segment {base}, deleted locally"
        assert base not in self.index, f"segment {base} uploaded again although indexed"
        waiting = [b for b in self.segments if b not in self.index and b <= base]
        assert len(waiting) <= self.max_in_flight, (
            f"segment {base} started with {len(waiting) - 1} older segments not indexed"
        )
        if base not in self._started:
            assert all(b < base for b in self._started), f"segment {base} started out of order"
            self._started.add(base)

    def commit(self, start: int, next_offset: int, key: str, size: int, crc: int) -> None:
        """A `CommitIndex` created its entry in the durable index."""
        segment = self.segments.get(start)
        assert segment is not None and segment.next_offset == next_offset, (
            f"entry {start}–{next_offset - 1} is not a sealed segment"
        )
        expected = self.indexed_next
        first = min(self.segments)
        assert start == (first if expected is None else expected), (
            f"entry {start} leaves a gap or overlap after {expected}"
        )
        assert self.objects.get(key) == segment.data, f"entry {start} names an object unlike it"
        assert (size, crc) == (len(segment.data), crc32c_py(segment.data)), "wrong size or CRC"
        self.index[start] = Entry(start, next_offset, key, size, crc)

    def allow_delete(self, base: int) -> None:
        assert base in self.index, f"local delete of segment {base} allowed before indexing"
        self.deletable.add(base)

    def delete_object(self, key: str, start: int) -> None:
        """Only an object that can never be indexed may go: its start lies inside the indexed
        history (an entry start is final) and it is not the indexed key."""
        assert key not in self.indexed_keys, f"indexed object {key} deleted"
        indexed_next = self.indexed_next
        assert indexed_next is not None and start < indexed_next, (
            f"object {key} deleted although it may still be indexed"
        )
        self.objects.pop(key, None)

    # -- the end --------------------------------------------------------------------------------

    def check_complete(self) -> None:
        """Liveness, once everything was allowed to finish: every segment is indexed, its
        object equals the segment, and every local file may go."""
        missing = sorted(set(self.segments) - set(self.index))
        assert not missing, f"segments {missing[:5]} never indexed"
        for start, entry in self.index.items():
            assert self.objects.get(entry.key) == self.segments[start].data, f"object {start}"
        assert self.local <= self.deletable, "an indexed segment's local delete never allowed"

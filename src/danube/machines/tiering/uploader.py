"""One topic's upload of sealed WAL segments to object storage, as a pure state machine
(spec/object-layout.md).

The WAL closes a segment (`CloseSegment`) only once all of it is durable, and never changes it
again; the driver reports each closed segment with `segment_sealed`. The uploader decides
which segment to upload when, when to retry, and when to publish an upload in the object index;
the driver moves the bytes (`UploadSegment`), writes the metadata (`CommitIndex`), lets local
retention go (`AllowLocalDelete`) and collects orphans (`ListObjects`, `DeleteObject`), and
reports every outcome back. Every input takes the wall clock in milliseconds.

**Order.** Segments are uploaded in offset order, and at most `max_in_flight` of the oldest
uncommitted ones are uploading or uploaded-but-uncommitted at a time (default 1: strictly one
segment after the other). Index entries are committed one at a time in offset order, so the
index never has a gap, not even for a moment, and a crash cannot leave one.

**Idempotent resume, no checkpoint.** An object's key is a function of its offsets and the
writer's epoch, its index path of its offsets (`danube.machines.tiering.layout`), and an index
entry is written with compare-and-create. So the index itself is the uploader's checkpoint: after a
crash the driver passes the committed entries and the local sealed segments to `recovered`;
segments already indexed are skipped (and their local files may go), and a segment uploaded
but not indexed is simply uploaded again (to the same key under the same epoch, overwriting
the same bytes; under a new epoch to a new key, leaving the old one an orphan), then indexed.
A commit repeated after an ambiguous failure finds its entry present (`index_exists`) and
counts as done.

**Retries.** A `throttled` or `server_error` upload is retried after an exponential backoff
(`retry_base_ms` doubling up to `retry_max_ms`, plus the `jitter_ms` the driver passes, so
the machine stays deterministic); `throttled` also holds every other upload of the topic
until then, because the store asked us to slow down. A failed commit is retried the same way.
A `fatal` upload error (bad credentials, missing bucket, an unreadable local file) is not
retried: the machine reports `Halted(resumable=True)` and waits for `resume`.

**Local retention.** `AllowLocalDelete` goes out only after the segment's index entry is
committed (or found committed at `recovered`): local retention may delete a segment only once
readers can get it from its object.

**Halts.** Inconsistencies that retrying cannot fix (a sealed segment that does not continue
the index, a committed entry that names other bytes, an upload report that contradicts the
segment) stop the machine with `Halted(resumable=False)`: uploads and commits stop, local
retention stays blocked, nothing is overwritten. An operator has to look.

**Orphans.** An object uploaded but never indexed is invisible (readers follow only the index).
The only such objects that can never be indexed are those whose range starts below the end of
the index (an index start offset is written once): every `orphan_scan_interval_ms` the machine
lists the topic's prefix and deletes those, once older than `orphan_grace_ms`. A key at or past
the end of the index is kept: its writer (the epoch in its name) may still commit it.
"""

from __future__ import annotations

import enum
import itertools
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from danube import keys
from danube.effects import StoreTxn
from danube.machines.tiering import layout
from danube.machines.tiering.index import IndexEntry, entry_problems, validate_index
from danube.machines.wal import format
from danube.metadata.model import Compare, Op, Put
from danube.values.frozen import fast_init
from danube.values.names import TopicName

MIB = 1024 * 1024
_DAWN = -(1 << 62)
"""Earlier than any clock reading: "due at once"."""


class UploadError(enum.Enum):
    """How an upload failed, as the driver classifies the store's answer."""

    THROTTLED = "throttled"
    """The store asks to slow down (S3 SlowDown / HTTP 503, 429): back off, all uploads."""
    SERVER_ERROR = "server_error"
    """Transient (5xx, timeout, connection reset): back off, this upload."""
    FATAL = "fatal"
    """Retrying cannot help until someone acts (403, missing bucket, unreadable segment)."""


@fast_init
@dataclass(frozen=True, slots=True)
class UploaderConfig:
    max_in_flight: int = 1
    """Segments uploading or uploaded but not yet committed, oldest first."""
    retry_base_ms: int = 1_000
    retry_max_ms: int = 60_000
    index_interval_bytes: int = MIB
    """Object index density: one (offset, byte) pair at least every this many bytes. Coarser
    than the WAL's: the index lives in the metadata store (64 pairs for a 64 MiB segment)."""
    orphan_scan_interval_ms: int | None = 3_600_000
    """List the topic's objects this often (the first time at `recovered`); None: never."""
    orphan_grace_ms: int = 3_600_000
    """An orphan is deleted only once its object is this old."""

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {self.max_in_flight}")
        if not 0 <= self.retry_base_ms <= self.retry_max_ms:
            raise ValueError("retry delays must satisfy 0 <= retry_base_ms <= retry_max_ms")
        if self.index_interval_bytes < 0 or self.orphan_grace_ms < 0:
            raise ValueError("index_interval_bytes and orphan_grace_ms cannot be negative")
        if self.orphan_scan_interval_ms is not None and self.orphan_scan_interval_ms < 1:
            raise ValueError("orphan_scan_interval_ms must be positive or None")

    def retry_delay_ms(self, failures: int) -> int:
        """Delay after the `failures`-th failure in a row (1 for the first)."""
        return min(self.retry_max_ms, self.retry_base_ms << min(failures - 1, 62))


@fast_init
@dataclass(frozen=True, slots=True)
class SealedSegment:
    """A closed local segment (from `CloseSegment`, or `RecoveredSegment` at a restart)."""

    base_offset: int
    next_offset: int
    size: int


class StoredObject(NamedTuple):
    """One key of a listing (`ListObjects`), with the store's last-modified time. A named
    tuple, not a frozen dataclass: every orphan scan makes one per object of the topic
    (37,000 in a 30 s cluster run), and a tuple is built at half the cost."""

    key: str
    modified_ms: int


# -- effects ----------------------------------------------------------------------------------


@fast_init
@dataclass(frozen=True, slots=True)
class UploadSegment:
    """Read the local segment file whole, run `index.describe_object(data, segment_base,
    next_offset, index_interval_bytes)` (it verifies every frame), write the bytes to `key`
    (overwrite), then call `upload_done` with the facts, or `upload_failed` (a segment that
    does not verify, or is gone, is `FATAL`)."""

    segment_base: int
    next_offset: int
    size: int
    key: str
    index_interval_bytes: int


@fast_init
@dataclass(frozen=True, slots=True)
class CommitIndex:
    """In one metadata transaction: if `path` does not exist (compare version == 0), put
    `value` there and `current_value` at `current_path`. Then call `index_committed`; when
    the compare fails, read `path` and call `index_exists` with what is there; on an error
    (outcome unknown, or the entry vanished meanwhile) call `commit_failed`."""

    path: str
    entry: IndexEntry
    current_path: str

    @property
    def value(self) -> dict[str, Any]:
        return self.entry.to_json()

    @property
    def current_value(self) -> dict[str, str]:
        return layout.current_value(self.entry.start_offset)

    def creation(self) -> tuple[tuple[Compare, ...], tuple[Op, ...]]:
        """The transaction: the entry and `cur`, only if the entry does not exist yet."""
        return (
            (Compare(self.path, "version", "==", 0),),
            (Put(self.path, self.value), Put(self.current_path, self.current_value)),
        )

    def transaction(self) -> StoreTxn:
        """`creation` in the one store vocabulary: fenced by the topic's claim (cluster
        mode), and the entry's path read back when the compare fails or the outcome is
        unknown (the entry found tells "mine landed after all" from "another's")."""
        compares, ops = self.creation()
        return StoreTxn(
            compares, ops, read_back=(self.path,), fenced=(self.path,), purpose=f"index {self.path}"
        )


@fast_init
@dataclass(frozen=True, slots=True)
class AllowLocalDelete:
    """The segment is in the object index: local retention may delete it (subject to its own
    size and age limits). Offsets below `next_offset` are all indexed."""

    segment_base: int
    next_offset: int


@fast_init
@dataclass(frozen=True, slots=True)
class ListObjects:
    """List the keys under `prefix` (relative to `durable.root`) with their last-modified
    times and call `objects_listed` (an empty listing if the listing failed)."""

    prefix: str


@fast_init
@dataclass(frozen=True, slots=True)
class DeleteObject:
    """Delete the orphan `key`; nothing reports back (a failed delete is retried by the next
    scan)."""

    key: str


@fast_init
@dataclass(frozen=True, slots=True)
class Halted:
    """Uploads and commits stopped; local retention stays blocked. Surface `reason`. With
    `resumable`, call `resume` once the cause is fixed; otherwise an operator must repair the
    index or the segments and restart the topic."""

    reason: str
    resumable: bool


Effect = UploadSegment | CommitIndex | AllowLocalDelete | ListObjects | DeleteObject | Halted


def _start_of(entry: IndexEntry) -> int:
    return entry.start_offset


# -- state ------------------------------------------------------------------------------------


class _Phase(enum.Enum):
    QUEUED = "queued"
    """To upload once `due_ms` has come (and no throttle holds uploads)."""
    UPLOADING = "uploading"
    UPLOADED = "uploaded"
    """To commit once it is the oldest uncommitted segment and `due_ms` has come."""
    COMMITTING = "committing"


@dataclass(slots=True)
class _Segment:
    base: int
    next_offset: int
    size: int
    key: str
    phase: _Phase = _Phase.QUEUED
    due_ms: int = _DAWN
    failures: int = 0
    """Failures in a row of the current step (upload, then commit): the backoff exponent."""
    entry: IndexEntry | None = None


class Uploader:
    """One topic's uploader. Single-threaded by contract; call `recovered` first."""

    def __init__(
        self, topic: TopicName, config: UploaderConfig | None = None, epoch: int = 0
    ) -> None:
        """`epoch` names this writer's objects (`keys.object_key`): the revision of the
        broker's claim on the topic in cluster mode, 0 standalone."""
        if epoch < 0:
            raise ValueError(f"epoch cannot be negative, got {epoch}")
        self.topic = topic
        self.config = config or UploaderConfig()
        self.epoch = epoch
        self._entries: list[IndexEntry] = []
        self._indexed_keys: set[str] = set()
        self._uncommitted: deque[_Segment] = deque()
        """Sealed segments not yet in the index, oldest first, contiguous."""
        self._by_key: dict[str, _Segment] = {}
        self._throttled_until = _DAWN
        self._listing = False
        self._next_scan_ms: int | None = None
        self._halt: Halted | None = None
        self._started = False

    # -- properties -----------------------------------------------------------------------------

    @property
    def entries(self) -> Sequence[IndexEntry]:
        """The committed index, oldest first: what readers may use (do not modify)."""
        return self._entries

    @property
    def indexed_next(self) -> int | None:
        """One past the last indexed offset; None while the index is empty."""
        return self._entries[-1].next_offset if self._entries else None

    @property
    def halted(self) -> Halted | None:
        return self._halt

    @property
    def idle(self) -> bool:
        """Every sealed segment is indexed (wait for this before a graceful unload)."""
        return not self._uncommitted

    @property
    def next_timer_ms(self) -> int | None:
        """When `tick` next has something to do (a retry or an orphan scan), if ever."""
        if self._halt is not None:
            return None
        if not self._uncommitted:  # the usual answer, asked at every tick of every topic
            return None if self._listing else self._next_scan_ms
        # The earliest of the deadlines below, without a list per call (asked at every tick of
        # every topic with a segment on its way: most of them).
        uncommitted = self._uncommitted
        due: int | None = None
        throttled, queued = self._throttled_until, _Phase.QUEUED
        for segment in itertools.islice(uncommitted, self.config.max_in_flight):
            if segment.phase is queued:
                at = segment.due_ms if segment.due_ms > throttled else throttled
                if due is None or at < due:
                    due = at
        if uncommitted[0].phase is _Phase.UPLOADED:
            at = uncommitted[0].due_ms
            if due is None or at < due:
                due = at
        scan = self._next_scan_ms
        if scan is not None and not self._listing and (due is None or scan < due):
            due = scan
        return due

    # -- inputs ---------------------------------------------------------------------------------

    def recovered(
        self, indexed: Sequence[IndexEntry], sealed: Sequence[SealedSegment], now_ms: int
    ) -> list[Effect]:
        """The durable state, once, before any other input: the committed index entries (a
        scan of `keys.index_prefix`, `cur` left out) and every closed local segment after
        WAL recovery (`RecoveryPlan.segments`: all of them are closed)."""
        if self._started:
            raise ValueError(f"{self.topic.full}: recovered called twice")
        self._started = True
        if self.config.orphan_scan_interval_ms is not None:
            self._next_scan_ms = now_ms
        entries = sorted(indexed, key=_start_of)
        problems = validate_index(entries)
        prefix = keys.object_prefix(self.topic)
        for entry in entries:
            if not entry.key.startswith(prefix):
                problems.append(
                    f"index entry {entry.start_offset:020d} names key {entry.key!r}, which is "
                    "not one of this topic's objects"
                )
        if problems:
            return self._stop(f"the object index is unsound: {'; '.join(problems)}", False)
        self._entries = entries
        self._indexed_keys = {entry.key for entry in entries}
        effects: list[Effect] = []
        for segment in sorted(sealed, key=lambda s: s.base_offset):
            effects += self._add(segment.base_offset, segment.next_offset, segment.size)
        return effects + self._pump(now_ms)

    def segment_sealed(
        self, base_offset: int, next_offset: int, size: int, now_ms: int
    ) -> list[Effect]:
        """The WAL closed this segment (`CloseSegment`): it is durable and final."""
        self._require_started()
        return self._add(base_offset, next_offset, size) + self._pump(now_ms)

    def upload_done(
        self,
        key: str,
        size: int,
        crc32c: int,
        offset_index: Sequence[tuple[int, int]],
        now_ms: int,
    ) -> list[Effect]:
        """The object is written; the facts come from `index.describe_object`."""
        segment = self._expect(key, _Phase.UPLOADING)
        entry = IndexEntry(
            segment.base,
            segment.next_offset - 1,
            size,
            crc32c,
            key,
            now_ms,
            tuple((offset, position) for offset, position in offset_index),
        )
        problems = entry_problems(entry)
        if size != segment.size:
            problems.insert(0, f"{size} bytes uploaded, {segment.size} sealed")
        if problems:
            segment.phase = _Phase.QUEUED
            reason = (
                f"the upload of {format.segment_name(segment.base)} does not match the sealed "
                f"segment ({'; '.join(problems)}): the local file changed after it was sealed"
            )
            return self._stop(reason, False)
        segment.phase, segment.entry = _Phase.UPLOADED, entry
        segment.due_ms, segment.failures = _DAWN, 0
        return self._pump(now_ms)

    def upload_failed(
        self,
        key: str,
        kind: UploadError,
        now_ms: int,
        reason: str = "",
        jitter_ms: int = 0,
    ) -> list[Effect]:
        """The object may or may not have been written; the retry overwrites it either way.
        `jitter_ms` (≥ 0, the driver's random choice) is added to the backoff."""
        segment = self._expect(key, _Phase.UPLOADING)
        segment.phase = _Phase.QUEUED
        if kind is UploadError.FATAL:
            segment.due_ms, segment.failures = _DAWN, 0
            return self._stop(f"uploading {key} failed: {reason or kind.value}", True)
        segment.failures += 1
        segment.due_ms = now_ms + self._backoff(segment.failures, jitter_ms)
        if kind is UploadError.THROTTLED:
            self._throttled_until = max(self._throttled_until, segment.due_ms)
        return self._pump(now_ms)

    def index_committed(self, start_offset: int, now_ms: int) -> list[Effect]:
        """`CommitIndex` created the entry."""
        segment = self._expect_commit(start_offset)
        assert segment.entry is not None
        return self._committed(segment.entry, now_ms)

    def index_exists(self, existing: IndexEntry, now_ms: int) -> list[Effect]:
        """`CommitIndex` found an entry at its path: this machine's own earlier commit (its
        outcome was unknown), or, if it names other bytes, someone else's."""
        segment = self._expect_commit(existing.start_offset)
        assert segment.entry is not None
        segment.phase = _Phase.UPLOADED
        problems = entry_problems(existing)
        if problems:
            return self._stop(f"the stored index entry is unsound: {'; '.join(problems)}", False)
        if existing.same_object(segment.entry):
            return self._committed(existing, now_ms)
        reason = (
            f"index entry {existing.start_offset:020d} already exists and names another object "
            f"(key {existing.key!r}, offsets {existing.start_offset}–{existing.end_offset}, "
            f"{existing.size} bytes, crc32c {existing.crc32c}) than the local segment: another "
            "broker has written this topic's history"
        )
        return self._stop(reason, False)

    def commit_failed(self, start_offset: int, now_ms: int, jitter_ms: int = 0) -> list[Effect]:
        """The metadata store failed the transaction or its outcome is unknown; the retry's
        compare-and-create sorts out which."""
        segment = self._expect_commit(start_offset)
        segment.phase = _Phase.UPLOADED
        segment.failures += 1
        segment.due_ms = now_ms + self._backoff(segment.failures, jitter_ms)
        return self._pump(now_ms)

    def objects_listed(self, objects: Sequence[StoredObject], now_ms: int) -> list[Effect]:
        """The answer to `ListObjects`: deletes the orphans in it."""
        if not self._listing:
            raise ValueError(f"{self.topic.full}: objects_listed without a ListObjects")
        self._listing = False
        interval = self.config.orphan_scan_interval_ms
        self._next_scan_ms = None if interval is None else now_ms + interval
        indexed_next = self.indexed_next
        if indexed_next is None:  # nothing is indexed: no object can be an orphan yet
            return self._pump(now_ms)
        # `_is_orphan`'s cheap tests inlined (a scan lists every object of the topic, most
        # of them indexed, and a call per object was a percent of a cluster run)
        indexed, young = self._indexed_keys, now_ms - self.config.orphan_grace_ms
        effects: list[Effect] = [
            DeleteObject(stored.key)
            for stored in objects
            if stored.key not in indexed
            and stored.modified_ms <= young
            and self._is_orphan(stored, now_ms, indexed_next)
        ]
        return effects + self._pump(now_ms)

    def tick(self, now_ms: int) -> list[Effect]:
        """Time passes: due retries and orphan scans start (every input does this too)."""
        self._require_started()
        return self._pump(now_ms)

    def resume(self, now_ms: int) -> list[Effect]:
        """After a resumable halt: retry the failed upload and carry on."""
        self._require_started()
        if self._halt is None:
            return self._pump(now_ms)
        if not self._halt.resumable:
            raise ValueError(f"{self.topic.full}: this halt cannot be resumed: {self._halt}")
        self._halt = None
        return self._pump(now_ms)

    # -- the engine -----------------------------------------------------------------------------

    def _add(self, base: int, next_offset: int, size: int) -> list[Effect]:
        if next_offset <= base or base < 0 or size <= 0:
            raise ValueError(f"{self.topic.full}: sealed segment {base}–{next_offset} is empty")
        name = format.segment_name(base)
        indexed_next = self.indexed_next
        if indexed_next is not None and base < indexed_next:
            entry = self._entry_at(base)
            if entry is not None and (entry.next_offset, entry.size) == (next_offset, size):
                return [AllowLocalDelete(base, next_offset)]
            reason = (
                f"local segment {name} (offsets {base}–{next_offset - 1}, {size} bytes) "
                "overlaps the object index without matching an entry"
            )
            return self._stop(reason, False)
        expected = self._uncommitted[-1].next_offset if self._uncommitted else indexed_next
        if expected is not None and base != expected:
            low, high = sorted((base, expected))
            what = "in no segment" if base > expected else "in two segments"
            reason = (
                f"local segment {name} does not continue the uploaded history, which ends "
                f"before offset {expected}: offsets {low}–{high - 1} are {what}"
            )
            return self._stop(reason, False)
        key = keys.object_key(self.topic, base, next_offset, self.epoch)
        segment = _Segment(base, next_offset, size, key)
        self._uncommitted.append(segment)
        self._by_key[key] = segment
        return []

    def _pump(self, now_ms: int) -> list[Effect]:
        """Starts every upload, commit and scan that is due."""
        effects: list[Effect] = []
        if self._halt is not None:
            return effects
        if now_ms >= self._throttled_until:
            for segment in itertools.islice(self._uncommitted, self.config.max_in_flight):
                if segment.phase is _Phase.QUEUED and now_ms >= segment.due_ms:
                    segment.phase = _Phase.UPLOADING
                    effects.append(
                        UploadSegment(
                            segment.base,
                            segment.next_offset,
                            segment.size,
                            segment.key,
                            self.config.index_interval_bytes,
                        )
                    )
        head = self._uncommitted[0] if self._uncommitted else None
        if head is not None and head.phase is _Phase.UPLOADED and now_ms >= head.due_ms:
            assert head.entry is not None
            head.phase = _Phase.COMMITTING
            path = keys.index_path(self.topic, head.base)
            effects.append(CommitIndex(path, head.entry, keys.current_path(self.topic)))
        scan = self._next_scan_ms
        if scan is not None and not self._listing and now_ms >= scan:
            self._listing = True
            effects.append(ListObjects(keys.object_prefix(self.topic)))
        return effects

    def _committed(self, entry: IndexEntry, now_ms: int) -> list[Effect]:
        segment = self._uncommitted.popleft()
        del self._by_key[segment.key]
        self._entries.append(entry)
        self._indexed_keys.add(entry.key)
        return [AllowLocalDelete(segment.base, segment.next_offset), *self._pump(now_ms)]

    def _is_orphan(self, stored: StoredObject, now_ms: int, indexed_next: int) -> bool:
        """Never indexable (its range starts inside the indexed history, whose entry starts
        are final) and old enough. The cheap tests come first: most listed objects are
        indexed, and parsing every key of every scan was a tenth of a cluster run."""
        if (
            stored.key in self._indexed_keys
            or now_ms - stored.modified_ms < self.config.orphan_grace_ms
        ):
            return False
        parsed = keys.parse_object_key(self.topic, stored.key)
        return parsed is not None and parsed[0] < indexed_next

    def _entry_at(self, start: int) -> IndexEntry | None:
        at = bisect_left(self._entries, start, key=_start_of)
        if at < len(self._entries) and self._entries[at].start_offset == start:
            return self._entries[at]
        return None

    def _backoff(self, failures: int, jitter_ms: int) -> int:
        if jitter_ms < 0:
            raise ValueError(f"jitter_ms cannot be negative, got {jitter_ms}")
        return self.config.retry_delay_ms(failures) + jitter_ms

    def _stop(self, reason: str, resumable: bool) -> list[Effect]:
        """Halts, or makes a resumable halt final; a halt already as final is not repeated."""
        if self._halt is not None and (resumable or not self._halt.resumable):
            return []
        self._halt = Halted(f"{self.topic.full}: {reason}", resumable)
        return [self._halt]

    def _expect(self, key: str, phase: _Phase) -> _Segment:
        segment = self._by_key.get(key)
        if segment is None or segment.phase is not phase:
            raise ValueError(f"{self.topic.full}: no {phase.value} segment has key {key}")
        return segment

    def _expect_commit(self, start_offset: int) -> _Segment:
        head = self._uncommitted[0] if self._uncommitted else None
        if head is None or head.base != start_offset or head.phase is not _Phase.COMMITTING:
            raise ValueError(f"{self.topic.full}: no commit of entry {start_offset} under way")
        return head

    def _require_started(self) -> None:
        if not self._started:
            raise ValueError(f"{self.topic.full}: call recovered before any other input")

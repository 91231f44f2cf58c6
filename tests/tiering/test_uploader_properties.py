"""Stateful property test of the uploader against a simulated object store, metadata store and
local disk, judged by the reference model `spec/models/uploader_model.py`.

Random segments are sealed (their `CloseSegment` reaching the uploader at once, later, or not
before a crash); the driver performs effects one at a time in emission order and may fail any
upload (throttled, server error, fatal; the object written or not) or commit (applied or
not: the outcome of a failed metadata call is unknown), delivers completions in any order, lets
local retention delete what it may, plants stray objects, and crashes at any point. A crash
rebuilds the uploader from what is durable: the committed index, the local segment files and,
implicitly, the objects. Throughout:

1. uploads start in offset order, only for segments still local and not yet indexed, within
   the window of `max_in_flight` oldest unindexed segments, to the segment's deterministic key;
2. the index only grows by the next contiguous entry, whose object equals the segment's bytes
   (size and CRC included), and stays sound (`validate_index`); one commit at a time;
3. a local segment is deleted only after its index entry was committed;
4. only objects that can never be indexed are deleted, never an indexed one;
and when the run ends, with failures switched off, every sealed segment gets indexed, every
orphan older than the grace period is collected, and every indexed offset reads back from its
object through the tiered read planner.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from danube.machines.tiering import layout
from danube.machines.tiering.index import IndexEntry, describe_object, validate_index
from danube.machines.tiering.reader import ObjectRead, decode_object_read, plan_read
from danube.machines.tiering.uploader import (
    AllowLocalDelete,
    CommitIndex,
    DeleteObject,
    Effect,
    Halted,
    ListObjects,
    SealedSegment,
    StoredObject,
    Uploader,
    UploaderConfig,
    UploadError,
    UploadSegment,
)
from spec.models.uploader_model import Segment, TieringModel
from tests.tiering.segments import NOW, TOPIC, build_segment, record

configs = st.builds(
    UploaderConfig,
    max_in_flight=st.integers(1, 3),
    retry_base_ms=st.integers(0, 50),
    retry_max_ms=st.integers(50, 400),
    index_interval_bytes=st.integers(0, 100),
    orphan_scan_interval_ms=st.none() | st.integers(50, 500),
    orphan_grace_ms=st.integers(0, 300),
)
frame_lists = st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=3), min_size=1, max_size=3)
"""A segment: frames, each a list of record sizes."""
UPLOAD_FAILURES = (UploadError.THROTTLED, UploadError.SERVER_ERROR, UploadError.FATAL)


def key_of(base: int, next_offset: int) -> str:
    return layout.object_key(TOPIC, base, next_offset)


class UploaderWorld(RuleBasedStateMachine):
    @initialize(config=configs)
    def setup(self, config: UploaderConfig) -> None:
        self.config = config
        self.now = NOW
        self.model = TieringModel(key_of, config.max_in_flight)
        self.records: dict[int, bytes] = {}
        self.next_offset = 0
        self.local: dict[int, bytes] = {}
        self.modified: dict[str, int] = {}
        """Last-modified time of every object (its bytes are in the model)."""
        self.meta: dict[str, Any] = {}
        self.allowed: set[int] = set()
        self.to_notify: deque[SealedSegment] = deque()
        self.start_uploader()

    def start_uploader(self) -> None:
        """A (re)started broker: the uploader built from the durable state alone."""
        self.io: deque[Effect] = deque()
        self.completions: list[tuple[Any, ...]] = []
        self.uploading: set[str] = set()
        self.committing = False
        self.halted: Halted | None = None
        self.uploader = Uploader(TOPIC, self.config)
        sealed = [
            SealedSegment(base, self.model.segments[base].next_offset, len(data))
            for base, data in sorted(self.local.items())
        ]
        self.handle(self.uploader.recovered(self.durable_index(), sealed, self.now))

    def durable_index(self) -> list[IndexEntry]:
        return [
            IndexEntry.from_json(value)
            for path, value in sorted(self.meta.items())
            if layout.index_start(path) is not None
        ]

    # -- the driver -----------------------------------------------------------------------------

    def handle(self, effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case UploadSegment(segment_base=base, key=key):
                    self.model.upload_started(base, key)
                    assert key not in self.uploading, f"{key} uploading twice at once"
                    self.uploading.add(key)
                    assert len(self.uploading) <= self.config.max_in_flight
                    self.io.append(effect)
                case CommitIndex():
                    assert not self.committing, "two commits in flight"
                    self.committing = True
                    self.io.append(effect)
                case AllowLocalDelete(segment_base=base, next_offset=next_offset):
                    self.model.allow_delete(base)
                    assert next_offset == self.model.segments[base].next_offset
                    self.allowed.add(base)
                case Halted():
                    assert effect.resumable, effect.reason  # this world is never inconsistent
                    self.halted = effect
                case ListObjects() | DeleteObject():
                    self.io.append(effect)

    def write_object(self, key: str, data: bytes) -> None:
        self.model.write_object(key, data)
        self.modified[key] = self.now

    def perform(self, fail: bool = False, variant: int = 0) -> None:
        effect = self.io.popleft()
        match effect:
            case UploadSegment(segment_base=base, next_offset=next_offset, key=key):
                data = self.local[base]
                if fail:
                    if variant & 4:  # the PUT landed although the call failed
                        self.write_object(key, data)
                    kind = UPLOAD_FAILURES[variant % 3]
                    self.completions.append(("upload_failed", key, kind, variant % 7))
                else:
                    facts = describe_object(data, base, next_offset, effect.index_interval_bytes)
                    self.write_object(key, data)
                    self.completions.append(("upload_done", key, facts))
            case CommitIndex(entry=entry):
                created = self.compare_and_create(effect) if not fail or variant & 1 else None
                if fail:
                    self.completions.append(("commit_failed", entry.start_offset, variant % 7))
                elif created:
                    self.completions.append(("committed", entry.start_offset))
                else:
                    existing = IndexEntry.from_json(self.meta[effect.path])
                    self.completions.append(("exists", existing))
            case ListObjects(prefix=prefix):
                listing = [] if fail else self.listing(prefix)
                self.completions.append(("listed", listing))
            case DeleteObject(key=key):
                if not fail:
                    parsed = layout.parse_object_key(TOPIC, key)
                    assert parsed is not None, f"deleted foreign key {key}"
                    self.model.delete_object(key, parsed[0])
                    del self.modified[key]

    def compare_and_create(self, commit: CommitIndex) -> bool:
        if commit.path in self.meta:
            return False
        self.meta[commit.path] = commit.value
        self.meta[commit.current_path] = commit.current_value
        entry = commit.entry
        self.model.commit(
            entry.start_offset, entry.next_offset, entry.key, entry.size, entry.crc32c
        )
        return True

    def listing(self, prefix: str) -> list[StoredObject]:
        found = sorted(self.modified.items())
        return [StoredObject(key, at) for key, at in found if key.startswith(prefix)]

    def deliver(self, index: int) -> None:
        kind, *args = self.completions.pop(index)
        uploader, now = self.uploader, self.now
        match kind:
            case "upload_done":
                key, facts = args
                self.uploading.discard(key)
                effects = uploader.upload_done(
                    key, facts.size, facts.crc32c, facts.offset_index, now
                )
            case "upload_failed":
                key, error, jitter = args
                self.uploading.discard(key)
                effects = uploader.upload_failed(key, error, now, "injected", jitter)
            case "committed":
                self.committing = False
                effects = uploader.index_committed(args[0], now)
            case "exists":
                self.committing = False
                effects = uploader.index_exists(args[0], now)
            case "commit_failed":
                self.committing = False
                effects = uploader.commit_failed(args[0], now, args[1])
            case _:
                effects = uploader.objects_listed(args[0], now)
        self.handle(effects)

    def notify_one(self) -> None:
        sealed = self.to_notify.popleft()
        self.handle(
            self.uploader.segment_sealed(
                sealed.base_offset, sealed.next_offset, sealed.size, self.now
            )
        )

    # -- rules ----------------------------------------------------------------------------------

    @rule(frames=frame_lists, notify=st.booleans(), dt=st.integers(0, 50))
    def seal(self, frames: list[list[int]], notify: bool, dt: int) -> None:
        """The WAL closes a segment; its `CloseSegment` reaches the uploader now or later."""
        self.now += dt
        base = self.next_offset
        batches = []
        for sizes in frames:
            batch = []
            for size in sizes:
                self.records[self.next_offset] = record(self.next_offset, size)
                batch.append(self.records[self.next_offset])
                self.next_offset += 1
            batches.append(batch)
        data = build_segment(base, batches, self.now)
        self.local[base] = data
        self.model.seal(Segment(base, self.next_offset, data))
        self.to_notify.append(SealedSegment(base, self.next_offset, len(data)))
        while notify and self.to_notify:
            self.notify_one()

    @precondition(lambda self: self.to_notify)
    @rule()
    def notify(self) -> None:
        self.notify_one()

    @precondition(lambda self: self.io)
    @rule(failure=st.integers(0, 3), variant=st.integers(0, 63))
    def perform_io(self, failure: int, variant: int) -> None:
        self.perform(fail=failure == 0, variant=variant)

    @precondition(lambda self: self.completions)
    @rule(pick=st.integers(0, 3), dt=st.integers(0, 30))
    def complete(self, pick: int, dt: int) -> None:
        self.now += dt
        self.deliver(pick % len(self.completions))

    @rule(
        steps=st.lists(
            st.tuples(st.integers(0, 2), st.integers(0, 9), st.integers(0, 63)),
            min_size=1,
            max_size=12,
        ),
        dt=st.integers(0, 20),
    )
    def run_io(self, steps: list[tuple[int, int, int]], dt: int) -> None:
        """Several driver steps at once (perform, failing one in ten, or deliver the oldest or
        newest completion), so that runs get deep enough for retries and recommits."""
        for step, failure, variant in steps:
            self.now += dt
            if self.io and (step == 0 or not self.completions):
                self.perform(fail=failure == 0, variant=variant)
            elif self.completions:
                self.deliver(0 if step == 1 else -1)

    @rule(dt=st.integers(0, 500))
    def tick(self, dt: int) -> None:
        self.now += dt
        self.handle(self.uploader.tick(self.now))

    @precondition(lambda self: self.uploader.next_timer_ms is not None)
    @rule()
    def wait_for_timer(self) -> None:
        due = self.uploader.next_timer_ms
        assert due is not None
        self.now = max(self.now, due)
        self.handle(self.uploader.tick(self.now))

    @precondition(lambda self: self.allowed & self.local.keys())
    @rule()
    def retain(self) -> None:
        """Local retention deletes the oldest segment it has been allowed to."""
        base = min(self.allowed & self.local.keys())
        self.model.delete_local(base)
        del self.local[base]

    @precondition(lambda self: self.halted is not None)
    @rule()
    def resume(self) -> None:
        self.halted = None
        self.handle(self.uploader.resume(self.now))

    @rule(start=st.integers(0, 40), length=st.integers(1, 10), age=st.integers(0, 400))
    def stray_object(self, start: int, length: int, age: int) -> None:
        """An object no index names: a crashed upload of another incarnation or owner."""
        key = key_of(start, start + length)
        ours = {key_of(s.base, s.next_offset) for s in self.model.segments.values()}
        if key in ours or key in self.modified:
            return
        self.model.write_object(key, b"stray")
        self.modified[key] = self.now - age

    @rule()
    def crash(self) -> None:
        """The broker dies: effects under way and unsent notifications are lost; the uploader
        is rebuilt from the index, the local files and the objects."""
        self.model.crash()
        self.to_notify.clear()
        self.start_uploader()

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def index_is_sound_and_known(self) -> None:
        durable = self.durable_index()
        assert validate_index(durable) == []
        known = self.uploader.entries
        assert len(known) <= len(durable)
        assert all(a.same_object(b) for a, b in zip(known, durable, strict=False))

    def teardown(self) -> None:
        """Liveness with failures switched off, then the whole history reads back."""
        if not hasattr(self, "uploader"):
            return
        while self.to_notify:
            self.notify_one()
        self.drain(until_idle=True)
        self.model.check_complete()
        if self.config.orphan_scan_interval_ms is not None:
            self.now += self.config.orphan_scan_interval_ms + self.config.orphan_grace_ms
            self.handle(self.uploader.tick(self.now))
            self.drain(until_idle=False)
            indexed_next = self.model.indexed_next
            orphans = [
                key
                for key in self.model.objects
                if key not in self.model.indexed_keys
                and indexed_next is not None
                and (parsed := layout.parse_object_key(TOPIC, key)) is not None
                and parsed[0] < indexed_next
            ]
            assert not orphans, f"orphans left: {orphans}"
        entries = self.uploader.entries
        for offset in range(entries[0].start_offset if entries else 0, self.next_offset):
            plan = plan_read(entries, self.next_offset, offset, 1, 1 << 20)
            assert isinstance(plan, ObjectRead)
            data = self.model.objects[plan.key][plan.start_byte : plan.end_byte]
            assert decode_object_read(plan, data) == (self.records[offset],)

    def drain(self, until_idle: bool) -> None:
        for _ in range(10_000):
            if self.io:
                self.perform()
            elif self.completions:
                self.deliver(0)
            elif self.halted is not None:
                self.resume()  # an operator fixed what the fatal error was about
            elif until_idle and not self.uploader.idle:
                due = self.uploader.next_timer_ms
                assert due is not None, "the uploader stalled with segments to index"
                self.now = max(self.now, due)
                self.handle(self.uploader.tick(self.now))
            else:
                return
        raise AssertionError("the driver never ran out of work")


UploaderWorld.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestUploaderWorld = UploaderWorld.TestCase

"""Example tests of the uploader, one per rule of its module docstring and of
spec/object-layout.md: upload order and the in-flight window, commit order, retries and
backoff, throttling, failure kinds and halts, idempotent resume, local-delete permission and
orphan collection. The upload facts are stand-ins here; tests/tiering/test_uploader_properties
runs the machine on real segment bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from danube.machines.tiering import layout
from danube.machines.tiering.index import IndexEntry
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
from tests.tiering.segments import TOPIC

QUIET = UploaderConfig(orphan_scan_interval_ms=None, retry_base_ms=100, retry_max_ms=1_000)
SIZE = 1_000
POSITION = 56
"""Where the first frame starts in these stand-in segments (after the header)."""


def key(base: int, next_offset: int) -> str:
    return layout.object_key(TOPIC, base, next_offset)


def entry(base: int, next_offset: int, *, size: int = SIZE, crc: int = 7) -> IndexEntry:
    return IndexEntry(base, next_offset - 1, size, crc, key(base, next_offset), 5, ((base, 56),))


def start(
    config: UploaderConfig = QUIET,
    indexed: tuple[IndexEntry, ...] = (),
    sealed: tuple[tuple[int, int], ...] = (),
    now: int = 0,
) -> tuple[Uploader, list[Effect]]:
    uploader = Uploader(TOPIC, config)
    segments = [SealedSegment(base, end, SIZE) for base, end in sealed]
    return uploader, uploader.recovered(indexed, segments, now)


def done(uploader: Uploader, upload: UploadSegment, now: int = 0) -> list[Effect]:
    return uploader.upload_done(upload.key, upload.size, 7, [(upload.segment_base, 56)], now)


def uploads(effects: list[Effect]) -> list[int]:
    return [e.segment_base for e in effects if isinstance(e, UploadSegment)]


def only(effects: list[Effect], kind: type):
    found = [e for e in effects if isinstance(e, kind)]
    assert len(found) == 1, effects
    return found[0]


# -- order ------------------------------------------------------------------------------------


def test_one_segment_at_a_time_by_default_and_delete_allowed_only_after_commit() -> None:
    uploader, effects = start()
    assert effects == []
    first = uploader.segment_sealed(0, 10, SIZE, 0)
    assert first == [UploadSegment(0, 10, SIZE, key(0, 10), QUIET.index_interval_bytes)]
    assert uploader.segment_sealed(10, 25, SIZE, 0) == []  # waits for segment 0's commit
    commit = only(done(uploader, first[0], now=3), CommitIndex)
    assert commit.entry == IndexEntry(0, 9, SIZE, 7, key(0, 10), 3, ((0, POSITION),))
    assert not uploader.entries and not uploader.idle
    effects = uploader.index_committed(0, 4)
    assert effects[0] == AllowLocalDelete(0, 10)
    assert uploads(effects) == [10]
    assert uploader.entries == [commit.entry] and uploader.indexed_next == 10


def test_commit_writes_the_entry_and_danubes_current_pointer() -> None:
    uploader, _ = start()
    upload = uploader.segment_sealed(120, 135, SIZE, 0)[0]
    commit = only(done(uploader, upload, now=9), CommitIndex)
    assert commit.path == "/storage/topics/default/tiered/segments/00000000000000000120"
    assert commit.current_path == "/storage/topics/default/tiered/segments/cur"
    assert commit.current_value == {"start": "00000000000000000120"}
    assert commit.value == {
        "start_offset": 120,
        "end_offset": 134,
        "size": SIZE,
        "crc32c": 7,
        "key": "storage/topics/default/tiered/segments/"
        "00000000000000000120-00000000000000000135.wal",
        "created_ms": 9,
        "offset_index": [[120, POSITION]],
    }


def test_window_uploads_ahead_but_commits_strictly_in_offset_order() -> None:
    uploader, _ = start(UploaderConfig(max_in_flight=3, orphan_scan_interval_ms=None))
    started = [uploader.segment_sealed(b, b + 10, SIZE, 0) for b in (0, 10, 20, 30)]
    assert [uploads(effects) for effects in started] == [[0], [10], [20], []]
    first, second, third = (effects[0] for effects in started[:3])
    assert done(uploader, third) == [] and done(uploader, second) == []
    assert only(done(uploader, first), CommitIndex).entry.start_offset == 0
    effects = uploader.index_committed(0, 0)
    # segment 30 enters the window; segment 10 is next to commit, one commit at a time
    assert effects[0] == AllowLocalDelete(0, 10)
    assert uploads(effects) == [30]
    assert only(effects, CommitIndex).entry.start_offset == 10
    effects = uploader.index_committed(10, 0)
    assert only(effects, CommitIndex).entry.start_offset == 20


def test_a_sealed_segment_must_continue_the_history() -> None:
    uploader, _ = start()
    uploader.segment_sealed(0, 10, SIZE, 0)
    halted = only(uploader.segment_sealed(12, 20, SIZE, 0), Halted)
    assert not halted.resumable and "offsets 10–11 are in no segment" in halted.reason
    with pytest.raises(ValueError, match="cannot be resumed"):
        uploader.resume(0)


# -- retries ----------------------------------------------------------------------------------


def test_server_errors_back_off_exponentially_up_to_the_cap_plus_jitter() -> None:
    uploader, _ = start()
    upload = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    now, retries = 0, []
    for _ in range(6):
        assert uploader.upload_failed(upload.key, UploadError.SERVER_ERROR, now) == []
        due = uploader.next_timer_ms
        assert due is not None
        assert uploader.tick(due - 1) == []
        assert uploader.tick(due) == [upload]  # the same key: the retry overwrites
        retries.append(due - now)
        now = due
    assert retries == [100, 200, 400, 800, 1_000, 1_000]
    assert uploader.upload_failed(upload.key, UploadError.SERVER_ERROR, now, jitter_ms=37) == []
    assert uploader.next_timer_ms == now + 1_037


def test_success_resets_the_backoff_for_the_commit() -> None:
    uploader, _ = start()
    upload = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    uploader.upload_failed(upload.key, UploadError.SERVER_ERROR, 0)
    assert uploader.tick(100) == [upload]
    uploader.upload_failed(upload.key, UploadError.SERVER_ERROR, 100)
    assert uploader.tick(300) == [upload]
    commit = only(done(uploader, upload, now=300), CommitIndex)
    assert uploader.commit_failed(0, 300) == []
    assert uploader.next_timer_ms == 400  # the commit's first failure: the base delay
    assert uploader.tick(400) == [commit]
    assert uploader.index_committed(0, 400)[0] == AllowLocalDelete(0, 10)


def test_throttling_holds_every_upload_until_the_backoff_ends() -> None:
    config = UploaderConfig(max_in_flight=3, orphan_scan_interval_ms=None, retry_base_ms=100)
    uploader, _ = start(config)
    first = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    uploader.segment_sealed(10, 20, SIZE, 0)
    assert uploader.upload_failed(first.key, UploadError.THROTTLED, 0) == []
    assert uploader.segment_sealed(20, 30, SIZE, 50) == []  # room in the window, but held
    assert uploader.tick(99) == []
    assert uploads(uploader.tick(100)) == [0, 20]


def test_a_server_error_delays_only_its_own_segment() -> None:
    uploader, _ = start(UploaderConfig(max_in_flight=3, orphan_scan_interval_ms=None))
    first = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    uploader.upload_failed(first.key, UploadError.SERVER_ERROR, 0)
    assert uploads(uploader.segment_sealed(10, 20, SIZE, 1)) == [10]


def test_a_fatal_error_halts_until_resumed_and_in_flight_work_still_lands() -> None:
    uploader, _ = start(UploaderConfig(max_in_flight=2, orphan_scan_interval_ms=None))
    first = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    second = uploader.segment_sealed(10, 20, SIZE, 0)[0]
    halted = only(uploader.upload_failed(first.key, UploadError.FATAL, 0, "403 Forbidden"), Halted)
    assert halted.resumable and "403 Forbidden" in halted.reason
    assert uploader.halted == halted and uploader.next_timer_ms is None
    assert done(uploader, second) == []  # accepted, but nothing new starts while halted
    assert uploader.tick(10_000) == []
    resumed = uploader.resume(10_000)
    assert resumed == [first]
    commit = only(done(uploader, first), CommitIndex)
    assert commit.entry.start_offset == 0
    assert only(uploader.index_committed(0, 0), CommitIndex).entry.start_offset == 10


def test_a_structural_halt_is_not_softened_by_a_later_fatal_error() -> None:
    uploader, _ = start(UploaderConfig(max_in_flight=2, orphan_scan_interval_ms=None))
    first = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    assert only(uploader.segment_sealed(11, 20, SIZE, 0), Halted).resumable is False
    assert uploader.upload_failed(first.key, UploadError.FATAL, 0) == []
    assert uploader.halted is not None and not uploader.halted.resumable


# -- commits ----------------------------------------------------------------------------------


def test_an_existing_identical_entry_counts_as_committed() -> None:
    uploader, _ = start()
    upload = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    done(uploader, upload, now=50)
    earlier = entry(0, 10)  # our own commit whose outcome was unknown, made at time 5
    effects = uploader.index_exists(earlier, 60)
    assert effects == [AllowLocalDelete(0, 10)]
    assert uploader.entries == [earlier]


def test_an_existing_entry_for_other_bytes_halts_without_allowing_the_delete() -> None:
    uploader, _ = start()
    upload = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    done(uploader, upload)
    halted = only(uploader.index_exists(entry(0, 10, crc=8), 0), Halted)
    assert not halted.resumable and "another broker" in halted.reason
    assert not uploader.entries
    uploader, _ = start()
    done(uploader, uploader.segment_sealed(0, 10, SIZE, 0)[0])
    malformed = replace(entry(0, 10), offset_index=())
    halted = only(uploader.index_exists(malformed, 0), Halted)
    assert "entry is unsound" in halted.reason and not uploader.entries


def test_an_upload_that_contradicts_the_sealed_segment_halts() -> None:
    uploader, _ = start()
    upload = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    halted = uploader.upload_done(upload.key, SIZE - 1, 7, [(0, POSITION)], 0)
    assert "999 bytes uploaded, 1000 sealed" in only(halted, Halted).reason
    uploader, _ = start()
    upload = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    halted = uploader.upload_done(upload.key, SIZE, 7, [(3, POSITION)], 0)
    assert "offset_index starts at offset 3" in only(halted, Halted).reason


# -- resume after a crash ---------------------------------------------------------------------


def test_resume_skips_indexed_segments_and_reuploads_the_rest_to_the_same_keys() -> None:
    before, _ = start()
    upload = before.segment_sealed(20, 30, SIZE, 0)[0]
    # crash after the upload, before the commit: the new machine uploads to the same key
    indexed = (entry(0, 10), entry(10, 20))
    after, effects = start(indexed=indexed, sealed=((10, 20), (20, 30), (30, 45)))
    assert effects == [AllowLocalDelete(10, 20), upload]
    assert after.indexed_next == 20
    commit = only(done(after, upload), CommitIndex)
    assert commit.path == layout.index_path(TOPIC, 20)


def test_resume_with_a_local_segment_that_does_not_continue_the_index_halts() -> None:
    _, effects = start(indexed=(entry(0, 10),), sealed=((12, 20),))
    assert "offsets 10–11 are in no segment" in only(effects, Halted).reason
    _, effects = start(indexed=(entry(0, 10), entry(10, 20)), sealed=((10, 15),))
    assert "overlaps the object index" in only(effects, Halted).reason
    assert uploads(effects) == []


def test_resume_refuses_an_unsound_index() -> None:
    _, effects = start(indexed=(entry(0, 10), entry(12, 20)), sealed=((20, 30),))
    halted = only(effects, Halted)
    assert "offsets 10–11 are missing" in halted.reason and uploads(effects) == []
    foreign = IndexEntry(0, 9, SIZE, 7, "elsewhere/" + layout.object_name(0, 10), 5, ((0, 56),))
    _, effects = start(indexed=(foreign,))
    assert "names key 'elsewhere/" in only(effects, Halted).reason


def test_inputs_need_recovered_first_and_completions_must_match() -> None:
    uploader = Uploader(TOPIC, QUIET)
    with pytest.raises(ValueError, match="call recovered"):
        uploader.segment_sealed(0, 10, SIZE, 0)
    uploader.recovered((), (), 0)
    with pytest.raises(ValueError, match="called twice"):
        uploader.recovered((), (), 0)
    with pytest.raises(ValueError, match="no uploading segment"):
        uploader.upload_done(key(0, 10), SIZE, 7, [(0, POSITION)], 0)
    with pytest.raises(ValueError, match="no commit of entry 0"):
        uploader.index_committed(0, 0)
    with pytest.raises(ValueError, match="is empty"):
        uploader.segment_sealed(10, 10, SIZE, 0)
    upload = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    with pytest.raises(ValueError, match="jitter_ms"):
        uploader.upload_failed(upload.key, UploadError.SERVER_ERROR, 0, jitter_ms=-1)


# -- orphans ----------------------------------------------------------------------------------


def test_orphans_are_only_unindexed_objects_inside_the_indexed_history_past_the_grace() -> None:
    config = UploaderConfig(orphan_scan_interval_ms=500, orphan_grace_ms=100)
    uploader, effects = start(config, indexed=(entry(0, 10), entry(10, 20)), now=1_000)
    assert effects == [ListObjects("storage/topics/default/tiered/segments/")]
    listing = [
        StoredObject(key(0, 10), 0),  # indexed
        StoredObject(key(0, 15), 0),  # superseded: start 0 is indexed under another key
        StoredObject(key(5, 10), 0),  # starts inside an entry: can never be indexed
        StoredObject(key(5, 10).replace(".wal", ".tmp"), 0),  # not ours to judge
        StoredObject(key(10, 12), 950),  # an orphan, but younger than the grace period
        StoredObject(key(20, 30), 0),  # past the index: may still be committed
        StoredObject(layout.object_key(TOPIC, 20, 30).replace("tiered", "tiered2"), 0),
    ]
    assert uploader.objects_listed(listing, 1_000) == [
        DeleteObject(key(0, 15)),
        DeleteObject(key(5, 10)),
    ]
    assert uploader.next_timer_ms == 1_500
    assert uploader.tick(1_499) == []
    assert uploader.tick(1_500) == [ListObjects(layout.object_prefix(TOPIC))]
    assert uploader.objects_listed([StoredObject(key(10, 12), 950)], 1_500) == [
        DeleteObject(key(10, 12))
    ]
    with pytest.raises(ValueError, match="without a ListObjects"):
        uploader.objects_listed([], 1_500)


def test_nothing_is_an_orphan_while_the_index_is_empty() -> None:
    config = UploaderConfig(orphan_scan_interval_ms=500, orphan_grace_ms=0)
    uploader, effects = start(config, now=1_000)
    assert effects == [ListObjects(layout.object_prefix(TOPIC))]
    assert uploader.objects_listed([StoredObject(key(0, 10), 0)], 5_000) == []


# -- timers and config ------------------------------------------------------------------------


def test_idle_and_timers() -> None:
    uploader, _ = start()
    assert uploader.idle and uploader.next_timer_ms is None
    upload = uploader.segment_sealed(0, 10, SIZE, 0)[0]
    assert not uploader.idle and uploader.next_timer_ms is None  # waiting on the driver
    done(uploader, upload)
    uploader.index_committed(0, 0)
    assert uploader.idle


@pytest.mark.parametrize(
    "settings",
    [
        {"max_in_flight": 0},
        {"retry_base_ms": 10, "retry_max_ms": 5},
        {"retry_base_ms": -1},
        {"index_interval_bytes": -1},
        {"orphan_grace_ms": -1},
        {"orphan_scan_interval_ms": 0},
    ],
)
def test_config_rejects_nonsense(settings: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        UploaderConfig(**settings)

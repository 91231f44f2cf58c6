"""Example tests of the WAL machine, one per rule of spec/durability.md: offsets, group
commit, the two durability modes, rotation, the hot cache and reads, retention, failures."""

from __future__ import annotations

import pytest

from danube.machines.memory.accounting import batch_cost
from danube.machines.wal import format
from danube.machines.wal.machine import (
    Acknowledge,
    CachedRecords,
    CloseSegment,
    CreateSegment,
    DeleteSegment,
    Durability,
    Effect,
    Failed,
    FileRead,
    Fsync,
    NotRetained,
    Readable,
    WalConfig,
    WalMachine,
    WalUnavailable,
    Write,
)
from danube.machines.wal.recovery import plan_recovery
from danube.values.errors import DanubeError, ErrorCode
from tests.wal.simdisk import TOPIC, SimDisk, drain

NOW = 1_700_000_000_000
FLUSH = Durability.FLUSH


def frame_size(*records: bytes) -> int:
    return len(format.encode_frame(0, 0, list(records)))


HEADER = len(format.encode_segment_header(TOPIC, 0, 0))


def of(effects: list[Effect], kind: type) -> list:
    return [e for e in effects if isinstance(e, kind)]


def only(effects: list[Effect], kind: type):
    found = of(effects, kind)
    assert len(found) == 1, effects
    return found[0]


def frames_in(write: Write) -> list[format.Frame]:
    frames, position = [], 0
    while position < len(write.data):
        frames.append(format.decode_frame(write.data, position))
        position += int.from_bytes(write.data[position + 4 : position + 8], "little")
    return frames


def cycle(machine: WalMachine, effects: list[Effect], now: int = NOW) -> list[Effect]:
    """Completes the one write cycle the effects started (FSYNC mode)."""
    write = only(effects, Write)
    fsync = only(machine.write_done(write.write_id, now), Fsync)
    return machine.fsync_done(fsync.fsync_id, now)


# -- offsets --------------------------------------------------------------------------------------


def test_offsets_are_dense_from_zero_and_each_append_is_one_frame() -> None:
    machine = WalMachine(TOPIC, WalConfig())
    first, effects = machine.append([b"a", b"b", b"c"], NOW)
    assert first == 0
    create, write = effects
    assert isinstance(create, CreateSegment) and create.base_offset == 0
    assert format.decode_segment_header(create.header).topic == TOPIC
    assert isinstance(write, Write) and write.position == len(create.header)
    assert [(f.base_offset, f.records, f.publish_ms) for f in frames_in(write)] == [
        (0, [b"a", b"b", b"c"], NOW)
    ]
    assert machine.append([b"d"], NOW)[0] == 3
    assert machine.next_offset == 4


def test_offsets_continue_after_recovery_in_a_new_segment() -> None:
    disk, machine = SimDisk(), WalMachine(TOPIC, WalConfig())
    for batch in ([b"a", b"b"], [b"c"]):
        drain(machine, disk, machine.append(batch, NOW)[1], NOW)
    plan = plan_recovery(TOPIC, disk.scans())
    again = WalMachine(TOPIC, WalConfig(), plan)
    assert (again.first_offset, again.next_offset, again.durable_offset) == (0, 3, 3)
    assert again.readable_offset == 3
    first, effects = again.append([b"d"], NOW + 1)
    assert first == 3
    # Recovered segments stay closed: the append starts a new one.
    assert only(effects, CreateSegment).base_offset == 3


def test_a_batch_no_frame_can_hold_is_refused_without_using_an_offset() -> None:
    machine = WalMachine(TOPIC, WalConfig())
    for bad in ([], [b""] * 65536):
        with pytest.raises(DanubeError) as caught:
            machine.append(bad, NOW)
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert machine.next_offset == 0 and machine.queued_bytes == 0


# -- group commit (FSYNC) -------------------------------------------------------------------------


def test_fsync_mode_acknowledges_only_after_the_fsync() -> None:
    machine = WalMachine(TOPIC, WalConfig())
    _, effects = machine.append([b"a"], NOW)
    write = only(effects, Write)
    after_write = machine.write_done(write.write_id, NOW)
    assert after_write == [Fsync(write.write_id + 1, 0)]
    assert not of(after_write, Acknowledge) and machine.readable_offset == 0
    assert machine.read(0, 10, 100) == CachedRecords(0, ())
    done = machine.fsync_done(write.write_id + 1, NOW)
    assert done == [Acknowledge(0), Readable(0)]
    assert machine.durable_offset == machine.readable_offset == 1
    assert machine.read(0, 10, 100) == CachedRecords(0, (b"a",))


def test_synced_writes_are_durable_at_write_done_and_need_no_fsync() -> None:
    """`synced_writes`: the driver fsyncs each write itself, so the machine acknowledges at
    write_done, writes the next group at once, and seals a segment without an Fsync."""
    machine = WalMachine(TOPIC, WalConfig(synced_writes=True, segment_bytes=200))
    _, effects = machine.append([b"a"], NOW)
    write = only(effects, Write)
    assert machine.append([b"b"], NOW)[1] == []
    done = machine.write_done(write.write_id, NOW)
    assert done[:2] == [Acknowledge(0), Readable(0)] and not of(done, Fsync)
    assert machine.durable_offset == machine.readable_offset == 1
    second = only(done, Write)
    assert machine.write_done(second.write_id, NOW)[:2] == [Acknowledge(1), Readable(1)]
    _, effects = machine.append([b"x" * 150], NOW)
    assert of(effects, CloseSegment) and not of(effects, Fsync), "sealed without an fsync"


def test_appends_during_a_cycle_join_the_next_one_as_one_write_and_one_fsync() -> None:
    machine = WalMachine(TOPIC, WalConfig())
    _, effects = machine.append([b"first"], NOW)
    write = only(effects, Write)
    # Three appends while the write runs, two more while its fsync runs: no effects.
    assert all(machine.append([b"w%d" % i], NOW)[1] == [] for i in range(3))
    fsync = only(machine.write_done(write.write_id, NOW), Fsync)
    assert all(machine.append([b"f%d" % i, b"x"], NOW)[1] == [] for i in range(2))
    effects = machine.fsync_done(fsync.fsync_id, NOW)
    assert effects[:2] == [Acknowledge(0), Readable(0)]
    batch = only(effects, Write)
    assert [f.base_offset for f in frames_in(batch)] == [1, 2, 3, 4, 6]
    assert machine.queued_bytes == 0
    # One fsync covers all five appends.
    assert cycle(machine, effects) == [Acknowledge(7), Readable(7)]


def test_a_group_commit_write_stops_at_max_write_bytes() -> None:
    size = frame_size(b"0123456789")
    machine = WalMachine(TOPIC, WalConfig(max_write_bytes=2 * size))
    _, effects = machine.append([b"0123456789"], NOW)
    for _ in range(5):
        machine.append([b"0123456789"], NOW)
    assert machine.queued_bytes == 5 * size
    effects = cycle(machine, effects)
    assert len(only(effects, Write).data) == 2 * size
    effects = cycle(machine, effects)
    assert len(only(effects, Write).data) == 2 * size
    assert only(cycle(machine, effects), Write).position == HEADER + 5 * size


def test_a_frame_larger_than_max_write_bytes_is_written_alone() -> None:
    machine = WalMachine(TOPIC, WalConfig(max_write_bytes=1))
    _, effects = machine.append([b"x" * 100], NOW)
    machine.append([b"y"], NOW)
    assert len(frames_in(only(effects, Write))) == 1
    assert len(frames_in(only(cycle(machine, effects), Write))) == 1


# -- FLUSH ----------------------------------------------------------------------------------------


def test_flush_mode_acknowledges_at_write_done_and_fsyncs_on_the_interval() -> None:
    machine = WalMachine(TOPIC, WalConfig(durability=FLUSH, flush_interval_ms=100))
    _, effects = machine.append([b"a"], NOW)
    write = only(effects, Write)
    assert machine.write_done(write.write_id, NOW) == [Acknowledge(0), Readable(0)]
    assert machine.durable_offset == 0 and machine.readable_offset == 1
    assert machine.tick(NOW + 99) == []
    fsync = only(machine.tick(NOW + 100), Fsync)
    assert machine.tick(NOW + 500) == []  # one fsync at a time
    assert machine.fsync_done(fsync.fsync_id, NOW + 501) == []
    assert machine.durable_offset == 1
    assert machine.tick(NOW + 10_000) == []  # nothing unsynced


def test_flush_mode_writes_while_an_fsync_runs_and_the_fsync_covers_only_what_was_written() -> None:
    machine = WalMachine(TOPIC, WalConfig(durability=FLUSH, flush_interval_ms=10))
    _, effects = machine.append([b"a"], NOW)
    machine.write_done(only(effects, Write).write_id, NOW)
    fsync = only(machine.tick(NOW + 10), Fsync)
    _, effects = machine.append([b"b"], NOW + 11)
    write = only(effects, Write)  # not held back by the fsync
    assert machine.write_done(write.write_id, NOW + 12) == [Acknowledge(1), Readable(1)]
    machine.fsync_done(fsync.fsync_id, NOW + 13)
    assert machine.durable_offset == 1
    assert only(machine.tick(NOW + 22), Fsync).segment_base == 0


def test_flush_mode_fsyncs_when_a_write_completes_after_the_interval() -> None:
    machine = WalMachine(TOPIC, WalConfig(durability=FLUSH, flush_interval_ms=10))
    _, effects = machine.append([b"a"], NOW)
    machine.write_done(only(effects, Write).write_id, NOW)
    _, effects = machine.append([b"b"], NOW + 5)
    assert of(machine.write_done(only(effects, Write).write_id, NOW + 10), Fsync)


def test_flush_interval_restarts_when_the_clock_steps_back() -> None:
    machine = WalMachine(TOPIC, WalConfig(durability=FLUSH, flush_interval_ms=100))
    _, effects = machine.append([b"a"], NOW)
    machine.write_done(only(effects, Write).write_id, NOW)
    assert machine.tick(NOW - 5000) == []
    assert machine.tick(NOW - 4901) == []
    assert of(machine.tick(NOW - 4900), Fsync)


# -- rotation -------------------------------------------------------------------------------------


def test_size_rotation_closes_the_durable_segment_then_starts_the_next_at_a_frame() -> None:
    size = frame_size(b"abcd")
    machine = WalMachine(TOPIC, WalConfig(segment_bytes=HEADER + 2 * size))
    _, effects = machine.append([b"abcd"], NOW)
    effects = cycle(machine, effects)
    _, effects = machine.append([b"abcd"], NOW)
    effects = cycle(machine, effects)
    _, effects = machine.append([b"abcd"], NOW + 7)
    close, create, write = effects
    assert close == CloseSegment(0)
    assert create.base_offset == 2
    header = format.decode_segment_header(create.header)
    assert (header.base_offset, header.created_ms) == (2, NOW + 7)
    assert (write.segment_base, write.position) == (2, len(create.header))


def test_size_rotation_splits_a_group_commit_at_the_segment_boundary() -> None:
    size = frame_size(b"abcd")
    machine = WalMachine(TOPIC, WalConfig(segment_bytes=HEADER + 2 * size))
    _, effects = machine.append([b"abcd"], NOW)
    for _ in range(3):
        machine.append([b"abcd"], NOW)
    effects = cycle(machine, effects)
    assert len(only(effects, Write).data) == size  # fills segment 0
    effects = cycle(machine, effects)
    assert of(effects, CloseSegment) == [CloseSegment(0)]
    assert only(effects, Write).segment_base == 2


def test_flush_mode_rotation_waits_for_an_fsync_before_writing_the_next_segment() -> None:
    size = frame_size(b"abcd")
    config = WalConfig(durability=FLUSH, segment_bytes=HEADER + size, flush_interval_ms=10**6)
    machine = WalMachine(TOPIC, config)
    _, effects = machine.append([b"abcd"], NOW)
    effects = machine.write_done(only(effects, Write).write_id, NOW)
    _, effects = machine.append([b"abcd"], NOW)
    fsync = only(effects, Fsync)
    assert not of(effects, Write) and not of(effects, CloseSegment)
    effects = machine.fsync_done(fsync.fsync_id, NOW)
    assert [type(e) for e in effects] == [CloseSegment, CreateSegment, Write]


def test_a_frame_larger_than_a_segment_gets_a_segment_of_its_own() -> None:
    machine = WalMachine(TOPIC, WalConfig(segment_bytes=HEADER + 10))
    _, effects = machine.append([b"x" * 100], NOW)
    assert only(effects, CreateSegment).base_offset == 0
    machine.append([b"y"], NOW)
    effects = cycle(machine, effects)
    assert of(effects, CloseSegment) == [CloseSegment(0)]
    assert only(effects, CreateSegment).base_offset == 1


def test_age_rotation_holds_queued_appends_for_the_next_segment() -> None:
    machine = WalMachine(TOPIC, WalConfig(segment_age_ms=1000))
    _, effects = machine.append([b"a"], NOW)
    assert machine.tick(NOW + 999) == []
    machine.append([b"b"], NOW + 999)
    assert machine.tick(NOW + 1000) == []  # waits for the cycle in flight
    effects = cycle(machine, effects, NOW + 1001)
    assert effects[:3] == [Acknowledge(0), Readable(0), CloseSegment(0)]
    assert only(effects, CreateSegment).base_offset == only(effects, Write).segment_base == 1


def test_seal_closes_the_active_segment_and_the_next_append_starts_another() -> None:
    machine = WalMachine(TOPIC, WalConfig(segment_age_ms=1000))
    _, effects = machine.append([b"a"], NOW)
    cycle(machine, effects)
    assert not machine.idle
    assert machine.seal(NOW) == [CloseSegment(0)]
    assert machine.idle
    assert machine.seal(NOW) == []
    _, effects = machine.append([b"b"], NOW)
    assert only(effects, CreateSegment).base_offset == 1


def test_tick_ages_out_an_idle_segment() -> None:
    machine = WalMachine(TOPIC, WalConfig(segment_age_ms=1000))
    _, effects = machine.append([b"a"], NOW)
    cycle(machine, effects)
    assert machine.tick(NOW + 1000) == [CloseSegment(0)]
    assert machine.tick(NOW + 5000) == []


# -- cache and reads ------------------------------------------------------------------------------


def filled(config: WalConfig, batches: list[list[bytes]]) -> tuple[WalMachine, SimDisk]:
    disk, machine = SimDisk(), WalMachine(TOPIC, config)
    for batch in batches:
        drain(machine, disk, machine.append(batch, NOW)[1], NOW)
    return machine, disk


def test_the_cache_is_byte_bounded_and_evicts_the_oldest() -> None:
    one = batch_cost(4, 1)  # what a one-record batch of 4 bytes costs in memory
    machine, disk = filled(WalConfig(cache_bytes=2 * one + 1), [[b"aaaa"], [b"bbbb"], [b"cccc"]])
    assert machine.cached_bytes == 2 * one
    assert machine.read(1, 10, 100) == CachedRecords(1, (b"bbbb", b"cccc"))
    plan = machine.read(0, 10, 100)
    assert isinstance(plan, FileRead)
    assert (plan.segment_base, plan.start, plan.from_offset) == (0, HEADER, 0)
    assert disk.read(plan) == (b"aaaa", b"bbbb", b"cccc")


def test_reads_never_go_beyond_readable() -> None:
    machine = WalMachine(TOPIC, WalConfig(cache_bytes=0))
    _, effects = machine.append([b"a", b"b"], NOW)
    cycle(machine, effects)
    _, effects = machine.append([b"c"], NOW)  # written, not yet durable
    write = only(effects, Write)
    machine.write_done(write.write_id, NOW)
    plan = machine.read(0, 10, 10**6)
    assert isinstance(plan, FileRead) and plan.end_offset == 2 and plan.end == write.position
    assert machine.read(2, 10, 100) == CachedRecords(2, ())


def test_cache_reads_honour_max_records_and_max_bytes_but_always_return_one() -> None:
    machine, _ = filled(WalConfig(), [[b"aaaa", b"bbbb"], [b"cccc"]])
    assert machine.read(0, 2, 100) == CachedRecords(0, (b"aaaa", b"bbbb"))
    assert machine.read(0, 10, 8) == CachedRecords(0, (b"aaaa", b"bbbb"))
    assert machine.read(1, 10, 1) == CachedRecords(1, (b"bbbb",))


def test_file_reads_start_at_a_sparse_index_entry_and_honour_the_limits() -> None:
    size = frame_size(b"0123456789")
    config = WalConfig(cache_bytes=0, index_interval_bytes=2 * size)
    machine, disk = filled(config, [[b"%010d" % i] for i in range(10)])
    plan = machine.read(3, 4, 10**6)
    assert isinstance(plan, FileRead)
    # Entries at frames 0, 2, 4, ...: offset 3 lies in the range from entry 2.
    assert (plan.start, plan.start_offset) == (HEADER + 2 * size, 2)
    # Four records wanted (3..6): the range stops at the entry of offset 8.
    assert (plan.end, plan.end_offset) == (HEADER + 8 * size, 7)
    assert disk.read(plan) == tuple(b"%010d" % i for i in range(3, 7))
    small = machine.read(3, 10, 1)
    assert isinstance(small, FileRead) and small.end == HEADER + 4 * size
    assert disk.read(small) == (b"0000000003",)


def test_file_reads_stay_within_one_segment_and_use_recovered_indexes() -> None:
    size = frame_size(b"ab")
    config = WalConfig(segment_bytes=HEADER + 3 * size, cache_bytes=0)
    machine, disk = filled(config, [[b"ab"] for _ in range(7)])
    assert sorted(disk.files) == [0, 3, 6]
    again = WalMachine(TOPIC, config, plan_recovery(TOPIC, disk.scans()))
    for reader in (machine, again):
        plan = reader.read(1, 100, 10**6)
        assert isinstance(plan, FileRead)
        assert (plan.segment_base, plan.end_offset) == (0, 3)
        assert disk.read(plan) == (b"ab", b"ab")
        plan = reader.read(3, 100, 10**6)
        assert isinstance(plan, FileRead) and plan.segment_base == 3


def test_a_damaged_range_is_reported_not_served() -> None:
    machine, disk = filled(WalConfig(cache_bytes=0), [[b"abc"], [b"def"]])
    plan = machine.read(0, 10, 100)
    assert isinstance(plan, FileRead)
    disk.files[0].cache[plan.end - 1] ^= 0xFF
    with pytest.raises(format.WalFormatError, match=r"00000000000000000000\.wal is damaged"):
        disk.read(plan)


# -- retention ------------------------------------------------------------------------------------


def test_retention_by_bytes_deletes_the_oldest_closed_segments() -> None:
    size = frame_size(b"ab")
    segment = HEADER + size
    config = WalConfig(segment_bytes=segment, retention_bytes=2 * segment, cache_bytes=0)
    machine, disk = filled(config, [[b"ab"] for _ in range(4)])
    assert sorted(disk.files) == [0, 1, 2, 3]
    deletes = machine.tick(NOW)
    assert deletes == [DeleteSegment(0), DeleteSegment(1)]
    assert machine.first_offset == 2
    assert machine.read(1, 10, 100) == NotRetained(2)
    assert isinstance(machine.read(2, 10, 100), FileRead)


def test_retention_by_time_dates_a_segment_by_its_successor_and_spares_the_newest() -> None:
    size = frame_size(b"ab")
    config = WalConfig(segment_bytes=HEADER + size, retention_ms=1000)
    disk, machine = SimDisk(), WalMachine(TOPIC, config)
    for i in range(3):  # segments created at NOW, NOW + 100, NOW + 200
        drain(machine, disk, machine.append([b"ab"], NOW + 100 * i)[1], NOW + 100 * i)
    assert machine.tick(NOW + 1099) == []
    assert machine.tick(NOW + 1100) == [DeleteSegment(0)]
    assert machine.tick(NOW + 10**9) == [DeleteSegment(1)]  # never segment 2, the newest
    machine.seal(NOW)
    assert machine.tick(NOW + 10**9) == []


def test_retention_evicts_cached_records_of_deleted_segments() -> None:
    size = frame_size(b"ab")
    config = WalConfig(segment_bytes=HEADER + size, retention_bytes=1)
    machine, _ = filled(config, [[b"ab"] for _ in range(3)])
    one = batch_cost(2, 1)
    assert machine.cached_bytes == 3 * one
    machine.tick(NOW)
    assert machine.cached_bytes == one
    assert machine.read(2, 10, 100) == CachedRecords(2, (b"ab",))


# -- failures -------------------------------------------------------------------------------------


def test_a_failed_fsync_stops_the_machine_and_never_acknowledges() -> None:
    machine = WalMachine(TOPIC, WalConfig())
    _, effects = machine.append([b"a"], NOW)
    cycle(machine, effects)
    _, effects = machine.append([b"b"], NOW)
    machine.append([b"c"], NOW)
    write = only(effects, Write)
    fsync = only(machine.write_done(write.write_id, NOW), Fsync)
    failed = only(machine.fsync_failed(fsync.fsync_id, "EIO"), Failed)
    assert failed == Failed(failed.reason, 0, write.position, 1, 1)
    assert "fsync of segment 00000000000000000000.wal failed (EIO)" in failed.reason
    assert "page cache" in failed.reason and machine.failure == failed.reason
    with pytest.raises(WalUnavailable) as caught:
        machine.append([b"d"], NOW)
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert machine.fsync_done(fsync.fsync_id, NOW) == []  # stale, ignored
    assert machine.tick(NOW + 10**6) == []
    assert machine.read(0, 10, 100) == CachedRecords(0, (b"a",))


def test_a_failed_fsync_in_flush_mode_reports_the_acknowledged_records_it_loses() -> None:
    machine = WalMachine(TOPIC, WalConfig(durability=FLUSH, flush_interval_ms=10))
    _, effects = machine.append([b"a", b"b"], NOW)
    machine.write_done(only(effects, Write).write_id, NOW)
    fsync = only(machine.tick(NOW + 10), Fsync)
    failed = only(machine.fsync_failed(fsync.fsync_id, "EIO"), Failed)
    assert (failed.truncate_to, failed.next_offset, failed.unacknowledged_from) == (HEADER, 0, 2)
    assert machine.readable_offset == 0  # no longer served: the driver cuts them off


def test_after_a_failure_reads_stay_within_what_the_driver_keeps() -> None:
    config = WalConfig(durability=FLUSH, flush_interval_ms=10, cache_bytes=0)
    machine = WalMachine(TOPIC, config)
    _, effects = machine.append([b"a"], NOW)
    machine.write_done(only(effects, Write).write_id, NOW)
    fsync = only(machine.tick(NOW + 10), Fsync)
    machine.fsync_done(fsync.fsync_id, NOW + 10)
    _, effects = machine.append([b"b"], NOW + 10)
    machine.write_done(only(effects, Write).write_id, NOW + 10)
    failed = only(machine.fsync_failed(only(machine.seal(NOW), Fsync).fsync_id, "EIO"), Failed)
    assert (failed.next_offset, failed.unacknowledged_from) == (1, 2)
    plan = machine.read(0, 10, 10**6)
    assert isinstance(plan, FileRead)
    assert (plan.end, plan.end_offset) == (failed.truncate_to, 1)


def test_a_failed_write_keeps_what_was_written_before_it() -> None:
    machine = WalMachine(TOPIC, WalConfig(durability=FLUSH))
    _, effects = machine.append([b"a"], NOW)
    machine.write_done(only(effects, Write).write_id, NOW)
    _, effects = machine.append([b"b"], NOW)
    write = only(effects, Write)
    failed = only(machine.write_failed(write.write_id, "ENOSPC"), Failed)
    assert (failed.truncate_to, failed.next_offset, failed.unacknowledged_from) == (
        write.position,
        1,
        1,
    )
    assert "failed (ENOSPC)" in failed.reason


def test_an_unknown_completion_is_a_driver_bug() -> None:
    machine = WalMachine(TOPIC, WalConfig())
    with pytest.raises(ValueError, match="unknown write 7"):
        machine.write_done(7, NOW)
    with pytest.raises(ValueError, match="unknown fsync 7"):
        machine.fsync_failed(7, "EIO")


# -- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field", ["segment_bytes", "max_write_bytes", "flush_interval_ms", "retention_ms"]
)
def test_config_rejects_non_positive_limits(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        WalConfig(**{field: 0})


def test_config_rejects_negative_sizes() -> None:
    with pytest.raises(ValueError, match="cache_bytes"):
        WalConfig(cache_bytes=-1)


def test_a_plan_for_another_topic_is_refused() -> None:
    plan = plan_recovery("/default/other", [])
    with pytest.raises(ValueError, match="/default/other"):
        WalMachine(TOPIC, WalConfig(), plan)


def test_an_idle_machine_holds_no_pending_queue_and_appends_after_one_still_commit() -> None:
    """Issue 23: each idle topic kept an empty deque (about 600 bytes) for its next write;
    the queue now exists only while frames wait, and the next append makes it again."""
    machine = WalMachine(TOPIC, WalConfig())
    assert machine._pending is None
    _, effects = machine.append([b"a"], NOW)
    assert machine._pending is None  # taken by the write at once
    _, queued = machine.append([b"b"], NOW)  # the write runs: this one waits
    assert queued == [] and machine._pending is not None
    done = cycle(machine, effects)
    assert Acknowledge(0) in done and machine._pending is None
    cycle(machine, done)
    assert machine.durable_offset == 2 and machine._pending is None

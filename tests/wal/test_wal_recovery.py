"""Recovery planning (spec/durability.md, "Recovery"): a torn or empty newest segment is
repaired; anything else that is damaged stops the topic with an actionable `CorruptSegment`."""

from __future__ import annotations

import random

import pytest

from danube.machines.wal import format
from danube.machines.wal.machine import CreateSegment, Durability, WalConfig, WalMachine, Write
from danube.machines.wal.recovery import (
    CorruptSegment,
    SyncSegment,
    TruncateSegment,
    UnreadableSegment,
    plan_recovery,
)
from danube.values.errors import ErrorCode
from spec.models.wal_model import Crash
from tests.wal.simdisk import TOPIC, SimDisk, drain, perform

NOW = 1_700_000_000_000


def segment(base: int, batches: list[list[bytes]], topic: str = TOPIC) -> bytearray:
    data = bytearray(format.encode_segment_header(topic, base, NOW + base))
    offset = base
    for batch in batches:
        data += format.encode_frame(offset, NOW, batch)
        offset += len(batch)
    return data


def scans(*files: tuple[int, bytes]) -> list[tuple[int, format.SegmentScan | UnreadableSegment]]:
    found: list[tuple[int, format.SegmentScan | UnreadableSegment]] = []
    for base, data in files:
        try:
            found.append((base, format.scan_segment(bytes(data))))
        except format.WalFormatError as exc:
            found.append((base, UnreadableSegment(len(data), str(exc))))
    return found


THREE = [[b"a"], [b"b"], [b"c"]]


def test_an_empty_directory_is_a_new_topic() -> None:
    plan = plan_recovery(TOPIC, [])
    assert (plan.actions, plan.segments, plan.next_offset) == ((), (), 0)


def test_whole_segments_are_kept_closed_and_the_newest_is_synced() -> None:
    first, second = segment(0, THREE), segment(3, [[b"d", b"e"]])
    plan = plan_recovery(TOPIC, scans((3, second), (0, first)))
    assert plan.actions == (SyncSegment(3),)
    assert plan.next_offset == 5
    kept = plan.segments[0]
    assert (kept.base_offset, kept.next_offset, kept.size, kept.created_ms) == (
        0,
        3,
        len(first),
        NOW,
    )
    assert kept.base_offsets == (0, 1, 2) and len(kept.positions) == 3


def test_a_torn_tail_is_truncated_and_offsets_continue_after_the_valid_prefix() -> None:
    data = segment(0, THREE)
    whole = len(data)
    data += format.encode_frame(3, NOW, [b"torn"])[:-3]
    plan = plan_recovery(TOPIC, scans((0, data)))
    assert plan.actions == (TruncateSegment(0, whole), SyncSegment(0))
    assert plan.next_offset == 3
    machine = WalMachine(TOPIC, WalConfig(), plan)
    assert machine.append([b"d"], NOW)[0] == 3


@pytest.mark.parametrize("keep", [0, 1, 31, 36])
def test_a_newest_segment_without_a_whole_frame_stays_until_it_is_replaced(keep: int) -> None:
    first = segment(0, THREE)
    empty = segment(3, [])
    empty += format.encode_frame(3, NOW, [b"x"])[:keep]
    plan = plan_recovery(TOPIC, scans((0, first), (3, empty)))
    assert plan.actions == (SyncSegment(0),)
    assert (plan.next_offset, plan.replaced, len(plan.segments)) == (3, 3, 1)


@pytest.mark.parametrize("keep", [0, 5, 20])
def test_a_header_cut_short_inside_create_segment_stays_until_it_is_replaced(keep: int) -> None:
    short = format.encode_segment_header(TOPIC, 3, NOW)[:keep]
    plan = plan_recovery(TOPIC, scans((0, segment(0, THREE)), (3, short)))
    assert plan.actions == (SyncSegment(0),)
    assert (plan.next_offset, plan.replaced) == (3, 3)


def test_a_lone_frameless_segment_keeps_offsets_going_after_retention() -> None:
    """Retention deleted every segment with frames; the newest, frameless file is all that
    says offsets continue at 7, so recovery must not delete it."""
    for data in (segment(7, []), format.encode_segment_header(TOPIC, 7, NOW)[:9]):
        plan = plan_recovery(TOPIC, scans((7, data)))
        assert (plan.actions, plan.segments, plan.replaced) == ((), (), 7)
        machine = WalMachine(TOPIC, WalConfig(), plan)
        assert machine.first_offset == machine.next_offset == 7
        create = machine.append([b"h"], NOW)[1][0]
        assert create == CreateSegment(7, format.encode_segment_header(TOPIC, 7, NOW))


def test_offsets_survive_retention_then_two_crashes() -> None:
    """The scenario that made recovery keep frameless files: retention deletes the only
    segment with frames while the next one has none on disk yet; a power failure, then a
    process crash."""
    disk = SimDisk()
    size = len(format.encode_frame(0, NOW, [b"ab"]))
    header = len(format.encode_segment_header(TOPIC, 0, NOW))
    config = WalConfig(segment_bytes=header + size, retention_bytes=1)
    machine = WalMachine(TOPIC, config)
    drain(machine, disk, machine.append([b"ab"], NOW)[1], NOW)
    _, effects = machine.append([b"cd"], NOW)  # rotates: Close(0), Create(1), Write
    effects += machine.tick(NOW)  # retention deletes segment 0
    for effect in effects:
        if not isinstance(effect, Write):  # the write never happens
            perform(disk, effect)
    assert sorted(disk.files) == [1]
    for crash in (Crash.POWER, Crash.PROCESS):
        disk.crash(crash, random.Random(0))
        plan = plan_recovery(TOPIC, disk.scans())
        assert plan.next_offset == 1
    assert WalMachine(TOPIC, config, plan).append([b"ef"], NOW)[0] == 1


def test_an_undecodable_header_on_a_segment_with_data_is_corruption() -> None:
    data = segment(3, THREE)
    data[0] ^= 0xFF
    with pytest.raises(CorruptSegment, match="header does not decode") as caught:
        plan_recovery(TOPIC, scans((0, segment(0, THREE)), (3, data)))
    assert caught.value.segment == "00000000000000000003.wal" and caught.value.position == 0


def test_an_undecodable_header_on_an_older_segment_is_corruption() -> None:
    short = format.encode_segment_header(TOPIC, 0, NOW)[:10]
    with pytest.raises(CorruptSegment, match="header does not decode"):
        plan_recovery(TOPIC, scans((0, short), (0 + 3, segment(3, THREE))))


def test_a_flipped_byte_in_the_middle_stops_the_topic_with_an_actionable_error() -> None:
    first = segment(0, THREE)
    second = segment(3, [[b"d", b"e"], [b"f"]])
    header = len(format.encode_segment_header(TOPIC, 0, NOW))
    frame = len(format.encode_frame(0, NOW, [b"a"]))
    first[header + frame + 33] ^= 0x01  # the record byte of offset 1
    with pytest.raises(CorruptSegment) as caught:
        plan_recovery(TOPIC, scans((0, first), (3, second)))
    error = caught.value
    assert error.code is ErrorCode.FAILED_PRECONDITION
    assert (error.segment, error.position) == ("00000000000000000000.wal", header + frame)
    assert (error.lost_from, error.lost_through) == (1, 5)
    message = str(error)
    for part in (
        TOPIC,
        "00000000000000000000.wal",
        f"byte {header + frame}",
        "offsets from 1 through 5",
        "valid frame follows",
        "object storage",
        "1 newer segment file(s)",
    ):
        assert part in message, part


def test_corruption_in_the_newest_segment_names_the_offsets_it_knows() -> None:
    header = len(format.encode_segment_header(TOPIC, 0, NOW))
    data = segment(0, THREE)
    data[header + 4] ^= 0x01  # the length of the first frame; valid frames follow it
    with pytest.raises(CorruptSegment) as caught:
        plan_recovery(TOPIC, scans((0, data)))
    assert (caught.value.position, caught.value.lost_from) == (header, 0)
    assert caught.value.lost_through is None  # unknown: inside frames it cannot trust
    assert "offsets from 0." in str(caught.value)


def test_a_torn_older_segment_is_corruption() -> None:
    first = segment(0, THREE)[:-2]
    with pytest.raises(CorruptSegment, match="a newer segment exists") as caught:
        plan_recovery(TOPIC, scans((0, first), (3, segment(3, [[b"d"]]))))
    assert (caught.value.lost_from, caught.value.lost_through) == (2, 3)


def test_an_empty_older_segment_is_corruption() -> None:
    with pytest.raises(CorruptSegment, match="older than the newest holds no frame"):
        plan_recovery(TOPIC, scans((0, segment(0, [])), (3, segment(3, [[b"d"]]))))


def test_a_missing_segment_is_a_gap() -> None:
    files = (0, segment(0, THREE)), (6, segment(6, [[b"g"]]))
    with pytest.raises(CorruptSegment, match="offsets 3–5 are missing") as caught:
        plan_recovery(TOPIC, scans(*files))
    assert caught.value.segment == "00000000000000000006.wal"


def test_overlapping_segments_are_corruption() -> None:
    files = (0, segment(0, THREE)), (2, segment(2, [[b"x"]]))
    with pytest.raises(CorruptSegment, match="offsets 2–2 are claimed by two segments"):
        plan_recovery(TOPIC, scans(*files))


@pytest.mark.parametrize(("base", "topic"), [(0, "/default/other"), (5, TOPIC)])
def test_a_header_naming_another_topic_or_offset_is_corruption(base: int, topic: str) -> None:
    with pytest.raises(CorruptSegment, match="the header names"):
        plan_recovery(TOPIC, scans((0, segment(base, THREE, topic))))


# -- crashes in the two durability modes ----------------------------------------------------------


class LoseAllUnsynced(random.Random):
    """A power failure after which no unsynced byte made it to the disk."""

    def randint(self, a: int, b: int) -> int:
        return a


def run_and_crash(durability: Durability, crash: Crash) -> tuple[int, int]:
    """Acknowledges 2 appends with an fsync and 1 more after it (in FLUSH mode), then
    crashes; returns (acknowledged appends, records recovered)."""
    disk = SimDisk()
    machine = WalMachine(TOPIC, WalConfig(durability=durability, flush_interval_ms=10**6))
    drain(machine, disk, machine.append([b"a"], NOW)[1], NOW)
    drain(machine, disk, machine.seal(NOW), NOW)  # an fsync in either mode
    acked = drain(machine, disk, machine.append([b"b"], NOW)[1], NOW)
    disk.crash(crash, LoseAllUnsynced())
    plan = plan_recovery(TOPIC, disk.scans())
    for action in plan.actions:
        disk.apply(action)
    return 1 + len(acked) // 2, len(disk.records()[1])


@pytest.mark.parametrize("crash", list(Crash))
def test_fsync_mode_loses_nothing_acknowledged(crash: Crash) -> None:
    acked, recovered = run_and_crash(Durability.FSYNC, crash)
    assert acked == recovered == 2


def test_flush_mode_loses_nothing_written_in_a_process_crash() -> None:
    assert run_and_crash(Durability.FLUSH, Crash.PROCESS) == (2, 2)


def test_flush_mode_loses_acknowledged_unsynced_appends_in_a_power_failure() -> None:
    assert run_and_crash(Durability.FLUSH, Crash.POWER) == (2, 1)

"""The WAL checkpoint on real files (`SegmentFiles`, spec/wal-format.md "Checkpoint"): marks
alternate between two slots and survive a reopen, a torn slot leaves the mark before it,
recovery judges the newest segment against the mark and marks where offsets continue, and an
operator's `accept-loss` lets an emptied directory continue after the mark, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.machines.wal import checkpoint as ck
from danube.machines.wal import format
from danube.machines.wal.machine import CreateSegment
from danube.machines.wal.recovery import LOSS_ACCEPTED_NAME, CorruptSegment
from danube.runtime import segment_files
from danube.runtime.segment_files import SegmentFiles
from tests.broker.test_segment_files import TOPIC, _write_segments

pytestmark = pytest.mark.trio


def _mark(directory: Path) -> ck.Checkpoint | None:
    return ck.decode_checkpoint((directory / ck.CHECKPOINT_NAME).read_bytes())


async def test_marks_alternate_slots_never_decrease_and_a_torn_slot_leaves_the_previous(
    tmp_path: Path,
) -> None:
    files = SegmentFiles(tmp_path)
    assert files.write_checkpoint(5) and files.write_checkpoint(9)
    assert not files.write_checkpoint(7), "a mark never goes back"
    files.close()
    newest = _mark(tmp_path)
    assert newest is not None and (newest.sequence, newest.durable_end) == (1, 9)
    with open(tmp_path / ck.CHECKPOINT_NAME, "r+b") as file:  # the last write torn
        file.seek(newest.position + 10)
        file.write(b"\xff" * 6)
    older = _mark(tmp_path)
    assert older is not None and (older.sequence, older.durable_end) == (0, 5)


async def test_a_cut_frame_below_the_mark_is_loss_above_it_a_torn_tail(tmp_path: Path) -> None:
    segments = await _write_segments(tmp_path, 40)
    newest = segments[-1]
    whole = newest.stat().st_size
    with open(newest, "r+b") as file:
        file.truncate(whole - 5)
    files = SegmentFiles(tmp_path)
    files.write_checkpoint(40)  # the broker's writer had marked every frame
    files.close()
    with pytest.raises(CorruptSegment) as raised:
        await SegmentFiles(tmp_path).recover(TOPIC)
    assert (raised.value.segment, raised.value.lost_from) == (newest.name, 39)
    assert newest.stat().st_size == whole - 5, "nothing touched"

    (tmp_path / ck.CHECKPOINT_NAME).unlink()
    files = SegmentFiles(tmp_path)
    files.write_checkpoint(39)  # the last frame lay in the window after the mark
    files.close()
    plan = await SegmentFiles(tmp_path).recover(TOPIC)
    assert plan.next_offset == 39
    mark = _mark(tmp_path)
    assert mark is not None and mark.durable_end == 39


async def test_recovery_marks_where_offsets_continue(tmp_path: Path) -> None:
    await _write_segments(tmp_path, 12)
    # The test's log writes no marks: the checkpoint, created empty with the first segment,
    # holds none.
    assert _mark(tmp_path) is None
    plan = await SegmentFiles(tmp_path).recover(TOPIC)
    mark = _mark(tmp_path)
    assert plan.next_offset == 12 and mark is not None and mark.durable_end == 12


async def test_accept_loss_continues_after_the_mark_once(tmp_path: Path) -> None:
    segments = await _write_segments(tmp_path, 12)
    await SegmentFiles(tmp_path).recover(TOPIC)  # marks 12
    for path in segments:
        path.unlink()
    with pytest.raises(CorruptSegment, match="no segment file is left"):
        await SegmentFiles(tmp_path).recover(TOPIC)
    (tmp_path / LOSS_ACCEPTED_NAME).write_text("3\n")
    plan = await SegmentFiles(tmp_path).recover(TOPIC)
    assert (plan.next_offset, plan.replaced) == (12, 12)
    assert not (tmp_path / LOSS_ACCEPTED_NAME).exists()
    # A restart before the first append: the frameless segment says where offsets go on.
    assert [path.name for path in tmp_path.glob("*.wal")] == [f"{12:020d}.wal"]
    again = await SegmentFiles(tmp_path).recover(TOPIC)
    assert (again.next_offset, again.replaced) == (12, 12)


async def test_an_accept_loss_file_that_is_no_number_counts_as_zero(tmp_path: Path) -> None:
    """'²' passes str.isdigit but int() refuses it: the file must count as 0, not raise a
    ValueError the WAL task does not expect (review of issue 20)."""
    segments = await _write_segments(tmp_path, 12)
    await SegmentFiles(tmp_path).recover(TOPIC)  # marks 12
    for path in segments:
        path.unlink()
    (tmp_path / LOSS_ACCEPTED_NAME).write_text("²\n")
    plan = await SegmentFiles(tmp_path).recover(TOPIC)
    assert plan.next_offset == 12  # after the mark, whatever the file said


async def test_the_first_segment_creates_the_checkpoint_so_the_first_mark_needs_no_directory_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real = segment_files._fsync_directory

    def counted(directory: Path) -> None:
        synced.append("directory")
        real(directory)

    monkeypatch.setattr(segment_files, "_fsync_directory", counted)
    files = SegmentFiles(tmp_path)
    header = format.encode_segment_header(TOPIC, 0, 1)
    files.carry(CreateSegment(0, header))
    assert synced == ["directory"], "one directory fsync for the segment and the checkpoint"
    assert (tmp_path / ck.CHECKPOINT_NAME).read_bytes() == b"", "created empty, before it"
    # A crash here: the empty checkpoint reads as no mark, exactly as a missing one did.
    scan = SegmentFiles(tmp_path).scan()
    assert scan.checkpoint_end is None
    plan = await SegmentFiles(tmp_path).recover(TOPIC)
    assert plan.next_offset == 0
    # The first mark: pwrite and fdatasync only.
    synced.clear()
    files = SegmentFiles(tmp_path)
    files.scan()
    files.carry(CreateSegment(0, header))  # the checkpoint is kept as it is, not emptied
    assert files.write_checkpoint(3)
    assert synced == ["directory"], "only the segment's own directory fsync"
    files.close()
    mark = _mark(tmp_path)
    assert mark is not None and mark.durable_end == 3
    files = SegmentFiles(tmp_path)
    files.scan()
    files.carry(CreateSegment(0, header))
    mark = _mark(tmp_path)
    assert mark is not None and mark.durable_end == 3, "a later segment keeps the mark"
    files.close()


async def test_a_mark_before_any_segment_still_makes_the_checkpoint_entry_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    monkeypatch.setattr(segment_files, "_fsync_directory", synced.append)
    assert SegmentFiles(tmp_path).write_checkpoint(4)
    assert synced == [tmp_path]

"""The newest segment's end against durable evidence (spec/wal-format.md "Reading and
recovery", issue 20 item 7): a damaged last frame, a deleted or a zeroed newest segment are a
torn tail only when nothing durable says their offsets existed; offsets never continue below
what anything durable has seen. And the checkpoint codec that carries the WAL's own evidence."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.machines.wal import checkpoint as ck
from danube.machines.wal.recovery import (
    CorruptSegment,
    PlaceSegment,
    RecoveryEvidence,
    TruncateSegment,
    plan_recovery,
)
from tests.wal.simdisk import TOPIC
from tests.wal.test_wal_recovery import THREE, scans, segment

# -- the checkpoint file ---------------------------------------------------------------------


def _file(*marks: ck.Checkpoint) -> bytearray:
    data = bytearray(ck.SLOTS * ck.SLOT_SIZE)
    for mark in marks:
        data[mark.position : mark.position + ck.SLOT_SIZE] = ck.encode_checkpoint(mark)
    return data


@settings(deadline=None)
@given(st.integers(0, 2**63), st.integers(0, 2**63))
def test_a_mark_reads_back_and_the_newer_slot_wins(sequence: int, end: int) -> None:
    first = ck.Checkpoint(sequence, end)
    second = ck.next_mark(first, end + 1)
    assert second.slot != first.slot
    assert ck.decode_checkpoint(_file(first)) == first
    assert ck.decode_checkpoint(_file(first, second)) == second


@settings(max_examples=300, deadline=None)
@given(st.integers(0, ck.SLOT_SIZE * 8 - 1), st.integers(1, 10**9))
def test_a_torn_or_flipped_slot_leaves_the_previous_mark(bit: int, end: int) -> None:
    """A crash tears only the slot being written; the other holds the mark before it. No
    single flipped bit makes a slot read as another valid mark."""
    older = ck.Checkpoint(7, end)
    newer = ck.next_mark(older, end + 5)
    data = _file(older, newer)
    data[newer.position + bit // 8] ^= 1 << (bit % 8)
    assert ck.decode_checkpoint(data) in (older, newer)
    if bit // 8 < 28:  # the padding is not covered
        assert ck.decode_checkpoint(data) == older


def test_no_valid_slot_is_no_mark() -> None:
    assert ck.decode_checkpoint(b"") is None
    assert ck.decode_checkpoint(bytes(64)) is None
    half = ck.encode_checkpoint(ck.Checkpoint(0, 10))[:20]
    assert ck.decode_checkpoint(half) is None


# -- the rule -------------------------------------------------------------------------------


def _flipped_last_frame() -> tuple[bytearray, int]:
    """THREE (offsets 0-2) with a bit flipped 5 bytes from the end: (data, last frame start)."""
    data = segment(0, THREE)
    start = len(segment(0, THREE[:2]))
    data[-5] ^= 0x10
    return data, start


def test_a_damaged_last_frame_is_a_torn_tail_when_nothing_says_it_was_durable() -> None:
    data, start = _flipped_last_frame()
    for evidence in (RecoveryEvidence(), RecoveryEvidence(checkpoint_end=2, acknowledged_end=2)):
        plan = plan_recovery(TOPIC, scans((0, data)), evidence)
        assert plan.next_offset == 2
        assert TruncateSegment(0, start) in plan.actions


@pytest.mark.parametrize(
    ("evidence", "says"),
    [
        (RecoveryEvidence(checkpoint_end=3), "the WAL checkpoint says offsets through 2"),
        (RecoveryEvidence(acknowledged_end=3), "a subscription cursor acknowledged offset 2"),
        (RecoveryEvidence(indexed_end=3), "the object index holds offsets through 2"),
    ],
)
def test_a_damaged_last_frame_that_was_durable_stops_the_topic(
    evidence: RecoveryEvidence, says: str
) -> None:
    """The issue's reproduction, in the rule: each kind of evidence alone proves the loss."""
    data, start = _flipped_last_frame()
    with pytest.raises(CorruptSegment) as raised:
        plan_recovery(TOPIC, scans((0, data)), evidence)
    error = raised.value
    assert (error.segment, error.position) == (f"{0:020d}.wal", start)
    assert (error.lost_from, error.lost_through) == (2, 2)
    assert says in str(error) and f"byte {start}" in str(error)
    assert "accept-loss" in str(error)


def test_a_deleted_newest_segment_stops_the_topic() -> None:
    first = segment(0, THREE)
    with pytest.raises(CorruptSegment) as raised:
        plan_recovery(TOPIC, scans((0, first)), RecoveryEvidence(checkpoint_end=5))
    assert (raised.value.lost_from, raised.value.lost_through) == (3, 4)
    assert "a newer segment file is missing" in str(raised.value)


def test_the_only_segment_deleted_stops_the_topic_unless_the_index_holds_it() -> None:
    with pytest.raises(CorruptSegment) as raised:
        plan_recovery(TOPIC, [], RecoveryEvidence(checkpoint_end=3))
    assert "no segment file is left" in str(raised.value)
    # Retention may delete what object storage holds: the history continues from there.
    plan = plan_recovery(TOPIC, [], RecoveryEvidence(checkpoint_end=3, indexed_end=3))
    assert plan.next_offset == 3


@pytest.mark.parametrize("how", ["frames-zeroed", "zero-length", "header-only"])
def test_a_zeroed_newest_segment_stops_the_topic(how: str) -> None:
    first, newest = segment(0, THREE), segment(3, [[b"d"], [b"e"]])
    header = len(segment(3, []))
    damaged = {
        "frames-zeroed": newest[:header] + bytes(len(newest) - header),
        "zero-length": b"",
        "header-only": newest[:header],
    }[how]
    evidence = RecoveryEvidence(checkpoint_end=5)
    with pytest.raises(CorruptSegment) as raised:
        plan_recovery(TOPIC, scans((0, first), (3, damaged)), evidence)
    assert raised.value.segment == f"{3:020d}.wal"
    assert (raised.value.lost_from, raised.value.lost_through) == (3, 4)
    # The same files with nothing claiming offset 3 are the honest end of a crash.
    plan = plan_recovery(TOPIC, scans((0, first), (3, damaged)), RecoveryEvidence(3, 3))
    assert (plan.next_offset, plan.replaced) == (3, 3)


def test_an_empty_directory_continues_at_the_index_unless_more_was_acknowledged() -> None:
    """An empty directory continues at the object index's end (a new topic, a new disk whose
    history is in object storage); a cursor beyond it proves the directory lost data."""
    assert plan_recovery(TOPIC, [], RecoveryEvidence(indexed_end=4)).next_offset == 4
    assert plan_recovery(TOPIC, [], RecoveryEvidence(4, 3, 4)).next_offset == 4
    with pytest.raises(CorruptSegment, match="the WAL directory holds no segment file") as raised:
        plan_recovery(TOPIC, [], RecoveryEvidence(acknowledged_end=9, indexed_end=4))
    assert (raised.value.lost_from, raised.value.lost_through) == (4, 8)


def test_an_accepted_loss_continues_after_everything_and_leaves_a_frameless_segment() -> None:
    """The operator's remedy assigns no offset the checkpoint, a cursor or the index already
    names, and leaves that offset on disk for a restart before the first append."""
    accepted = RecoveryEvidence(checkpoint_end=10, acknowledged_end=7, loss_accepted_at=12)
    plan = plan_recovery(TOPIC, [], accepted)
    assert (plan.next_offset, plan.replaced, plan.actions) == (12, 12, (PlaceSegment(12),))
    below = RecoveryEvidence(checkpoint_end=10, loss_accepted_at=0)
    assert plan_recovery(TOPIC, [], below).next_offset == 10
    placed = segment(12, [])
    again = plan_recovery(TOPIC, scans((12, placed)), RecoveryEvidence(checkpoint_end=12))
    assert (again.next_offset, again.replaced) == (12, 12)


def test_the_remedy_names_an_offset_after_everything_durable() -> None:
    data, _ = _flipped_last_frame()
    evidence = RecoveryEvidence(checkpoint_end=3, acknowledged_end=2, indexed_end=0)
    with pytest.raises(CorruptSegment) as raised:
        plan_recovery(TOPIC, scans((0, data)), evidence)
    assert "write 3 into a new file named accept-loss" in str(raised.value)


# -- the property ---------------------------------------------------------------------------

DAMAGE = ["none", "truncate", "flip", "zero-frames", "delete-newest"]


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=4), min_size=1, max_size=3),
    damage=st.sampled_from(DAMAGE),
    where=st.integers(0, 10_000),
    lag=st.integers(0, 3),
    cursor_lag=st.integers(0, 8),
)
def test_recovery_never_continues_below_durable_evidence(
    sizes: list[list[int]], damage: str, where: int, lag: int, cursor_lag: int
) -> None:
    """Segments of frames (each record one byte), all durable; evidence that trails the true
    end (the checkpoint by `lag` frames at most, cursors anywhere below); any damage to the
    newest segment. Recovery either stops the topic or continues at or after every claim,
    and it stops whenever the damage removed an offset the checkpoint covers."""
    files: list[tuple[int, bytearray]] = []
    frame_ends: list[int] = []
    offset = 0
    for counts in sizes:
        base = offset
        batches = [[bytes([65 + i % 26])] * count for i, count in enumerate(counts)]
        files.append((base, segment(base, batches)))
        for count in counts:
            offset += count
            frame_ends.append(offset)
    true_end = offset
    checkpoint_end = frame_ends[max(0, len(frame_ends) - 1 - lag)]
    acknowledged_end = max(0, true_end - cursor_lag)
    base, newest = files[-1]
    header = len(segment(base, []))
    if damage == "truncate":
        files[-1] = (base, newest[: header + where % (len(newest) - header + 1)])
    elif damage == "flip":
        position = header + where % (len(newest) - header)
        newest[position] ^= 1 << (where % 8)
    elif damage == "zero-frames":
        files[-1] = (base, newest[:header] + bytes(len(newest) - header))
    elif damage == "delete-newest":
        files.pop()
    evidence = RecoveryEvidence(checkpoint_end=checkpoint_end, acknowledged_end=acknowledged_end)
    try:
        plan = plan_recovery(TOPIC, scans(*files), evidence)
    except CorruptSegment as error:
        assert error.lost_from < max(checkpoint_end, acknowledged_end, true_end)
        return
    assert plan.next_offset >= evidence.claimed_end
    assert plan.next_offset >= checkpoint_end
    if damage == "none":
        assert plan.next_offset == true_end

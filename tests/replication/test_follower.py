"""Every transition of `FollowerLog`'s table (danube.machines.replication.follower)."""

from __future__ import annotations

from danube.machines.replication.follower import FollowerLog, FollowerState
from danube.machines.replication.messages import (
    AppendFrames,
    Mismatch,
    Reconcile,
    RecordEpoch,
    Replicate,
    Replicated,
    StaleEpoch,
    TruncateTo,
    end_of_epoch,
)


def _msg(epoch: int, prev_end: int, count: int = 2) -> Replicate:
    return Replicate("t", epoch, prev_end, b"x" * count, count, 0)


def _follower(end: int = 0, epoch: int = 1) -> FollowerLog:
    return FollowerLog("t", epoch=epoch, log_end=end, epoch_starts=[(epoch, 0)])


def test_lower_epoch_is_refused_with_the_epoch_seen() -> None:
    f = _follower(epoch=3)
    assert f.replicate(_msg(2, 0)) == [StaleEpoch("t", 3)]
    assert f.log_end == 0


def test_a_gap_or_overlap_answers_mismatch_with_the_log_end() -> None:
    f = _follower(end=4)
    assert f.replicate(_msg(1, 2)) == [Mismatch("t", 1, 4)]
    assert f.replicate(_msg(1, 6)) == [Mismatch("t", 1, 4)]
    assert f.log_end == 4


def test_frames_at_the_log_end_are_appended_and_acknowledged_once_durable() -> None:
    f = _follower(end=4)
    assert f.replicate(_msg(1, 4, 3)) == [AppendFrames(b"xxx", 4, 7)]
    assert f.replicate(_msg(1, 7, 1)) == [AppendFrames(b"x", 7, 8)]
    assert f.appended_durable(7) == [Replicated("t", 1, 7)]
    assert f.appended_durable(7) == []
    assert f.appended_durable(8) == [Replicated("t", 1, 8)]


def test_a_probe_is_answered_with_the_durable_end_only_when_all_is_durable() -> None:
    f = _follower(end=4)
    assert f.replicate(_msg(1, 4, 0)) == [Replicated("t", 1, 4)]
    f.replicate(_msg(1, 4, 2))
    assert f.replicate(_msg(1, 6, 0)) == []


def test_a_higher_epoch_is_recorded_and_reconciled_before_any_append() -> None:
    f = _follower(end=6)
    assert f.replicate(_msg(2, 6)) == [RecordEpoch(2, None), Reconcile("t", 2, 1)]
    assert f.state is FollowerState.RECONCILING
    assert f.replicate(_msg(2, 6)) == [Reconcile("t", 2, 1)]
    assert f.log_end == 6
    assert f.replicate(_msg(1, 6)) == [StaleEpoch("t", 2)]


def test_new_epoch_truncates_by_the_owners_end_of_the_last_epoch() -> None:
    f = _follower(end=6)
    f.replicate(_msg(2, 6))
    assert f.new_epoch(2, 4) == [TruncateTo(4), RecordEpoch(2, 4), Mismatch("t", 2, 4)]
    assert (f.log_end, f.durable_end, f.state) == (4, 4, FollowerState.IN_EPOCH)
    assert f.epoch_starts == [(1, 0), (2, 4)]
    assert f.replicate(_msg(2, 4)) == [AppendFrames(b"xx", 4, 6)]


def test_new_epoch_keeps_a_shorter_log_and_ignores_a_lower_epoch() -> None:
    f = _follower(end=3)
    assert f.new_epoch(2, 5) == [RecordEpoch(2, 3), Mismatch("t", 2, 3)]
    assert f.new_epoch(1, 0) == []
    assert f.log_end == 3


def test_frames_appended_under_an_older_epoch_are_not_acknowledged() -> None:
    f = _follower(end=0)
    f.replicate(_msg(1, 0))
    f.replicate(_msg(2, 2, 0))
    assert f.appended_durable(2) == []
    f.new_epoch(2, 2)
    assert f.appended_durable(2) == []
    assert f.durable_end == 2


def test_recovered_reconciles_again_when_the_epoch_was_seen_but_not_started() -> None:
    f = FollowerLog.recovered("t", epoch=2, durable_end=5, epoch_starts=[(1, 0)])
    assert f.state is FollowerState.RECONCILING and f.log_end == 5
    g = FollowerLog.recovered("t", epoch=2, durable_end=5, epoch_starts=[(1, 0), (2, 3)])
    assert g.state is FollowerState.IN_EPOCH and g.last_epoch == 2


def test_end_of_epoch() -> None:
    starts = [(1, 0), (3, 10), (5, 20)]
    assert end_of_epoch(starts, 1, 30) == 10
    assert end_of_epoch(starts, 2, 30) == 10
    assert end_of_epoch(starts, 3, 30) == 20
    assert end_of_epoch(starts, 5, 30) == 30

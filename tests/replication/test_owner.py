"""Every transition of `OwnerReplication`'s table (danube.machines.replication.owner)."""

from __future__ import annotations

from danube.machines.replication.messages import (
    AcknowledgeUpTo,
    Deposed,
    Mismatch,
    NotEnoughInSync,
    ProposeInSync,
    ReadableUpTo,
    ReadForResend,
    Replicate,
    Replicated,
    Send,
    StaleEpoch,
)
from danube.machines.replication.owner import LinkState, OwnerReplication


def _owner(**kw: object) -> OwnerReplication:
    args: dict = dict(
        durable_end=0, high_watermark=0, followers=("f1", "f2"), in_sync=("f1", "f2"), version=1
    )
    args.update(kw)
    return OwnerReplication("t", 1, **args)


def _sends(effects: list) -> list[tuple[str, int, int]]:
    return [(e.follower, e.message.prev_end, e.message.end) for e in effects if isinstance(e, Send)]


def test_start_probes_every_follower_at_the_durable_end() -> None:
    o = _owner(durable_end=5, high_watermark=5)
    assert o.start(0) == [
        Send("f1", Replicate("t", 1, 5, b"", 0, 5)),
        Send("f2", Replicate("t", 1, 5, b"", 0, 5)),
    ]


def test_durable_sends_to_every_follower_pipelined_and_acks_nothing_yet() -> None:
    o = _owner()
    assert _sends(o.durable(2, b"ab", 0)) == [("f1", 0, 2), ("f2", 0, 2)]
    assert _sends(o.durable(3, b"c", 1)) == [("f1", 2, 3), ("f2", 2, 3)]
    assert o.high_watermark == 0


def test_high_watermark_is_the_minimum_of_the_in_sync_acknowledged_ends() -> None:
    o = _owner()
    o.durable(2, b"ab", 0)
    o.durable(4, b"cd", 0)
    assert o.replicated("f1", Replicated("t", 1, 4), 1) == []
    assert o.replicated("f2", Replicated("t", 1, 2), 1) == [AcknowledgeUpTo(2), ReadableUpTo(2)]
    assert o.replicated("f2", Replicated("t", 1, 4), 1) == [AcknowledgeUpTo(4), ReadableUpTo(4)]


def test_answers_of_a_lower_epoch_are_ignored_and_a_higher_one_deposes() -> None:
    o = _owner()
    o.durable(2, b"ab", 0)
    assert o.replicated("f1", Replicated("t", 0, 2), 1) == []
    assert o.replicated("f1", Replicated("t", 2, 2), 1) == [Deposed("t", 2)]
    assert o.durable(3, b"c", 2) == [] and o.replicated("f2", Replicated("t", 1, 2), 2) == []


def test_stale_epoch_deposes() -> None:
    o = _owner()
    assert o.stale_epoch("f1", StaleEpoch("t", 1)) == []
    assert o.stale_epoch("f1", StaleEpoch("t", 3)) == [Deposed("t", 3)]
    assert o.deposed and o.tick(10_000) == []


def test_mismatch_resends_from_the_window_and_ignores_a_repeat() -> None:
    o = _owner()
    o.durable(2, b"ab", 0)
    o.durable(4, b"cd", 0)
    assert _sends(o.mismatch("f1", Mismatch("t", 1, 2), 1)) == [("f1", 2, 4)]
    assert o.mismatch("f1", Mismatch("t", 1, 2), 1) == []
    assert _sends(o.mismatch("f1", Mismatch("t", 1, 0), 1)) == [("f1", 0, 2), ("f1", 2, 4)]


def test_mismatch_before_the_window_reads_the_wal_then_streams_again() -> None:
    o = _owner(window_bytes=2)
    o.durable(2, b"ab", 0)
    o.durable(4, b"cd", 0)
    assert o.mismatch("f1", Mismatch("t", 1, 0), 1) == [ReadForResend("f1", 0)]
    assert o.links["f1"].state is LinkState.READING
    assert _sends(o.durable(6, b"ef", 1)) == [("f2", 4, 6)]
    assert _sends(o.frames_read("f1", 0, b"abcd", 4, 2)) == [("f1", 0, 4), ("f1", 4, 6)]
    assert o.links["f1"].state is LinkState.STREAMING


def test_mismatch_at_the_durable_end_probes() -> None:
    o = _owner()
    o.durable(2, b"ab", 0)
    assert _sends(o.mismatch("f1", Mismatch("t", 1, 2), 1)) == [("f1", 2, 2)]


def test_stream_broke_resends_from_the_acknowledged_end() -> None:
    o = _owner()
    o.durable(2, b"ab", 0)
    o.replicated("f1", Replicated("t", 1, 2), 0)
    o.durable(4, b"cd", 0)
    assert _sends(o.stream_broke("f1", 1)) == [("f1", 2, 4)]


def test_tick_shrinks_a_laggard_and_the_watermark_waits_for_the_commit() -> None:
    o = _owner(lag_ms=100)
    o.durable(2, b"ab", 0)
    o.replicated("f1", Replicated("t", 1, 2), 50)
    assert o.tick(100) == []
    assert o.tick(101) == [ProposeInSync("t", 1, ("f1",), 1)]
    assert o.tick(200) == []
    assert o.high_watermark == 0
    assert o.replicas_seen(("f1",), 2, 1) == [AcknowledgeUpTo(2), ReadableUpTo(2)]


def test_a_proposal_seen_unresolved_stays_outstanding_and_is_made_again_at_a_tick() -> None:
    """The value it compared, seen again, says nothing of a proposal that may still land;
    a newer version resolves it."""
    o = _owner(lag_ms=100)
    o.durable(2, b"ab", 0)
    assert o.tick(101) == [ProposeInSync("t", 1, (), 1)]
    assert o.replicas_seen(("f1", "f2"), 1, 1) == []
    assert o.pending == ()
    assert o.tick(102) == [ProposeInSync("t", 1, (), 1)]
    assert o.tick(103) == []  # outstanding again
    o.replicas_seen((), 2, 1)
    assert o.pending is None and o.in_sync == frozenset()


def test_an_expand_seen_unresolved_still_counts_its_member() -> None:
    """`python -m sim --cluster --replicated --profile peers --seed 149`: the owner shrank
    the set to nothing, proposed the caught-up f2, and then saw the shrink's value again
    (the watch's copy after the read-back). Clearing the proposal there acknowledged a
    record f2 lacked, and the expand then landed: f2 was promoted without it."""
    o = _owner(followers=("f2",), in_sync=(), version=5)
    o.durable(2, b"ab", 0)
    assert ProposeInSync("t", 1, ("f2",), 5) in o.replicated("f2", Replicated("t", 1, 2), 0)
    o.durable(3, b"c", 0)
    assert o.replicas_seen((), 5, 1) == []  # the shrink's value, seen again
    assert o.high_watermark == 2  # f2 lacks offset 2: not acknowledged
    assert o.replicas_seen(("f2",), 6, 1) == []  # the expand landed
    assert o.replicated("f2", Replicated("t", 1, 3), 0) == [AcknowledgeUpTo(3), ReadableUpTo(3)]


def test_a_caught_up_follower_is_proposed_and_counted_from_the_proposal() -> None:
    o = _owner(in_sync=("f1",), version=3)
    o.durable(2, b"ab", 0)
    o.replicated("f1", Replicated("t", 1, 2), 0)
    expand = o.replicated("f2", Replicated("t", 1, 2), 0)
    assert ProposeInSync("t", 1, ("f1", "f2"), 3) in expand
    o.durable(4, b"cd", 0)
    assert o.replicated("f1", Replicated("t", 1, 4), 0) == []
    assert o.replicas_seen(("f1", "f2"), 4, 1) == []
    assert o.replicated("f2", Replicated("t", 1, 4), 0) == [AcknowledgeUpTo(4), ReadableUpTo(4)]


def test_replicas_seen_with_a_higher_epoch_deposes() -> None:
    assert _owner().replicas_seen(("f1",), 9, 2) == [Deposed("t", 2)]


def test_below_min_in_sync_nothing_is_acknowledged() -> None:
    o = _owner(in_sync=(), min_in_sync=2)
    assert NotEnoughInSync("t", 0, 2) in o.durable(2, b"ab", 0)
    assert o.high_watermark == 0
    o.replicated("f1", Replicated("t", 1, 2), 0)
    assert o.replicas_seen(("f1",), 2, 1) == [AcknowledgeUpTo(2), ReadableUpTo(2)]


def test_alone_the_owner_acknowledges_at_its_durable_end() -> None:
    o = _owner(followers=(), in_sync=())
    assert o.durable(2, b"ab", 0) == [AcknowledgeUpTo(2), ReadableUpTo(2)]


def test_max_in_flight_holds_sends_back_until_acknowledged() -> None:
    o = _owner(max_in_flight=3)
    o.durable(2, b"ab", 0)
    o.durable(4, b"cd", 0)
    assert _sends(o.durable(6, b"ef", 0)) == []
    assert _sends(o.replicated("f1", Replicated("t", 1, 2), 1)) == [("f1", 4, 6)]


def test_a_resend_held_back_by_max_in_flight_probes() -> None:
    o = _owner(max_in_flight=2)
    o.durable(2, b"ab", 0)
    o.durable(4, b"cd", 0)
    assert _sends(o.mismatch("f1", Mismatch("t", 1, 4), 1)) == [("f1", 4, 4)]


def test_a_chunked_read_asks_for_the_rest() -> None:
    o = _owner(window_bytes=1)
    o.durable(2, b"ab", 0)
    o.durable(4, b"cd", 0)
    o.durable(6, b"ef", 0)
    assert o.mismatch("f1", Mismatch("t", 1, 0), 1) == [ReadForResend("f1", 0)]
    out = o.frames_read("f1", 0, b"ab", 2, 1)
    assert _sends(out) == [("f1", 0, 2)] and out[-1] == ReadForResend("f1", 2)
    assert o.frames_read("f1", 0, b"ab", 2, 1) == []
    assert _sends(o.frames_read("f1", 2, b"cd", 4, 1)) == [("f1", 2, 4), ("f1", 4, 6)]


def test_a_resend_the_wal_cannot_serve_probes_and_a_follower_below_it_leaves_in_sync() -> None:
    """The WAL starts at 4 (a new owner's log begins where the object index ends): the link
    believed the follower at 0, a probe finds where it really is. At 4 it is caught up from
    there; below 4 it cannot be here, and it leaves the in-sync set instead of holding the
    high watermark back for ever (found by the cluster simulator, seed 135)."""
    o = _owner(durable_end=6, window_bytes=1)
    assert o.stream_broke("f1", 0) == [ReadForResend("f1", 0)]
    probe = o.resend_unavailable("f1", 4, 1)
    assert _sends(probe) == [("f1", 6, 6)]
    assert o.mismatch("f1", Mismatch("t", 1, 4), 2) == [ReadForResend("f1", 4)]
    assert not o.links["f1"].behind
    o = _owner(durable_end=6, window_bytes=1)
    o.stream_broke("f1", 0)
    o.resend_unavailable("f1", 4, 1)
    assert o.mismatch("f1", Mismatch("t", 1, 2), 2) == [ProposeInSync("t", 1, ("f2",), 1)]
    assert o.links["f1"].behind
    assert _sends(o.durable(8, b"gh", 3)) == [("f2", 6, 8)]


def test_a_proposal_lost_without_a_read_back_is_made_again_at_a_tick() -> None:
    """The store answered neither the proposal nor its read-back: left outstanding, it
    would block every later change of the in-sync set (and an unload waiting for the high
    watermark) for ever (found by the cluster simulator, heavy profile, seed 11)."""
    o = _owner(lag_ms=100)
    o.durable(2, b"ab", 0)
    assert o.tick(101) == [ProposeInSync("t", 1, (), 1)]
    assert o.tick(102) == []  # outstanding
    assert o.proposal_lost() == []
    assert o.pending == ()  # it may still land
    assert o.tick(103) == [ProposeInSync("t", 1, (), 1)]


def test_a_proposal_refused_for_its_claim_deposes_the_owner_and_it_proposes_no_more() -> None:
    """The read-back of a refused proposal at the version it compared says the claim's
    compare failed (`claim_gone`): the owner stops as for a higher epoch. Taken as an
    unresolved proposal instead, it was made again at every tick, 20 refused writes a
    second per topic until the owner heard otherwise (invariant o, seed 22 of the `peers`
    swarm)."""
    o = _owner(lag_ms=100)
    o.durable(2, b"ab", 0)
    assert o.tick(101) == [ProposeInSync("t", 1, (), 1)]
    assert o.replicas_seen(("f1", "f2"), 1, 1, claim_gone=1) == [Deposed("t", 1)]
    assert o.deposed
    assert o.tick(102) == [] and o.tick(10_000) == []
    assert o.next_timer_ms is None


def test_a_claim_gone_under_an_older_epoch_says_nothing_of_this_one() -> None:
    o = OwnerReplication(
        "t", 3, durable_end=0, high_watermark=0, followers=("f1", "f2"), in_sync=("f1", "f2"),
        version=1, lag_ms=100,
    )  # fmt: skip
    o.durable(2, b"ab", 0)
    assert o.tick(101) == [ProposeInSync("t", 3, (), 1)]
    assert o.replicas_seen(("f1", "f2"), 1, 3, claim_gone=2) == []
    assert not o.deposed
    assert o.tick(102) == [ProposeInSync("t", 3, (), 1)]

"""`OwnerReplication.next_timer_ms`: when the owner's `tick` next has work (issue 23 point 4:
the broker ticks a replicated topic only then or when an input touched it). A lower bound,
checked against `tick` itself: a copy of the machine ticked one millisecond before the
deadline does nothing, one ticked at it does something."""

from __future__ import annotations

import copy

from danube.machines.replication.messages import ProposeInSync, Replicated, Send
from danube.machines.replication.owner import OwnerReplication

LAG = 1_000


def _owner(**kw: object) -> OwnerReplication:
    args: dict = dict(
        durable_end=0,
        high_watermark=0,
        followers=("f1", "f2"),
        in_sync=("f1", "f2"),
        version=1,
        lag_ms=LAG,
    )
    args.update(kw)
    return OwnerReplication("t", 1, **args)


def _ticks_at(owner: OwnerReplication, now_ms: int) -> list:
    return copy.deepcopy(owner).tick(now_ms)


def _exact(owner: OwnerReplication) -> int:
    """The deadline, checked to be the first instant at which `tick` acts."""
    due = owner.next_timer_ms
    assert due is not None
    assert _ticks_at(owner, due - 1) == [], "a tick before the deadline acts: it is too late"
    assert _ticks_at(owner, due) != [], "a tick at the deadline does nothing"
    return due


def test_an_idle_in_sync_owner_has_no_deadline() -> None:
    owner = _owner()
    assert owner.next_timer_ms is None
    assert _ticks_at(owner, 10 * LAG) == []


def test_an_unacknowledged_send_is_due_lag_ms_after_it_went_out() -> None:
    owner = _owner()
    owner.durable(2, b"ab", 100)
    owner.durable(3, b"c", 400)  # the oldest unacknowledged send counts
    assert _exact(owner) == 100 + LAG + 1
    owner.replicated("f1", Replicated("t", 1, 2), 500)
    owner.replicated("f2", Replicated("t", 1, 2), 500)
    assert _exact(owner) == 400 + LAG + 1
    owner.replicated("f1", Replicated("t", 1, 3), 600)
    owner.replicated("f2", Replicated("t", 1, 3), 600)
    assert owner.next_timer_ms is None


def test_a_proposal_under_way_has_no_deadline_until_it_is_lost() -> None:
    owner = _owner()
    owner.durable(2, b"ab", 100)
    effects = owner.tick(100 + LAG + 1)
    assert [e for e in effects if isinstance(e, ProposeInSync)]
    assert owner.next_timer_ms is None, "only its answer (an input) gives the owner work"
    owner.proposal_lost()
    assert owner.next_timer_ms == 0 and _ticks_at(owner, 0) != []


def test_a_catching_up_follower_is_probed_lag_ms_after_it_was_last_heard() -> None:
    owner = _owner(in_sync=(), durable_end=5, high_watermark=5, now_ms=200)
    assert _exact(owner) == 200 + LAG + 1
    probes = owner.tick(200 + LAG + 1)
    assert sorted(e.follower for e in probes if isinstance(e, Send)) == ["f1", "f2"]
    assert _exact(owner) == 200 + 2 * LAG + 2  # probed then: due again a lag later


def test_a_caught_up_follower_not_proposed_is_due_at_once() -> None:
    owner = _owner(in_sync=("f1",))  # f2 holds the whole (empty) log: it joins at a tick
    assert owner.next_timer_ms == 0
    assert _ticks_at(owner, 0) == [ProposeInSync("t", 1, ("f1", "f2"), 1)]


def test_a_proposal_seen_unresolved_is_due_at_once() -> None:
    owner = _owner(in_sync=("f1",))
    owner.durable(2, b"ab", 0)
    owner.replicated("f1", Replicated("t", 1, 2), 1)
    owner.replicated("f2", Replicated("t", 1, 2), 1)  # proposes f2 at once
    assert owner.pending == ("f1", "f2") and owner.next_timer_ms is None
    owner.replicas_seen(("f1",), 1, 1)  # its version seen again: may still land, retried
    assert owner.next_timer_ms == 0 and _ticks_at(owner, 0) != []


def test_a_member_gone_from_the_followers_is_due_at_once() -> None:
    owner = _owner(followers=("f1",), in_sync=("f1", "f2"))
    assert owner.next_timer_ms == 0 and _ticks_at(owner, 0) != []


def test_a_deposed_owner_has_no_deadline() -> None:
    owner = _owner()
    owner.durable(2, b"ab", 0)
    owner.replicated("f1", Replicated("t", 2, 2), 1)
    assert owner.deposed and owner.next_timer_ms is None

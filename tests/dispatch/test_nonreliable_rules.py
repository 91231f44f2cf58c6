"""Example-based tests of the non-reliable dispatch rules, one rule per test.

`NonReliableSubscription` is a pure state machine: these tests drive it directly and read the
effects it returns (`ConsumerReady`), its drop counters and what `take` hands out.
"""

from __future__ import annotations

from collections import Counter

import pytest

from danube.machines.dispatch import (
    ConsumerReady,
    DropReason,
    NonReliableSubscription,
    QueueLimits,
    SubscriptionType,
)

BIG = QueueLimits(max_messages=10_000, max_bytes=10_000_000)


def make(
    sub_type: SubscriptionType,
    names: tuple[str, ...] = ("c1",),
    *,
    limits: QueueLimits = BIG,
    connect: bool = True,
    filters: dict[str, tuple[str, ...]] | None = None,
) -> tuple[NonReliableSubscription, dict[str, int]]:
    """A subscription with consumers `names` (ids 1, 2, ... in that order), all connected."""
    sub = NonReliableSubscription(sub_type, limits)
    ids = {}
    for index, name in enumerate(names, start=1):
        sub.add_consumer(index, name, (filters or {}).get(name, ()))
        ids[name] = index
    if connect:
        for consumer_id in ids.values():
            assert sub.connect(consumer_id) == []
    return sub, ids


def drops(sub: NonReliableSubscription) -> dict[DropReason, int]:
    return {reason: count for reason, count in sub.dropped.items() if count}


def drain(sub: NonReliableSubscription, consumer_id: int) -> list[object]:
    return sub.take(consumer_id, 1_000_000)


# -- Exclusive --------------------------------------------------------------------------------


def test_exclusive_sends_everything_to_the_single_consumer() -> None:
    sub, ids = make(SubscriptionType.EXCLUSIVE)
    assert sub.active_consumer == ids["c1"]
    for i in range(5):
        sub.publish(f"m{i}", 1, b"k%d" % i)
    assert drain(sub, ids["c1"]) == [f"m{i}" for i in range(5)]
    assert drops(sub) == {}
    assert sub.delivered == 5


def test_exclusive_without_a_connected_consumer_drops_no_consumer() -> None:
    sub, ids = make(SubscriptionType.EXCLUSIVE, connect=False)
    assert sub.active_consumer is None
    assert sub.publish("m", 1, b"") == []
    assert drops(sub) == {DropReason.NO_CONSUMER: 1}
    assert sub.queued(ids["c1"]) == 0


def test_subscription_without_consumers_drops_no_consumer_for_every_type() -> None:
    for sub_type in SubscriptionType:
        sub = NonReliableSubscription(sub_type, BIG)
        assert sub.publish("m", 1, b"key") == []
        assert drops(sub) == {DropReason.NO_CONSUMER: 1}, sub_type


# -- Failover ---------------------------------------------------------------------------------


def test_failover_first_connected_consumer_is_active_and_stays_active() -> None:
    sub, ids = make(SubscriptionType.FAILOVER, ("c1", "c2", "c3"), connect=False)
    sub.connect(ids["c2"])
    assert sub.active_consumer == ids["c2"]
    sub.connect(ids["c1"])
    sub.connect(ids["c3"])
    assert sub.active_consumer == ids["c2"], "a newly connected consumer must not take over"
    for i in range(4):
        sub.publish(i, 1, b"k%d" % i)
    assert sub.queued(ids["c2"]) == 4
    assert sub.queued(ids["c1"]) == sub.queued(ids["c3"]) == 0


def test_failover_promotes_the_earliest_added_connected_consumer() -> None:
    # Added c1, c2, c3; connected in the order c3, c2, c1: c3 is active. When c3 leaves, the
    # earliest *added* connected consumer (c1) takes over, not the earliest connected (c2).
    sub, ids = make(SubscriptionType.FAILOVER, ("c1", "c2", "c3"), connect=False)
    for name in ("c3", "c2", "c1"):
        sub.connect(ids[name])
    assert sub.active_consumer == ids["c3"]
    sub.disconnect(ids["c3"])
    assert sub.active_consumer == ids["c1"]
    sub.publish("m", 1, b"")
    assert drain(sub, ids["c1"]) == ["m"]


def test_failover_old_active_reconnecting_does_not_take_back_over() -> None:
    sub, ids = make(SubscriptionType.FAILOVER, ("c1", "c2"))
    assert sub.active_consumer == ids["c1"]
    sub.disconnect(ids["c1"])
    assert sub.active_consumer == ids["c2"]
    sub.connect(ids["c1"])
    assert sub.active_consumer == ids["c2"]


def test_failover_with_nobody_connected_drops_and_the_next_connect_becomes_active() -> None:
    sub, ids = make(SubscriptionType.FAILOVER, ("c1", "c2"))
    sub.disconnect(ids["c1"])
    sub.disconnect(ids["c2"])
    assert sub.active_consumer is None
    sub.publish("lost", 1, b"")
    assert drops(sub) == {DropReason.NO_CONSUMER: 1}
    sub.connect(ids["c2"])
    assert sub.active_consumer == ids["c2"]
    assert sub.publish("kept", 1, b"") == [ConsumerReady(ids["c2"])]


def test_failover_stranded_messages_move_to_the_new_active_in_order() -> None:
    sub, ids = make(SubscriptionType.FAILOVER, ("c1", "c2"))
    for i in range(3):
        sub.publish(i, 1, b"")
    assert sub.take(ids["c1"], 1) == [0]
    effects = sub.disconnect(ids["c1"])
    assert effects == [ConsumerReady(ids["c2"])]
    assert drain(sub, ids["c2"]) == [1, 2]
    assert sub.queued(ids["c1"]) == 0


def test_removing_the_active_consumer_promotes_and_forgets_it() -> None:
    sub, ids = make(SubscriptionType.FAILOVER, ("c1", "c2"))
    sub.publish("m", 1, b"")
    assert sub.remove_consumer(ids["c1"]) == [ConsumerReady(ids["c2"])]
    assert sub.consumer_ids == [ids["c2"]]
    assert sub.active_consumer == ids["c2"]
    assert drain(sub, ids["c2"]) == ["m"]


# -- Shared -----------------------------------------------------------------------------------


def test_shared_round_robin_in_consumer_order() -> None:
    sub, ids = make(SubscriptionType.SHARED, ("c1", "c2", "c3"))
    for i in range(7):
        sub.publish(i, 1, b"")
    assert drain(sub, ids["c1"]) == [0, 3, 6]
    assert drain(sub, ids["c2"]) == [1, 4]
    assert drain(sub, ids["c3"]) == [2, 5]


def test_shared_skips_disconnected_consumers() -> None:
    sub, ids = make(SubscriptionType.SHARED, ("c1", "c2", "c3"))
    sub.disconnect(ids["c2"])
    for i in range(4):
        sub.publish(i, 1, b"")
    assert drain(sub, ids["c1"]) == [0, 2]
    assert drain(sub, ids["c3"]) == [1, 3]
    assert sub.queued(ids["c2"]) == 0


def test_shared_skips_full_consumers() -> None:
    sub, ids = make(SubscriptionType.SHARED, ("c1", "c2"), limits=QueueLimits(2, 1000))
    for i in range(4):
        sub.publish(i, 1, b"")  # c1: 0, 2; c2: 1, 3
    drain(sub, ids["c2"])
    sub.publish("a", 1, b"")
    sub.publish("b", 1, b"")
    assert drops(sub) == {}
    assert drain(sub, ids["c2"]) == ["a", "b"]
    assert drain(sub, ids["c1"]) == [0, 2]


def test_shared_all_full_drops_queue_full() -> None:
    sub, _ = make(SubscriptionType.SHARED, ("c1", "c2"), limits=QueueLimits(1, 1000))
    sub.publish(0, 1, b"")
    sub.publish(1, 1, b"")
    assert sub.publish(2, 1, b"") == []
    assert drops(sub) == {DropReason.QUEUE_FULL: 1}


def test_shared_none_connected_drops_no_consumer() -> None:
    sub, _ = make(SubscriptionType.SHARED, ("c1", "c2"), connect=False)
    sub.publish(0, 1, b"")
    assert drops(sub) == {DropReason.NO_CONSUMER: 1}


def test_shared_disconnect_reroutes_queued_messages_without_duplicates() -> None:
    sub, ids = make(SubscriptionType.SHARED, ("c1", "c2", "c3"))
    for i in range(6):
        sub.publish(i, 1, b"")
    drain(sub, ids["c2"])  # 1, 4 delivered
    drain(sub, ids["c3"])  # 2, 5 delivered
    effects = sub.disconnect(ids["c1"])  # 0 and 3 are stranded
    assert sorted(e.consumer_id for e in effects) == [ids["c2"], ids["c3"]]
    rerouted = drain(sub, ids["c2"]) + drain(sub, ids["c3"])
    assert sorted(rerouted) == [0, 3]
    assert sub.delivered == 6


def test_rerouted_messages_keep_publish_order_per_consumer() -> None:
    sub, ids = make(SubscriptionType.SHARED, ("c1", "c2"))
    sub.publish(0, 1, b"")  # -> c1
    sub.publish(1, 1, b"")  # -> c2
    sub.disconnect(ids["c1"])  # 0 is re-routed to c2, which already holds 1
    assert drain(sub, ids["c2"]) == [0, 1]


# -- Key-Shared -------------------------------------------------------------------------------


def test_key_shared_connect_moves_pending_messages_to_the_keys_new_owner() -> None:
    """Without this, the old owner's queue and the new owner's would both hold messages of
    one key, and per-key order would break across the two streams."""
    sub, ids = make(SubscriptionType.KEY_SHARED, ("c1",))
    keys = [b"k%d" % i for i in range(40)]
    for i, key in enumerate(keys):
        sub.publish((i, key), 1, key)
    sub.add_consumer(2, "c2", ())
    effects = sub.connect(2)
    assert [e.consumer_id for e in effects] == [2]
    moved = drain(sub, 2)
    stayed = drain(sub, ids["c1"])
    assert moved and stayed, "40 keys over two consumers: some must move"
    assert {key for _, key in moved}.isdisjoint({key for _, key in stayed})
    assert moved == sorted(moved) and stayed == sorted(stayed)
    for key in keys:
        sub.publish(("again", key), 1, key)
    assert {key for _, key in drain(sub, 2)} == {key for _, key in moved}


def test_key_shared_same_key_same_consumer() -> None:
    sub, ids = make(SubscriptionType.KEY_SHARED, ("c1", "c2", "c3"))
    keys = [b"k%d" % (i % 20) for i in range(200)]
    for i, key in enumerate(keys):
        sub.publish((i, key), 1, key)
    owner_of: dict[bytes, set[int]] = {}
    for consumer_id in ids.values():
        for _, key in drain(sub, consumer_id):
            owner_of.setdefault(key, set()).add(consumer_id)
    assert all(len(owners) == 1 for owners in owner_of.values())
    assert len(set().union(*owner_of.values())) > 1, "20 keys should spread over 3 consumers"


def test_key_shared_filters_restrict_the_candidates() -> None:
    filters = {"orders": ("order-*",), "users": ("user-?",)}
    sub, ids = make(SubscriptionType.KEY_SHARED, ("orders", "users"), filters=filters)
    for key in (b"order-1", b"order-", b"user-7", b"order-abc"):
        sub.publish(key, 1, key)
    assert drain(sub, ids["orders"]) == [b"order-1", b"order-", b"order-abc"]
    assert drain(sub, ids["users"]) == [b"user-7"]
    for key in (b"user-77", b"Order-1", b"other"):
        sub.publish(key, 1, key)
    assert drops(sub) == {DropReason.NO_KEY_MATCH: 3}


def test_key_shared_consumer_without_filters_takes_every_key() -> None:
    sub, ids = make(SubscriptionType.KEY_SHARED, ("all", "some"), filters={"some": ("zzz",)})
    for key in (b"a", b"b", b"c", b"", b"\xff"):
        sub.publish(key, 1, key)
    assert drain(sub, ids["all"]) == [b"a", b"b", b"c", b"", b"\xff"]


def test_key_shared_none_connected_drops_no_consumer() -> None:
    sub, _ = make(SubscriptionType.KEY_SHARED, ("c1",), connect=False)
    sub.publish("m", 1, b"k")
    assert drops(sub) == {DropReason.NO_CONSUMER: 1}


def test_key_shared_full_owner_drops_instead_of_spilling_to_another_consumer() -> None:
    sub, ids = make(SubscriptionType.KEY_SHARED, ("c1", "c2"), limits=QueueLimits(1, 1000))
    sub.publish("first", 1, b"hot")
    (owner,) = [c for c in ids.values() if sub.queued(c)]
    sub.publish("second", 1, b"hot")
    assert drops(sub) == {DropReason.QUEUE_FULL: 1}
    assert [sub.queued(c) for c in ids.values()].count(1) == 1
    assert drain(sub, owner) == ["first"]


def test_key_shared_disconnect_reroutes_to_eligible_consumers_only() -> None:
    filters = {"narrow": ("a*",), "wide": ("*",), "other": ("b*",)}
    sub, ids = make(SubscriptionType.KEY_SHARED, ("narrow", "wide", "other"), filters=filters)
    keys = [b"a%d" % i for i in range(30)]
    for key in keys:
        sub.publish(key, 1, key)
    assert sub.queued(ids["other"]) == 0
    assert 0 < sub.queued(ids["wide"]) < 30, "both a*-eligible consumers should own some keys"
    sub.disconnect(ids["wide"])
    assert sorted(drain(sub, ids["narrow"])) == sorted(keys)
    assert sub.queued(ids["other"]) == 0
    assert drops(sub) == {}
    sub, ids = make(SubscriptionType.KEY_SHARED, ("narrow", "wide", "other"), filters=filters)
    for key in keys:
        sub.publish(key, 1, key)
    sub.disconnect(ids["narrow"])
    sub.disconnect(ids["wide"])  # nobody left accepts a*: the stranded messages are dropped
    assert drops(sub) == {DropReason.NO_KEY_MATCH: 30}
    assert sub.queued(ids["other"]) == 0


# -- bounded queues ---------------------------------------------------------------------------


def test_queue_bounded_by_message_count() -> None:
    sub, ids = make(SubscriptionType.EXCLUSIVE, limits=QueueLimits(3, 1000))
    for i in range(5):
        sub.publish(i, 1, b"")
    assert sub.queued(ids["c1"]) == 3
    assert drops(sub) == {DropReason.QUEUE_FULL: 2}
    assert drain(sub, ids["c1"]) == [0, 1, 2]


def test_queue_bounded_by_bytes_exact_fit_allowed() -> None:
    sub, ids = make(SubscriptionType.EXCLUSIVE, limits=QueueLimits(100, 10))
    sub.publish("six", 6, b"")
    sub.publish("five", 5, b"")  # 11 > 10: dropped
    sub.publish("four", 4, b"")  # 10 == 10: fits
    assert drain(sub, ids["c1"]) == ["six", "four"]
    assert drops(sub) == {DropReason.QUEUE_FULL: 1}


def test_message_larger_than_max_bytes_never_fits() -> None:
    sub, ids = make(SubscriptionType.SHARED, ("c1", "c2"), limits=QueueLimits(100, 10))
    sub.publish("huge", 11, b"")
    assert drops(sub) == {DropReason.QUEUE_FULL: 1}
    assert sub.queued(ids["c1"]) == sub.queued(ids["c2"]) == 0


def test_take_frees_room() -> None:
    sub, ids = make(SubscriptionType.EXCLUSIVE, limits=QueueLimits(1, 1000))
    sub.publish(0, 1, b"")
    sub.publish(1, 1, b"")
    assert drain(sub, ids["c1"]) == [0]
    sub.publish(2, 1, b"")
    assert drain(sub, ids["c1"]) == [2]
    assert drops(sub) == {DropReason.QUEUE_FULL: 1}


def test_stranded_messages_that_do_not_fit_are_dropped_queue_full() -> None:
    sub, ids = make(SubscriptionType.FAILOVER, ("c1", "c2"), limits=QueueLimits(2, 1000))
    sub.publish(0, 1, b"")
    sub.publish(1, 1, b"")
    sub.disconnect(ids["c1"])
    sub.publish(2, 1, b"")
    assert drain(sub, ids["c2"]) == [0, 1]
    assert drops(sub) == {DropReason.QUEUE_FULL: 1}


# -- ConsumerReady and take -------------------------------------------------------------------


def test_consumer_ready_only_on_empty_to_non_empty() -> None:
    sub, ids = make(SubscriptionType.EXCLUSIVE)
    c1 = ids["c1"]
    assert sub.publish(0, 1, b"") == [ConsumerReady(c1)]
    assert sub.publish(1, 1, b"") == []
    assert sub.take(c1, 1) == [0]
    assert sub.publish(2, 1, b"") == [], "queue still non-empty: no new ConsumerReady"
    assert drain(sub, c1) == [1, 2]
    assert sub.publish(3, 1, b"") == [ConsumerReady(c1)]


def test_no_consumer_ready_for_a_dropped_message() -> None:
    sub, _ = make(SubscriptionType.EXCLUSIVE, limits=QueueLimits(1, 1000))
    sub.publish(0, 1, b"")
    assert sub.publish(1, 1, b"") == []


def test_take_is_fifo_and_respects_limit() -> None:
    sub, ids = make(SubscriptionType.EXCLUSIVE)
    c1 = ids["c1"]
    for i in range(5):
        sub.publish(i, 1, b"")
    assert sub.take(c1, 0) == []
    assert sub.take(c1, 2) == [0, 1]
    assert sub.take(c1, 2) == [2, 3]
    assert sub.take(c1, 2) == [4]
    assert sub.take(c1, 2) == []
    assert sub.delivered == 5


def test_connect_is_idempotent_and_disconnect_of_disconnected_is_a_no_op() -> None:
    sub, ids = make(SubscriptionType.SHARED, ("c1", "c2"))
    sub.publish(0, 1, b"")
    assert sub.connect(ids["c1"]) == []
    assert sub.queued(ids["c1"]) == 1
    sub.disconnect(ids["c2"])
    assert sub.disconnect(ids["c2"]) == []
    assert sub.queued(ids["c1"]) == 1


@pytest.mark.parametrize("sub_type", list(SubscriptionType))
def test_every_message_is_counted_exactly_once(sub_type: SubscriptionType) -> None:
    sub, ids = make(sub_type, ("c1", "c2"), limits=QueueLimits(3, 1000))
    for i in range(10):
        sub.publish(i, 1, b"k%d" % (i % 3))
    taken = drain(sub, ids["c1"]) + drain(sub, ids["c2"])
    assert Counter(taken) == Counter(set(taken))
    assert len(taken) + sum(sub.dropped.values()) == 10

"""Example-based tests of the reliable dispatch rules, one rule per test.

`ReliableSubscription` is a pure state machine; `Driver` plays the broker around it: it keeps
the topic's routing keys (the WAL), answers every `Read` at once unless told otherwise, and
records what each consumer was sent and which cursors were persisted.
"""

from __future__ import annotations

import pytest

from danube.machines.dispatch.keyshared import HashRing
from danube.machines.dispatch.reliable import (
    DEFAULT_POLICY,
    MAX_UNACKED_MESSAGES_LIMIT,
    Backoff,
    Deliver,
    Effect,
    FailurePolicy,
    PersistCursor,
    Read,
    ReliableSubscription,
)
from danube.machines.dispatch.types import SubscriptionType

EXCLUSIVE = SubscriptionType.EXCLUSIVE
SHARED = SubscriptionType.SHARED
FAILOVER = SubscriptionType.FAILOVER
KEY_SHARED = SubscriptionType.KEY_SHARED

FAST = FailurePolicy(ack_timeout_ms=1_000, base_redelivery_delay_ms=100)


class Driver:
    """The broker around one subscription."""

    def __init__(
        self,
        sub_type: SubscriptionType,
        consumers: tuple[str, ...] = ("c1",),
        *,
        filters: dict[str, tuple[str, ...]] | None = None,
        connect: bool = True,
        start: int = 0,
        wal: list[bytes] | None = None,
        auto_read: bool = True,
        max_unacked_messages: int = 10,
        cursor_flush_ms: int = 1_000,
        policy: FailurePolicy = DEFAULT_POLICY,
    ) -> None:
        self.now = 0
        self.wal: list[bytes] = list(wal or [b""] * start)
        self.auto_read = auto_read
        self.reads: list[Read] = []
        self.pending: Read | None = None
        self.sent: list[Deliver] = []
        self.persisted: list[int] = []
        self.sub = ReliableSubscription(
            sub_type,
            start,
            max_unacked_messages=max_unacked_messages,
            cursor_flush_ms=cursor_flush_ms,
            policy=policy,
        )
        self.ids: dict[str, int] = {}
        for index, name in enumerate(consumers, start=1):
            self.run(self.sub.add_consumer(index, name, (filters or {}).get(name, ()), self.now))
            self.ids[name] = index
        if connect:
            for name in consumers:
                self.connect(name)
        if len(self.wal) > start:
            self.run(self.sub.readable(len(self.wal) - 1, self.now))

    def run(self, effects: list[Effect]) -> list[Effect]:
        """Performs the effects (reads at once when `auto_read`); returns them and those of
        the reads they caused."""
        done = list(effects)
        for effect in effects:
            if isinstance(effect, Read):
                assert effect.from_offset + effect.max_records <= len(self.wal)
                self.reads.append(effect)
                self.pending = effect
                if self.auto_read:
                    done.extend(self.answer())
            elif isinstance(effect, Deliver):
                self.sent.append(effect)
            elif isinstance(effect, PersistCursor):
                self.persisted.append(effect.cursor)
        return done

    def answer(self, count: int | None = None, *, order: list[int] | None = None) -> list[Effect]:
        """Answers the outstanding Read with its first `count` records (all by default), in
        the given order of positions."""
        read = self.pending
        assert read is not None
        self.pending = None
        offsets = list(range(read.from_offset, read.from_offset + read.max_records))[:count]
        if order is not None:
            offsets = [offsets[i] for i in order]
        return self.run(self.sub.records_read([(o, self.wal[o]) for o in offsets], self.now))

    def publish(self, *keys: bytes, count: int = 0) -> list[Effect]:
        self.wal.extend(keys or [b""] * count)
        return self.run(self.sub.readable(len(self.wal) - 1, self.now))

    def connect(self, name: str) -> list[Effect]:
        return self.run(self.sub.connect(self.ids[name], self.now))

    def disconnect(self, name: str) -> list[Effect]:
        return self.run(self.sub.disconnect(self.ids[name], self.now))

    def add(self, name: str, filters: tuple[str, ...] = (), *, connect: bool = True) -> None:
        self.ids[name] = max(self.ids.values(), default=0) + 1
        self.run(self.sub.add_consumer(self.ids[name], name, filters, self.now))
        if connect:
            self.connect(name)

    def ack(self, *offsets: int) -> list[Effect]:
        effects: list[Effect] = []
        for offset in offsets:
            effects.extend(self.run(self.sub.ack(offset, self.now)))
        return effects

    def nack(self, offset: int, delay_ms: int | None = None) -> list[Effect]:
        return self.run(self.sub.nack(offset, delay_ms, self.now))

    def at(self, now: int) -> list[Effect]:
        """Ticks at `now`."""
        self.now = now
        return self.run(self.sub.tick(now))

    def got(self, name: str) -> list[int]:
        """Every offset sent to the consumer, in order."""
        return [o for d in self.sent if d.consumer_id == self.ids[name] for o in d.offsets]

    def take(self) -> list[tuple[str, tuple[int, ...]]]:
        """The deliveries since the last call, by consumer name."""
        names = {i: n for n, i in self.ids.items()}
        taken = [(names[d.consumer_id], d.offsets) for d in self.sent]
        self.sent.clear()
        return taken


def delivers(effects: list[Effect]) -> list[Deliver]:
    return [e for e in effects if isinstance(e, Deliver)]


# -- window and reads -------------------------------------------------------------------------


def test_the_window_bounds_reads_and_deliveries() -> None:
    d = Driver(EXCLUSIVE)
    d.publish(count=25)
    assert d.reads == [Read(0, 10)]
    assert d.take() == [("c1", tuple(range(10)))]
    assert d.sub.window_size == 10


def test_a_lagging_consumer_reads_in_batches_of_a_quarter_window() -> None:
    """One free slot does not trigger a one-record read while a backlog waits; it does when
    that one record is all there is."""
    d = Driver(EXCLUSIVE, max_unacked_messages=8)
    d.publish(count=20)
    d.ack(0)
    assert d.reads == [Read(0, 8)], "one free slot of eight: wait for a batch"
    d.ack(1)
    assert d.reads[-1] == Read(8, 2)
    d.ack(*range(2, 18))
    assert all(read.max_records >= 2 for read in d.reads)
    assert d.sub.read_position == 20
    d.ack(18, 19)
    d.publish(b"")
    assert d.reads[-1] == Read(20, 1), "a lone new record is read at once"


def test_never_reads_beyond_the_readable_end() -> None:
    d = Driver(SHARED)
    d.publish(count=3)
    assert d.reads == [Read(0, 3)]
    d.ack(0, 1, 2)
    assert d.reads == [Read(0, 3)]
    d.publish(count=1)
    assert d.reads == [Read(0, 3), Read(3, 1)]


def test_nothing_is_read_while_no_consumer_is_connected() -> None:
    d = Driver(SHARED, connect=False)
    assert d.publish(count=5) == []
    d.connect("c1")
    assert d.reads == [Read(0, 5)]
    assert d.got("c1") == [0, 1, 2, 3, 4]


def test_one_read_at_a_time_and_a_partial_shuffled_answer_rereads_the_rest() -> None:
    d = Driver(SHARED, auto_read=False)
    d.publish(count=6)
    assert d.reads == [Read(0, 6)]
    assert d.publish(count=2) == [], "no second Read while one is outstanding"
    # offsets 3, 0 and 1 arrive (shuffled); 2 is missing, so 3 waits to be read again
    effects = d.answer(4, order=[3, 0, 1])
    assert delivers(effects) == [Deliver(1, (0, 1))]
    assert d.reads[-1] == Read(2, 6)
    assert d.answer(0) == [Read(2, 6)], "an empty answer asks again"


def test_answers_nobody_asked_for_are_ignored() -> None:
    d = Driver(SHARED, auto_read=False)
    d.publish(count=2)
    d.answer()
    assert d.take() == [("c1", (0, 1))]
    stale = d.sub.records_read([(0, b""), (1, b""), (5, b"")], d.now)
    assert stale == [], "no Read outstanding"
    d.publish(count=2)
    assert d.reads[-1] == Read(2, 2)
    d.pending = None
    effects = d.run(d.sub.records_read([(3, b""), (9, b"")], d.now))
    assert effects == [Read(2, 2)], "no run from offset 2: read again"
    assert d.sub.read_position == 2


def test_max_unacked_messages_range() -> None:
    for bad in (0, MAX_UNACKED_MESSAGES_LIMIT + 1):
        with pytest.raises(ValueError, match="max_unacked_messages"):
            ReliableSubscription(SHARED, 0, max_unacked_messages=bad)
    with pytest.raises(ValueError, match="ack_timeout_ms"):
        FailurePolicy(ack_timeout_ms=0)


def test_a_full_window_of_ten_thousand_is_one_read_and_one_deliver() -> None:
    """The Python work is per batch: one effect carries every offset."""
    d = Driver(EXCLUSIVE, max_unacked_messages=MAX_UNACKED_MESSAGES_LIMIT)
    effects = d.publish(count=MAX_UNACKED_MESSAGES_LIMIT)
    assert effects == [
        Read(0, MAX_UNACKED_MESSAGES_LIMIT),
        Deliver(1, tuple(range(MAX_UNACKED_MESSAGES_LIMIT))),
    ]


# -- acks and the cursor ----------------------------------------------------------------------


def test_out_of_order_acks_move_the_cursor_over_the_acknowledged_prefix_only() -> None:
    d = Driver(SHARED, cursor_flush_ms=0)
    d.publish(count=5)
    d.ack(1, 3)
    assert d.sub.cursor == -1
    d.ack(0)
    assert d.sub.cursor == 1
    d.ack(2)
    assert d.sub.cursor == 3
    assert d.persisted == [1, 3]


def test_acks_for_offsets_not_in_flight_are_ignored() -> None:
    d = Driver(SHARED, policy=FAST)
    d.publish(count=3)
    d.ack(0)
    assert d.ack(0) == [], "duplicate"
    assert d.ack(7) == [] and d.ack(-1) == [], "never delivered"
    d.at(1_000)  # 1 and 2 time out
    assert d.ack(1) == [], "late"
    assert d.sub.cursor == 0
    d.at(1_100)
    assert d.take() == [("c1", (0, 1, 2)), ("c1", (1, 2))]


def test_the_cursor_is_persisted_at_once_then_at_most_once_per_flush_interval() -> None:
    d = Driver(SHARED, cursor_flush_ms=1_000)
    d.publish(count=5)
    d.ack(0)
    assert d.persisted == [0], "the first advance goes out at once"
    d.now = 500
    d.ack(1)
    d.ack(2)
    assert d.persisted == [0]
    assert d.sub.next_timer_ms == 1_000, "the trailing advance has a timer"
    assert d.at(999) == []
    assert d.at(1_000) == [PersistCursor(2)]
    d.now = 1_200
    d.ack(3)
    assert d.persisted == [0, 2]
    d.now = 2_000
    d.ack(4)
    assert d.persisted == [0, 2, 4]


def test_flush_persists_now_and_only_a_moved_cursor() -> None:
    d = Driver(SHARED)
    assert d.run(d.sub.flush(d.now)) == []
    d.publish(count=3)
    d.ack(0)
    d.ack(1)
    assert d.persisted == [0]
    assert d.run(d.sub.flush(d.now)) == [PersistCursor(1)]
    assert d.run(d.sub.flush(d.now)) == []


# -- nack and ack timeout ---------------------------------------------------------------------


def test_nack_redelivers_after_the_policy_delay_doubling_each_time() -> None:
    d = Driver(SHARED, policy=FailurePolicy(base_redelivery_delay_ms=100))
    d.publish(b"")
    d.take()
    d.nack(0)
    assert d.at(99) == []
    assert delivers(d.at(100)) == [Deliver(1, (0,))]
    d.nack(0)
    assert d.at(299) == []
    assert delivers(d.at(300)) == [Deliver(1, (0,))]
    d.nack(0)
    assert d.sub.next_timer_ms == 700


def test_redeliveries_are_counted_and_first_deliveries_are_not() -> None:
    d = Driver(KEY_SHARED, consumers=("c1", "c2"), policy=FailurePolicy(base_redelivery_delay_ms=0))
    d.publish(b"a", b"b", b"a", b"c")
    assert sorted(o for _, offsets in d.take() for o in offsets) == [0, 1, 3]
    d.ack(0)
    assert [o for _, offsets in d.take() for o in offsets] == [2], "a key's next, sent later"
    assert d.sub.redelivered == 0
    d.nack(1)
    d.at(1)
    assert d.sub.redelivered == 1
    leaving = "c1" if 3 in d.sub.in_flight(d.ids["c1"]) else "c2"
    held = len(d.sub.in_flight(d.ids[leaving]))
    d.disconnect(leaving)
    assert held and d.sub.redelivered == 1 + held, "its messages went to the other consumer"


def test_configure_changes_the_window_and_policy_of_a_live_subscription() -> None:
    d = Driver(SHARED, max_unacked_messages=2, policy=FailurePolicy(ack_timeout_ms=10_000))
    d.publish(count=5)
    assert [o for _, offsets in d.take() for o in offsets] == [0, 1]
    d.run(d.sub.configure(d.now, max_unacked_messages=4))
    assert [o for _, offsets in d.take() for o in offsets] == [2, 3]
    d.run(d.sub.configure(d.now, policy=FailurePolicy(ack_timeout_ms=100)))
    d.ack(0)
    assert [o for _, offsets in d.take() for o in offsets] == [4]
    # 4 was sent under the 100 ms timeout: it times out first, though sent last
    d.at(100)
    assert 4 not in d.sub.in_flight(1) and 1 in d.sub.in_flight(1)
    with pytest.raises(ValueError):
        d.sub.configure(d.now, max_unacked_messages=0)


def test_a_nack_delay_lengthens_but_never_shortens_and_is_capped() -> None:
    policy = FailurePolicy(base_redelivery_delay_ms=100, max_redelivery_delay_ms=1_000)
    d = Driver(SHARED, policy=policy)
    d.publish(count=3)
    d.nack(0, 10)
    d.nack(1, 500)
    d.nack(2, 5_000)
    assert delivers(d.at(100)) == [Deliver(1, (0,))]
    assert delivers(d.at(500)) == [Deliver(1, (1,))]
    assert d.at(999) == []
    assert delivers(d.at(1_000)) == [Deliver(1, (2,))]


def test_fixed_backoff_and_no_delay() -> None:
    fixed = FailurePolicy(base_redelivery_delay_ms=50, backoff=Backoff.FIXED)
    assert [fixed.redelivery_delay_ms(n, None) for n in (1, 2, 5)] == [50, 50, 50]
    d = Driver(SHARED, policy=FailurePolicy(base_redelivery_delay_ms=0))
    d.publish(b"")
    assert delivers(d.nack(0)) == [Deliver(1, (0,))], "no delay: redelivered at once"


def test_an_ack_timeout_redelivers_and_an_ack_at_the_deadline_is_late() -> None:
    d = Driver(SHARED, policy=FAST)
    d.publish(count=2)
    d.now = 999
    d.ack(0)
    assert d.sub.cursor == 0
    d.now = 1_000
    assert d.ack(1) == [], "at the deadline the ack is late"
    assert d.sub.cursor == 0
    assert delivers(d.at(1_100)) == [Deliver(1, (1,))]
    # the timeout's failure is stored with the cursor, one cursor_flush_ms after the last
    assert d.sub.next_timer_ms == 1_999
    assert d.at(1_999) == [PersistCursor(0, ((1, 1),))]
    assert d.sub.next_timer_ms == 2_100


def test_a_disconnect_is_not_charged_as_a_failure() -> None:
    d = Driver(SHARED, ("c1", "c2"), policy=FAST)
    d.publish(b"")
    assert d.take() == [("c1", (0,))]
    d.disconnect("c1")
    assert d.take() == [("c2", (0,))]
    d.nack(0)
    assert d.sub.next_timer_ms == 100, "first failure: the base delay"


# -- Exclusive and Failover -------------------------------------------------------------------


def test_exclusive_delivers_everything_in_offset_order() -> None:
    d = Driver(EXCLUSIVE, max_unacked_messages=4)
    d.publish(count=10)
    d.ack(0, 1)
    d.ack(2, 3)
    assert d.got("c1") == list(range(8))


def test_exclusive_redelivery_restarts_at_the_first_unacknowledged_offset() -> None:
    """The in-flight ones after it go again too, in order, and nothing new is sent while the
    nacked message waits."""
    d = Driver(EXCLUSIVE, max_unacked_messages=5, policy=FAST)
    d.publish(count=5)
    assert d.take() == [("c1", (0, 1, 2, 3, 4))]
    d.ack(0)
    d.nack(2)
    d.ack(4)
    d.publish(count=3)
    assert d.take() == [], "the run is broken: nothing new until the restart"
    assert delivers(d.at(100)) == [Deliver(1, (1, 2, 3, 5, 6))]


def test_exclusive_waits_for_the_latest_redelivery_time() -> None:
    d = Driver(EXCLUSIVE, policy=FAST)
    d.publish(count=3)
    d.take()
    d.nack(1, 500)
    d.nack(0)
    assert d.at(100) == []
    assert delivers(d.at(500)) == [Deliver(1, (0, 1, 2))]


def test_exclusive_reconnect_redelivers_to_the_same_consumer() -> None:
    d = Driver(EXCLUSIVE)
    d.publish(count=4)
    d.ack(1)
    d.take()
    assert d.disconnect("c1") == []
    assert d.sub.active_consumer is None
    assert d.publish(count=1) == [], "nobody to read for"
    d.connect("c1")
    assert d.take() == [("c1", (0, 2, 3)), ("c1", (4,))], "then it reads what it held back"


def test_a_takeover_is_a_disconnect_then_a_connect() -> None:
    d = Driver(EXCLUSIVE)
    d.publish(count=2)
    d.take()
    assert d.connect("c1") == [], "connecting a connected consumer changes nothing"
    d.disconnect("c1")
    d.connect("c1")
    assert d.take() == [("c1", (0, 1))]


def test_failover_sends_only_to_the_active_consumer_and_promotes_in_order() -> None:
    d = Driver(FAILOVER, ("c1", "c2", "c3"))
    d.publish(count=4)
    d.ack(0)
    assert d.take() == [("c1", (0, 1, 2, 3))]
    d.disconnect("c1")
    assert d.sub.active_consumer == d.ids["c2"], "the earliest-added connected standby"
    assert d.take() == [("c2", (1, 2, 3))]
    d.connect("c1")
    d.publish(count=1)
    assert d.sub.active_consumer == d.ids["c2"], "the active consumer is sticky"
    assert d.take() == [("c2", (4,))]


def test_failover_without_unacked_messages_continues_on_the_standby() -> None:
    d = Driver(FAILOVER, ("c1", "c2"))
    d.publish(count=2)
    d.ack(0, 1)
    d.disconnect("c1")
    d.publish(count=1)
    assert d.take() == [("c1", (0, 1)), ("c2", (2,))]


def test_removing_the_active_consumer_redelivers_to_the_next() -> None:
    d = Driver(FAILOVER, ("c1", "c2"))
    d.publish(count=2)
    d.run(d.sub.remove_consumer(d.ids["c1"], d.now))
    assert d.sub.consumer_ids == [d.ids["c2"]]
    assert d.take() == [("c1", (0, 1)), ("c2", (0, 1))]


# -- Shared -----------------------------------------------------------------------------------


def test_shared_round_robin_over_connected_consumers() -> None:
    d = Driver(SHARED, ("c1", "c2", "c3"))
    d.disconnect("c2")
    d.publish(count=5)
    assert d.got("c1") == [0, 2, 4]
    assert d.got("c3") == [1, 3]
    assert d.got("c2") == []


def test_shared_disconnect_sends_in_flight_messages_to_the_others() -> None:
    d = Driver(SHARED, ("c1", "c2"))
    d.publish(count=4)
    d.ack(1)
    d.take()
    d.disconnect("c1")
    assert d.take() == [("c2", (0, 2))]
    assert d.sub.in_flight(d.ids["c2"]) == {0, 2, 3}
    assert d.sub.in_flight(d.ids["c1"]) == set()


def test_shared_with_nobody_connected_waits_and_loses_nothing() -> None:
    d = Driver(SHARED, ("c1", "c2"))
    d.publish(count=2)
    d.take()
    d.disconnect("c1")
    d.disconnect("c2")
    d.publish(count=1)
    assert d.take() == [("c2", (0,))]
    d.connect("c2")
    assert d.take() == [("c2", (0, 1)), ("c2", (2,))]
    assert d.sub.in_flight(d.ids["c2"]) == {0, 1, 2}


def test_shared_due_redeliveries_go_before_new_messages() -> None:
    d = Driver(SHARED, policy=FAST, auto_read=False)
    d.publish(count=4)
    d.answer(2)
    d.nack(0)
    d.now = 100
    d.answer()
    assert d.got("c1") == [0, 1, 0, 2, 3]


# -- Key-Shared -------------------------------------------------------------------------------


def test_key_shared_one_message_in_flight_per_key_without_blocking_other_keys() -> None:
    d = Driver(KEY_SHARED)
    d.publish(b"a", b"a", b"b", b"a", b"c", b"b")
    assert d.got("c1") == [0, 2, 4]
    d.ack(0)
    assert d.got("c1") == [0, 2, 4, 1]
    d.ack(2)
    d.ack(1)
    assert d.got("c1") == [0, 2, 4, 1, 5, 3], "each key in offset order"


def test_key_shared_messages_behind_a_busy_key_count_toward_the_window() -> None:
    d = Driver(KEY_SHARED, max_unacked_messages=3)
    d.publish(b"a", b"a", b"a", b"b")
    assert d.got("c1") == [0]
    assert d.sub.window_size == 3, "b is not even read"
    d.ack(0)
    assert d.got("c1") == [0, 1, 3]


def test_key_shared_routes_by_filters_and_the_ring() -> None:
    filters = {"c1": ("a*",), "c2": ("b*",), "c3": ("b*", "z?")}
    d = Driver(KEY_SHARED, ("c1", "c2", "c3"), filters=filters)
    keys = [b"a1", b"b1", b"zz", b"a2", b"b2", b"b3", b"b4"]
    d.publish(*keys)
    assert d.got("c1") == [0, 3], "the only consumer that accepts a*"
    ring = HashRing([(d.ids["c2"], "c2"), (d.ids["c3"], "c3")])
    expected = {d.ids["c2"]: [], d.ids["c3"]: [2]}
    for offset in (1, 4, 5, 6):
        owner = ring.owner(keys[offset])
        assert owner is not None
        expected[owner].append(offset)
    assert d.got("c2") == sorted(expected[d.ids["c2"]])
    assert d.got("c3") == sorted(expected[d.ids["c3"]])
    assert d.got("c2") and len(d.got("c3")) > 1


def test_key_shared_a_key_nobody_accepts_waits_for_a_consumer_that_does() -> None:
    d = Driver(KEY_SHARED, filters={"c1": ("a*",)})
    d.publish(b"zz", b"a1")
    assert d.got("c1") == [1]
    d.ack(1)
    assert d.sub.cursor == -1, "never skipped"
    d.add("c2", ("z*",))
    assert d.got("c2") == [0]
    d.ack(0)
    assert d.sub.cursor == 1


def test_key_shared_filter_change_can_route_a_waiting_key() -> None:
    d = Driver(KEY_SHARED, filters={"c1": ("a*",)})
    d.publish(b"zz")
    assert d.take() == []
    d.run(d.sub.set_filters(d.ids["c1"], ("z*",), d.now))
    assert d.take() == [("c1", (0,))]


def test_key_shared_in_flight_message_stays_with_its_consumer_when_the_ring_changes() -> None:
    d = Driver(KEY_SHARED, ("c1",), max_unacked_messages=100)
    keys = [bytes([k]) * 3 for k in b"abcdefghijklmnop"]
    d.publish(*keys, *keys)
    first = d.got("c1")
    assert first == list(range(len(keys)))
    d.add("c2")
    assert d.got("c2") == [], "nothing moves while in flight"
    d.ack(*first)
    moved = d.got("c2")
    assert moved, "the new owner gets its keys' next messages"
    ring = HashRing([(d.ids["c1"], "c1"), (d.ids["c2"], "c2")])
    assert all(ring.owner(d.wal[o]) == d.ids["c2"] for o in moved)


def test_key_shared_disconnect_redelivers_to_the_keys_new_owner() -> None:
    d = Driver(KEY_SHARED, ("c1", "c2"))
    keys = [bytes([k]) for k in b"abcdefgh"]
    d.publish(*keys)
    d.take()
    held = d.sub.in_flight(d.ids["c1"])
    d.disconnect("c1")
    assert d.take() == [("c2", tuple(sorted(held)))]


# -- restart and timers -----------------------------------------------------------------------


def test_a_restart_resumes_after_the_persisted_cursor_and_redelivers_the_rest() -> None:
    d = Driver(SHARED, cursor_flush_ms=1_000)
    d.publish(count=6)
    d.ack(0)
    d.ack(1, 3)
    assert d.persisted == [0]
    again = Driver(SHARED, start=d.persisted[-1] + 1, wal=d.wal)
    assert again.got("c1") == [1, 2, 3, 4, 5], "at least once: unflushed acks count for nothing"


def test_next_timer_is_the_earliest_deadline_redelivery_or_flush() -> None:
    d = Driver(SHARED, policy=FAST, cursor_flush_ms=300)
    assert d.sub.next_timer_ms is None
    d.publish(count=3)
    assert d.sub.next_timer_ms == 1_000
    d.ack(0)
    d.now = 50
    d.nack(1)
    assert d.sub.next_timer_ms == 150
    d.ack(2)
    d.at(150)
    d.ack(1)
    assert d.persisted == [0]
    assert d.sub.next_timer_ms == 300, "the trailing cursor flush"
    assert d.at(300) == [PersistCursor(2)]


def test_no_timer_while_a_broken_run_has_no_consumer() -> None:
    """A timer that is already due would make the driver tick in a loop."""
    d = Driver(EXCLUSIVE, policy=FAST)
    d.publish(count=2)
    d.disconnect("c1")
    assert d.sub.next_timer_ms == 1_000, "the stale deadlines only: early, never stuck"
    d.at(1_000)
    assert d.sub.next_timer_ms is None
    d.connect("c1")
    assert d.take() == [("c1", (0, 1)), ("c1", (0, 1))]
    assert d.sub.next_timer_ms == 2_000


def test_the_clock_never_goes_back() -> None:
    d = Driver(SHARED, policy=FAST)
    d.at(5_000)
    d.publish(b"")
    d.at(10)
    assert d.sub.next_timer_ms == 6_000


def test_a_consumer_registers_once() -> None:
    d = Driver(SHARED)
    with pytest.raises(ValueError, match="already registered"):
        d.sub.add_consumer(d.ids["c1"], "c1", (), 0)


@pytest.mark.parametrize("sub_type", [EXCLUSIVE, SHARED, KEY_SHARED])
def test_dispatch_rate_sends_a_burst_then_one_message_per_turn(
    sub_type: SubscriptionType,
) -> None:
    d = Driver(sub_type, max_unacked_messages=100)
    d.run(d.sub.configure(0, dispatch_rate=10))
    d.publish(*[b"k%d" % i for i in range(15)])
    assert len([o for _, offsets in d.take() for o in offsets]) == 10, "one second's worth"
    assert d.sub.next_timer_ms == 100, "the next turn comes after 1/rate"
    assert delivers(d.at(99)) == []
    assert [o for x in delivers(d.at(100)) for o in x.offsets] == [10]
    d.take()
    d.at(1_000)
    assert sorted(o for _, offsets in d.take() for o in offsets) == [11, 12, 13, 14]
    d.run(d.sub.configure(d.now, dispatch_rate=0))
    d.publish(*[b"x%d" % i for i in range(30)])
    assert len([o for _, offsets in d.take() for o in offsets]) == 30, "no limit any more"


def test_a_dispatch_rate_asks_for_no_tick_while_nothing_waits_for_its_turn() -> None:
    """Messages held back by something else (here an Exclusive run waiting to restart after
    a nack) ask for no rate timer: one would tick the subscription every millisecond."""
    d = Driver(EXCLUSIVE, policy=FailurePolicy(base_redelivery_delay_ms=100))
    d.run(d.sub.configure(0, dispatch_rate=10))
    d.publish(count=2)
    d.take()
    d.nack(0)
    d.publish(count=2)
    assert d.sub.next_timer_ms == 100, "only the restart of the run"
    assert [o for x in delivers(d.at(100)) for o in x.offsets] == [0, 1, 2, 3]

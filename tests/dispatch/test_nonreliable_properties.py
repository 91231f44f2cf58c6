"""Property tests of non-reliable dispatch: random interleavings of membership changes,
publishes and takes, with the delivery invariants checked after every step.

The state machine reads each consumer's queue through the dispatcher's private `_consumers`
(white-box on purpose: the public API exposes only queue lengths, and the FIFO, byte-bound and
"where did this message go" checks need the contents). Everything else it checks against an
independent model of the rules: the Exclusive/Failover active consumer, the drop reasons, the
Key-Shared filters (with a reference glob matcher) and key stickiness.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from danube.machines.dispatch import (
    ConsumerReady,
    DropReason,
    NonReliableSubscription,
    QueueLimits,
    SubscriptionType,
)
from tests.dispatch.reference import glob_match

KEYS = [b"", b"a", b"b", b"ab", b"ba", b"aab", b"order-1", b"order-2", b"\xc3\xa9"]
PATTERNS = ["*", "a*", "b*", "?", "??", "a?b", "*b", "order-*", "ab", "\u00e9"]


def accepted(filters: tuple[str, ...], key: bytes) -> bool:
    return not filters or any(glob_match(f.encode(), key) for f in filters)


def queue_of(sub: NonReliableSubscription, consumer_id: int) -> list[int]:
    return [item.message for item in sub._consumers[consumer_id].queue]


@dataclass
class Msg:
    size: int
    key: bytes


class DispatchMachine(RuleBasedStateMachine):
    """One subscription of a random type; invariants (a)-(h) of the dispatch rules."""

    @initialize(
        sub_type=st.sampled_from(list(SubscriptionType)),
        max_messages=st.integers(1, 4),
        max_bytes=st.integers(3, 12),
    )
    def setup(self, sub_type: SubscriptionType, max_messages: int, max_bytes: int) -> None:
        self.limits = QueueLimits(max_messages, max_bytes)
        self.sub = NonReliableSubscription(sub_type, self.limits)
        self.sub_type = sub_type
        self.order: list[int] = []  # consumer ids in add order (the model)
        self.connected: set[int] = set()
        self.filters: dict[int, tuple[str, ...]] = {}
        self.active: int | None = None
        self.messages: dict[int, Msg] = {}
        self.taken_by: dict[int, int] = {}
        self.received: dict[int, list[int]] = {}
        self.key_owner: dict[bytes, int] = {}
        self.rerouted: set[int] = set()
        self.next_consumer = 1

    # -- helpers ------------------------------------------------------------------------------

    def snapshot(self) -> dict[int, list[int]]:
        return {c: queue_of(self.sub, c) for c in self.sub.consumer_ids}

    def room(self, queue: list[int], size: int) -> bool:
        return (
            len(queue) < self.limits.max_messages
            and sum(self.messages[m].size for m in queue) + size <= self.limits.max_bytes
        )

    def check_ready(
        self, before: dict[int, list[int]], after: dict[int, list[int]], effects: list
    ) -> None:
        """(h): ConsumerReady exactly for the queues that went from empty to non-empty."""
        assert all(isinstance(e, ConsumerReady) for e in effects)
        ready = [e.consumer_id for e in effects]
        assert len(ready) == len(set(ready)), f"duplicate ConsumerReady {effects}"
        expected = {c for c, q in after.items() if q and not before.get(c)}
        assert set(ready) == expected

    def appended(
        self, before: dict[int, list[int]], after: dict[int, list[int]], skip: int | None = None
    ) -> dict[int, list[int]]:
        """(g): no other queue lost or reordered a message; returns what each one gained
        (moved messages are merged in publish order, checked by `publish_order`)."""
        gained = {}
        for c, q in after.items():
            if c == skip:
                continue
            old = before.get(c, [])
            kept = [m for m in q if m in set(old)]
            assert kept == old, f"queue of {c} reordered or lost messages: {old} {q}"
            new = [m for m in q if m not in set(old)]
            if new:
                gained[c] = new
        return gained

    def drop_delta(self, before: dict[DropReason, int]) -> Counter[DropReason]:
        delta = Counter({r: self.sub.dropped[r] - before[r] for r in DropReason})
        assert all(v >= 0 for v in delta.values())
        return +delta

    def forget_key_owners(self) -> None:
        self.key_owner.clear()

    def record_owners(self, gained: dict[int, list[int]]) -> None:
        """(f): while membership is unchanged, a key always goes to the same consumer."""
        if self.sub_type is not SubscriptionType.KEY_SHARED:
            return
        for c, ids in gained.items():
            for m in ids:
                key = self.messages[m].key
                assert accepted(self.filters[c], key), f"{c} got key {key!r} it does not accept"
                assert c in self.connected
                owner = self.key_owner.setdefault(key, c)
                assert owner == c, f"key {key!r} moved from {owner} to {c} without a change"

    def promote(self, leaving: int) -> None:
        if self.active == leaving:
            self.active = next((c for c in self.order if c in self.connected), None)

    def leave(self, consumer_id: int, *, remove: bool) -> None:
        """disconnect or remove, then check where the stranded messages went."""
        before = self.snapshot()
        drops_before = dict(self.sub.dropped)
        was_connected = consumer_id in self.connected
        if remove:
            effects = self.sub.remove_consumer(consumer_id)
            self.order.remove(consumer_id)
            del self.filters[consumer_id]
        else:
            effects = self.sub.disconnect(consumer_id)
        self.connected.discard(consumer_id)
        after = self.snapshot()
        if remove:
            assert consumer_id not in after
        else:
            assert after[consumer_id] == []
        self.check_ready(before, after, effects)
        gained = self.appended(before, after, skip=consumer_id)
        stranded = before[consumer_id]
        if not was_connected:
            assert stranded == [] and gained == {} and effects == []
            return
        self.promote(consumer_id)
        self.forget_key_owners()
        dropped = self.drop_delta(drops_before)
        # each stranded message went to exactly one other queue or was dropped, in order
        moved = [m for ids in gained.values() for m in ids]
        self.rerouted.update(moved)
        assert sorted(moved) == sorted(set(moved))
        assert set(moved) <= set(stranded)
        assert len(moved) + sum(dropped.values()) == len(stranded)
        for ids in gained.values():
            positions = [stranded.index(m) for m in ids]
            assert positions == sorted(positions), "re-routed messages reordered"
        if self.sub_type in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            assert set(gained) <= {self.active}
            if self.active is None:
                assert set(dropped) <= {DropReason.NO_CONSUMER}
        if not self.connected:
            assert gained == {}
            assert set(dropped) <= {DropReason.NO_CONSUMER}
        self.record_owners(gained)

    # -- rules --------------------------------------------------------------------------------

    @precondition(lambda self: len(self.order) < 5)
    @rule(filters=st.lists(st.sampled_from(PATTERNS), max_size=2), connect=st.booleans())
    def add_consumer(self, filters: list[str], connect: bool) -> None:
        consumer_id = self.next_consumer
        self.next_consumer += 1
        if self.sub_type is not SubscriptionType.KEY_SHARED:
            filters = []
        self.sub.add_consumer(consumer_id, f"consumer-{consumer_id}", tuple(filters))
        self.order.append(consumer_id)
        self.filters[consumer_id] = tuple(filters)
        assert self.sub.queued(consumer_id) == 0
        assert not self.sub.is_connected(consumer_id)
        if connect:
            self.connect(consumer_index=len(self.order) - 1)

    @precondition(lambda self: self.order)
    @rule(consumer_index=st.integers(0, 10))
    def connect(self, consumer_index: int) -> None:
        consumer_id = self.order[consumer_index % len(self.order)]
        before = self.snapshot()
        effects = self.sub.connect(consumer_id)
        after = self.snapshot()
        self.check_ready(before, after, effects)
        if consumer_id not in self.connected:
            self.connected.add(consumer_id)
            self.forget_key_owners()
            if self.active is None and self.sub_type in (
                SubscriptionType.EXCLUSIVE,
                SubscriptionType.FAILOVER,
            ):
                self.active = consumer_id
        if self.sub_type is SubscriptionType.KEY_SHARED:
            # Queued messages follow their key to its new owner (or are dropped if it is full).
            gained = self.appended(
                {c: [m for m in q if m in after.get(c, [])] for c, q in before.items()}, after
            )
            self.rerouted.update(m for ids in gained.values() for m in ids)
            self.record_owners({c: q for c, q in after.items() if q})
        else:
            assert after == before, "connect must not move messages"
        assert self.sub.is_connected(consumer_id)

    @precondition(lambda self: self.order)
    @rule(consumer_index=st.integers(0, 10))
    def disconnect(self, consumer_index: int) -> None:
        self.leave(self.order[consumer_index % len(self.order)], remove=False)

    @precondition(lambda self: self.order)
    @rule(consumer_index=st.integers(0, 10))
    def remove(self, consumer_index: int) -> None:
        self.leave(self.order[consumer_index % len(self.order)], remove=True)

    @rule(key=st.sampled_from(KEYS), size=st.integers(0, 6))
    def publish(self, key: bytes, size: int) -> None:
        message_id = len(self.messages)
        self.messages[message_id] = Msg(size, key)
        before = self.snapshot()
        drops_before = dict(self.sub.dropped)
        effects = self.sub.publish(message_id, size, key)
        after = self.snapshot()
        self.check_ready(before, after, effects)
        gained = self.appended(before, after)
        dropped = self.drop_delta(drops_before)
        assert sum(dropped.values()) + sum(len(v) for v in gained.values()) == 1
        if gained:
            ((recipient, ids),) = gained.items()
            assert ids == [message_id]
            assert recipient in self.connected
            assert self.room(before[recipient], size)
        (reason,) = dropped or [None]
        eligible = [c for c in self.order if c in self.connected]
        if self.sub_type is SubscriptionType.KEY_SHARED:
            eligible = [c for c in eligible if accepted(self.filters[c], key)]
            owner = self.key_owner.get(key)
            if gained:
                assert owner in (None, recipient)
            elif reason is DropReason.QUEUE_FULL and owner is not None:
                assert not self.room(before[owner], size)
            self.record_owners(gained)
        if self.sub_type in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            if gained:
                assert recipient == self.active
            elif self.active is None:
                assert reason is DropReason.NO_CONSUMER
            else:
                assert reason is DropReason.QUEUE_FULL
                assert not self.room(before[self.active], size)
        if not self.connected:
            assert reason is DropReason.NO_CONSUMER
        elif self.sub_type is SubscriptionType.KEY_SHARED and not eligible:
            assert reason is DropReason.NO_KEY_MATCH
        elif reason is not None:
            assert reason is DropReason.QUEUE_FULL
            if self.sub_type is SubscriptionType.SHARED:
                assert not any(self.room(before[c], size) for c in eligible)
            else:
                assert any(not self.room(before[c], size) for c in eligible)

    @precondition(lambda self: self.order)
    @rule(consumer_index=st.integers(0, 10), limit=st.integers(0, 4))
    def take(self, consumer_index: int, limit: int) -> None:
        consumer_id = self.order[consumer_index % len(self.order)]
        before = self.snapshot()
        delivered = self.sub.delivered
        taken = self.sub.take(consumer_id, limit)
        after = self.snapshot()
        assert taken == before[consumer_id][:limit]
        assert after[consumer_id] == before[consumer_id][len(taken) :]
        assert {c: q for c, q in after.items() if c != consumer_id} == {
            c: q for c, q in before.items() if c != consumer_id
        }
        assert self.sub.delivered == delivered + len(taken)
        for m in taken:
            assert m not in self.taken_by, f"message {m} taken twice"
            self.taken_by[m] = consumer_id
        self.received.setdefault(consumer_id, []).extend(taken)

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def conservation(self) -> None:
        """(a) and (b)."""
        queues = self.snapshot()
        queued = [m for q in queues.values() for m in q]
        assert len(queued) == len(set(queued)), "a message is queued twice"
        assert not set(queued) & set(self.taken_by), "a taken message is still queued"
        assert sum(self.sub.queued(c) for c in queues) == len(queued)
        assert self.sub.delivered == len(self.taken_by)
        assert len(self.messages) == (
            len(self.taken_by) + sum(self.sub.dropped.values()) + len(queued)
        )

    @invariant()
    def bounds(self) -> None:
        """(c), and a disconnected consumer never holds messages."""
        for c, q in self.snapshot().items():
            size = sum(self.messages[m].size for m in q)
            assert len(q) <= self.limits.max_messages
            assert size <= self.limits.max_bytes
            assert self.sub._consumers[c].queued_bytes == size
            if c not in self.connected:
                assert q == []
            assert self.sub.is_connected(c) == (c in self.connected)

    @invariant()
    def single_active(self) -> None:
        """(d)."""
        if self.sub_type not in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            assert self.sub.active_consumer is None
            return
        active = self.sub.active_consumer
        assert active == self.active
        assert (active is None) == (not self.connected)
        assert active is None or active in self.connected
        for c, q in self.snapshot().items():
            assert not q or c == active

    @invariant()
    def fifo_per_consumer(self) -> None:
        """(g), end to end: the messages a consumer took that were queued by publish (never
        re-routed) came out in publish order. (`appended` and `take` check the step-wise form:
        queues only grow at the tail and `take` pops the head.)"""
        for got in self.received.values():
            direct = [m for m in got if m not in self.rerouted]
            assert direct == sorted(direct)

    @invariant()
    def publish_order(self) -> None:
        """(g), stronger: every queue holds its messages in publish order, moved ones too."""
        for q in self.snapshot().values():
            assert q == sorted(q)

    @invariant()
    def one_queue_per_key(self) -> None:
        """(f), for pending messages: on Key-Shared one consumer at a time holds a key's
        queued messages, through any membership change."""
        if self.sub_type is not SubscriptionType.KEY_SHARED:
            return
        holders: dict[bytes, set[int]] = {}
        for c, q in self.snapshot().items():
            for m in q:
                holders.setdefault(self.messages[m].key, set()).add(c)
        assert all(len(h) == 1 for h in holders.values()), holders

    @invariant()
    def membership(self) -> None:
        assert self.sub.consumer_ids == self.order


TestDispatchMachine = DispatchMachine.TestCase
TestDispatchMachine.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- (e) Shared round-robin fairness ----------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    consumers=st.integers(1, 6),
    disconnected=st.sets(st.integers(0, 5)),
    publishes=st.lists(st.integers(0, 3), min_size=1, max_size=60),
)
def test_shared_round_robin_is_fair(
    consumers: int, disconnected: set[int], publishes: list[int]
) -> None:
    """Connected consumers that are never full receive consecutive publishes in add order,
    cycling; their counts differ by at most one. Interleaved takes change nothing."""
    sub = NonReliableSubscription(SubscriptionType.SHARED, QueueLimits(10_000, 10**9))
    ids = list(range(100, 100 + consumers))
    for c in ids:
        sub.add_consumer(c, f"c{c}", ())
        sub.connect(c)
    for index in disconnected:
        if index < consumers:
            sub.disconnect(ids[index])
    live = [c for c in ids if sub.is_connected(c)]
    recipients = []
    for n, take_from in enumerate(publishes):
        before = {c: sub.queued(c) for c in ids}
        sub.publish(n, 1, b"")
        recipients += [c for c in ids if sub.queued(c) == before[c] + 1]
        sub.take(ids[take_from % consumers], take_from)
    if not live:
        assert recipients == []
        assert sub.dropped[DropReason.NO_CONSUMER] == len(publishes)
        return
    assert recipients == [live[i % len(live)] for i in range(len(publishes))]
    counts = Counter(recipients)
    assert max(counts.values()) - min(counts.get(c, 0) for c in live) <= 1
    assert sum(sub.dropped.values()) == 0


@settings(max_examples=30, deadline=None)
@given(consumers=st.integers(1, 5), publishes=st.integers(0, 40))
def test_shared_with_nobody_connected_drops_everything(consumers: int, publishes: int) -> None:
    sub = NonReliableSubscription(SubscriptionType.SHARED, QueueLimits())
    for c in range(consumers):
        sub.add_consumer(c, f"c{c}", ())
    for n in range(publishes):
        assert sub.publish(n, 1, b"") == []
    assert sub.dropped[DropReason.NO_CONSUMER] == publishes


# -- (f) Key-Shared stickiness and filters ----------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    filters=st.lists(st.lists(st.sampled_from(PATTERNS), max_size=2), min_size=1, max_size=4),
    keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=60),
)
def test_key_shared_sticky_and_filtered(filters: list[list[str]], keys: list[bytes]) -> None:
    sub = NonReliableSubscription(SubscriptionType.KEY_SHARED, QueueLimits(10_000, 10**9))
    for c, patterns in enumerate(filters):
        sub.add_consumer(c, f"consumer-{c}", tuple(patterns))
        sub.connect(c)
    owner: dict[bytes, int] = {}
    for n, key in enumerate(keys):
        sub.publish((n, key), 1, key)
    no_match = 0
    for key in keys:
        if not any(accepted(tuple(p), key) for p in filters):
            no_match += 1
    assert sub.dropped[DropReason.NO_KEY_MATCH] == no_match
    delivered = []
    for c, patterns in enumerate(filters):
        got = sub.take(c, 10_000)
        assert [n for n, _ in got] == sorted(n for n, _ in got), "per-consumer FIFO"
        for _, key in got:
            assert accepted(tuple(patterns), key)
            assert owner.setdefault(key, c) == c, f"key {key!r} split over consumers"
        delivered += got
    assert len(delivered) + no_match == len(keys)

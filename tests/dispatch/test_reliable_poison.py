"""Property tests of the poison-message policies of reliable dispatch (issue 24): random
interleavings of publishes, acks, nacks, ack timeouts, disconnects, operator `release` and
`skip`, and dead-letter reports, on every subscription type, with consumers that never
acknowledge the poison key. Judged from outside the machine:

- a failed message (Shared, Key-Shared) goes out again within the policy's delay cap;
- no message is charged more than `max_redelivery_count + 1` failed deliveries, and one that
  the policy resolves (dropped, blocked, sent to the dead letters) has exactly that many;
- the cursor passes only offsets a consumer acknowledged, the Drop policy or an operator
  skipped, or the driver reported stored in the dead-letter topic;
- while a message is blocked, Exclusive/Failover/Shared send no message that was never sent,
  and Key-Shared sends nothing of a key before its earlier messages are resolved;
- once consumers acknowledge everything but the poison and every blocked message is skipped,
  the cursor reaches the end (nothing is stuck for ever).

Planted bugs caught: an off-by-one in the limit, a backoff ignoring its cap."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from danube.machines.dispatch.failure import (
    DeadLetter,
    Dropped,
    EntryState,
    FailurePolicy,
    Poison,
)
from danube.machines.dispatch.poison import REPUBLISH_RETRY_FLOOR_MS
from danube.machines.dispatch.reliable import Deliver, Read, ReliableSubscription
from danube.machines.dispatch.types import SubscriptionType

POISON = b"poison"
KEYS = [b"a", b"b", POISON]
ACK_TIMEOUT = 50


class Harness:
    """Drives one subscription and keeps the outside view the properties are judged by."""

    def __init__(
        self, sub_type: SubscriptionType, policy: FailurePolicy, consumers: int, rate: int = 0
    ):
        self.sub = ReliableSubscription(sub_type, 0, max_unacked_messages=4, policy=policy)
        self.sub.dispatch_rate = rate
        self.failed_at: dict[int, int] = {}
        """Offsets failed and not sent since: when (at the latest) they failed."""
        self.policy = policy
        self.now = 0
        self.keys: dict[int, bytes] = {}
        self.published = 0
        self.resolved: set[int] = set()
        self.charged: dict[int, int] = {}
        """Failed deliveries per offset since it was last released."""
        self.sent: set[int] = set()
        self.exhausted: set[int] = set()
        self.dead_letters: set[int] = set()
        self.consumers = list(range(1, consumers + 1))
        for cid in self.consumers:
            self.apply(self.sub.add_consumer(cid, f"c{cid}", ("*",), self.now))
            self.apply(self.sub.connect(cid, self.now))

    def in_flight(self) -> dict[int, int]:
        return {o: c for c in self.consumers for o in self.sub.in_flight(c)}

    def step(self, action: tuple) -> None:
        """One input; failures charged by it are told apart from free resends by what left
        the consumers' in-flight sets."""
        before = self.in_flight()
        kind, arg = action
        left_free: set[int] = set()
        acked: set[int] = set()
        if kind == "publish":
            for _ in range(arg):
                self.keys[self.published] = KEYS[(self.published * 7 + arg) % len(KEYS)]
                self.published += 1
            effects = self.sub.readable(self.published - 1, self.now)
        elif kind == "answer":  # consumers nack the poison, ack the rest, of what they hold
            effects = []
            for offset in sorted(before):
                if offset not in self.in_flight():
                    continue
                if self.keys[offset] == POISON:
                    if arg:
                        effects += self.sub.nack(offset, None, self.now)
                else:
                    effects += self.sub.ack(offset, self.now)
                    acked.add(offset)
        elif kind == "tick":
            self.now += arg
            effects = self.sub.tick(self.now)
        elif kind == "bounce":
            cid = self.consumers[arg % len(self.consumers)]
            left_free = {o for o, c in before.items() if c == cid}
            effects = self.sub.disconnect(cid, self.now)
            self.apply(effects, before)
            effects = self.sub.connect(cid, self.now)
            before = {o: c for o, c in before.items() if c != cid}
        elif kind == "release" and self.sub.blocked:
            offset = self.sub.blocked[arg % len(self.sub.blocked)]
            effects = self.sub.release(offset, self.now)
            self.charged[offset] = 0
            self.exhausted.discard(offset)
        elif kind == "skip" and self.sub.blocked:
            effects = self.sub.skip(self.sub.blocked[arg % len(self.sub.blocked)], self.now)
        elif kind == "stored" and self.dead_letters:
            offset = sorted(self.dead_letters)[arg % len(self.dead_letters)]
            self.dead_letters.discard(offset)
            if arg % 3:
                effects = self.sub.dead_lettered(offset, self.now)
                self.resolved.add(offset)
            else:
                effects = self.sub.dead_letter_failed(offset, self.now)
        else:
            effects = self.sub.tick(self.now)
        self.resolved |= acked
        after = self.in_flight()
        for offset, cid in before.items():
            if offset not in acked and offset not in left_free and after.get(offset) != cid:
                self.charged[offset] = self.charged.get(offset, 0) + 1
                self.failed_at[offset] = self.now
        self.apply(effects, before)
        self.check()

    def apply(self, effects: list, before: dict[int, int] | None = None) -> None:
        limit = self.policy.max_redelivery_count
        blocked_now = bool(self.sub.blocked)
        # A `Read` is answered later, as a driver's I/O is: after every other effect of the
        # same calls (an "answer" step gathers several calls' effects; answering a read of
        # one before a later call's `Dropped` was seen took a drop for an overtaking).
        effects = [e for e in effects if not isinstance(e, Read)] + [
            e for e in effects if isinstance(e, Read)
        ]
        for effect in effects:
            if isinstance(effect, Read):
                end = min(effect.from_offset + effect.max_records, self.published)
                pairs = [(o, self.keys[o]) for o in range(effect.from_offset, end)]
                self.apply(self.sub.records_read(pairs, self.now))
            elif isinstance(effect, Deliver):
                for offset in effect.offsets:
                    assert offset not in self.exhausted, f"exhausted {offset} sent again"
                    if offset not in self.sent and blocked_now:
                        assert self.sub.sub_type is SubscriptionType.KEY_SHARED, (
                            f"new offset {offset} sent while {self.sub.blocked} blocked"
                        )
                    if self.sub.sub_type is SubscriptionType.KEY_SHARED:
                        earlier = [
                            o
                            for o in range(offset)
                            if self.keys[o] == self.keys[offset] and o not in self.resolved
                        ]
                        assert not earlier, f"{offset} overtook {earlier} of its key"
                    self.sent.add(offset)
                    self.failed_at.pop(offset, None)
            elif isinstance(effect, Dropped):
                assert self.policy.poison is Poison.DROP or effect.offset in self.exhausted
                self.resolved.add(effect.offset)
                self.exhausted.add(effect.offset)
            elif isinstance(effect, DeadLetter):
                self.dead_letters.add(effect.offset)
                self.exhausted.add(effect.offset)
        for offset in self.sub.blocked:
            self.exhausted.add(offset)
        for offset in self.exhausted - self.resolved:
            if self.charged.get(offset, 0):
                assert self.charged[offset] == limit + 1, (offset, self.charged[offset], limit)

    def check(self) -> None:
        limit = self.policy.max_redelivery_count
        if self.sub.dispatch_rate == 0 and self.sub.sub_type in (
            SubscriptionType.SHARED,
            SubscriptionType.KEY_SHARED,
        ):  # a failed message goes out again by the policy's cap (Exclusive: the run's turn)
            cap = self.policy.max_redelivery_delay_ms
            for offset, failed in list(self.failed_at.items()):
                if offset in self.resolved or self.sub.entry_state(offset) in (
                    EntryState.BLOCKED,
                    EntryState.DEAD_LETTERING,
                ):
                    del self.failed_at[offset]
                else:
                    assert self.now < failed + cap, (
                        f"{offset} failed by {failed} and not sent again at {self.now}, "
                        f"past the {cap} ms cap"
                    )
        for offset, count in self.charged.items():
            assert count <= limit + 1, f"{offset} charged {count} failures, limit {limit}"
            state = self.sub.entry_state(offset)
            if count == limit + 1 and offset not in self.resolved:
                assert state in (EntryState.BLOCKED, EntryState.DEAD_LETTERING), (offset, state)
        passed = set(range(self.sub.cursor + 1))
        assert passed <= self.resolved, f"cursor passed unresolved {sorted(passed - self.resolved)}"

    def drain(self) -> None:
        """Everything but the poison is acknowledged, blocked messages are skipped, dead
        letters stored: the cursor must reach the end."""
        for _ in range(600):
            if self.sub.cursor == self.published - 1:
                return
            for offset in list(self.sub.blocked):
                self.apply(self.sub.skip(offset, self.now))
            for offset in sorted(self.dead_letters):
                self.dead_letters.discard(offset)
                self.resolved.add(offset)
                self.apply(self.sub.dead_lettered(offset, self.now))
            self.step(("answer", 1))
            self.step(("tick", 60))
        raise AssertionError(f"stuck at cursor {self.sub.cursor} of {self.published - 1}")


ACTIONS = st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 4)),
    st.tuples(st.just("answer"), st.integers(0, 1)),
    st.tuples(st.just("tick"), st.sampled_from([1, 10, 30, ACK_TIMEOUT, 200])),
    st.tuples(st.just("bounce"), st.integers(0, 5)),
    st.tuples(st.just("release"), st.integers(0, 5)),
    st.tuples(st.just("skip"), st.integers(0, 5)),
    st.tuples(st.just("stored"), st.integers(0, 5)),
)


def run(
    sub_type: SubscriptionType,
    limit: int,
    poison: Poison,
    consumers: int,
    actions: list,
    rate: int = 0,
) -> Harness:
    policy = FailurePolicy(
        ack_timeout_ms=ACK_TIMEOUT,
        base_redelivery_delay_ms=5,
        max_redelivery_delay_ms=12,  # 5, 10, then capped: 20 would pass it
        max_redelivery_count=limit,
        poison=poison,
        dead_letter_topic="/default/dead" if poison is Poison.DEAD_LETTER else None,
    )
    harness = Harness(sub_type, policy, consumers, rate)
    for action in actions:
        harness.step(action)
    harness.drain()
    return harness


CASES = dict(
    sub_type=st.sampled_from(list(SubscriptionType)),
    limit=st.integers(0, 3),
    poison=st.sampled_from(list(Poison)),
    consumers=st.integers(1, 2),
    actions=st.lists(ACTIONS, max_size=60),
    rate=st.sampled_from([0, 0, 5, 20]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**CASES)
@example(
    sub_type=SubscriptionType.KEY_SHARED,
    limit=0,
    poison=Poison.DROP,
    consumers=1,
    actions=[("publish", 1), ("publish", 3), ("publish", 1)],
    rate=0,
)
def test_poison_policies_hold_their_promises(
    sub_type: SubscriptionType,
    limit: int,
    poison: Poison,
    consumers: int,
    actions: list,
    rate: int,
) -> None:
    run(sub_type, limit, poison, consumers, actions, rate)


@pytest.mark.parametrize("sub_type", list(SubscriptionType))
@pytest.mark.parametrize("poison", list(Poison))
def test_a_poison_message_is_delivered_limit_plus_one_times(
    sub_type: SubscriptionType, poison: Poison
) -> None:
    actions = [("publish", 3)] + [("answer", 1), ("tick", 200)] * 6
    harness = run(sub_type, 2, poison, 1, actions)
    poisoned = [o for o, k in harness.keys.items() if k == POISON]
    assert poisoned and all(harness.charged[o] == 3 for o in poisoned)
    if poison is Poison.DROP:
        assert harness.sub.dropped == len(poisoned)


def test_a_planted_backoff_ignoring_the_cap_is_caught() -> None:
    """The exponential delay without `min(max_redelivery_delay_ms, ...)`."""

    def uncapped(self: FailurePolicy, failures: int, requested_ms: int | None) -> int:
        return max(self.base_redelivery_delay_ms << (failures - 1), requested_ms or 0)

    actions = [("publish", 3)] + [("answer", 1), ("tick", 1)] * 30
    run(SubscriptionType.SHARED, 3, Poison.DROP, 1, actions)
    planted = mock.patch.object(FailurePolicy, "redelivery_delay_ms", uncapped)
    with planted, pytest.raises(AssertionError, match="past the 12 ms cap"):
        run(SubscriptionType.SHARED, 3, Poison.DROP, 1, actions)


def test_a_planted_off_by_one_in_the_limit_is_caught() -> None:
    """`failures >= limit`: one delivery short of Danube's `limit + 1`."""

    def short(self: FailurePolicy, failures: int) -> bool:
        return failures >= self.max_redelivery_count

    for sub_type in SubscriptionType:
        planted = mock.patch.object(FailurePolicy, "exhausted", short)
        with planted, pytest.raises(AssertionError):
            test_a_poison_message_is_delivered_limit_plus_one_times(sub_type, Poison.DROP)


def blocked_subscription(sub_type: SubscriptionType) -> Harness:
    """Offset 0 (the poison key) blocked after 2 deliveries (2, of the same key, too unless
    Key-Shared holds it back); offsets 3 and 4 published while it is blocked."""
    policy = FailurePolicy(
        ack_timeout_ms=ACK_TIMEOUT,
        base_redelivery_delay_ms=5,
        max_redelivery_delay_ms=5,
        max_redelivery_count=1,
        poison=Poison.BLOCK,
    )
    harness = Harness(sub_type, policy, 1, rate=2)
    harness.keys = {0: POISON, 1: b"a", 2: POISON, 3: b"b", 4: b"a"}
    harness.published = 3
    harness.apply(harness.sub.readable(2, 0))
    for _ in range(6):
        harness.step(("answer", 0))  # 1 acknowledged; 0 and 2 time out
        harness.step(("tick", 600))
        if harness.sub.blocked:
            break
    assert harness.sub.blocked[0] == 0
    harness.published = 5
    harness.apply(harness.sub.readable(4, harness.now))
    for _ in range(8):
        harness.step(("answer", 1))
        harness.step(("tick", 600))
    return harness


@pytest.mark.parametrize("sub_type", list(SubscriptionType))
def test_block_stops_new_messages_or_only_the_key(sub_type: SubscriptionType) -> None:
    harness = blocked_subscription(sub_type)
    assert harness.sub.entry_state(0) is EntryState.BLOCKED
    assert harness.sub.cursor == -1
    if sub_type is SubscriptionType.KEY_SHARED:
        assert harness.sent == {0, 1, 3, 4}  # 2 waits behind 0, its key's blocked head
    else:
        assert 3 not in harness.sent and 4 not in harness.sent
    harness.step(("release", 0))
    assert harness.sub.entry_state(0) is not EntryState.BLOCKED
    harness.step(("tick", 600))
    harness.drain()  # blocks 0 again, then skips it
    assert harness.sub.dropped >= 1 and harness.sub.cursor == 4


def test_a_policy_change_applies_to_blocked_messages_at_once() -> None:
    """A higher limit releases a blocked message (its attempts kept); Drop drops it."""
    harness = blocked_subscription(SubscriptionType.SHARED)
    offset = harness.sub.blocked[0]
    attempts = harness.sub.attempts(offset)
    higher = dataclasses.replace(harness.policy, max_redelivery_count=attempts)
    blocked = set(harness.sub.blocked)
    harness.policy = higher
    effects = harness.sub.configure(harness.now, policy=higher)
    harness.exhausted -= blocked - set(harness.sub.blocked)
    harness.apply(effects)
    assert offset not in harness.sub.blocked and harness.sub.attempts(offset) == attempts
    for _ in range(5):  # sent again, it times out: exhausted under the new limit too
        harness.step(("tick", 600))
    assert offset in harness.sub.blocked and harness.sub.attempts(offset) == attempts + 1
    drop = dataclasses.replace(higher, poison=Poison.DROP)
    harness.policy = drop
    effects = harness.sub.configure(harness.now, policy=drop)
    assert Dropped(offset, attempts + 1) in effects
    assert offset not in harness.sub.blocked and harness.sub.entry_state(offset) is None


def _dead_lettering(delay_ms: int) -> tuple[FailurePolicy, ReliableSubscription]:
    """A Shared subscription whose one message (offset 0) was nacked once under DeadLetter
    with no redelivery left and a redelivery delay of `delay_ms`: its republish is asked."""
    policy = FailurePolicy(
        ack_timeout_ms=ACK_TIMEOUT,
        base_redelivery_delay_ms=delay_ms,
        max_redelivery_delay_ms=delay_ms,
        max_redelivery_count=0,
        poison=Poison.DEAD_LETTER,
        dead_letter_topic="/default/dlq",
    )
    sub = ReliableSubscription(SubscriptionType.SHARED, 0, policy=policy)
    sub.add_consumer(1, "c1", ("*",), 0)
    sub.connect(1, 0)
    [read] = [e for e in sub.readable(0, 0) if isinstance(e, Read)]
    assert isinstance(read, Read)
    sub.records_read([(0, b"k")], 0)
    assert sub.in_flight(1) == frozenset({0})
    asked = sub.nack(0, None, 1, reason="bad")
    assert DeadLetter(0, 1, "bad", "/default/dlq") in asked
    return policy, sub


def test_a_policy_changed_while_a_dead_letter_failed_decides_at_the_retry() -> None:
    """DeadLetter, then the operator switches to Block: the failed republish is not asked
    again for a dead-letter topic the policy no longer names; the message is blocked (or,
    under a policy that no longer exhausts it, sent again)."""
    policy, sub = _dead_lettering(5)
    sub.dead_letter_failed(0, 2)
    block = dataclasses.replace(policy, poison=Poison.BLOCK, dead_letter_topic=None)
    sub.configure(3, policy=block)
    assert sub.entry_state(0) is EntryState.DEAD_LETTERING, "the republish may still land"
    again = sub.tick(2 + REPUBLISH_RETRY_FLOOR_MS)
    assert not any(isinstance(e, DeadLetter) for e in again)
    assert sub.entry_state(0) is EntryState.BLOCKED and sub.blocked == (0,)


def test_a_failed_republish_is_not_asked_again_at_once_under_a_zero_delay() -> None:
    """A policy without redelivery delay: a republish that fails at once (its dead-letter
    topic still loading after a restart, or refused) used to be asked again in the same call,
    which failed again at once, for ever (the simulator's seed 257 spun at one instant after
    restart made the dead-letter topic's load lazy). It waits `REPUBLISH_RETRY_FLOOR_MS`."""
    _, sub = _dead_lettering(0)
    again = sub.dead_letter_failed(0, 2)
    assert not any(isinstance(e, DeadLetter) for e in again)
    assert not any(isinstance(e, DeadLetter) for e in sub.tick(2))
    later = sub.tick(2 + REPUBLISH_RETRY_FLOOR_MS)
    assert DeadLetter(0, 1, "bad", "/default/dlq") in later

"""Failure counts persisted with the cursor (issue 24, spec/failure-policies.md "What is
persisted"): a restarted or moved subscription reads them back, so a poison message's
deliveries never start again at 0 past the point they were stored; one exhausted already is
resolved by its policy without another delivery."""

from __future__ import annotations

import pytest

from danube.machines.dispatch.failure import DeadLetter, Dropped, FailurePolicy, Poison
from danube.machines.dispatch.reliable import Deliver, PersistCursor, ReliableSubscription
from danube.machines.dispatch.types import SubscriptionType

LIMIT = 2
FLUSH = 100


def policy(poison: Poison = Poison.DROP) -> FailurePolicy:
    topic = "/default/dlq" if poison is Poison.DEAD_LETTER else None
    return FailurePolicy(
        ack_timeout_ms=1_000,
        base_redelivery_delay_ms=0,
        max_redelivery_delay_ms=0,
        max_redelivery_count=LIMIT,
        poison=poison,
        dead_letter_topic=topic,
    )


def started(
    sub_type: SubscriptionType,
    attempts: dict[int, int] | None = None,
    poison: Poison = Poison.DROP,
    *,
    messages: int = 2,
) -> tuple[ReliableSubscription, list[object]]:
    """A subscription at offset 0 with a connected consumer and `messages` readable records
    (all of key b"k"); the effects up to the first delivery."""
    sub = ReliableSubscription(
        sub_type, 0, cursor_flush_ms=FLUSH, policy=policy(poison), attempts=attempts
    )
    effects: list[object] = []
    effects += sub.add_consumer(1, "c1", ("*",), 0)
    effects += sub.connect(1, 0)
    effects += sub.readable(messages - 1, 0)
    effects += sub.records_read([(o, b"k") for o in range(messages)], 0)
    return sub, effects


def sent(effects: list[object]) -> list[int]:
    return [o for e in effects if isinstance(e, Deliver) for o in e.offsets]


@pytest.mark.parametrize("sub_type", list(SubscriptionType))
def test_failures_are_stored_with_the_cursor_and_read_back(sub_type: SubscriptionType) -> None:
    sub, effects = started(sub_type, messages=1)
    assert sent(effects) == [0]
    effects = sub.nack(0, None, 10)
    stored = [e for e in effects if isinstance(e, PersistCursor)]
    assert stored == [PersistCursor(-1, ((0, 1),))], "the cursor did not move; the count did"
    effects = sub.nack(0, None, 20)  # redelivered at once (no delay), failed again
    assert not [e for e in effects if isinstance(e, PersistCursor)], "within cursor_flush_ms"
    assert sub.next_timer_ms == 10 + FLUSH
    stored = [e for e in sub.tick(10 + FLUSH) if isinstance(e, PersistCursor)]
    assert stored == [PersistCursor(-1, ((0, 2),))]
    rebuilt, effects = started(sub_type, dict(stored[0].attempts or ()), messages=1)
    assert sent(effects) == [0]
    assert rebuilt.attempts(0) == 2, "the restarted subscription starts from the stored count"


@pytest.mark.parametrize("sub_type", list(SubscriptionType))
def test_deliveries_left_after_a_restart_are_what_the_limit_leaves(
    sub_type: SubscriptionType,
) -> None:
    """Two failures stored with a limit of 2: one delivery left, then the policy drops it."""
    sub, effects = started(sub_type, {0: LIMIT}, messages=2)
    assert 0 in sent(effects)
    dropped = [e for e in sub.nack(0, None, 5) if isinstance(e, Dropped)]
    assert dropped == [Dropped(0, LIMIT + 1)]


@pytest.mark.parametrize("sub_type", list(SubscriptionType))
@pytest.mark.parametrize("poison", list(Poison))
def test_a_message_exhausted_before_the_restart_is_not_delivered_again(
    sub_type: SubscriptionType, poison: Poison
) -> None:
    sub, effects = started(sub_type, {0: LIMIT + 1}, poison)
    assert 0 not in sent(effects), "exhausted already: its policy decides, not a delivery"
    if poison is Poison.DROP:
        assert Dropped(0, LIMIT + 1) in effects and sub.cursor == 0
        assert sub.attempt_counts() == {}
    elif poison is Poison.BLOCK:
        assert sub.blocked == (0,) and sub.attempts(0) == LIMIT + 1
    else:
        assert [e for e in effects if isinstance(e, DeadLetter)] == [
            DeadLetter(0, LIMIT + 1, "", "/default/dlq")
        ]
    if sub_type is SubscriptionType.KEY_SHARED and poison is not Poison.DROP:
        assert 1 not in sent(effects), "the key's later message waits behind its head"
    elif poison is Poison.DROP or sub_type is SubscriptionType.KEY_SHARED:
        assert 1 in sent(effects)


def test_a_release_resets_the_stored_count() -> None:
    sub, _ = started(SubscriptionType.SHARED, {0: LIMIT + 1}, Poison.BLOCK, messages=1)
    assert sub.blocked == (0,)
    effects = sub.release(0, 10)
    assert sent(effects) == [0]
    stored = [e for e in effects if isinstance(e, PersistCursor)]
    assert stored == [PersistCursor(-1, ())], "the stored count is cleared"


def test_counts_of_offsets_the_cursor_passed_are_not_restored() -> None:
    sub = ReliableSubscription(SubscriptionType.SHARED, 5, attempts={3: 4, 5: 1, 6: 0})
    assert sub.attempt_counts() == {5: 1}


def test_a_healthy_subscription_stores_no_counts() -> None:
    sub, _ = started(SubscriptionType.SHARED, messages=2)
    effects = sub.ack(0, 1) + sub.ack(1, 2) + sub.tick(1 + FLUSH)
    stored = [e for e in effects if isinstance(e, PersistCursor)]
    assert stored == [PersistCursor(0), PersistCursor(1)]


@pytest.mark.parametrize("sub_type", [SubscriptionType.SHARED, SubscriptionType.KEY_SHARED])
def test_failures_settled_before_they_were_stored_write_nothing(
    sub_type: SubscriptionType,
) -> None:
    """A message nacked and then acknowledged within one flush interval, behind an older one
    still unacknowledged: the cursor did not move and no count is left to store, so a flush
    writes nothing (it once wrote the same cursor again with no counts; the property test's
    model found it)."""
    sub = ReliableSubscription(sub_type, 0, cursor_flush_ms=FLUSH, policy=policy())
    sub.add_consumer(1, "c1", ("*",), 0)
    sub.connect(1, 0)
    sub.readable(2, 0)
    keys = [b"a", b"b", b"c"]  # Key-Shared: one key each, so all three go out at once
    effects = sub.records_read([(o, keys[o]) for o in range(3)], 0)
    assert sent(effects) == [0, 1, 2]
    stored = [e for e in sub.ack(0, 1) if isinstance(e, PersistCursor)]
    assert stored == [PersistCursor(0, None)]
    assert sent(sub.nack(2, None, 10)) == [2], "redelivered at once (no delay)"
    assert not [e for e in sub.ack(2, 20) if isinstance(e, PersistCursor)]
    assert [e for e in sub.flush(30) if isinstance(e, PersistCursor)] == []

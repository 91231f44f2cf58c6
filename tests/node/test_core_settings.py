"""What an operator sets through the admin API, in the core: namespace and topic policies
(enforced at once, kept across restarts), a subscription's failure policy and dispatch window
(applied to a live subscription, kept for one that does not exist yet), and unsubscribing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.machines.dispatch.failure import NO_LIMIT
from danube.machines.dispatch.reliable import Backoff
from danube.machines.node.settings import (
    POLICY_FIELDS,
    PoisonPolicy,
    SubscriptionFailureSettings,
    merged_policies,
    policy_changes,
)
from danube.runtime.poison_metrics import poison_families
from danube.values.config import MAX_UNACKED_MESSAGES_LIMIT, DispatchStrategy, Policies
from danube.values.errors import DanubeError, ErrorCode
from tests.node.test_core import code_of
from tests.node.test_core_reliable import EXCLUSIVE, SHARED, TOPIC, Broker, payloads

NON = DispatchStrategy.NON_RELIABLE


def _policy(**fields: object) -> SubscriptionFailureSettings:
    return SubscriptionFailureSettings(poison_policy=PoisonPolicy.BLOCK, **fields)  # type: ignore[arg-type]


# -- policies -----------------------------------------------------------------------------------


def test_namespace_policy_applies_at_once_to_existing_topics() -> None:
    broker = Broker()
    broker.producer(name="p1")
    step = broker.core.set_namespace_policies("default", {"max_producers_per_topic": 1})
    broker.run(step.effects)
    assert step.value["max_producers_per_topic"] == 1
    assert broker.metadata["/namespaces/default/policy"]["max_producers_per_topic"] == 1
    with pytest.raises(DanubeError) as refused:
        broker.producer(name="p2")
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert "max_producers_per_topic" in refused.value.message
    assert broker.producer(name="p1") == broker.producer(name="p1"), "an existing one stays"


def test_topic_policies_override_the_namespace_and_survive_a_restart() -> None:
    broker = Broker()
    pid = broker.producer()
    step = broker.core.set_topic_policies(TOPIC, {"max_message_size": 3})
    broker.run(step.effects)
    assert step.value["max_message_size"] == 3
    policies, overridden = broker.core.topic_policies(TOPIC)
    assert overridden == ["max_message_size"]
    assert policies["max_producers_per_topic"] == Policies().max_producers_per_topic
    with pytest.raises(DanubeError) as refused:
        broker.publish(pid, "four")
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert "max_message_size of 3" in refused.value.message
    assert broker.publish(pid, "ok") == 0

    again = Broker(files=broker.driver.files, metadata=broker.metadata)
    assert again.core.topic_policies(TOPIC) == (policies, ["max_message_size"])
    cleared = again.core.clear_topic_policies(TOPIC)
    again.run(cleared.effects)
    assert cleared.value["max_message_size"] == Policies().max_message_size
    assert f"/topics{TOPIC}/policy" not in again.metadata
    assert again.publish(pid, "four") == 1


def test_subscription_limits_come_from_the_topic() -> None:
    broker = Broker()
    broker.producer()
    broker.run(broker.core.set_topic_policies(TOPIC, {"max_subscriptions_per_topic": 1}).effects)
    broker.consumer("c1", sub="s1")
    with pytest.raises(DanubeError) as refused:
        broker.consumer("c2", sub="s2")
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert "max_subscriptions_per_topic" in refused.value.message


@pytest.mark.parametrize(
    "changes",
    [{}, {"max_producers": 1}, {"max_message_size": -1}, {"max_message_size": 1.5},
     {"max_message_size": True}, {"max_message_size": 1 << 32}, []],
)  # fmt: skip
def test_bad_policy_changes_are_refused_and_change_nothing(changes: object) -> None:
    broker = Broker()
    before = broker.core.namespace_policies("default")
    code = code_of(lambda: broker.core.set_namespace_policies("default", changes))  # type: ignore[arg-type]
    assert code is ErrorCode.INVALID_ARGUMENT
    assert broker.core.namespace_policies("default") == before


def test_policies_of_unknown_namespace_or_topic_are_not_found() -> None:
    broker = Broker()
    assert code_of(lambda: broker.core.set_namespace_policies("nope", {"max_message_size": 1})) is (
        ErrorCode.NOT_FOUND
    )
    assert code_of(lambda: broker.core.topic_policies("/default/none")) is ErrorCode.NOT_FOUND


@given(st.dictionaries(st.sampled_from(POLICY_FIELDS), st.integers(0, (1 << 32) - 1), min_size=1))
def test_valid_policy_changes_are_taken_as_given(changes: dict[str, int]) -> None:
    assert policy_changes(changes) == changes


# -- failure policy ---------------------------------------------------------------------------


def test_failure_policy_applies_to_a_live_subscription() -> None:
    """A nack's redelivery waits for the policy's delay: set to a fixed 5 s, the message is
    not back at 4 s and is back at 5 s."""
    broker = Broker()
    pid = broker.producer()
    consumer = broker.consumer("c", sub_type=SHARED)
    broker.publish(pid, "m0")
    assert payloads(broker.take(consumer)) == ["m0"]
    policy = _policy(base_redelivery_delay_ms=5_000, backoff=Backoff.FIXED)
    step = broker.core.set_failure_policy(TOPIC, "s", policy, now_ms=broker.driver.now_ms)
    broker.run(step.effects)
    assert broker.core.failure_policy(TOPIC, "s") == policy
    start = broker.driver.now_ms
    broker.run(broker.core.nack(TOPIC, "s", 0, None, now_ms=start).effects)
    broker.run(broker.core.tick(start + 4_000).effects)
    assert broker.take(consumer) == []
    broker.run(broker.core.tick(start + 5_000).effects)
    assert payloads(broker.take(consumer)) == ["m0"]


@pytest.mark.parametrize("poison", [PoisonPolicy.DROP, PoisonPolicy.BLOCK])
def test_a_redelivery_limit_applies_to_a_live_subscription_and_a_restart(
    poison: PoisonPolicy,
) -> None:
    """max_redelivery_count 1: m0 is delivered twice; then Drop skips it (the cursor passes
    it, counted), Block keeps it (the cursor waits; Shared sends nothing new)."""
    broker = Broker()
    pid = broker.producer()
    consumer = broker.consumer("c", sub_type=SHARED)
    policy = SubscriptionFailureSettings(
        max_redelivery_count=1, base_redelivery_delay_ms=0, poison_policy=poison
    )
    broker.run(
        broker.core.set_failure_policy(TOPIC, "s", policy, now_ms=broker.driver.now_ms).effects
    )
    broker.publish(pid, "m0")
    for _ in range(2):
        assert payloads(broker.take(consumer)) == ["m0"]
        broker.run(broker.core.nack(TOPIC, "s", 0, None, now_ms=broker.driver.now_ms).effects)
    broker.run(broker.core.tick(broker.driver.now_ms + 10).effects)
    broker.publish(pid, "m1")
    if poison is PoisonPolicy.DROP:
        assert payloads(broker.take(consumer)) == ["m1"]
        broker.ack(1)
        broker.run(broker.core.tick(broker.driver.now_ms + 10_000).effects)
        assert broker.cursor() == 1
        assert broker.core.drop_counts() == {(TOPIC, "s", "poison_policy"): 1}
    else:
        assert broker.take(consumer) == []
        broker.run(broker.core.tick(broker.driver.now_ms + 10_000).effects)
        assert broker.cursor() in (None, -1)
        assert broker.core.blocked(TOPIC, "s") == (0,)
    families = {f.name: f for f in poison_families("b", broker.core)}
    [dropped] = families["danube_subscription_poison_dropped"].samples
    [blocked] = families["danube_subscription_blocked_messages"].samples
    assert (dropped.value, blocked.value) == ((1, 0) if poison is PoisonPolicy.DROP else (0, 1))
    if poison is PoisonPolicy.BLOCK:  # the operator skips it: dropped, the cursor moves on
        skipped = broker.core.resolve_blocked(
            TOPIC, "s", 0, release=False, now_ms=broker.driver.now_ms
        )
        broker.run(skipped.effects)
        assert skipped.value and broker.core.blocked(TOPIC, "s") == ()
        assert payloads(broker.take(consumer)) == ["m1"]
    again = Broker(files=broker.driver.files, metadata=broker.metadata)
    assert again.core.failure_policy(TOPIC, "s") == policy


def test_failure_policy_set_before_the_subscription_exists_is_used_by_it() -> None:
    broker = Broker()
    broker.producer()
    policy = _policy(ack_timeout_ms=1234)
    broker.run(broker.core.set_failure_policy(TOPIC, "later", policy).effects)
    stored = broker.metadata[f"/topics{TOPIC}/subscriptions/later/failure_policy"]
    assert stored["ack_timeout_ms"] == 1234
    assert broker.core.subscription_type(TOPIC, "later") is None
    broker.consumer("c", sub="later")
    again = Broker(files=broker.driver.files, metadata=broker.metadata)
    assert again.core.failure_policy(TOPIC, "later") == policy


def test_failure_policy_rules() -> None:
    broker = Broker()
    broker.producer()
    assert code_of(lambda: _policy(ack_timeout_ms=0)) is ErrorCode.INVALID_ARGUMENT
    assert (
        code_of(lambda: _policy(base_redelivery_delay_ms=10, max_redelivery_delay_ms=5))
        is ErrorCode.INVALID_ARGUMENT
    )
    assert (
        code_of(lambda: SubscriptionFailureSettings(poison_policy=PoisonPolicy.DEAD_LETTER))
        is ErrorCode.INVALID_ARGUMENT
    ), "DeadLetter needs a dead-letter topic (as Danube)"
    assert code_of(lambda: _policy(dead_letter_topic="not a topic")) is ErrorCode.INVALID_ARGUMENT
    assert _policy(max_redelivery_count=3).dispatch_policy.max_redelivery_count == 3
    dead_letter = SubscriptionFailureSettings(
        max_redelivery_count=3, dead_letter_topic=TOPIC, poison_policy=PoisonPolicy.DEAD_LETTER
    )
    assert (
        code_of(lambda: broker.core.set_failure_policy(TOPIC, "s", dead_letter))
        is ErrorCode.INVALID_ARGUMENT
    ), "a topic cannot be its own dead-letter topic"
    assert code_of(lambda: _policy(max_redelivery_count=1 << 32)) is ErrorCode.INVALID_ARGUMENT
    nonreliable = "/default/plain"
    broker.run(broker.core.create_topic(nonreliable, NON).effects)
    assert (
        code_of(lambda: broker.core.set_failure_policy(nonreliable, "s", _policy()))
        is ErrorCode.FAILED_PRECONDITION
    )
    to_plain = SubscriptionFailureSettings(
        dead_letter_topic=nonreliable, poison_policy=PoisonPolicy.DEAD_LETTER
    )
    assert (
        code_of(lambda: broker.core.set_failure_policy(TOPIC, "s", to_plain))
        is ErrorCode.FAILED_PRECONDITION
    ), "a dead-letter topic must be reliable (Danube's strategy mismatch, said at once)"
    assert (
        code_of(lambda: broker.core.set_failure_policy(TOPIC, "bad/name", _policy()))
        is ErrorCode.INVALID_ARGUMENT
    )


def test_failure_policy_json_round_trips() -> None:
    policy = SubscriptionFailureSettings(
        ack_timeout_ms=7,
        base_redelivery_delay_ms=1,
        max_redelivery_delay_ms=9,
        backoff=Backoff.FIXED,
        dead_letter_topic="/default/dlq",
        poison_policy=PoisonPolicy.DEAD_LETTER,
    )
    assert SubscriptionFailureSettings.from_json(policy.to_json()) == policy


def test_max_redelivery_count_zero_means_no_redelivery_as_in_danube() -> None:
    """Danube's meaning (danube-reference §3.6): with 0 a nacked message is exhausted after
    its one delivery: Drop skips it and the next message is delivered. Read as "no limit"
    (this branch's first cut) m0 would come back for ever."""
    broker = Broker()
    pid = broker.producer()
    consumer = broker.consumer("c", sub_type=SHARED)
    policy = SubscriptionFailureSettings(
        max_redelivery_count=0, base_redelivery_delay_ms=0, poison_policy=PoisonPolicy.DROP
    )
    broker.run(
        broker.core.set_failure_policy(TOPIC, "s", policy, now_ms=broker.driver.now_ms).effects
    )
    broker.publish(pid, "m0")
    assert payloads(broker.take(consumer)) == ["m0"]
    broker.run(broker.core.nack(TOPIC, "s", 0, None, now_ms=broker.driver.now_ms).effects)
    broker.run(broker.core.tick(broker.driver.now_ms + 10).effects)
    broker.publish(pid, "m1")
    assert payloads(broker.take(consumer)) == ["m1"]
    assert broker.core.drop_counts() == {(TOPIC, "s", "poison_policy"): 1}


def test_no_limit_is_u32_max_and_old_stored_zeros_keep_meaning_no_limit() -> None:
    """A subscription nobody set a policy for redelivers for ever, said as u32's maximum
    (which Danube reads the same way); a policy stored before limits existed, whose 0 was
    the only value accepted, still means "for ever"; one stored now keeps Danube's 0."""
    assert SubscriptionFailureSettings().max_redelivery_count == NO_LIMIT == (1 << 32) - 1
    assert not SubscriptionFailureSettings().dispatch_policy.exhausted(10**6)
    zero = _policy(max_redelivery_count=0)
    assert SubscriptionFailureSettings.from_json(zero.to_json()) == zero
    legacy = {k: v for k, v in zero.to_json().items() if k != "limits"}
    assert SubscriptionFailureSettings.from_json(legacy).max_redelivery_count == NO_LIMIT
    dead_letter = SubscriptionFailureSettings(
        max_redelivery_count=0,
        dead_letter_topic="/default/dlq",
        poison_policy=PoisonPolicy.DEAD_LETTER,
    )
    assert dead_letter.dispatch_policy.exhausted(1), "0: dead-lettered after one delivery"


# -- dispatch window --------------------------------------------------------------------------


def test_dispatch_window_changes_a_live_subscription() -> None:
    broker = Broker(max_unacked=2)
    pid = broker.producer()
    consumer = broker.consumer("c")
    for i in range(6):
        broker.publish(pid, f"m{i}")
    assert payloads(broker.take(consumer)) == ["m0", "m1"]
    step = broker.core.set_dispatch_window(TOPIC, "s", 5, now_ms=broker.driver.now_ms)
    broker.run(step.effects)
    assert broker.core.dispatch_window(TOPIC, "s") == 5
    assert payloads(broker.take(consumer)) == ["m2", "m3", "m4"]
    again = Broker(files=broker.driver.files, metadata=broker.metadata, max_unacked=2)
    assert again.core.dispatch_window(TOPIC, "s") == 5


@pytest.mark.parametrize("window", [0, MAX_UNACKED_MESSAGES_LIMIT + 1])
def test_dispatch_window_range(window: int) -> None:
    broker = Broker()
    broker.producer()
    code = code_of(lambda: broker.core.set_dispatch_window(TOPIC, "s", window))
    assert code is ErrorCode.INVALID_ARGUMENT
    assert broker.core.dispatch_window(TOPIC, "s") is None


# -- unsubscribe ------------------------------------------------------------------------------


def test_unsubscribe_refuses_an_attached_consumer_then_removes_everything() -> None:
    broker = Broker()
    pid = broker.producer()
    consumer_id, generation = broker.consumer("c", sub_type=EXCLUSIVE)
    broker.run(broker.core.set_dispatch_window(TOPIC, "s", 3).effects)
    broker.publish(pid, "m0")
    with pytest.raises(DanubeError) as refused:
        broker.core.unsubscribe(TOPIC, "s")
    assert refused.value.code is ErrorCode.FAILED_PRECONDITION
    assert "consumer(s) (c); close them first" in refused.value.message
    broker.run(broker.core.close_stream(consumer_id, generation).effects)
    broker.run(broker.core.unsubscribe(TOPIC, "s").effects)
    assert broker.core.subscriptions(TOPIC) == []
    assert not [k for k in broker.metadata if "/subscriptions/s" in k]
    assert not broker.core.consumer_healthy(consumer_id)
    assert broker.core.dispatch_window(TOPIC, "s") is None
    assert code_of(lambda: broker.core.unsubscribe(TOPIC, "s")) is ErrorCode.NOT_FOUND
    again = Broker(files=broker.driver.files, metadata=broker.metadata)
    assert again.core.subscriptions(TOPIC) == []


def test_unsubscribe_leaves_a_subscription_whose_name_extends_it() -> None:
    broker = Broker()
    broker.producer()
    first = broker.consumer("c1", sub="s")
    broker.consumer("c2", sub="s2")
    broker.run(broker.core.close_stream(*first).effects)
    broker.run(broker.core.unsubscribe(TOPIC, "s").effects)
    assert broker.core.subscriptions(TOPIC) == ["s2"]
    assert f"/topics{TOPIC}/subscriptions/s2" in broker.metadata


def test_stored_topic_policies_that_do_not_validate_are_left_out() -> None:
    """A hand-written policy key must not make every publish fail: bad fields fall back to
    the namespace's values."""
    broker = Broker()
    pid = broker.producer()
    broker.metadata[f"/topics{TOPIC}/policy"] = {
        "max_message_size": "big",
        "max_producers_per_topic": 3,
        "unknown": 1,
    }
    again = Broker(files=broker.driver.files, metadata=broker.metadata)
    policies, overridden = again.core.topic_policies(TOPIC)
    assert overridden == ["max_producers_per_topic"]
    assert policies["max_message_size"] == Policies().max_message_size
    assert again.publish(pid, "still works") == 0


def test_unsubscribe_checks_the_name_before_looking_it_up() -> None:
    broker = Broker()
    broker.producer()
    assert code_of(lambda: broker.core.unsubscribe(TOPIC, "bad/name")) is ErrorCode.INVALID_ARGUMENT


def test_merged_policies_keep_what_another_broker_wrote() -> None:
    stored = {**dict.fromkeys(POLICY_FIELDS, 0), "max_consumers_per_topic": 4}
    merged = merged_policies(stored, {"max_producers_per_topic": 2})
    assert merged["max_consumers_per_topic"] == 4 and merged["max_producers_per_topic"] == 2
    assert merged_policies(None, {"max_producers_per_topic": 1})["max_message_size"] == (
        Policies().max_message_size
    )


# -- publish rate -------------------------------------------------------------------------------


def test_publish_rate_paces_after_a_one_second_burst() -> None:
    broker = Broker()
    broker.producer()
    assert broker.core.publish_pace(TOPIC, 1, now_ms=0) == 0, "no rate: no waiting"
    broker.run(broker.core.set_topic_policies(TOPIC, {"max_publish_rate": 10}).effects)
    waits = [broker.core.publish_pace(TOPIC, 1, now_ms=5_000) for _ in range(13)]
    assert waits[:10] == [0] * 10
    assert waits[10:] == [100, 200, 300], "each message past the burst waits 1/rate more"
    # 1.3 s of messages taken at 5 s: at 6 s they are within the burst again
    assert broker.core.publish_pace(TOPIC, 1, now_ms=6_000) == 0
    assert broker.core.publish_pace(TOPIC, 5, now_ms=10_000) == 0, "a batch counts its messages"
    assert broker.core.publish_pace(TOPIC, 20, now_ms=10_000) == 1_500, "and waits for its size"
    assert broker.core.publish_pace(TOPIC, 1, now_ms=10_000) == 1_600


def test_publish_rate_refuses_what_would_wait_too_long() -> None:
    broker = Broker()
    broker.producer()
    broker.run(broker.core.set_topic_policies(TOPIC, {"max_publish_rate": 10}).effects)
    assert broker.core.publish_pace(TOPIC, 500, now_ms=0) == 10_000, "held at most 10 s"
    with pytest.raises(DanubeError) as refused:
        broker.core.publish_pace(TOPIC, 1, now_ms=0)
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert "max_publish_rate" in refused.value.message
    assert broker.core.publish_pace(TOPIC, 1, now_ms=39_000) == 10_000, "a refusal takes no slot"
    with pytest.raises(DanubeError):
        broker.core.publish_pace(TOPIC, 1, now_ms=39_000)


def test_dispatch_rate_policy_paces_a_live_subscription() -> None:
    broker = Broker(max_unacked=100)
    pid = broker.producer()
    consumer = broker.consumer("c")
    broker.run(broker.core.set_topic_policies(TOPIC, {"max_subscription_dispatch_rate": 5}).effects)
    broker.run(broker.core.tick(broker.driver.now_ms).effects)
    for i in range(8):
        broker.publish(pid, f"m{i}")
    assert payloads(broker.take(consumer)) == [f"m{i}" for i in range(5)]
    broker.run(broker.core.tick(broker.driver.now_ms + 200).effects)
    assert payloads(broker.take(consumer)) == ["m5"]
    broker.run(broker.core.clear_topic_policies(TOPIC).effects)
    broker.run(broker.core.tick(broker.driver.now_ms + 201).effects)
    assert payloads(broker.take(consumer)) == ["m6", "m7"], "no limit once the policy is gone"


def test_a_raised_publish_rate_forgives_what_the_old_rate_made_wait() -> None:
    broker = Broker()
    broker.producer()
    broker.run(broker.core.set_topic_policies(TOPIC, {"max_publish_rate": 1}).effects)
    assert broker.core.publish_pace(TOPIC, 11, now_ms=0) == 10_000
    broker.run(broker.core.set_topic_policies(TOPIC, {"max_publish_rate": 10_000}).effects)
    assert broker.core.publish_pace(TOPIC, 1, now_ms=0) == 0, "11 messages are nothing at 10k/s"


def test_overrides_whose_write_failed_are_written_again_as_memory_holds_them() -> None:
    """An override answered UNAVAILABLE (its write failed or its answer was lost) stays in
    memory and is written again, whole: the store ends as memory whether the failed write
    never landed (simulator seed 55, replicated peers: the owner enforced 451, the store
    and so the next owner 381) or landed late (taking the change back lost to that: swarm
    seed 3010 with data planes)."""
    broker = Broker()
    broker.producer()
    broker.run(broker.core.set_topic_policies(TOPIC, {"max_producers_per_topic": 7}).effects)
    lost = broker.core.set_topic_policies(TOPIC, {"max_producers_per_topic": 9})
    again = broker.core.persist_topic_policies_again(TOPIC)  # `lost` never landed
    broker.run(again.effects)
    assert broker.metadata[f"/topics{TOPIC}/policy"] == {"max_producers_per_topic": 9}
    assert again.value is not None and again.value["max_producers_per_topic"] == 9
    broker.run(lost.effects)  # or it lands late, after the write again: the same value
    assert broker.metadata[f"/topics{TOPIC}/policy"] == broker.core.topic_overrides(TOPIC)

    cleared = broker.core.clear_topic_policies(TOPIC)
    broker.run(broker.core.persist_topic_policies_again(TOPIC).effects)
    assert f"/topics{TOPIC}/policy" not in broker.metadata
    broker.run(cleared.effects)
    assert f"/topics{TOPIC}/policy" not in broker.metadata
    assert broker.core.persist_topic_policies_again("/default/elsewhere").effects == ()

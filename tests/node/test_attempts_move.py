"""Failure counts across a topic move (issue 24, spec/failure-policies.md "What is
persisted"): the unload flushes them with the cursor, the next owner's adoption reads them
back, so a poison message's deliveries go on from where they were, never from 0."""

from __future__ import annotations

from danube.machines.node.settings import PoisonPolicy, SubscriptionFailureSettings
from danube.testing import CoreDriver
from tests.node.test_core_moves import TOPIC, adopt, broker, shared_state, unload
from tests.node.test_dead_letters_cluster import exhaust, publish

LIMIT = 3
POLICY = SubscriptionFailureSettings(
    max_redelivery_count=LIMIT,
    base_redelivery_delay_ms=100,
    max_redelivery_delay_ms=100,
    poison_policy=PoisonPolicy.DROP,
)


def machine(driver: CoreDriver) -> object:
    return driver.core.catalogue.topic(TOPIC).subscriptions["s"].reliable


def test_failure_counts_move_with_the_topic() -> None:
    objects, metadata = shared_state()
    old = broker(6650, objects, metadata)
    adopt(old)
    old.run(old.core.set_failure_policy(TOPIC, "s", POLICY, now_ms=old.now_ms).effects)
    offset = publish(old, b"poison")
    exhaust(old, offset)  # two deliveries, two nacks
    assert machine(old).attempts(offset) == 2  # type: ignore[attr-defined]
    unload(old)
    old.run(old.core.remove(TOPIC, reason="moved", delete_files=True).effects)
    stored = metadata[f"/topics{TOPIC}/subscriptions/s/attempts"]
    assert stored == [[offset, 2]], "the unload flushed the counts with the cursor"

    new = broker(6651, objects, metadata)
    adopt(new)
    sub = machine(new)
    assert sub.attempt_counts() == {offset: 2}, "read back by the new owner"  # type: ignore[attr-defined]
    # two more deliveries (LIMIT 3: four in all), then the policy drops it
    exhaust(new, offset)
    assert new.core.drop_counts() == {(TOPIC, "s", "poison_policy"): 1}
    assert sub.cursor == offset  # type: ignore[attr-defined]


def test_a_cleared_policy_stays_cleared_when_the_topic_moves() -> None:
    """`clear-failure-policy` deletes the stored policy: the next owner's adoption finds none,
    and the subscription runs with its namespace's default there (issue 24)."""
    objects, metadata = shared_state()
    metadata["/namespaces/default/policy"] = {
        "failure_policy": {"limits": "danube", "max_redelivery_count": 1, "poison_policy": "drop"}
    }
    old = broker(6650, objects, metadata)
    adopt(old)
    old.run(old.core.set_failure_policy(TOPIC, "s", POLICY, now_ms=old.now_ms).effects)
    offset = publish(old, b"poison")
    exhaust(old, offset)
    assert machine(old).policy.max_redelivery_count == LIMIT  # type: ignore[attr-defined]
    step = old.core.clear_failure_policy(TOPIC, "s", now_ms=old.now_ms)
    old.run(step.effects)
    assert step.value is True
    assert machine(old).policy.max_redelivery_count == 1  # type: ignore[attr-defined]
    unload(old)
    old.run(old.core.remove(TOPIC, reason="moved", delete_files=True).effects)
    assert f"/topics{TOPIC}/subscriptions/s/failure_policy" not in metadata

    new = broker(6651, objects, metadata)
    adopt(new)
    assert new.core.failure_policy(TOPIC, "s") is None, "no policy of its own on the new owner"
    assert machine(new).policy.max_redelivery_count == 1  # type: ignore[attr-defined]

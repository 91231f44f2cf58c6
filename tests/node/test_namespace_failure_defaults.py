"""A namespace's default failure policy (issue 24): set through the namespace policies
(`failure_policy`, Danube's `SubscriptionFailurePolicy` fields as a JSON object), used by
every reliable subscription of the namespace that sets no policy of its own, applied to live
subscriptions at the next tick whichever broker the change came through, and kept across
restarts."""

from __future__ import annotations

import json

import pytest

from danube import keys
from danube.machines.dispatch.failure import NO_LIMIT, Poison
from danube.machines.node.catalogue import Catalogue
from danube.machines.node.effects import BrokerIdentity
from danube.machines.node.settings import (
    PoisonPolicy,
    SubscriptionFailureSettings,
    merged_policies,
    namespace_failure,
)
from danube.values.config import config_from_mapping
from danube.values.errors import ConfigError, DanubeError, ErrorCode
from danube.values.names import parse_topic
from tests.node.test_core_reliable import SHARED, TOPIC, Broker, payloads

DROP_AFTER_ONE = {"max_redelivery_count": 1, "base_redelivery_delay_ms": 0, "poison_policy": "drop"}


def _set_default(broker: Broker, value: object) -> dict:
    step = broker.core.set_namespace_policies("default", {"failure_policy": value})
    broker.run(step.effects)
    broker.run(broker.core.tick(broker.driver.now_ms).effects)
    return step.value


def _policy_of(broker: Broker, sub: str) -> object:
    return broker.core.catalogue.topic(TOPIC).subscriptions[sub].reliable.policy


def test_a_new_subscription_without_its_own_policy_takes_the_namespace_default() -> None:
    broker = Broker()
    broker.producer()
    answer = _set_default(broker, DROP_AFTER_ONE)
    assert answer["failure_policy"]["max_redelivery_count"] == 1
    assert answer["failure_policy"]["poison_policy"] == "drop"
    assert (
        broker.metadata["/namespaces/default/policy"]["failure_policy"]
        == (answer["failure_policy"])
    )
    own = SubscriptionFailureSettings(max_redelivery_count=5, poison_policy=PoisonPolicy.BLOCK)
    broker.run(broker.core.set_failure_policy(TOPIC, "own", own).effects)
    broker.consumer("c1", sub="s", sub_type=SHARED)
    broker.consumer("c2", sub="own", sub_type=SHARED)
    assert _policy_of(broker, "s").max_redelivery_count == 1
    assert _policy_of(broker, "s").poison is Poison.DROP
    assert _policy_of(broker, "own").max_redelivery_count == 5, "its own policy wins"
    assert broker.core.failure_policy(TOPIC, "s") is None, "no policy of its own"


def test_a_changed_default_reaches_live_subscriptions_at_once() -> None:
    """m0 failed twice under the broker's default (for ever); the new default allows one
    failure: the message is dropped when it comes up again, not delivered a third time."""
    broker = Broker()
    pid = broker.producer()
    consumer = broker.consumer("c", sub_type=SHARED)
    assert _policy_of(broker, "s").max_redelivery_count == NO_LIMIT
    broker.publish(pid, "m0")
    for _ in range(2):
        assert payloads(broker.take(consumer)) == ["m0"]
        broker.run(broker.core.nack(TOPIC, "s", 0, None, now_ms=broker.driver.now_ms).effects)
        broker.run(broker.core.tick(broker.driver.now_ms + 1_000).effects)
    _set_default(broker, DROP_AFTER_ONE)
    assert _policy_of(broker, "s").max_redelivery_count == 1
    broker.run(broker.core.tick(broker.driver.now_ms + 60_000).effects)
    broker.publish(pid, "m1")
    assert payloads(broker.take(consumer)) == ["m1"]
    assert broker.core.drop_counts() == {(TOPIC, "s", "poison_policy"): 1}


def test_clearing_the_default_gives_the_brokers_back_and_a_restart_keeps_it() -> None:
    broker = Broker()
    broker.producer()
    broker.consumer("c", sub_type=SHARED)
    _set_default(broker, DROP_AFTER_ONE)
    again = Broker(files=broker.driver.files, metadata=broker.metadata)
    again.consumer("c", sub_type=SHARED)
    assert _policy_of(again, "s").max_redelivery_count == 1, "read back with the namespace"
    answer = _set_default(again, None)
    assert "failure_policy" not in answer
    assert _policy_of(again, "s").max_redelivery_count == NO_LIMIT


def test_a_cleared_own_policy_follows_the_namespace_default_live_and_after_a_restart() -> None:
    """A subscription with its own policy goes back to the namespace's default (issue 24):
    the live subscription takes the default at once, the stored policy is deleted (a restart,
    as a move, reads the default back), and the namespace's later changes reach it."""
    broker = Broker()
    broker.producer()
    _set_default(broker, DROP_AFTER_ONE)
    own = SubscriptionFailureSettings(max_redelivery_count=5, poison_policy=PoisonPolicy.BLOCK)
    broker.run(broker.core.set_failure_policy(TOPIC, "s", own).effects)
    broker.consumer("c", sub_type=SHARED)
    assert _policy_of(broker, "s").max_redelivery_count == 5
    key = keys.failure_policy(parse_topic(TOPIC), "s")
    assert key in broker.metadata
    step = broker.core.clear_failure_policy(TOPIC, "s", now_ms=broker.driver.now_ms)
    broker.run(step.effects)
    assert step.value is True
    assert _policy_of(broker, "s").max_redelivery_count == 1, "the default, at once"
    assert _policy_of(broker, "s").poison is Poison.DROP
    assert broker.core.failure_policy(TOPIC, "s") is None
    assert key not in broker.metadata, "the stored policy is deleted"
    again = broker.core.clear_failure_policy(TOPIC, "s")
    assert again.value is False, "nothing of its own left to clear"
    restarted = Broker(files=broker.driver.files, metadata=broker.metadata)
    restarted.consumer("c", sub_type=SHARED)
    assert _policy_of(restarted, "s").max_redelivery_count == 1, "read back: the default"
    _set_default(restarted, {"max_redelivery_count": 3, "poison_policy": "drop"})
    assert _policy_of(restarted, "s").max_redelivery_count == 3, "and it follows its changes"


def test_clearing_releases_a_message_blocked_under_the_own_policy() -> None:
    """Blocked under its own policy (no redelivery, Block); back on the broker's default
    (for ever) the message is no longer exhausted and goes out again."""
    broker = Broker()
    pid = broker.producer()
    own = SubscriptionFailureSettings(
        max_redelivery_count=0, base_redelivery_delay_ms=0, poison_policy=PoisonPolicy.BLOCK
    )
    broker.run(broker.core.set_failure_policy(TOPIC, "s", own).effects)
    consumer = broker.consumer("c", sub_type=SHARED)
    broker.publish(pid, "m0")
    assert payloads(broker.take(consumer)) == ["m0"]
    broker.run(broker.core.nack(TOPIC, "s", 0, None, now_ms=broker.driver.now_ms).effects)
    broker.run(broker.core.tick(broker.driver.now_ms + 1_000).effects)
    assert broker.core.blocked(TOPIC, "s") == (0,)
    broker.run(broker.core.clear_failure_policy(TOPIC, "s", now_ms=broker.driver.now_ms).effects)
    broker.run(broker.core.tick(broker.driver.now_ms + 1_000).effects)
    assert broker.core.blocked(TOPIC, "s") == ()
    assert payloads(broker.take(consumer)) == ["m0"]


def test_a_default_from_another_broker_is_applied_too() -> None:
    """Cluster mode: the watch reports the namespace's new value (`namespace_seen`)."""
    broker = Broker()
    broker.producer()
    broker.consumer("c", sub_type=SHARED)
    value = dict(broker.core.namespace_policies("default"))
    value["failure_policy"] = DROP_AFTER_ONE
    broker.core.namespace_seen("default", value)
    broker.run(broker.core.tick(broker.driver.now_ms).effects)
    assert _policy_of(broker, "s").max_redelivery_count == 1


def test_the_dead_letter_topic_does_not_dead_letter_to_itself() -> None:
    dlq = "/default/dlq"
    broker = Broker()
    broker.producer()
    _set_default(broker, {"poison_policy": "dead_letter", "dead_letter_topic": dlq})
    broker.consumer("c", sub_type=SHARED)
    assert _policy_of(broker, "s").poison is Poison.DEAD_LETTER
    catalogue = broker.core.catalogue
    assert catalogue.failure_policy(catalogue.topic(TOPIC), "x").dead_letter_topic == dlq
    broker.run(broker.core.create_topic(dlq, catalogue.topic(TOPIC).strategy).effects)
    assert catalogue.failure_policy(catalogue.topic(dlq), "x").poison is Poison.BLOCK


@pytest.mark.parametrize(
    "changes",
    [
        {"failure_policy": {"poison_policy": "dead_letter"}},  # no dead-letter topic
        {"failure_policy": {"ack_timeout_ms": 0}},
        {"failure_policy": {"poison_policy": "sometimes"}},
        {"failure_policy": 3},
        # numbers that are not whole, typos and a meaning of 0 other than Danube's: refused,
        # not converted or dropped (1e400 once reached a traceback: OverflowError)
        {"failure_policy": {"max_redelivery_count": 1e400}},
        {"failure_policy": {"ack_timeout_ms": 2.7}},
        {"failure_policy": {"max_redelivery_count": True}},
        {"failure_policy": {"max_redelivery_count": "3"}},
        {"failure_policy": {"max_redelivery_counts": 3, "poison_policy": "drop"}},
        {"failure_policy": {"limits": "old", "max_redelivery_count": 0}},
    ],
)
def test_a_bad_default_is_refused(changes: dict) -> None:
    broker = Broker()
    with pytest.raises(DanubeError) as refused:
        broker.core.set_namespace_policies("default", changes)
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert "failure_policy" not in broker.core.namespace_policies("default")


def test_a_topic_cannot_override_the_default() -> None:
    broker = Broker()
    broker.producer()
    with pytest.raises(DanubeError) as refused:
        broker.core.set_topic_policies(TOPIC, {"failure_policy": DROP_AFTER_ONE})
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert "set-failure-policy" in refused.value.message


def test_the_configuration_gives_new_namespaces_a_default_checked_at_start() -> None:
    """`policies.failure_policy` (a table or its JSON text) is the default of the
    namespaces the broker creates; its fields are checked when the broker starts."""
    config = config_from_mapping({"policies": {"failure_policy": DROP_AFTER_ONE}})
    assert json.loads(config.policies.failure_policy) == DROP_AFTER_ONE
    catalogue = Catalogue(BrokerIdentity("b:1", "b:1"), config.policies)
    catalogue.bootstrap(["orders"])
    default = namespace_failure(catalogue.namespaces_by_name["orders"])
    assert default is not None and default.max_redelivery_count == 1
    with pytest.raises(ConfigError):
        config_from_mapping({"policies": {"failure_policy": 3}})
    bad = config_from_mapping({"policies": {"failure_policy": '{"poison_policy": "never"}'}})
    with pytest.raises(DanubeError):
        Catalogue(BrokerIdentity("b:1", "b:1"), bad.policies)


def test_a_cluster_merge_keeps_the_default_another_broker_wrote() -> None:
    """Cluster mode merges a change into the store's value (`merged_policies`): a limit
    changed through one broker keeps the default written through another."""
    stored = merged_policies({}, {"failure_policy": DROP_AFTER_ONE})
    merged = merged_policies(stored, {"max_producers_per_topic": 1})
    assert merged["failure_policy"] == stored["failure_policy"]
    assert merged["max_producers_per_topic"] == 1
    assert "failure_policy" not in merged_policies(merged, {"failure_policy": None})


def test_a_default_read_back_may_be_given_again() -> None:
    """What `namespace_policies` shows (with its `limits` marker) is accepted as it is."""
    broker = Broker()
    policy = {"max_redelivery_count": 2, "poison_policy": "drop"}
    broker.core.set_namespace_policies("default", {"failure_policy": policy})
    shown = broker.core.namespace_policies("default")["failure_policy"]
    stored = json.loads(shown) if isinstance(shown, str) else shown
    broker.core.set_namespace_policies("default", {"failure_policy": stored})
    assert broker.core.namespace_policies("default")["failure_policy"] == shown

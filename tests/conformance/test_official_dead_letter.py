"""The DeadLetter poison policy seen by the official Danube Python client (issue 24, point 5):
a consumer that nacks one message on a subscription with `max_redelivery_count` 2 and a
dead-letter topic sees it three times and no more; a second official consumer on the
dead-letter topic receives it with its payload, its attributes and Danube's `x-original-*`
attributes pointing back to the original."""

from __future__ import annotations

import pytest

from danube.localcluster.broker_process import BrokerProcess
from danube.proto.danube_admin import (
    SubscriptionBackoffStrategy,
    SubscriptionFailurePolicy,
    SubscriptionPoisonPolicy,
)
from tests.conformance.harness import (
    admin_create_reliable_topic,
    admin_set_failure_policy,
    run_scenario,
)
from tests.support.aio import unique_topic

pytestmark = [pytest.mark.slow, pytest.mark.conformance]


def test_a_nacked_message_goes_to_the_dead_letter_topic_after_three_deliveries(
    broker: BrokerProcess,
) -> None:
    topic, dlq = unique_topic("conf-poisoned"), unique_topic("conf-dlq")
    admin_create_reliable_topic(broker, topic)
    admin_create_reliable_topic(broker, dlq)
    policy = SubscriptionFailurePolicy(
        max_redelivery_count=2,
        ack_timeout_ms=30_000,
        base_redelivery_delay_ms=100,
        max_redelivery_delay_ms=200,
        backoff_strategy=SubscriptionBackoffStrategy.Fixed,
        dead_letter_topic=dlq,
        poison_policy=SubscriptionPoisonPolicy.DeadLetter,
    )
    admin_set_failure_policy(broker, topic, "conf-poisoned", policy)
    result = run_scenario("dead_letter", broker.url, topic, "conf-poisoned", dlq, broker=broker)

    deliveries = result["deliveries"]
    assert len(deliveries) == 3 and result["after"] == []
    original = deliveries[0]
    assert {d["topic_offset"] for d in deliveries} == {original["topic_offset"]}
    [dead] = result["dead_letters"]
    assert dead["topic"] == dlq and dead["payload"] == original["payload"]
    assert dead["attributes"] == {
        "kind": "poison",
        "text": "grüße",
        "x-original-topic": topic,
        "x-original-subscription": "conf-poisoned",
        "x-original-topic-offset": str(original["topic_offset"]),
        "x-original-producer-id": str(original["producer_id"]),
        "x-original-broker-addr": dead["attributes"]["x-original-broker-addr"],
        "x-original-publish-time": dead["attributes"]["x-original-publish-time"],
        "x-poison-policy": "dead_letter",
        "x-delivery-attempt": "3",
        "x-failure-reason": "cannot parse",
    }, "the last nack's reason, as Danube"
    assert dead["attributes"]["x-original-broker-addr"]

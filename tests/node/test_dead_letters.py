"""The DeadLetter poison policy's republish flow in the core and the interpreter (issue 24,
spec/failure-policies.md): an exhausted message is appended to the dead-letter topic (created
as Danube does when missing) with its payload, its attributes and Danube's `x-original-*`
attributes, and the original's cursor passes it only once that append is stored; a failed
republish is asked again after the backoff, never dropped."""

from __future__ import annotations

import random
from typing import Any

from danube.machines.dispatch import QueueLimits
from danube.machines.dispatch.failure import EntryState
from danube.machines.dispatch.poison import REPUBLISH_RETRY_FLOOR_MS
from danube.machines.node.core import BrokerCore, BrokerIdentity, DeadLetterPublish
from danube.machines.node.settings import PoisonPolicy, SubscriptionFailureSettings
from danube.machines.wal import records
from danube.machines.wal.machine import WalConfig
from danube.runtime.poison_metrics import poison_families
from danube.testing import CoreDriver
from danube.values.config import DispatchStrategy, Policies
from tests.node.test_core import replay
from tests.node.test_core_reliable import EARLIEST, SHARED, TOPIC, URL

DLQ = "/default/dlq"
REL = DispatchStrategy.RELIABLE


class Broker:
    def __init__(self) -> None:
        self.core = BrokerCore(
            BrokerIdentity(URL, URL),
            rng=random.Random(7),
            default_policies=Policies(),
            queue_limits=QueueLimits(),
            wal_config=WalConfig(),
            routing_key_of=records.routing_key,
        )
        self.driver = CoreDriver(self.core)
        self.metadata: dict[str, Any] = {}
        self.seen: list[Any] = []
        self.run(self.core.bootstrap(["default"]).effects)
        self.run(self.core.create_topic(TOPIC, REL).effects)

    def run(self, effects: Any) -> list[Any]:
        out = self.driver.run(effects)
        self.seen.extend(out)
        replay(out, self.metadata)
        return out

    @property
    def now(self) -> int:
        return self.driver.now_ms

    def publish(self, payload: bytes, attributes: dict[str, str]) -> int:
        producer = self.core.create_producer(TOPIC, "p", access_mode=0, strategy=REL)
        self.run(producer.effects)
        record = records.Record(
            producer_id=producer.value, topic_name=TOPIC, payload=payload, publish_time=77,
            producer_name="p", attributes=attributes, broker_addr=URL,
        )  # fmt: skip

        def encode(offset: int) -> bytes:
            record.topic_offset = offset
            return records.encode(record)

        step = self.core.publish(
            producer.value, TOPIC, record, len(payload), None, encode=encode, now_ms=self.now
        )
        self.run(step.effects)
        return step.value

    def consumer(self, topic: str, sub: str) -> tuple[int, int]:
        step = self.core.subscribe(topic, "c", sub, SHARED, (), EARLIEST, now_ms=self.now)
        self.run(step.effects)
        opened = self.core.open_stream(step.value, now_ms=self.now)
        self.run(opened.effects)
        return step.value, opened.value

    def take(self, consumer: tuple[int, int]) -> list[records.Record]:
        taken = self.core.take(consumer[0], consumer[1], 1000)
        assert taken is not None
        return [records.decode(item) for item in taken]

    def nack(self, offset: int) -> None:
        self.run(self.core.nack(TOPIC, "s", offset, None, now_ms=self.now).effects)

    def tick(self, ms: int) -> None:
        self.driver.now_ms += ms
        self.run(self.core.tick(self.now).effects)


def _dead_letter_policy(limit: int = 1) -> SubscriptionFailureSettings:
    return SubscriptionFailureSettings(
        max_redelivery_count=limit,
        base_redelivery_delay_ms=10,
        max_redelivery_delay_ms=40,
        dead_letter_topic=DLQ,
        poison_policy=PoisonPolicy.DEAD_LETTER,
    )


def test_an_exhausted_message_is_stored_in_the_dead_letter_topic_with_its_origin() -> None:
    broker = Broker()
    broker.run(broker.core.set_failure_policy(TOPIC, "s", _dead_letter_policy()).effects)
    consumer = broker.consumer(TOPIC, "s")
    offset = broker.publish(b"poison", {"kind": "bad"})
    for _ in range(2):  # max_redelivery_count 1: two deliveries
        assert [r.payload for r in broker.take(consumer)] == [b"poison"]
        broker.nack(offset)
        broker.tick(50)
    assert broker.take(consumer) == [], "exhausted: not delivered a third time"
    # the dead-letter topic did not exist: created (reliable), the first append waited for
    # its WAL and failed; the retry after the backoff stores it
    assert DLQ in broker.core.topics("default")
    for _ in range(5):
        broker.tick(50)
    published = [e for e in broker.seen if isinstance(e, DeadLetterPublish)]
    assert published[0].failure is not None and published[-1].failure is None
    broker.tick(1_000)  # the failure counts were stored lately: the cursor flush waits its turn
    assert broker.metadata["/topics/default/r/subscriptions/s/cursor"] == offset
    assert "/topics/default/r/subscriptions/s/attempts" not in broker.metadata
    assert broker.core.dead_letters.stored == 1
    dlq = broker.consumer(DLQ, "audit")
    [dead] = broker.take(dlq)
    assert dead.payload == b"poison" and dead.topic_name == DLQ
    assert dead.attributes == {
        "kind": "bad",
        "x-original-topic": TOPIC,
        "x-original-subscription": "s",
        "x-original-topic-offset": str(offset),
        "x-original-producer-id": dead.attributes["x-original-producer-id"],
        "x-original-broker-addr": URL,
        "x-original-publish-time": "77",
        "x-poison-policy": "dead_letter",
        "x-delivery-attempt": "2",
        "x-failure-reason": "nack",
    }
    assert dead.attributes["x-original-producer-id"] != "0"
    families = {f.name: f for f in poison_families("b", broker.core)}
    dead_lettered = {
        sample.labels["topic"]: sample.value
        for sample in families["danube_subscription_dlq"].samples
    }
    assert dead_lettered == {TOPIC: 1, DLQ: 0}
    causes = {
        sample.labels["cause"]: sample.value
        for sample in families["danube_subscription_redelivery_causes"].samples
        if sample.labels["topic"] == TOPIC
    }
    assert causes == {"nack": 1}, "the first nack asked for a redelivery, the second exhausted"


def test_the_original_stays_until_its_dead_letter_is_stored() -> None:
    """The report of the append is what lets the cursor pass: held back, the message stays
    dead-lettering and the cursor does not move; a lost append asks again."""
    broker = Broker()
    broker.run(broker.core.create_topic(DLQ, REL).effects)
    broker.run(broker.core.set_failure_policy(TOPIC, "s", _dead_letter_policy(0)).effects)
    consumer = broker.consumer(TOPIC, "s")
    offset = broker.publish(b"poison", {})
    broker.take(consumer)
    held: list[DeadLetterPublish] = []
    real = broker.core.dead_letter_done
    broker.core.dead_letter_done = lambda publish, failure, now_ms=0: (  # type: ignore[method-assign]
        held.append(publish) or real(publish, "lost", now_ms=now_ms)
    )
    broker.nack(offset)
    machine = broker.core.catalogue.topics_by_name[TOPIC].subscriptions["s"].reliable
    assert held and machine.entry_state(offset) is EntryState.DEAD_LETTERING
    assert machine.cursor < offset
    broker.core.dead_letter_done = real  # type: ignore[method-assign]
    broker.tick(50)  # a failed republish waits at least REPUBLISH_RETRY_FLOOR_MS
    assert machine.entry_state(offset) is EntryState.DEAD_LETTERING
    broker.tick(50 + REPUBLISH_RETRY_FLOOR_MS)
    assert machine.entry_state(offset) is None and machine.cursor == offset
    assert broker.core.dead_letters.failed == 1 and broker.core.dead_letters.stored == 1


def test_messages_in_flight_to_a_consumer_that_leaves_are_counted_as_its_redeliveries() -> None:
    broker = Broker()
    consumer = broker.consumer(TOPIC, "s")
    broker.publish(b"m0", {})
    broker.publish(b"m1", {})
    assert len(broker.take(consumer)) == 2
    broker.run(broker.core.close_stream(*consumer, now_ms=broker.now).effects)
    machine = broker.core.catalogue.topics_by_name[TOPIC].subscriptions["s"].reliable
    assert machine.redeliveries_by_cause == {"consumer gone": 2}

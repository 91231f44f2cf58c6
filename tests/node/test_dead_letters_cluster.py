"""A dead-letter topic served by another broker (cluster mode, issue 24): the origin's core
asks its port to publish the dead letter elsewhere (`ForwardDeadLetter`) and feeds
`dead_lettered` to the subscription only once the other broker stored it; a failed forward
is asked again after the policy's backoff, the original staying in the window meanwhile.
Two cores share one metadata dict and object store, as two brokers share etcd and S3; the
test's forward hook publishes on the other core as the runtime's internal producer would
(`danube.runtime.dead_letter_forward`)."""

from __future__ import annotations

from typing import Any

from danube.machines.cluster.ownership import load_entries, load_reads
from danube.machines.node import paths
from danube.machines.node.core import ForwardDeadLetter
from danube.machines.node.settings import PoisonPolicy, SubscriptionFailureSettings
from danube.machines.wal import records
from danube.metadata.model import KeyValue
from danube.runtime.poison_metrics import poison_families
from danube.testing import CoreDriver
from danube.values.config import DispatchStrategy
from danube.values.names import parse_topic
from tests.node.test_core_moves import CLAIMS, EARLIEST, TOPIC, broker, shared_state

DLQ = "/default/moving-dlq"
REPUBLISHES = "danube_dead_letter_republishes"
REL = DispatchStrategy.RELIABLE
POLICY = SubscriptionFailureSettings(
    max_redelivery_count=1,
    base_redelivery_delay_ms=100,
    max_redelivery_delay_ms=100,
    poison_policy=PoisonPolicy.DEAD_LETTER,
    dead_letter_topic=DLQ,
)


def adopt(driver: CoreDriver, topic: str) -> None:
    prefixes, policy_key = load_reads(topic)

    def kv(key: str) -> KeyValue:
        return KeyValue(key, driver.metadata[key], 1, 1, 1, None)

    scanned = [kv(k) for k in sorted(driver.metadata) if k.startswith(prefixes)]
    policy = kv(policy_key) if policy_key in driver.metadata else None
    step = driver.core.adopt(
        load_entries(topic, scanned, policy), keep_local=False, epoch=next(CLAIMS)
    )
    driver.run(step.effects)


def two_brokers() -> tuple[CoreDriver, CoreDriver]:
    """`origin` serves TOPIC, `other` serves DLQ."""
    objects, metadata = shared_state()
    name = parse_topic(DLQ)
    metadata[paths.namespace_topic(name)] = None
    metadata[paths.topic_delivery(name)] = REL.label
    origin, other = broker(6650, objects, metadata), broker(6651, objects, metadata)
    adopt(origin, TOPIC)
    adopt(other, DLQ)
    return origin, other


def publish(driver: CoreDriver, payload: bytes) -> int:
    producer = driver.core.create_producer(TOPIC, "p", access_mode=0, strategy=REL)
    driver.run(producer.effects)
    record = records.Record(
        producer_id=producer.value, topic_name=TOPIC, payload=payload, producer_name="p",
        attributes={"kind": "bad"}, broker_addr="http://127.0.0.1:6650",
    )  # fmt: skip

    def encode(offset: int) -> bytes:
        record.topic_offset = offset
        return records.encode(record)

    step = driver.core.publish(
        producer.value, TOPIC, payload, len(payload), None, encode=encode, now_ms=driver.now_ms
    )
    driver.run(step.effects)
    return step.value


class Forwarder:
    """The other broker's side of a forwarded dead letter: an internal producer publishing
    on its core. `down`: the other broker is unreachable (the forward fails)."""

    def __init__(self, other: CoreDriver) -> None:
        self.other = other
        self.down = False
        self.forwarded: list[ForwardDeadLetter] = []
        self.producer: int | None = None

    def __call__(self, effect: ForwardDeadLetter) -> None:
        self.forwarded.append(effect)
        if self.down:
            raise ConnectionError("the owner of the dead-letter topic does not answer")
        core = self.other.core
        if self.producer is None:
            step = core.create_producer(DLQ, "broker-dead-letter-a", access_mode=0, strategy=REL)
            self.other.run(step.effects)
            self.producer = step.value
        data = records.encode(effect.record)
        step = core.publish(
            self.producer, DLQ, data, len(data), None, encode=lambda _: data,
            now_ms=self.other.now_ms,
        )  # fmt: skip
        self.other.run(step.effects)


def cursor(driver: CoreDriver) -> Any:
    return driver.core.catalogue.topic(TOPIC).subscriptions["s"].reliable.cursor


def exhaust(origin: CoreDriver, offset: int) -> None:
    """A consumer takes the message and nacks it until the policy (one redelivery) gives
    up on it."""
    core = origin.core
    step = core.subscribe(TOPIC, "c", "s", 1, (), EARLIEST, now_ms=origin.now_ms)
    origin.run(step.effects)
    opened = core.open_stream(step.value, now_ms=origin.now_ms)
    origin.run(opened.effects)
    for _ in range(2):
        for _ in range(50):
            if core.take(step.value, opened.value, 10):
                break
            origin.now_ms += 10
            origin.run(core.tick(origin.now_ms).effects)
        else:
            raise AssertionError("the message was not delivered")
        origin.run(core.nack(TOPIC, "s", offset, None, now_ms=origin.now_ms).effects)


def tick(driver: CoreDriver, ms: int) -> None:
    for _ in range(ms // 10):
        driver.now_ms += 10
        driver.run(driver.core.tick(driver.now_ms).effects)


def test_a_dead_letter_topic_on_another_broker_is_reached_by_forwarding() -> None:
    origin, other = two_brokers()
    forwarder = Forwarder(other)
    origin.port.forward_dead_letter = forwarder
    step = origin.core.set_failure_policy(TOPIC, "s", POLICY, now_ms=origin.now_ms)
    origin.run(step.effects)  # allowed in cluster mode now
    offset = publish(origin, b"poison")
    exhaust(origin, offset)
    tick(origin, 200)
    [forwarded] = forwarder.forwarded
    assert forwarded.publish.topic == DLQ and forwarded.publish.origin == TOPIC
    attributes = forwarded.record.attributes
    assert attributes["x-original-topic"] == TOPIC
    assert attributes["x-original-topic-offset"] == str(offset)
    assert attributes["kind"] == "bad" and forwarded.record.payload == b"poison"
    assert not origin.core.serves(DLQ), "the origin did not create the topic itself"
    assert cursor(origin) == offset, "passed once the other broker stored it"
    assert origin.core.dead_letters.stored == 1 and origin.core.dead_letters.forwarded == 1
    assert other.core.wal_durable_end(DLQ) == 1, "stored on the other broker"
    families = {f.name: f for f in poison_families("a", origin.core)}
    outcomes = {s.labels["outcome"]: s.value for s in families[REPUBLISHES].samples}
    assert outcomes == {"stored": 1, "failed": 0, "forwarded": 1}


def test_a_failed_forward_is_asked_again_and_the_original_waits() -> None:
    origin, other = two_brokers()
    forwarder = Forwarder(other)
    forwarder.down = True
    origin.port.forward_dead_letter = forwarder
    origin.run(origin.core.set_failure_policy(TOPIC, "s", POLICY, now_ms=origin.now_ms).effects)
    offset = publish(origin, b"poison")
    exhaust(origin, offset)
    tick(origin, 1_000)
    assert len(forwarder.forwarded) >= 3, "asked again after the backoff"
    assert cursor(origin) == offset - 1, "the original waits in the window"
    assert origin.core.dead_letters.failed == len(forwarder.forwarded)
    forwarder.down = False
    tick(origin, 300)
    assert cursor(origin) == offset
    assert origin.core.dead_letters.stored == 1
    assert other.core.wal_durable_end(DLQ) == 1, "stored once: the failed ones never landed"


def test_without_a_forward_path_the_message_waits_never_dropped() -> None:
    """The memory port with no other broker: every forward fails; nothing is dropped."""
    origin, _ = two_brokers()
    origin.run(origin.core.set_failure_policy(TOPIC, "s", POLICY, now_ms=origin.now_ms).effects)
    offset = publish(origin, b"poison")
    exhaust(origin, offset)
    tick(origin, 500)
    assert cursor(origin) == offset - 1
    assert origin.core.dead_letters.failed >= 2 and origin.core.drop_counts() == {}

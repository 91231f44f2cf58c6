"""The `object` acknowledgement level in the broker core (spec/durability.md): a publish is
answered only once the object holding it is indexed, the active segment is sealed within the
batch window after its oldest unanswered publish became durable, and one upload answers the
whole batch. The I/O runs in memory (`danube.testing`)."""

from __future__ import annotations

import random

import pytest

from danube.machines.dispatch import QueueLimits
from danube.machines.node.core import BrokerCore, BrokerIdentity, PublishAcked
from danube.machines.tiering import UploaderConfig
from danube.machines.tiering.index import IndexEntry
from danube.machines.wal.machine import WalConfig
from danube.testing import CoreDriver
from danube.values.config import DispatchStrategy, Policies, TopicDurability

URL = "http://127.0.0.1:6650"
TOPIC = "/default/payments"
BATCH_MS = 100


def start(
    object_ack: bool = True, durability: TopicDurability | None = None
) -> tuple[CoreDriver, int]:
    core = BrokerCore(
        BrokerIdentity(URL, URL),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(),
        wal_config=WalConfig(segment_bytes=1 << 20),
        uploads=UploaderConfig(orphan_scan_interval_ms=None),
        durability=durability or TopicDurability("object" if object_ack else None, (), BATCH_MS),
    )
    driver = CoreDriver(core)
    driver.run(core.bootstrap(["default"]).effects)
    step = core.create_producer(TOPIC, "p", access_mode=0, strategy=DispatchStrategy.RELIABLE)
    driver.run(step.effects)
    return driver, step.value


def publish(driver: CoreDriver, producer_id: int, n: int) -> list[object]:
    payload = f"message {n}"
    step = driver.core.publish(
        producer_id, TOPIC, payload, len(payload), None,
        encode=lambda offset: payload.encode(), now_ms=driver.now_ms,
    )  # fmt: skip
    return driver.run(step.effects)


def tick(driver: CoreDriver, advance_ms: int) -> list[object]:
    driver.now_ms += advance_ms
    return driver.run(driver.core.tick(driver.now_ms).effects)


def index(driver: CoreDriver) -> list[IndexEntry]:
    return [
        IndexEntry.from_json(v)
        for k, v in sorted(driver.metadata.items())
        if "/segments/" in k and not k.endswith("/cur")
    ]


def test_a_publish_is_answered_only_once_its_object_is_indexed() -> None:
    driver, producer = start()
    publish(driver, producer, 0)
    assert TOPIC not in driver.acked  # durable on the local disk, not yet in an object
    tick(driver, BATCH_MS - 1)
    assert TOPIC not in driver.acked and driver.objects == {}
    effects = tick(driver, 1)
    assert PublishAcked(TOPIC, 0) in effects
    (entry,) = index(driver)
    assert (entry.start_offset, entry.end_offset) == (0, 0)
    assert entry.key in driver.objects


def test_one_upload_answers_every_publish_of_its_batch() -> None:
    driver, producer = start()
    for n in range(5):
        publish(driver, producer, n)
        tick(driver, 10)
    assert TOPIC not in driver.acked
    tick(driver, BATCH_MS)
    assert driver.acked[TOPIC] == 4
    (entry,) = index(driver)
    assert (entry.start_offset, entry.end_offset) == (0, 4)


def test_later_publishes_go_to_the_next_batch() -> None:
    driver, producer = start()
    publish(driver, producer, 0)
    tick(driver, BATCH_MS)
    assert driver.acked[TOPIC] == 0
    publish(driver, producer, 1)
    publish(driver, producer, 2)
    assert driver.acked[TOPIC] == 0
    tick(driver, BATCH_MS)
    assert driver.acked[TOPIC] == 2
    assert [(e.start_offset, e.end_offset) for e in index(driver)] == [(0, 0), (1, 2)]


def test_an_idle_topic_makes_no_uploads() -> None:
    driver, producer = start()
    publish(driver, producer, 0)
    tick(driver, BATCH_MS)
    objects = dict(driver.objects)
    for _ in range(10):
        tick(driver, BATCH_MS)
    assert driver.objects == objects


def test_without_it_a_publish_is_answered_at_the_fsync() -> None:
    driver, producer = start(object_ack=False)
    publish(driver, producer, 0)
    assert driver.acked[TOPIC] == 0
    assert driver.objects == {}


def test_the_level_is_chosen_per_topic() -> None:
    fast = "/default/metrics"
    driver, producer = start(durability=TopicDurability("fsync", ((TOPIC, "object"),), BATCH_MS))
    step = driver.core.create_producer(fast, "m", access_mode=0, strategy=DispatchStrategy.RELIABLE)
    driver.run(step.effects)
    publish(driver, producer, 0)
    driver.run(
        driver.core.publish(
            step.value, fast, "m", 1, None, encode=lambda offset: b"m", now_ms=driver.now_ms
        ).effects
    )
    assert driver.acked == {fast: 0}  # fsync: answered at once; TOPIC waits for its object
    tick(driver, BATCH_MS)
    assert driver.acked == {fast: 0, TOPIC: 0}
    assert all("metrics" not in key for key in driver.objects)


def test_it_needs_an_object_tier() -> None:
    with pytest.raises(ValueError, match="object tier"):
        BrokerCore(
            BrokerIdentity(URL, URL),
            rng=random.Random(1),
            default_policies=Policies(),
            queue_limits=QueueLimits(),
            durability=TopicDurability("object"),
        )

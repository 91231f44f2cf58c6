"""The `object` acknowledgement level in the broker core (spec/durability.md): a publish is
answered only once the object holding it is indexed, the active segment is sealed within the
batch window after its oldest unanswered publish became durable, and one upload answers the
whole batch. The I/O runs in memory (`danube.testing`)."""

from __future__ import annotations

import random

import pytest

from danube.machines.dispatch import QueueLimits, StartKind, StartPosition
from danube.machines.node import paths
from danube.machines.node.core import BrokerCore, BrokerIdentity, PublishAcked
from danube.machines.tiering import UploaderConfig
from danube.machines.tiering.index import IndexEntry
from danube.machines.wal.machine import WalConfig
from danube.testing import CoreDriver
from danube.values.config import DispatchStrategy, Policies, TopicDurability
from danube.values.names import parse_topic

URL = "http://127.0.0.1:6650"
TOPIC = "/default/payments"
BATCH_MS = 100
EARLIEST = StartPosition(StartKind.EARLIEST)


def start(
    object_ack: bool = True,
    durability: TopicDurability | None = None,
    stored: CoreDriver | None = None,
    disk: bool = False,
) -> tuple[CoreDriver, int]:
    """A broker on an empty disk; with `stored`, one that shares its object store and
    metadata (a new owner after a failover: the old owner's disk is gone with it), and with
    `disk` its files too (the same broker restarted)."""
    core = BrokerCore(
        BrokerIdentity(URL, URL),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(),
        wal_config=WalConfig(segment_bytes=1 << 20),
        uploads=UploaderConfig(orphan_scan_interval_ms=None),
        durability=durability or TopicDurability("object" if object_ack else None, (), BATCH_MS),
    )
    if stored is None:
        driver = CoreDriver(core)
    else:
        files = stored.files if disk else {}
        driver = CoreDriver(core, files, stored.objects, dict(stored.metadata))
        driver.now_ms = stored.now_ms
        driver.run(core.restore(dict(stored.metadata)).effects)
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


def subscribe(driver: CoreDriver) -> tuple[int, int]:
    core = driver.core
    step = core.subscribe(TOPIC, "audit", "audit", 0, (), EARLIEST, now_ms=driver.now_ms)
    driver.run(step.effects)
    opened = core.open_stream(step.value, now_ms=driver.now_ms)
    driver.run(opened.effects)
    return step.value, opened.value


def receive(driver: CoreDriver, consumer: tuple[int, int]) -> list[str]:
    """What the consumer is sent now, each acknowledged at once (offsets from 0, in order)."""
    taken = driver.core.take(*consumer, 1000)
    assert taken is not None
    received = [record.decode() for record in taken]
    for payload in received:
        offset = int(payload.split()[-1])
        driver.run(driver.core.ack(TOPIC, "audit", offset, now_ms=driver.now_ms).effects)
    return received


def test_a_record_is_delivered_only_once_its_object_is_indexed() -> None:
    """Delivered before its object is indexed, a record could be acknowledged by its
    consumer and then lost with the owner, its offset given to another message in a failover
    that the stored cursor already passed (seed 48 of the cluster poison run)."""
    driver, producer = start()
    consumer = subscribe(driver)
    publish(driver, producer, 0)
    assert receive(driver, consumer) == []  # durable on the owner's disk only
    tick(driver, BATCH_MS)
    assert driver.acked[TOPIC] == 0
    assert receive(driver, consumer) == ["message 0"]


def test_a_new_owner_reusing_an_unindexed_offset_delivers_its_message() -> None:
    window = 2_000  # longer than the cursor's flush interval (1 s)
    driver, producer = start(durability=TopicDurability("object", (), window))
    consumer = subscribe(driver)
    publish(driver, producer, 0)
    tick(driver, window)
    assert receive(driver, consumer) == ["message 0"]
    publish(driver, producer, 1)  # offset 1: fsynced, not indexed, not answered
    receive(driver, consumer)
    tick(driver, 1_100)  # the cursor is stored; the window is still open
    assert driver.acked[TOPIC] == 0
    cursor = paths.cursor(parse_topic(TOPIC), "audit")
    assert driver.metadata[cursor] == 0, "no cursor past the index"
    # the owner is lost with its disk: a new one continues at the index's end, offset 1
    fresh, producer = start(durability=TopicDurability("object", (), window), stored=driver)
    publish(fresh, producer, 1)  # the producer's retry, answered this time
    tick(fresh, window)
    assert fresh.acked[TOPIC] == 1
    consumer = subscribe(fresh)
    assert receive(fresh, consumer) == ["message 1"]


def test_after_a_restart_the_unindexed_records_become_readable_once_uploaded() -> None:
    driver, producer = start()
    publish(driver, producer, 0)  # fsynced, its window still open when the broker stops
    restarted, _ = start(stored=driver, disk=True)
    consumer = subscribe(restarted)
    for _ in range(5):
        tick(restarted, BATCH_MS)
    assert receive(restarted, consumer) == ["message 0"]  # the recovered segment's object


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

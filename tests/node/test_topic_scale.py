"""Topics at scale (issue 23): an idle topic costs a tick nothing, a topic's creation does not look
at every other topic, and a WAL's deadline is never later than its tick's first work."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube.machines.node.records import new_topic
from danube.machines.node.topic_table import TopicTable
from danube.machines.wal.deadline import DUE_NOW, next_due_ms
from danube.machines.wal.machine import Durability, WalConfig
from danube.values.config import DispatchStrategy
from danube.values.names import parse_topic, partition_index
from tests.node.test_core_reliable import EARLIEST, EXCLUSIVE, REL, TOPIC, Broker, payloads

IDLE_TOPICS = 200


def idle_broker(config: WalConfig | None = None, topics: int = IDLE_TOPICS) -> Broker:
    """A broker with `topics` reliable topics, each with a producer and one stored message."""
    broker = Broker(config)
    for index in range(topics):
        topic = f"/default/idle-{index}"
        step = broker.core.create_producer(topic, "p", access_mode=0, strategy=REL)
        broker.run(step.effects)
        published = broker.core.publish(
            step.value, topic, "x", 1, None, encode=lambda _: b"|x", now_ms=broker.driver.now_ms
        )
        broker.run(published.effects)
    return broker


def tick(broker: Broker, now_ms: int) -> int:
    """Ticks at `now_ms`; how many topics the tick visited."""
    broker.driver.now_ms = now_ms
    broker.run(broker.core.tick(now_ms).effects)
    return broker.core.catalogue.topics_by_name.visited


def test_a_tick_of_an_idle_broker_visits_no_topic() -> None:
    broker = idle_broker()
    assert tick(broker, 1_000) > 0  # the publishes touched them: visited once more
    assert [tick(broker, now) for now in range(1_050, 2_000, 50)] == [0] * 19


def test_a_subscribed_topic_is_visited_when_touched_or_due_not_at_every_tick() -> None:
    """Issue 28 point 3: with 1,000 subscribed topics the walk over every one of them at every
    tick took 30 % of the broker's main thread. A subscription's timers are indexed now."""
    broker = idle_broker(topics=20)
    tick(broker, 1_000)
    step = broker.core.subscribe(
        "/default/idle-3", "c", "s", EXCLUSIVE, (), EARLIEST, now_ms=broker.driver.now_ms
    )
    broker.run(step.effects)
    assert [tick(broker, now) for now in (1_050, 1_100, 1_150)] == [1, 0, 0]


def test_a_cursor_moved_by_acks_is_written_at_its_deadline_by_a_tick_that_visits_only_it() -> None:
    """The acknowledgements touch the topic; the tick after them schedules the cursor's flush
    and visits nothing more until it is due."""
    broker = Broker()
    pid = broker.producer()
    consumer = broker.consumer("c")
    for i in range(5):
        broker.publish(pid, f"m{i}")
    broker.take(consumer)
    for offset in range(5):
        broker.run(broker.core.ack(TOPIC, "s", offset, now_ms=100 + offset).effects)
    assert broker.cursor() == 0
    assert [tick(broker, now) for now in (200, 250, 300)] == [1, 0, 0]
    assert broker.cursor() == 0
    assert tick(broker, 5_000) == 1
    assert broker.cursor() == 4


def test_a_delivery_not_acknowledged_is_redelivered_at_its_deadline_without_other_input() -> None:
    broker = Broker()
    pid = broker.producer()
    consumer = broker.consumer("c")
    broker.publish(pid, "m0")
    assert payloads(broker.take(consumer)) == ["m0"]
    tick(broker, broker.driver.now_ms + 50)
    assert tick(broker, broker.driver.now_ms + 100) == 0
    redelivered = []
    for now in range(1_000, 120_000, 1_000):  # past any ack timeout
        tick(broker, now)
        redelivered += payloads(broker.take(consumer))
        if redelivered:
            break
    assert redelivered == ["m0"]


def test_a_namespace_policy_reaches_the_subscriptions_of_topics_no_input_touched() -> None:
    broker = idle_broker(topics=5)
    for index in range(5):
        step = broker.core.subscribe(
            f"/default/idle-{index}", "c", "s", EXCLUSIVE, (), EARLIEST, now_ms=1_000
        )
        broker.run(step.effects)
    tick(broker, 1_000)
    assert tick(broker, 1_050) == 0
    changes = {"max_subscription_dispatch_rate": 7}
    broker.run(broker.core.set_namespace_policies("default", changes).effects)
    assert tick(broker, 1_100) == 5
    records = broker.core.catalogue.topics_by_name.values()
    assert [r.subscriptions["s"].machine.dispatch_rate for r in records] == [7] * 5  # type: ignore[attr-defined]
    tick(broker, 1_150)  # the change touched them: visited once more
    assert tick(broker, 1_200) == 0


def test_segment_rotation_of_idle_topics_comes_at_its_deadline() -> None:
    """Rotation by age (`segment_age_ms`): due only at the deadline, and then for every topic."""
    age = 10_000
    broker = idle_broker(WalConfig(segment_age_ms=age), topics=30)
    tick(broker, 1_000)
    assert tick(broker, 1_050) == 0
    rotating = tick(broker, 1_000 + age + 100)
    assert rotating == 30
    logs = [r.log.wal for r in broker.core.catalogue.topics_by_name.values()]
    assert all(log is not None and not log.tick_due(1_000 + age + 100) for log in logs)


def test_partitions_come_from_the_index_as_a_scan_would_find_them() -> None:
    table = TopicTable()
    rng = random.Random(5)
    names = [f"/default/b{rng.randrange(3)}-part-{rng.randrange(12)}" for _ in range(60)]
    names += ["/default/b1", "/default/b1-part-01", "/default/b2-part-3-part-4"]
    for name in names:
        table[name] = new_topic(parse_topic(name), DispatchStrategy.RELIABLE)
    for name in names[::3]:
        if name in table:
            del table[name]
    for base in ("/default/b0", "/default/b1", "/default/b2", "/default/b2-part-3", "/x"):
        scan = sorted(
            (partition_index(name, base), name)
            for name in table
            if partition_index(name, base) is not None
        )
        assert table.partitions(base) == [name for _, name in scan]


def test_creating_a_topic_does_not_look_at_the_other_topics(monkeypatch) -> None:
    """`_check_partition_conflicts` used to call `partition_index` for every topic."""
    from danube.machines.node import catalogue

    broker = idle_broker(topics=50)
    calls = []
    original = catalogue.__dict__.get("partition_index")
    if original is not None:  # the scan (before issue 23) would count here
        monkeypatch.setattr(catalogue, "partition_index", lambda *a: calls.append(a))
    step = broker.core.create_producer("/default/new", "p", access_mode=0, strategy=REL)
    broker.run(step.effects)
    assert calls == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    durability=st.sampled_from([Durability.FSYNC, Durability.FLUSH]),
    segment_age=st.none() | st.integers(1, 5_000),
    retention_ms=st.none() | st.integers(1, 5_000),
    retention_bytes=st.none() | st.integers(1, 300),
    steps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2_000)), max_size=12),
)
def test_a_wal_deadline_is_never_later_than_its_tick_work(
    durability: Durability,
    segment_age: int | None,
    retention_ms: int | None,
    retention_bytes: int | None,
    steps: list[tuple[int, int]],
) -> None:
    """`next_due_ms` is a lower bound: wherever `tick_due` is true, the deadline has come."""
    config = WalConfig(
        durability=durability,
        segment_age_ms=segment_age,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        segment_bytes=64,
    )
    broker = idle_broker(config, topics=1)
    record = next(iter(broker.core.catalogue.topics_by_name.values()))
    producer_id = next(iter(broker.core.producers.by_id))
    now = 1_000
    for publishes, wait in steps:
        for _ in range(publishes):
            step = broker.core.publish(
                producer_id, record.name.full, "y" * 20, 20, None,
                encode=lambda _: b"|" + b"y" * 20, now_ms=now,
            )  # fmt: skip
            broker.run(step.effects)
        log = record.log.wal
        assert log is not None
        due = next_due_ms(log)
        near = () if due in (None, DUE_NOW) else (due - 1, due)  # a deadline a moment late shows
        for at in (now, now + 1, now + wait // 2, now + wait, now + 10_000, *near):
            if log.tick_due(at):
                assert due is not None and due <= at, (due, at)
        now += wait
        tick(broker, now)

"""Records held for consumers that left (spec/memory.md, "Consumer queues"; issue 28 review):
when a reliable subscription's last consumer goes, the records it read and that are not
acknowledged are let go, so the consumer pool's charge drops; they are read again from the
WAL when a consumer connects, nothing lost, nothing acknowledged sent again. Before, they
stayed in memory for as long as the consumer stayed away."""

from __future__ import annotations

from danube.machines.dispatch.types import SubscriptionType
from danube.machines.memory.budget import MemoryPools
from danube.machines.memory.consumer import HELD_PER_RECORD
from tests.node.test_core_reliable import TOPIC, Broker, payloads

KIB = 1024
SHARED = SubscriptionType.SHARED.value


def _broker() -> Broker:
    return Broker(memory=MemoryPools(1024 * KIB, 512 * KIB, 256 * KIB, 256 * KIB), max_unacked=10)


def _held(broker: Broker) -> int:
    pool = broker.core.logs.consumer_pool
    assert pool is not None
    return pool.used


def _leave(broker: Broker, consumer: tuple[int, int]) -> None:
    broker.run(broker.core.close_stream(*consumer, now_ms=broker.driver.now_ms).effects)


def _sub(broker: Broker, name: str = "s") -> object:
    return broker.core.catalogue.topics_by_name[TOPIC].subscriptions[name]


def test_the_last_consumer_leaving_lets_the_held_records_go_and_they_come_back() -> None:
    broker = _broker()
    pid = broker.producer()
    for i in range(6):
        broker.publish(pid, f"m{i}")
    consumer = broker.consumer("c")
    assert payloads(broker.take(consumer)) == [f"m{i}" for i in range(6)]
    broker.ack(1)
    broker.ack(3)  # out of order: the cursor stays before 0
    assert _held(broker) == 4 * (len(b"|m0") + HELD_PER_RECORD)
    _leave(broker, consumer)
    assert _held(broker) == 0, "the records of a consumer that left stayed in the pool"
    assert not _sub(broker).records  # type: ignore[attr-defined]
    again = broker.consumer("c")
    assert payloads(broker.take(again)) == ["m0", "m2", "m4", "m5"], "read again, acked skipped"
    assert _held(broker) == 4 * (len(b"|m0") + HELD_PER_RECORD)
    for offset in (0, 2, 4, 5):
        broker.ack(offset)
    assert _held(broker) == 0
    assert _sub(broker).reliable.cursor == 5  # type: ignore[attr-defined]


def test_records_stay_while_another_consumer_of_the_subscription_is_connected() -> None:
    broker = _broker()
    pid = broker.producer()
    for i in range(4):
        broker.publish(pid, f"m{i}")
    first = broker.consumer("a", sub_type=SHARED)
    second = broker.consumer("b", sub_type=SHARED)
    of_first, of_second = payloads(broker.take(first)), payloads(broker.take(second))
    assert sorted(of_first + of_second) == ["m0", "m1", "m2", "m3"]
    held = _held(broker)
    _leave(broker, first)
    assert _held(broker) == held, "the other consumer gets the first one's messages"
    assert sorted(payloads(broker.take(second))) == sorted(of_first)
    _leave(broker, second)
    assert _held(broker) == 0


def test_failure_counts_survive_the_let_go() -> None:
    broker = _broker()
    pid = broker.producer()
    broker.publish(pid, "m0")
    consumer = broker.consumer("c")
    assert payloads(broker.take(consumer)) == ["m0"]
    broker.run(broker.core.nack(TOPIC, "s", 0, None, now_ms=broker.driver.now_ms).effects)
    _leave(broker, consumer)
    assert _held(broker) == 0
    sub = _sub(broker)
    assert sub.reliable.attempt_counts() == {0: 1}  # type: ignore[attr-defined]


def test_a_consumer_that_subscribes_again_and_never_opens_its_stream_holds_nothing() -> None:
    """Review finding: a takeover (the same consumer subscribing again) ends its old stream
    without the let-go, and that stream's close is ignored from then on (another
    generation): if the client dies before opening its new stream, nothing let the held
    records go."""
    from tests.node.test_core_reliable import EARLIEST, EXCLUSIVE

    broker = _broker()
    producer = broker.producer()
    for i in range(4):
        broker.publish(producer, f"m{i}")
    consumer = broker.consumer("c")
    assert payloads(broker.take(consumer)) == ["m0", "m1", "m2", "m3"]
    assert _held(broker) > 0
    step = broker.core.subscribe(TOPIC, "c", "s", EXCLUSIVE, (), EARLIEST, now_ms=1)
    broker.run(step.effects)
    assert step.value == consumer[0]
    assert _held(broker) == 0

"""A restart through a real broker process with the WAL loads deferred (issue 23 point 3,
`danube.machines.node.deferred_loads`): the broker says it is ready without recovering every
reliable topic first; a topic is recovered at its first use or by the sweep, so every stored
message is still served and offsets continue after it, and a topic whose newest frame was
damaged is stopped at its first use with the corruption error (issue 20), not lost silently,
while the other topics serve."""

from __future__ import annotations

from pathlib import Path

from danube.client import DanubeClient, DispatchStrategy, SubType
from danube.localcluster.broker_process import BrokerProcess
from tests.broker.test_reliable_durability import _frames, _segments
from tests.broker.test_wal_damage import _assert_refused, _publish_acknowledged
from tests.support.aio import receive_n, run, unique_topic

RELIABLE = DispatchStrategy.RELIABLE
COUNT = 12


def _old_and_new(
    broker: BrokerProcess, topics: list[str], stored: int
) -> dict[str, list[tuple[int, bytes]]]:
    """Per topic: a new message sent after the restart, then what `earliest` shows of the
    `stored` old messages and the new one."""

    async def scenario() -> dict[str, list[tuple[int, bytes]]]:
        seen: dict[str, list[tuple[int, bytes]]] = {}
        async with DanubeClient(broker.url) as client:
            for topic in reversed(topics):  # against the sweep's order: first uses come first
                producer = await client.producer(topic, "p2", dispatch=RELIABLE).create()
                await producer.send(b"new")
                consumer = client.consumer(
                    topic, "c", "audit", sub_type=SubType.EXCLUSIVE, start="earliest"
                )
                await consumer.subscribe()
                seen[topic] = [(m.offset, m.payload) for m in await receive_n(consumer, stored + 1)]
        return seen

    return run(scenario)


def test_a_restart_serves_every_stored_message_and_continues_each_topics_offsets(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path / "data").start()
    topics = [unique_topic(f"lazy{i}") for i in range(COUNT)]
    for topic in topics:
        _publish_acknowledged(broker, topic, [b"old-0", b"old-1"])
    broker.kill()  # no graceful seal: recovery reads what the fsyncs left
    broker.start()
    seen = _old_and_new(broker, topics, 2)
    for topic in topics:
        assert seen[topic] == [(0, b"old-0"), (1, b"old-1"), (2, b"new")], (topic, seen[topic])
    assert "Traceback" not in broker.log_text(), broker.log_text()


def test_a_damaged_topic_among_many_stops_at_its_first_use_and_the_others_serve(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path / "data").start()
    topics = [unique_topic(f"lazy{i}") for i in range(COUNT)]
    for topic in topics:
        _publish_acknowledged(broker, topic, [f"old-{i}".encode() for i in range(3)])
    broker.stop()
    damaged = topics[-1]
    [segment] = _segments(broker, damaged)
    data = bytearray(segment.read_bytes())
    last = _frames(bytes(data))[-1]
    data[-5] ^= 0x10  # a bit of the newest acknowledged frame
    segment.write_bytes(data)
    broker.start()
    _assert_refused(broker, damaged, segment.name, last.start, 2, 2)
    seen = _old_and_new(broker, topics[:-1], 3)
    for topic in topics[:-1]:
        assert [offset for offset, _ in seen[topic]] == [0, 1, 2, 3], (topic, seen[topic])

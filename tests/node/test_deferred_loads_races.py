"""Lazy recovery's races (review findings on issue 23 point 3): a load under way when its topic
is deleted and created again, a producer's creation refused after it took its topic's load
off the queue, and a consumer coming back to a deferred topic."""

from __future__ import annotations

import pytest

from danube.effects import ScanTopic
from danube.machines.node.core import PublishAcked
from danube.values.errors import DanubeError, ErrorCode
from tests.node.test_core_reliable import EXCLUSIVE, REL, Broker, record_of
from tests.node.test_deferred_loads import TOPICS, _loads, _restarted, _stored


def _release(broker: Broker) -> None:
    held, broker.driver.port.held = broker.driver.port.held, []
    for effect, done in held:
        done(broker.driver.port.answer(effect))


def test_a_load_under_way_when_its_topic_is_deleted_and_created_again_is_not_applied() -> None:
    after, effects = _restarted(_stored(1))
    topic = TOPICS[0]
    core, port = after.core, after.driver.port
    port.hold = lambda e: isinstance(e, ScanTopic) and e.topic == topic
    assert _loads(effects) == [topic]
    after.run(effects)
    assert len(port.held) == 1  # the sweep's load waits on its directory scan
    after.run(core.delete_topic(topic).effects)
    created = core.create_producer(topic, "new", access_mode=0, strategy=REL)
    after.run(created.effects)
    _release(after)  # the deleted topic's load ends: stale, applied to nothing
    record = core.catalogue.topics_by_name[topic]
    wal = record.log.wal  # none yet, or the new record's own (fresh, empty) log
    assert wal is None or wal.next_offset == 0  # not the deleted topic's log
    port.hold = None
    _release(after)  # the new record's own (fresh) load, if it waited
    assert record.log.wal is not None and record.phase.writable
    step = core.publish(created.value, topic, "y", 1, None, encode=lambda _o: record_of("y"),
                        now_ms=6)  # fmt: skip
    acked = [e for e in after.run(step.effects) if isinstance(e, PublishAcked)]
    assert step.value == 0 and acked  # the new topic starts empty, at offset 0


def test_a_producer_refused_by_its_topics_limit_leaves_the_topics_load_queued() -> None:
    after, effects = _restarted(_stored(6))
    topic, core = TOPICS[5], after.core
    core.catalogue.set_namespace_policies("default", {"max_producers_per_topic": 1})
    with pytest.raises(DanubeError) as refused:
        core.create_producer(topic, "p2", access_mode=0, strategy=REL)
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert core.logs.deferred.pending(topic)  # still queued: the sweep or a request loads it
    after.run(effects)
    for now in range(10, 200, 10):
        after.run(core.tick(now).effects)
    assert core.catalogue.topics_by_name[topic].log.wal is not None


def test_a_consumer_coming_back_to_a_deferred_topic_moves_its_load_ahead() -> None:
    before = Broker()
    for topic in TOPICS:
        producer = before.producer(topic)
        before.run(before.core.subscribe(topic, "c", "s", EXCLUSIVE, (), now_ms=1).effects)
        step = before.core.publish(
            producer, topic, "m", 1, None, encode=lambda _o: record_of("m"), now_ms=1
        )
        before.run(step.effects)
    after, effects = _restarted(before)
    core = after.core
    topic = sorted(TOPICS)[-1]  # the last in the sweep's order
    assert topic not in _loads(effects)
    step = core.subscribe(topic, "c", "s", EXCLUSIVE, (), now_ms=2)  # the same consumer
    opened = core.open_stream(step.value, now_ms=2)
    loads = [*_loads(step.effects), *_loads(opened.effects), *_loads(core.tick(3).effects)]
    assert topic in loads

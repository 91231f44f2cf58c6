"""A restart's lazy recovery (issue 23 point 3, `danube.machines.node.deferred_loads`): the
restore makes every topic known but starts only the sweep's first loads; a request that needs
a topic's WAL starts its load ahead of the sweep; a producer's creation carries the load, so
its reply waits for it; nothing is served from a log that was not recovered."""

from __future__ import annotations

import pytest

from danube.machines.node.core import LoadWal
from danube.machines.node.deferred_loads import SWEEP_WIDTH, DeferredLoads
from danube.machines.node.effects import Step
from danube.machines.node.phase import TopicEvent
from danube.machines.node.records import TopicRecord, new_topic
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import parse_topic
from tests.node.test_core_reliable import REL, Broker, record_of

TOPICS = [f"/default/t{i}" for i in range(6)]


def _topics(names: list[str]) -> dict[str, TopicRecord]:
    return {name: new_topic(parse_topic(name), DispatchStrategy.RELIABLE) for name in names}


def _restore_step(names: list[str]) -> Step[None]:
    return Step(None, tuple(LoadWal(name, fresh=False) for name in names))


def _loads(effects: list[object] | tuple[object, ...]) -> list[str]:
    return [e.topic for e in effects if isinstance(e, LoadWal)]


def test_a_restore_starts_only_the_sweeps_first_loads_and_each_end_starts_the_next() -> None:
    topics = _topics(TOPICS)
    deferred = DeferredLoads(topics, width=2)
    step = deferred.defer(_restore_step(TOPICS))
    assert _loads(step.effects) == TOPICS[:2]
    assert deferred.left == 4 and deferred.pending(TOPICS[2]) and not deferred.pending(TOPICS[0])
    assert deferred.due() == []  # two under way: the sweep waits for one to end
    assert _loads(deferred.done(TOPICS[0])) == [TOPICS[2]]
    assert deferred.done("/default/not-swept") == []  # a repair's or a creation's load
    for topic in TOPICS[1:]:
        deferred.done(topic)
    assert deferred.left == 0


def test_a_wanted_topic_loads_before_the_sweep_and_beyond_its_width() -> None:
    topics = _topics(TOPICS)
    deferred = DeferredLoads(topics, width=1)
    deferred.defer(_restore_step(TOPICS))
    deferred.want(TOPICS[5])
    deferred.want(TOPICS[0])  # under way already: nothing to do
    assert _loads(deferred.due()) == [TOPICS[5]]
    assert not deferred.pending(TOPICS[5])
    assert _loads(deferred.start(TOPICS[4])) == [TOPICS[4]]  # a producer's creation
    assert deferred.start(TOPICS[4]) == []  # once


def test_fresh_loads_are_kept_and_a_topic_deleted_or_created_again_is_not_loaded_by_the_queue() -> (
    None
):
    topics = _topics(TOPICS[:3])
    deferred = DeferredLoads(topics, width=0)
    step = deferred.defer(Step(None, (*_restore_step(TOPICS[:3]).effects, LoadWal("/x/n", True))))
    assert step.effects == (LoadWal("/x/n", True),)
    del topics[TOPICS[0]]  # deleted
    topics[TOPICS[1]] = new_topic(parse_topic(TOPICS[1]), DispatchStrategy.RELIABLE)  # again
    topics[TOPICS[2]].advance(TopicEvent.LOAD_FAILED)  # stopped meanwhile
    for topic in TOPICS[:3]:
        deferred.want(topic)
    assert deferred.due() == []


def _stored(count: int) -> Broker:
    """A broker whose metadata holds `count` reliable topics of one acknowledged message."""
    broker = Broker()
    for topic in TOPICS[:count]:
        pid = broker.producer(topic)
        step = broker.core.publish(
            pid, topic, "m", 1, None, encode=lambda _o: record_of("m"), now_ms=1
        )
        broker.run(step.effects)
    return broker


def _restarted(before: Broker) -> tuple[Broker, tuple[object, ...]]:
    """A new core on the same files and metadata; the restore's effects are returned, not
    carried out."""
    after = Broker(files=before.driver.files)
    after.metadata = dict(before.metadata)
    step = after.core.restore(after.metadata)
    return after, step.effects


def test_after_a_restart_only_the_sweep_loads_and_a_publish_to_a_deferred_topic_waits() -> None:
    before = _stored(5)
    after, effects = _restarted(before)
    assert _loads(effects) == sorted(TOPICS[:5])[:SWEEP_WIDTH]
    topic = TOPICS[4]
    producer = next(iter(after.core.catalogue.topics_by_name[topic].producers.values()))
    with pytest.raises(DanubeError) as refused:
        after.core.publish(producer, topic, "n", 1, None, encode=lambda _o: b"n", now_ms=2)
    assert refused.value.code is ErrorCode.UNAVAILABLE  # not answered from an unloaded log
    tick = after.core.tick(3)
    assert _loads(tick.effects)[0] == topic  # ahead of the sweep
    after.run((*effects, *tick.effects))
    offset = after.core.publish(producer, topic, "n", 1, None, encode=lambda _o: b"n", now_ms=4)
    assert offset.value == 1  # after the stored message, not over it


def test_a_producer_created_on_a_deferred_topic_carries_its_load() -> None:
    before = _stored(4)
    after, _ = _restarted(before)
    step = after.core.create_producer(TOPICS[3], "p2", access_mode=0, strategy=REL)
    assert LoadWal(TOPICS[3], fresh=False) in step.effects


def test_a_deferred_topic_deleted_and_created_again_gets_only_its_fresh_load() -> None:
    before = _stored(4)
    after, _ = _restarted(before)
    topic = TOPICS[3]
    after.core.delete_topic(topic)
    created = after.core.create_topic(topic, REL)
    assert LoadWal(topic, fresh=True) in created.effects
    after.core.logs.deferred.want(topic)  # a request to it meanwhile
    assert topic not in _loads(after.core.tick(5).effects)  # not loaded as stored again

"""The topic life cycle's table (`danube.machines.node.phase`): every legal transition goes where
the table says, every other (phase, event) pair raises, and the core moves a topic through the
phases its requests and the driver's reports imply."""

from __future__ import annotations

import random

import pytest

from danube.machines.dispatch import QueueLimits
from danube.machines.node.core import BrokerCore, BrokerIdentity, TopicStopped
from danube.machines.node.phase import (
    TRANSITIONS,
    IllegalTransition,
    TopicEvent,
    TopicPhase,
    advance,
)
from danube.machines.wal.recovery import RecoveryPlan
from danube.values.config import DispatchStrategy, Policies

URL = "http://127.0.0.1:6650"
TOPIC = "/default/r"
EMPTY = RecoveryPlan(TOPIC, (), (), 0, None)


@pytest.mark.parametrize(
    ("phase", "event", "after"),
    [(p, e, a) for (p, e), a in TRANSITIONS.items()],
    ids=lambda v: v.value,
)
def test_every_legal_transition_goes_where_the_table_says(
    phase: TopicPhase, event: TopicEvent, after: TopicPhase
) -> None:
    assert advance(phase, event) is after


ILLEGAL = [(p, e) for p in TopicPhase for e in TopicEvent if (p, e) not in TRANSITIONS]


@pytest.mark.parametrize(("phase", "event"), ILLEGAL, ids=lambda v: v.value)
def test_every_other_transition_raises(phase: TopicPhase, event: TopicEvent) -> None:
    with pytest.raises(IllegalTransition, match=event.value):
        advance(phase, event)


def test_the_table_keeps_the_phases_properties() -> None:
    """A move never ends (only `remove` ends it), a stop never ends, and a stopped topic
    never has a working WAL."""
    for (phase, _), after in TRANSITIONS.items():
        assert not phase.moving or after.moving
        assert not phase.stopped or after.stopped
        assert not (after.stopped and after.writable)
    assert ILLEGAL, "some events must be refused somewhere"
    assert (TopicPhase.SERVING, TopicEvent.LOADED) in ILLEGAL


def core() -> BrokerCore:
    broker = BrokerCore(
        BrokerIdentity(URL, URL),
        rng=random.Random(1),
        default_policies=Policies(),
        queue_limits=QueueLimits(),
    )
    broker.bootstrap(["default"])
    return broker


def phase_of(broker: BrokerCore, topic: str = TOPIC) -> TopicPhase:
    return next(r.phase for r in broker.topic_records() if r.name.full == topic)


def test_a_reliable_topic_loads_serves_unloads_and_stops() -> None:
    broker = core()
    broker.create_topic(TOPIC, DispatchStrategy.RELIABLE)
    assert phase_of(broker) is TopicPhase.LOADING
    broker.wal_loaded(TOPIC, EMPTY, now_ms=0)
    assert phase_of(broker) is TopicPhase.SERVING
    broker.unload(TOPIC, 0)
    assert phase_of(broker) is TopicPhase.UNLOADING and not broker.serves(TOPIC)
    assert broker.wal_load_failed(TOPIC, "disk").effects == (TopicStopped(TOPIC, "disk"),)
    assert phase_of(broker) is TopicPhase.UNLOADING_STOPPED
    assert broker.settled(TOPIC)


def test_a_non_reliable_topic_serves_at_once() -> None:
    broker = core()
    broker.create_topic("/default/n", DispatchStrategy.NON_RELIABLE)
    assert phase_of(broker, "/default/n") is TopicPhase.SERVING
    broker.unload("/default/n", 0)
    assert phase_of(broker, "/default/n") is TopicPhase.UNLOADING


def test_loading_twice_is_a_driver_bug() -> None:
    broker = core()
    broker.create_topic(TOPIC, DispatchStrategy.RELIABLE)
    broker.wal_loaded(TOPIC, EMPTY, now_ms=0)
    with pytest.raises(IllegalTransition):
        broker.wal_loaded(TOPIC, EMPTY, now_ms=0)

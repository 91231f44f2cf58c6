"""Both dispatchers implement `danube.machines.dispatch.protocol.Subscription`, the one interface
the broker core uses, with the same parameters, and answer its uniform inputs as each
guarantee requires."""

from __future__ import annotations

import inspect

import pytest

from danube.machines.dispatch import ConsumerReady, DropReason, QueueLimits, SubscriptionType
from danube.machines.dispatch import reliable as rd
from danube.machines.dispatch.nonreliable import NonReliableSubscription
from danube.machines.dispatch.protocol import Subscription

SHARED = SubscriptionType.SHARED


def dispatchers() -> list[Subscription]:
    return [NonReliableSubscription(SHARED, QueueLimits()), rd.ReliableSubscription(SHARED, 0)]


def protocol_members() -> list[str]:
    return [
        name
        for name, value in vars(Subscription).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    ]


@pytest.mark.parametrize("dispatcher", dispatchers(), ids=lambda d: type(d).__name__)
def test_each_dispatcher_satisfies_the_protocol(dispatcher: Subscription) -> None:
    assert isinstance(dispatcher, Subscription)
    assert len(protocol_members()) >= 15
    for name in protocol_members():
        declared = vars(Subscription)[name]
        if isinstance(declared, property):
            getattr(dispatcher, name)  # readable
            continue
        wanted = list(inspect.signature(declared).parameters)[1:]
        have = inspect.signature(getattr(dispatcher, name)).parameters
        assert list(have)[: len(wanted)] == wanted, f"{type(dispatcher).__name__}.{name}"
        extra = [p for p in list(have.values())[len(wanted) :] if p.default is p.empty]
        assert not extra, f"{type(dispatcher).__name__}.{name} needs more than the protocol"


def test_a_non_reliable_consumer_starts_at_subscribe_a_reliable_one_with_its_stream() -> None:
    plain, reliable = dispatchers()
    for d in (plain, reliable):
        d.add_consumer(1, "c", (), 0)
    assert list(plain.subscribed(1, 0)) == [] and plain.is_connected(1)
    assert list(reliable.subscribed(1, 0)) == [] and not reliable.is_connected(1)


def test_a_stream_reset_sends_again_only_what_was_sent() -> None:
    plain = NonReliableSubscription(SHARED, QueueLimits())
    plain.add_consumer(1, "c", (), 0)
    plain.subscribed(1, 0)
    assert plain.publish("m", 1, b"") == [ConsumerReady(1)]
    assert plain.stream_reset(1, 0) == [] and plain.queued(1) == 1

    reliable = rd.ReliableSubscription(SHARED, 0)
    reliable.add_consumer(1, "c", (), 0)
    reliable.connect(1, 0)
    reliable.readable(0, 0)
    reliable.records_read([(0, b"")], 0)
    assert reliable.in_flight(1) == {0}
    reliable.stream_reset(1, 0)
    assert reliable.in_flight(1) == frozenset() and not reliable.is_connected(1)


def test_acks_statistics_and_takes_follow_the_guarantee() -> None:
    plain, reliable = dispatchers()
    assert list(plain.ack(0, 0)) == list(plain.nack(0, None, 0)) == []
    assert not plain.is_pending(0)
    assert plain.redelivered == 0 and plain.backlog(10) is None
    assert plain.drop_counts() == dict.fromkeys(DropReason, 0)
    assert reliable.drop_counts() == {} and reliable.take(1, 10) == []
    assert reliable.backlog(None) is None and reliable.backlog(10) == 10

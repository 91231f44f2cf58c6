"""What a cluster broker tells a client about a topic it does not serve (spec/cluster.md,
"Lookup, create and subscribe"): the pure rules of `danube.machines.cluster.placement`."""

from __future__ import annotations

import pytest

from danube.machines.cluster.keys import unassigned_key
from danube.machines.cluster.placement import (
    Answer,
    Located,
    TopicFacts,
    admin_route,
    creation,
    lookup,
    route,
)
from danube.metadata.model import Compare, Put
from danube.values.config import DispatchStrategy
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import parse_topic

T = "/default/orders"
ME = "1"
OTHER = {"broker_url": "http://b2:6650", "connect_url": "http://proxy:6650"}
RELIABLE = DispatchStrategy.RELIABLE


def code(call: object) -> ErrorCode:
    with pytest.raises(DanubeError) as raised:
        call()  # type: ignore[operator]
    return raised.value.code


def test_a_topic_claimed_by_another_broker_redirects_to_its_registration() -> None:
    located = lookup(T, TopicFacts(True, "2"), ME, OTHER)
    assert located == Located(Answer.REDIRECT, "http://b2:6650", "http://proxy:6650")
    assert located.proxy
    plain = lookup(T, TopicFacts(True, "2"), ME, {"broker_url": "http://b2:6650"})
    assert (plain.connect_url, plain.proxy) == ("http://b2:6650", False)


@pytest.mark.parametrize(
    ("facts", "registration", "expected"),
    [
        (TopicFacts(False, None), None, ErrorCode.NOT_FOUND),
        (TopicFacts(True, None), None, ErrorCode.UNAVAILABLE),  # being assigned or moved
        (TopicFacts(True, ME), None, ErrorCode.UNAVAILABLE),  # loading or leaving here
        (TopicFacts(True, "2"), None, ErrorCode.UNAVAILABLE),  # owner not registered
    ],
)
def test_lookups_without_an_owner_to_send_to(
    facts: TopicFacts, registration: dict[str, str] | None, expected: ErrorCode
) -> None:
    assert code(lambda: lookup(T, facts, ME, registration)) is expected


def test_producers_and_consumers_of_a_topic_served_elsewhere_look_it_up_again() -> None:
    for facts in (TopicFacts(True, "2"), TopicFacts(True, None), TopicFacts(True, ME)):
        for create in (RELIABLE, None):
            rule = lambda f=facts, c=create: route(T, f, ME, create=c, auto_create=True)  # noqa: E731
            assert code(rule) is ErrorCode.UNAVAILABLE


def test_only_a_producer_creates_and_only_with_auto_create() -> None:
    missing = TopicFacts(False, None)
    assert route(T, missing, ME, create=RELIABLE, auto_create=True) is RELIABLE
    assert code(lambda: route(T, missing, ME, create=None, auto_create=True)) is (
        ErrorCode.NOT_FOUND
    )
    assert code(lambda: route(T, missing, ME, create=RELIABLE, auto_create=False)) is (
        ErrorCode.NOT_FOUND
    )


def test_creation_is_one_transaction_with_a_marker_per_topic() -> None:
    names = [parse_topic(f"{T}-part-{i}") for i in range(2)]
    compares, ops = creation(names, RELIABLE)
    assert compares == tuple(
        Compare(f"/topics/default/orders-part-{i}/delivery", "version", "==", 0) for i in range(2)
    )
    assert Put("/topics/default/orders-part-1/delivery", "Reliable") in ops
    assert Put(unassigned_key(f"{T}-part-0"), None) in ops
    assert Put("/namespaces/default/topics/default/orders-part-1", None) in ops
    assert len(ops) == 6


def test_admin_questions_go_to_the_owners_admin_port_with_lookups_refusals() -> None:
    owner = {**OTHER, "admin_addr": "http://b2:6651"}
    assert admin_route(T, TopicFacts(True, "2"), ME, owner) == "http://b2:6651"
    assert code(lambda: admin_route(T, TopicFacts(True, "2"), ME, OTHER)) is (
        ErrorCode.UNAVAILABLE
    ), "an owner registered without an admin address cannot be asked"
    for facts, expected in [
        (TopicFacts(False, None), ErrorCode.NOT_FOUND),
        (TopicFacts(True, None), ErrorCode.UNAVAILABLE),
        (TopicFacts(True, ME), ErrorCode.UNAVAILABLE),
    ]:
        assert code(lambda facts=facts: admin_route(T, facts, ME, owner)) is expected

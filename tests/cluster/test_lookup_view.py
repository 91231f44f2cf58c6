"""TopicLookup answered from the broker's own view of `/cluster/` (issue 23: during a
failover every producer of the dead broker's topics looks its topic up again and again, and
each lookup read the store three times on the survivors busy loading those topics).

The pure rule (`placement.lookup_from_view`), the load manager's view keeping the
registrations' URLs, and the cluster placement answering without a store read."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from danube import keys
from danube.machines.cluster.load_manager import LoadManager, LoadManagerConfig
from danube.machines.cluster.placement import (
    Answer,
    Located,
    ViewFacts,
    lookup_from_view,
    route_from_view,
)
from danube.metadata import KeyValue, WatchEvent
from danube.runtime.placement import ClusterPlacement
from danube.values.errors import DanubeError, ErrorCode

T = "/default/orders"
ME = "1"
OTHER = {"broker_url": "http://b2:6650", "connect_url": "http://proxy:6650"}


def code(call: Any) -> ErrorCode:
    with pytest.raises(DanubeError) as raised:
        call()
    return raised.value.code


def test_an_assignment_to_another_broker_redirects_to_its_registration() -> None:
    located = lookup_from_view(T, ViewFacts("2", False, OTHER), ME)
    assert located == Located(Answer.REDIRECT, "http://b2:6650", "http://proxy:6650")


def test_a_pending_marker_or_an_assignment_here_is_unavailable_without_the_store() -> None:
    assert code(lambda: lookup_from_view(T, ViewFacts(None, True, None), ME)) is (
        ErrorCode.UNAVAILABLE
    )
    assert code(lambda: lookup_from_view(T, ViewFacts(ME, False, None), ME)) is (
        ErrorCode.UNAVAILABLE
    )


def test_what_the_view_cannot_tell_goes_to_the_store() -> None:
    # no assignment and no marker: the topic may not exist, or the view lags
    assert lookup_from_view(T, ViewFacts(None, False, None), ME) is None
    # the assignee's registration not seen (or without a URL)
    assert lookup_from_view(T, ViewFacts("2", False, None), ME) is None
    assert lookup_from_view(T, ViewFacts("2", False, {"admin_addr": "x"}), ME) is None


def kv(key: str, value: Any, revision: int) -> KeyValue:
    return KeyValue(key, value, revision, revision, 1, None)


def test_the_load_managers_view_keeps_each_registration_until_it_goes() -> None:
    manager = LoadManager(ME, LoadManagerConfig())
    manager.resync([kv(keys.register_key("2"), OTHER, 5)], 0)
    assert manager.registration("2") == OTHER
    assert manager.registration("3") is None
    value = {"broker_url": "http://b3:6650"}
    manager.observe(WatchEvent("put", keys.register_key("3"), value, 6, None), 0)
    assert manager.registration("3") == value
    manager.observe(WatchEvent("delete", keys.register_key("2"), None, 7, OTHER), 0)
    assert manager.registration("2") is None


class _Core:
    class identity:
        broker_url = "http://b1:6650"
        connect_url = "http://b1:6650"

    def serves(self, topic: str) -> bool:
        return False


class _NoStore:
    """A store the lookup must not read."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the lookup read the store ({name})")


def test_the_cluster_placement_answers_from_the_view_without_reading_the_store() -> None:
    placement = ClusterPlacement(_Core(), _NoStore(), ME, auto_create_topics=True)  # type: ignore[arg-type]
    placement.view = lambda topic: ViewFacts("2", False, OTHER)
    located = asyncio.run(placement.lookup(T))
    assert located.answer is Answer.REDIRECT and located.broker_url == "http://b2:6650"
    placement.view = lambda topic: ViewFacts(None, True, None)
    with pytest.raises(DanubeError) as raised:
        asyncio.run(placement.lookup(T))
    assert raised.value.code is ErrorCode.UNAVAILABLE


def test_create_and_subscribe_for_a_topic_being_assigned_are_answered_from_the_view() -> None:
    """Issue 23 point 4: each CreateProducer retry of a failover's producers read the store
    twice on the broker it reached; the view tells as much without a read."""
    placement = ClusterPlacement(_Core(), _NoStore(), ME, auto_create_topics=True)  # type: ignore[arg-type]
    for seen in (ViewFacts(None, True, None), ViewFacts(ME, False, None)):
        placement.view = lambda topic, seen=seen: seen
        with pytest.raises(DanubeError) as raised:
            asyncio.run(placement.route(T, None))
        assert raised.value.code is ErrorCode.UNAVAILABLE
        assert "being assigned" in str(raised.value)
    placement.view = lambda topic: ViewFacts("2", False, OTHER)
    with pytest.raises(DanubeError) as raised:
        asyncio.run(placement.route(T, None))
    assert raised.value.code is ErrorCode.UNAVAILABLE
    assert "look it up again" in str(raised.value)


def test_what_the_view_cannot_tell_of_a_create_goes_to_the_store() -> None:
    """No assignment and no marker (the topic may not exist: a create makes it), or a
    deletion's marker: the view does not answer."""
    assert route_from_view(T, ViewFacts(None, False, None), ME) is None
    assert route_from_view(T, ViewFacts(None, True, None, deleting=True), ME) is None
    placement = ClusterPlacement(_Core(), _NoStore(), ME, auto_create_topics=True)  # type: ignore[arg-type]
    placement.view = lambda topic: ViewFacts(None, False, None)
    with pytest.raises(AssertionError, match="read the store"):
        asyncio.run(placement.route(T, None))

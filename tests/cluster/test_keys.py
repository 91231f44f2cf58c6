"""Danube's `/cluster/` key layout and the unassigned marker values (danube-reference.md §6.2)."""

from __future__ import annotations

from typing import Any

import pytest

from danube.machines.cluster import keys
from danube.machines.cluster.keys import Marker, MarkerReason
from danube.metadata.model import Compare


def test_keys_are_danubes_paths_and_parse_back() -> None:
    assert keys.register_key("42") == "/cluster/register/42"
    assert keys.state_key("42") == "/cluster/brokers/42/state"
    assert keys.assignment_key("42", "/default/orders") == "/cluster/brokers/42/default/orders"
    assert keys.unassigned_key("/default/orders") == "/cluster/unassigned/default/orders"
    assert keys.load_key("42") == "/cluster/load/42"
    assert keys.history_key(1_700_000_000) == "/cluster/rebalancing_history/1700000000"
    assert keys.LEADER_KEY == "/cluster/leader"

    assert keys.parse_register_key("/cluster/register/42") == "42"
    assert keys.parse_state_key("/cluster/brokers/42/state") == "42"
    assert keys.parse_assignment_key("/cluster/brokers/42/default/orders") == (
        "42",
        "/default/orders",
    )
    assert keys.parse_unassigned_key("/cluster/unassigned/default/orders") == "/default/orders"
    assert keys.parse_load_key("/cluster/load/42") == "42"
    assert keys.parse_history_key("/cluster/rebalancing_history/1700000000") == 1_700_000_000


@pytest.mark.parametrize(
    "key",
    [
        "/cluster/leader",
        "/cluster/register/",
        "/cluster/register/a/b",
        "/cluster/brokers/42",
        "/cluster/brokers/42/default",
        "/cluster/brokers/42/default/a/b",
        "/cluster/brokers//default/orders",
        "/cluster/brokers/42/bad name/orders",
        "/cluster/unassigned/default",
        "/cluster/unassigned/default/a/b",
        "/cluster/load/",
        "/cluster/rebalancing_history/abc",
        "/cluster/loadx/42",
        "/namespaces/default/policy",
    ],
)
def test_other_keys_parse_as_nothing(key: str) -> None:
    parsers = (
        keys.parse_register_key,
        keys.parse_state_key,
        keys.parse_assignment_key,
        keys.parse_unassigned_key,
        keys.parse_load_key,
        keys.parse_history_key,
    )
    assert [parse(key) for parse in parsers] == [None] * len(parsers)


def test_state_key_is_not_an_assignment_but_a_namespace_called_state_is() -> None:
    assert keys.parse_assignment_key("/cluster/brokers/7/state") is None
    assert keys.parse_assignment_key("/cluster/brokers/7/state/t") == ("7", "/state/t")
    assert keys.parse_state_key("/cluster/brokers/7/state/t") is None


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (keys.register_key, ""),
        (keys.load_key, "a/b"),
        (lambda topic: keys.unassigned_key(topic), "default/orders"),
        (lambda topic: keys.assignment_key("1", topic), "/default"),
        (keys.history_key, -1),
    ],
)
def test_malformed_names_are_refused_when_building_keys(build: Any, argument: Any) -> None:
    with pytest.raises(ValueError):
        build(argument)


def test_leader_compare_guards_on_this_brokers_id() -> None:
    assert keys.leader_compare("42") == Compare("/cluster/leader", "value", "==", "42")


def test_broker_ids_are_json_numbers_when_decimal() -> None:
    assert keys.broker_id_to_json("42") == 42
    assert keys.broker_id_to_json("b1") == "b1"
    assert keys.broker_id_from_json(42) == "42"
    assert keys.broker_id_from_json("b1") == "b1"
    assert [keys.broker_id_from_json(v) for v in (True, -1, "", "a/b", 1.5, None)] == [None] * 6


@pytest.mark.parametrize(
    ("state", "mode"),
    [
        ({"mode": "draining", "reason": "admin_unload"}, "draining"),
        ({"mode": "active"}, "active"),
        ({"reason": "boot"}, None),
        (None, None),
        ("drained", None),
    ],
)
def test_broker_mode_reads_the_state_value(state: Any, mode: str | None) -> None:
    assert keys.broker_mode(state) == mode


@pytest.mark.parametrize(
    ("value", "marker"),
    [
        (None, Marker()),
        (
            {"reason": "unload", "from_broker": 7, "ready": False},
            Marker(MarkerReason.UNLOAD, "7", ready=False),
        ),
        ({"reason": "unload", "from_broker": 7, "ready": True}, Marker(MarkerReason.UNLOAD, "7")),
        (
            # Danube's rebalance marker has no `ready`: the topic may be assigned at once.
            {"reason": "rebalance", "from_broker": 1, "to_broker": 2, "timestamp": 99},
            Marker(MarkerReason.REBALANCE, "1", "2", timestamp=99),
        ),
        (
            {"reason": "drain_redirect", "from_broker": "b3"},
            Marker(MarkerReason.DRAIN_REDIRECT, "b3"),
        ),
        ({"reason": "split_brain"}, Marker()),
        ({"reason": "new"}, Marker()),
        ("unload", Marker()),
        ({"reason": "unload", "from_broker": [1], "ready": "no"}, Marker(MarkerReason.UNLOAD)),
    ],
)
def test_markers_read_leniently_like_danube(value: Any, marker: Marker) -> None:
    assert Marker.from_json(value) == marker


@pytest.mark.parametrize(
    "marker",
    [
        Marker(),
        Marker(MarkerReason.UNLOAD, "7", ready=False),
        Marker(MarkerReason.REBALANCE, "1", "b2", ready=False, timestamp=1_700_000_000),
        Marker(MarkerReason.DRAIN_REDIRECT, "3"),
    ],
)
def test_markers_round_trip(marker: Marker) -> None:
    assert Marker.from_json(marker.to_json()) == marker


def test_marker_json_has_danubes_shape() -> None:
    assert Marker().to_json() is None
    assert Marker(MarkerReason.UNLOAD, "7", ready=False).to_json() == {
        "reason": "unload",
        "from_broker": 7,
        "ready": False,
    }
    assert Marker(MarkerReason.REBALANCE, "1", "2", ready=False, timestamp=5).to_json() == {
        "reason": "rebalance",
        "from_broker": 1,
        "to_broker": 2,
        "timestamp": 5,
        "ready": False,
    }
    assert Marker(MarkerReason.DRAIN_REDIRECT, "3").to_json() == {
        "reason": "drain_redirect",
        "from_broker": 3,
    }

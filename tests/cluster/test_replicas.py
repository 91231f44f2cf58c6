"""The replica-set record (`danube.machines.cluster.replicas`, spec/replication.md
"Configuration and where it lives"): its key, its JSON codec (round trips; anything malformed
is a `ReplicaSetError` and nothing else) and the pure rules the load manager applies with it
(replication factor, follower placement, promotion candidates)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube import keys
from danube.machines.cluster.replicas import (
    ReplicaSet,
    ReplicaSetError,
    place_followers,
    promotion_candidates,
    replication_factor,
)
from danube.values.names import TopicName
from tests.core.test_keys import PARSERS, TOPICS

BROKER_IDS = st.sampled_from(["1", "2", "3", "4", "5", "42", "b-7"])


@st.composite
def replica_sets(draw: st.DrawFn) -> ReplicaSet:
    owner = draw(BROKER_IDS)
    followers = draw(st.lists(BROKER_IDS, unique=True, max_size=4))
    in_sync = draw(st.lists(st.sampled_from(followers), unique=True) if followers else st.just([]))
    starts = sorted(draw(st.lists(st.integers(0, 2**40), max_size=4)))
    numbers = sorted(
        draw(st.sets(st.integers(1, 2**40), min_size=len(starts), max_size=len(starts)))
    )
    epoch = draw(st.integers(numbers[-1] if numbers else 0, 2**41))
    return ReplicaSet(
        epoch, owner, tuple(followers), tuple(in_sync), tuple(zip(numbers, starts, strict=True))
    )


# -- the key ------------------------------------------------------------------------------------


def test_the_key_lives_under_cluster_and_parses_back() -> None:
    assert keys.replicas_key("/default/orders") == "/cluster/replicas/default/orders"
    assert keys.parse_replicas_key("/cluster/replicas/default/orders") == "/default/orders"
    assert keys.replicas_key("/default/orders").startswith(keys.CLUSTER_PREFIX)


@pytest.mark.parametrize(
    "key",
    [
        "/cluster/replicas/default",
        "/cluster/replicas/default/a/b",
        "/cluster/replicas//orders",
        "/cluster/replicas/bad name/orders",
        "/cluster/unassigned/default/orders",
        "/topics/default/orders/replicas",
    ],
)
def test_other_keys_are_not_replica_sets(key: str) -> None:
    assert keys.parse_replicas_key(key) is None


def test_no_other_cluster_parser_reads_a_replica_set_key() -> None:
    key = keys.replicas_key("/default/orders")
    parsers = (
        keys.parse_register_key,
        keys.parse_state_key,
        keys.parse_assignment_key,
        keys.parse_unassigned_key,
        keys.parse_load_key,
        keys.parse_history_key,
    )
    assert [parse(key) for parse in parsers] == [None] * len(parsers)


@given(TOPICS)
def test_every_topics_key_parses_back_and_no_other_parser_reads_it(topic: TopicName) -> None:
    key = keys.replicas_key(topic.full)
    assert [parse.__name__ for parse in PARSERS if parse(key) is not None] == []
    assert keys.parse_replicas_key(key) == topic.full
    for other in (keys.unassigned_key(topic.full), keys.assignment_key("7", topic.full)):
        assert keys.parse_replicas_key(other) is None


def test_the_key_refuses_an_invalid_topic() -> None:
    with pytest.raises(ValueError):
        keys.replicas_key("default/orders")


# -- the codec ----------------------------------------------------------------------------------


@settings(max_examples=300)
@given(replica_sets())
def test_a_record_round_trips_through_json_text(record: ReplicaSet) -> None:
    text = json.dumps(record.to_json())
    assert ReplicaSet.from_json(json.loads(text)) == record


def test_the_stored_form_is_plain_json() -> None:
    record = ReplicaSet(7, "1", ("2", "3"), ("3",), ((5, 0), (7, 120)))
    assert record.to_json() == {
        "epoch": 7,
        "owner": "1",
        "followers": ["2", "3"],
        "in_sync": ["3"],
        "epochs": [[5, 0], [7, 120]],
    }


def test_unknown_fields_are_ignored_for_later_versions() -> None:
    value: Any = {**ReplicaSet(0, "1").to_json(), "lag": {"2": 3}}
    assert ReplicaSet.from_json(value) == ReplicaSet(0, "1")


GOOD: dict[str, Any] = {
    "epoch": 9,
    "owner": "1",
    "followers": ["2", "3"],
    "in_sync": ["2"],
    "epochs": [[4, 0], [9, 10]],
}


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("epoch", -1),
        ("epoch", True),
        ("epoch", 1.5),
        ("epoch", "9"),
        ("owner", ""),
        ("owner", "a/b"),
        ("owner", 1),
        ("owner", None),
        ("followers", "2"),
        ("followers", ["2", "2"]),
        ("followers", ["2", None]),
        ("in_sync", {"2": True}),
        ("in_sync", ["", "2"]),
        ("epochs", [[4]]),
        ("epochs", [[4, 0, 1]]),
        ("epochs", [[9, 0], [4, 10]]),  # epochs must grow
        ("epochs", [[4, 0], [4, 10]]),
        ("epochs", [[4, 10], [9, 0]]),  # offsets must not go back
        ("epochs", [[4, -1]]),
        ("epochs", [[4, 0], [10, 10]]),  # beyond the record's epoch
        ("epochs", None),
    ],
)
def test_a_malformed_field_is_refused_by_name(field: str, bad: Any) -> None:
    with pytest.raises(ReplicaSetError, match=field):
        ReplicaSet.from_json({**GOOD, field: bad})


@pytest.mark.parametrize("value", [None, [], "x", 3, {}, {"epoch": 0, "owner": "1"}])
def test_a_value_that_is_not_a_record_is_refused(value: Any) -> None:
    with pytest.raises(ReplicaSetError):
        ReplicaSet.from_json(value)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**41) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@settings(max_examples=400)
@given(st.fixed_dictionaries({}, optional={name: JSON for name in GOOD}) | JSON)
def test_any_json_reads_as_a_record_or_a_replica_set_error_only(value: Any) -> None:
    try:
        record = ReplicaSet.from_json(value)
    except ReplicaSetError:
        return
    assert ReplicaSet.from_json(record.to_json()) == record


@settings(max_examples=200)
@given(replica_sets(), st.sampled_from(sorted(GOOD)), JSON)
def test_a_field_replaced_by_anything_is_read_or_refused_cleanly(
    record: ReplicaSet, field: str, junk: Any
) -> None:
    value = {**record.to_json(), field: junk}
    try:
        ReplicaSet.from_json(value)
    except ReplicaSetError as error:
        assert field in str(error) or "epoch" in str(error)


def test_a_record_is_checked_when_built_too() -> None:
    with pytest.raises(ReplicaSetError):
        ReplicaSet(-1, "1")
    with pytest.raises(ReplicaSetError):
        ReplicaSet(0, "1", ("2", "2"))
    assert issubclass(ReplicaSetError, ValueError)


# -- the rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "active", "factor"),
    [
        (None, 0, 1),
        (None, 1, 1),
        (None, 2, 2),
        (None, 5, 2),
        (3, 2, 2),  # capped by the active brokers
        (3, 5, 3),
        (1, 5, 1),
    ],
)
def test_replication_factor_defaults_to_two_and_is_capped(
    configured: int | None, active: int, factor: int
) -> None:
    assert replication_factor(configured, active) == factor


@given(
    owner=BROKER_IDS,
    current=st.lists(BROKER_IDS, unique=True, max_size=4),
    alive=st.sets(BROKER_IDS),
    factor=st.integers(1, 5),
    ranked=st.lists(BROKER_IDS, unique=True),
)
def test_placement_keeps_live_followers_and_tops_up_by_rank(
    owner: str, current: list[str], alive: set[str], factor: int, ranked: list[str]
) -> None:
    followers = place_followers(owner, current, alive, factor, ranked)
    assert owner not in followers
    assert len(set(followers)) == len(followers)
    kept = [f for f in current if f != owner and f in alive]
    assert list(followers[: len(kept)]) == kept  # a live follower is never dropped
    added = followers[len(kept) :]
    assert len(followers) == max(len(kept), min(factor - 1, len(kept) + len(added)))
    eligible = [b for b in ranked if b != owner and b not in kept]
    assert list(added) == eligible[: len(added)]  # the least loaded first
    if len(followers) < factor - 1:
        assert added == tuple(eligible)  # short only when no broker is left
    assert place_followers(owner, followers, alive | set(added), factor, ranked) == followers


@given(replica_sets(), st.sets(BROKER_IDS))
def test_promotion_picks_only_alive_in_sync_members(record: ReplicaSet, alive: set[str]) -> None:
    candidates = promotion_candidates(record, alive)
    if record.sealed or (not record.in_sync and not record.epochs):
        assert candidates is None  # replication not running: any broker
    else:
        assert candidates is not None
        assert candidates == (set(record.in_sync) | {record.owner}) & alive
    assert promotion_candidates(None, alive) is None

"""A replication factor per namespace and per topic (issue 27 point 1; spec/replication.md,
"Replication factor"): our policy record under `/cluster/policies/`, the admin's flow that
writes it, and the load manager, which reads it through its watch of `/cluster/` and adds or
drops followers when a topic's factor changes (topic, else namespace, else the cluster's).

The rule is also checked over random worlds (factors set and cleared while brokers come and
go), with two planted bugs caught: placement that ignores the policies, and a trim that drops
the in-sync follower instead of one that is behind."""

from __future__ import annotations

import random
from typing import Any

import pytest

from danube import keys
from danube.effects import Outcome, StoreTxn, TxnAnswer
from danube.effects.flow import run_now
from danube.machines.cluster import policies, replicas
from danube.machines.cluster.load_manager import LoadManager, Log, SetFollowers
from danube.machines.cluster.policies import PolicyError, factor_from_json, resolve
from danube.testing import ManagerDriver
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import parse_topic
from tests.cluster.test_replica_placement import (
    ME,
    S,
    back,
    cluster,
    config,
    create,
    expire,
    of,
    owned,
    owner,
    record,
    shrink,
)

# -- the record and its keys -----------------------------------------------------------------------


def test_policy_keys_name_a_namespace_or_a_topic_and_parse_back() -> None:
    assert keys.cluster_policy_key("ns") == "/cluster/policies/ns"
    assert keys.cluster_policy_key("/ns/orders") == "/cluster/policies/ns/orders"
    assert keys.parse_cluster_policy_key("/cluster/policies/ns") == "ns"
    assert keys.parse_cluster_policy_key("/cluster/policies/ns/orders") == "/ns/orders"
    for other in ("/cluster/policies/", "/cluster/policies/a/b/c", "/cluster/policies/bad name"):
        assert keys.parse_cluster_policy_key(other) is None
    assert keys.parse_replicas_key("/cluster/policies/ns/orders") is None
    with pytest.raises(ValueError):
        keys.cluster_policy_key("bad name")


@pytest.mark.parametrize(
    "value", [None, 3, {}, {"replication_factor": 0}, {"replication_factor": "2"}, [2]]
)
def test_a_record_that_is_not_one_is_refused_with_why(value: Any) -> None:
    with pytest.raises(PolicyError, match="policy record"):
        factor_from_json(value)


def test_a_record_reads_back_and_ignores_fields_it_does_not_know() -> None:
    assert factor_from_json(policies.factor_to_json(3)) == 3
    assert factor_from_json({"replication_factor": 1, "later": True}) == 1


def test_the_topic_wins_over_its_namespace_over_the_cluster_over_the_default() -> None:
    factors = {"ns": 3, "/ns/own": 1}
    assert resolve("/ns/own", factors, 2) == (1, policies.TOPIC)
    assert resolve("/ns/other", factors, 2) == (3, policies.NAMESPACE)
    assert resolve("/elsewhere/t", factors, 2) == (2, policies.CLUSTER)
    assert resolve("/elsewhere/t", factors, None) == (None, policies.DEFAULT)


# -- the admin's flow ------------------------------------------------------------------------------


def _namespace(d: ManagerDriver, namespace: str, *topics: str) -> None:
    d.store.put(keys.namespace_policy(namespace), {})
    for topic in topics:
        d.store.put(keys.namespace_topic(parse_topic(topic)), None)


def set_factor(d: ManagerDriver, name: str, factor: int | None, now: int = 0) -> list[Any]:
    """The admin's SetReplicationFactor, then the load manager sees it."""
    assert run_now(policies.set_factor(name, factor), d.store.perform) == factor
    return d.settle(now)


def test_the_flow_writes_clears_and_refuses_what_does_not_exist() -> None:
    d = cluster("1", "2")
    _namespace(d, "ns", "/ns/x")
    set_factor(d, "ns", 2)
    set_factor(d, "/ns/x", 1)
    assert d.store.value(keys.cluster_policy_key("/ns/x")) == {"replication_factor": 1}
    assert run_now(policies.read_factors("/ns/x"), d.store.perform) == (1, 2)
    set_factor(d, "/ns/x", None)
    assert keys.cluster_policy_key("/ns/x") not in d.store.data
    assert run_now(policies.read_factors("/ns/x"), d.store.perform) == (None, 2)
    for name, factor, code in (
        ("nope", 2, ErrorCode.NOT_FOUND),
        ("/ns/missing", 2, ErrorCode.NOT_FOUND),
        ("ns", 0, ErrorCode.INVALID_ARGUMENT),
        ("ns", policies.MAX_FACTOR + 1, ErrorCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(DanubeError) as caught:
            run_now(policies.set_factor(name, factor), d.store.perform)
        assert caught.value.code is code, (name, factor)


# -- the load manager ------------------------------------------------------------------------------


def followers(d: ManagerDriver, topic: str) -> tuple[str, ...]:
    found = record(d, topic)
    assert found is not None
    return found.followers


def test_raising_and_lowering_a_topics_factor_adds_and_drops_followers() -> None:
    d = cluster("1", "2", "3", "4")
    _namespace(d, "ns", "/ns/x")
    create(d, "/ns/x")
    holder = owner(d, "/ns/x")
    assert holder is not None and len(followers(d, "/ns/x")) == 1  # the default: 2
    effects = set_factor(d, "/ns/x", 3)
    assert len(of(effects, SetFollowers)) == 1
    assert len(followers(d, "/ns/x")) == 2 and holder not in followers(d, "/ns/x")
    set_factor(d, "/ns/x", 4)
    assert set(followers(d, "/ns/x")) == {"1", "2", "3", "4"} - {holder}
    set_factor(d, "/ns/x", 2)
    assert len(followers(d, "/ns/x")) == 1
    set_factor(d, "/ns/x", 1)  # no replication: the owner acknowledges alone
    assert followers(d, "/ns/x") == ()
    assert owner(d, "/ns/x") == holder and not d.failed


def test_a_namespaces_factor_applies_to_its_topics_unless_one_sets_its_own() -> None:
    d = cluster("1", "2", "3", "4")
    _namespace(d, "ns", "/ns/a", "/ns/b")
    _namespace(d, "other", "/other/c")
    for topic in ("/ns/a", "/ns/b", "/other/c"):
        create(d, topic)
    set_factor(d, "/ns/b", 1)
    set_factor(d, "ns", 3)
    assert len(followers(d, "/ns/a")) == 2
    assert followers(d, "/ns/b") == ()  # its own factor wins
    assert len(followers(d, "/other/c")) == 1  # another namespace: the default
    set_factor(d, "/ns/b", None)  # cleared: the namespace's applies again
    assert len(followers(d, "/ns/b")) == 2
    create(d, "/ns/new")  # a new topic is created with its namespace's factor
    assert len(followers(d, "/ns/new")) == 2


def test_the_clusters_factor_applies_where_no_policy_says_otherwise() -> None:
    d = cluster("1", "2", "3", "4", cfg=config(factor=3))
    _namespace(d, "ns", "/ns/x")
    create(d, "/ns/x")
    assert len(followers(d, "/ns/x")) == 2
    set_factor(d, "ns", 1)
    assert followers(d, "/ns/x") == ()


def test_the_factor_stays_capped_by_active_brokers_and_a_cap_never_drops_a_copy() -> None:
    d = cluster("1", "2", "3")
    _namespace(d, "ns", "/ns/x")
    owned(d, "/ns/x", "1", ("2",))
    set_factor(d, "/ns/x", 5)
    assert followers(d, "/ns/x") == ("2", "3")
    expire(d, "3")  # 2 active now: RF 5 capped at 2, the dead follower goes
    assert followers(d, "/ns/x") == ("2",)
    back(d, "3")
    assert followers(d, "/ns/x") == ("2", "3")


def test_lowering_the_factor_keeps_the_in_sync_follower() -> None:
    d = cluster("1", "2", "3", "4")
    _namespace(d, "ns", "/ns/x")
    owned(d, "/ns/x", "1", ("3", "4"))
    shrink(d, "/ns/x", ("4",))  # 3 fell behind
    set_factor(d, "/ns/x", 2)
    assert followers(d, "/ns/x") == ("4",)


def test_the_load_manager_learns_policies_from_a_resync_too() -> None:
    d = cluster("1", "2", "3", "4")
    _namespace(d, "ns", "/ns/x")
    set_factor(d, "ns", 3)
    fresh = ManagerDriver(LoadManager(ME, config()), d.store)
    fresh.run(fresh.manager.resync(d.store.snapshot(), 0))
    fresh.delivered = len(d.store.events)
    fresh.run(fresh.manager.became_leader(0))
    create(fresh, "/ns/x")
    assert len(followers(fresh, "/ns/x")) == 2


def test_an_unreadable_record_is_logged_and_counts_as_absent() -> None:
    d = cluster("1", "2", "3")
    _namespace(d, "ns", "/ns/x")
    create(d, "/ns/x")
    d.store.put(keys.cluster_policy_key("/ns/x"), {"replication_factor": "three"})
    effects = d.settle(0)
    (log,) = [e for e in of(effects, Log) if e.event == "policy_rejected"]
    assert "/cluster/policies/ns/x" in log.detail
    assert len(followers(d, "/ns/x")) == 1


# -- random worlds and their planted bugs ----------------------------------------------------------


class _IgnoresPolicies(LoadManager):
    """Planted bug: placement reads the cluster's factor only."""

    def _place(self, topic: str, owner: str, current: tuple[str, ...]) -> tuple[str, ...]:
        saved, self._replicas.factors = self._replicas.factors, {}
        try:
            return super()._place(topic, owner, current)
        finally:
            self._replicas.factors = saved


class _TrimsTheInSyncFollower(LoadManager):
    """Planted bug: a trim keeps the followers that are behind, not the in-sync ones."""

    def _place(self, topic: str, owner: str, current: tuple[str, ...]) -> tuple[str, ...]:
        seen = self._replicas.seen.get(topic)
        in_sync = seen[0].in_sync if seen and seen[0] else ()
        behind = tuple(f for f in current if f not in in_sync)
        original = replicas.place_followers

        def place(*args: Any, **kwargs: Any) -> tuple[str, ...]:
            kwargs["in_sync"] = behind
            return original(*args, **kwargs)

        replicas.place_followers = place
        try:
            return super()._place(topic, owner, current)
        finally:
            replicas.place_followers = original


def policy_world(seed: int, manager: type[LoadManager] = LoadManager) -> str | None:
    """Topics are created in two namespaces; namespace and topic factors are set and cleared,
    brokers expire and come back, owners record in-sync sets. Once calm, every topic has as
    many followers as its factor asks and the brokers allow, and a trim kept the in-sync
    followers. Returns what is wrong, if anything."""
    rng = random.Random(seed)
    brokers = ["1", "2", "3", "4", "5"]
    d = cluster(*brokers, cfg=config(factor=rng.choice([None, 1, 2, 3])), manager=manager)
    for namespace in ("a", "b"):
        _namespace(d, namespace)
    up, topics, factors = set(brokers), [], {}
    now = 0
    for step in range(rng.randint(10, 40)):
        now += rng.randint(0, 2) * S
        choice = rng.random()
        if choice < 0.25 or not topics:
            topic = f"/{rng.choice('ab')}/t{step}"
            _namespace(d, topic.split("/")[1], topic)
            create(d, topic, now)
            topics.append(topic)
        elif choice < 0.55:
            name = rng.choice([*topics, "a", "b"])
            factors[name] = rng.choice([None, 1, 2, 3, 4, 5])
            before = record(d, name) if name.startswith("/") else None
            set_factor(d, name, factors[name], now)
            after = record(d, name) if name.startswith("/") else None
            if (
                before is not None
                and after is not None
                and len(after.followers) < len(before.followers)
            ):
                synced = [f for f in before.followers if f in before.in_sync and f in up]
                lost = [f for f in synced if f not in after.followers]
                kept_behind = [f for f in after.followers if f not in before.in_sync]
                if lost and kept_behind:
                    return f"seed {seed}: lowering {name} dropped in-sync {lost} for {kept_behind}"
        elif choice < 0.7:
            topic = rng.choice(topics)
            found = record(d, topic)
            if found is not None and found.followers:
                shrink(d, topic, (rng.choice(found.followers),), now)
        elif choice < 0.85 and len(up) > 2:
            broker = rng.choice(sorted(up - {ME}))
            up.discard(broker)
            expire(d, broker, now=now)
        elif set(brokers) - up:
            broker = rng.choice(sorted(set(brokers) - up))
            up.add(broker)
            back(d, broker, now)
        if d.tick_at is not None and d.tick_at <= now:
            d.tick(now)
    for _ in range(4):
        now += 2 * S
        d.tick(now)
    configured = d.manager.config.replication_factor
    live = {name: f for name, f in factors.items() if f is not None}
    for topic in topics:
        holder, found = owner(d, topic), record(d, topic)
        if holder is None and keys.unassigned_key(topic) in d.store.data:
            continue  # its in-sync members are gone: unavailable (the promotion rule's)
        if holder is None or found is None:
            return f"seed {seed}: {topic} is not assigned with a replica set"
        wanted = resolve(topic, live, configured)[0]
        count = len(found.followers)
        expected = min((wanted or 2) - 1, len(up) - 1)
        # The default rule and a cap only add: a topic may keep more than the default asks.
        if count < expected or (wanted is not None and count != expected):
            return f"seed {seed}: {topic} has {count} followers, factor {wanted}, up {len(up)}"
    return None


def test_followers_follow_the_policies_over_random_worlds() -> None:
    for seed in range(60):
        assert policy_world(seed) is None


@pytest.mark.parametrize("planted", [_IgnoresPolicies, _TrimsTheInSyncFollower])
def test_planted_bugs_of_the_policy_rule_are_caught(planted: type[LoadManager]) -> None:
    for seed in range(200):
        if policy_world(seed, planted) is not None:
            return
    raise AssertionError(f"{planted.__doc__} went unnoticed for 200 seeds")


def test_in_force_reads_a_namespace_as_its_topics_without_their_own() -> None:
    assert policies.in_force("/ns/t", 1, 3, 2) == (1, policies.TOPIC)
    assert policies.in_force("/ns/t", None, 3, 2) == (3, policies.NAMESPACE)
    assert policies.in_force("/ns/t", None, None, 2) == (2, policies.CLUSTER)
    assert policies.in_force("ns", 3, 3, 2) == (3, policies.NAMESPACE)
    assert policies.in_force("ns", None, None, None) == (None, policies.DEFAULT)


@pytest.mark.parametrize("landed", [True, False])
def test_an_unanswered_write_is_read_back(landed: bool) -> None:
    d = cluster("1", "2")
    _namespace(d, "ns")
    key = keys.cluster_policy_key("ns")

    def perform(effect: Any) -> Any:
        if not isinstance(effect, StoreTxn):
            return d.store.perform(effect)
        if landed:
            d.store.txn(effect.compares, effect.ops)
        return TxnAnswer(Outcome.UNKNOWN, {key: d.store.data.get(key)})

    if landed:
        assert run_now(policies.set_factor("ns", 3), perform) == 3
    else:
        with pytest.raises(DanubeError) as caught:
            run_now(policies.set_factor("ns", 3), perform)
        assert caught.value.code is ErrorCode.UNAVAILABLE

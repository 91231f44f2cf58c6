"""The administrator's cluster writes (danube.machines.cluster.admin_ops) against the load manager
and a model store: unloading a topic, draining a broker to `drained`, activating it, deleting a
topic (owned, unassigned, or left behind by a dead owner), and the owner's side of a
deletion (danube.machines.cluster.ownership)."""

from __future__ import annotations

from danube.keys import cluster_policy_key
from danube.machines.cluster import admin_ops, keys
from danube.machines.cluster.admin_ops import Step
from danube.machines.cluster.keys import Marker, MarkerReason
from danube.machines.cluster.load_manager import Assign, MarkDrained, Release
from danube.machines.cluster.ownership import (
    Claim,
    Load,
    Ownership,
    OwnershipConfig,
    Unload,
    owner_key,
)
from danube.machines.cluster.ownership import Release as OwnerRelease
from danube.machines.node import paths
from danube.machines.tiering import layout as tier_layout
from danube.metadata.model import Put
from danube.testing import ManagerDriver
from danube.values.names import parse_topic
from tests.cluster.test_load_manager import ME, cluster, create, give, of, owner

T = "/default/orders"
MARKER = keys.unassigned_key(T)


def run(d: ManagerDriver, txn: admin_ops.Txn) -> bool:
    ok = d.store.txn(txn.compares, txn.ops)
    d.settle(0)
    return ok


def assignment_revision(d: ManagerDriver, broker: str, topic: str) -> int:
    return d.store.data[keys.assignment_key(broker, topic)].mod_revision


def owner_lets_go(d: ManagerDriver, topic: str) -> None:
    """What the owner's Release does to the marker (danube.machines.cluster.ownership)."""
    marker = Marker.from_json(d.store.value(keys.unassigned_key(topic)))
    d.store.put(keys.unassigned_key(topic), Marker(marker.reason, marker.from_broker).to_json())
    d.settle(0)


def mode(d: ManagerDriver, broker: str) -> str | None:
    kv = d.store.data.get(keys.state_key(broker))
    return keys.broker_mode(kv.value) if kv is not None else None


# -- unload ---------------------------------------------------------------------------------------


def test_an_unloaded_topic_waits_for_its_owner_then_goes_to_another_broker() -> None:
    d = cluster("1", "2", "3")
    give(d, "2", T)
    assert run(d, admin_ops.unload(ME, T, "2", assignment_revision(d, "2", T)))
    assert d.store.value(MARKER) == {"reason": "unload", "from_broker": 2, "ready": False}
    assert owner(d, T) is None  # not assigned while the owner seals it
    owner_lets_go(d, T)
    assert owner(d, T) in ("1", "3")
    assert d.manager.owner(T) == (owner(d, T), assignment_revision(d, owner(d, T), T))


def test_an_unload_from_a_stale_view_or_over_another_move_changes_nothing() -> None:
    d = cluster("1", "2")
    give(d, "2", T)
    stale = assignment_revision(d, "2", T) - 1
    assert not run(d, admin_ops.unload(ME, T, "2", stale))
    d.store.put(MARKER, Marker(MarkerReason.REBALANCE, "2", "1", ready=False).to_json())
    assert not run(d, admin_ops.unload(ME, T, "2", assignment_revision(d, "2", T)))
    assert owner(d, T) == "2"


def test_only_the_leader_writes_a_mode() -> None:
    d = cluster("1", "2", leader=False)
    assert not run(d, admin_ops.set_mode(ME, "2", keys.DRAINING, "admin_unload"))
    assert mode(d, "2") is None


def test_namespace_filters_accept_every_spelling() -> None:
    topics = ["/a/x", "/b/y", "/c/z"]
    assert admin_ops.selected(topics, [], []) == topics
    assert admin_ops.selected(topics, ["a", "/b/"], []) == ["/a/x", "/b/y"]
    assert admin_ops.selected(topics, [], ["/b"]) == ["/a/x", "/c/z"]


# -- drain ----------------------------------------------------------------------------------------


def test_a_drained_broker_is_marked_drained_once_its_last_unload_finished() -> None:
    d = cluster("1", "2", "3")
    give(d, "2", T, "/default/other")
    assert run(d, admin_ops.set_mode(ME, "2", keys.DRAINING, "admin_unload"))
    for topic in (T, "/default/other"):
        assert run(d, admin_ops.unload(ME, topic, "2", assignment_revision(d, "2", topic)))
    owner_lets_go(d, T)
    assert mode(d, "2") == keys.DRAINING  # the other unload still needs broker 2
    owner_lets_go(d, "/default/other")
    assert mode(d, "2") == keys.DRAINED
    assert [e.broker for e in of(d.effects, MarkDrained)] == ["2"]
    assert {owner(d, T), owner(d, "/default/other")} <= {"1", "3"}


def test_a_draining_or_drained_broker_gets_no_new_topic_until_activated() -> None:
    d = cluster("1", "2")
    run(d, admin_ops.set_mode(ME, "2", keys.DRAINING, "admin_unload"))
    assert mode(d, "2") == keys.DRAINED  # nothing to unload: drained at once
    for i in range(3):
        create(d, f"/default/t{i}")
    assert {a.broker for a in of(d.effects, Assign)} == {"1"}
    assert d.manager.active() == ["1"]
    run(d, admin_ops.set_mode(ME, "2", keys.ACTIVE, "admin_activate"))
    assert mode(d, "2") == keys.ACTIVE
    create(d, "/default/after")
    assert owner(d, "/default/after") == "2"


def test_an_active_broker_without_topics_is_left_active() -> None:
    d = cluster("1", "2")
    d.settle(0)
    assert not of(d.effects, MarkDrained)


# -- delete ---------------------------------------------------------------------------------------


def topic_metadata(d: ManagerDriver, topic: str) -> None:
    name = parse_topic(topic)
    d.store.put(paths.topic_delivery(name), "Reliable")
    d.store.put(paths.cursor(name, "s"), 4)
    d.store.put(paths.namespace_topic(name), None)
    d.store.put(tier_layout.index_path(name, 0), {"key": "x"})
    d.settle(0)


def step(d: ManagerDriver, topic: str = T) -> admin_ops.Decision:
    return admin_ops.delete_step(
        ME, topic, d.manager.owner(topic), d.manager.marker(topic), d.manager.registered()
    )


def test_deleting_an_owned_topic_waits_for_the_owner_then_purges_everything() -> None:
    d = cluster("1", "2")
    topic_metadata(d, T)
    topic_metadata(d, "/default/kept")
    for name in (T, "/default/kept"):  # their own replication factors
        d.store.put(cluster_policy_key(name), {"replication_factor": 1})
    give(d, "2", T)
    first = step(d)
    assert first.step is Step.POST and first.txn is not None
    assert run(d, first.txn)
    assert d.store.value(MARKER) == {"reason": "delete", "from_broker": 2, "ready": False}
    assert step(d).step is Step.WAIT
    d.store.put(owner_key(T), {"broker_id": 2})  # the owner's claim still stands
    owner_lets_go(d, T)
    assert owner(d, T) is None  # a delete marker is never assigned
    purge = step(d)
    assert purge.step is Step.PURGE and purge.txn is not None
    assert not run(d, purge.txn)  # not while a claim stands
    d.store.delete(owner_key(T))
    assert run(d, purge.txn)
    left = sorted(d.store.data)
    assert not [k for k in left if "orders" in k]
    kept = parse_topic("/default/kept")
    assert {paths.topic_delivery(kept), paths.namespace_topic(kept)} <= set(left)
    assert cluster_policy_key("/default/kept") in left
    assert tier_layout.index_path(kept, 0) in left


def test_deleting_an_unassigned_topic_beats_its_pending_assignment() -> None:
    d = cluster("1", "2", leader=False)  # a follower's view: the marker stays pending
    topic_metadata(d, T)
    create(d, T)
    d.store.put(keys.LEADER_KEY, ME)  # elected; its load manager has not acted yet
    decision = step(d)
    assert decision.step is Step.POST and decision.txn is not None
    d.store.put(MARKER, None)  # rewritten meanwhile: the tombstone's compare fails
    assert not run(d, decision.txn)
    retry = step(d)
    assert retry.txn is not None and run(d, retry.txn)
    assert Marker.from_json(d.store.value(MARKER)) == Marker(MarkerReason.DELETE)
    assert step(d).step is Step.PURGE


def test_a_delete_marker_left_by_a_dead_owner_is_released_still_a_delete_marker() -> None:
    d = cluster("1", "2")
    give(d, "2", T)
    txn = step(d).txn
    assert txn is not None and run(d, txn)
    d.store.delete(keys.register_key("2"))  # the owner died before letting go
    d.settle(0)
    (release,) = of(d.effects, Release)
    assert Marker.from_json(d.store.value(MARKER)) == Marker(MarkerReason.DELETE, "2")
    assert release.topic == T and owner(d, T) is None
    assert step(d).step is Step.PURGE


def test_a_delete_marker_survives_json() -> None:
    marker = Marker(MarkerReason.DELETE, "7", ready=False)
    assert marker.to_json() == {"reason": "delete", "from_broker": 7, "ready": False}
    assert Marker.from_json(marker.to_json()) == marker


# -- the owner's side of a deletion ---------------------------------------------------------------


def test_the_owner_drops_a_deleted_topic_without_sealing_and_marks_the_tombstone_ready() -> None:
    o = Ownership(OwnershipConfig("1", retry_ms=500))
    o.member(7, 0)
    (claim,) = o.assignment_seen(T, True, 0)
    assert isinstance(claim, Claim)
    assert o.claim_done(T, True, 40, 0, known=True, token=claim.token) == [Load(T, 40)]
    o.loaded(T, 0)
    o.marker_seen(T, Marker(MarkerReason.DELETE, "1", ready=False), 50, 0)
    assert o.assignment_seen(T, False, 0) == [Unload(T, 40, deleted=True)]
    (release,) = o.unloaded(T, 0)
    assert isinstance(release, OwnerRelease)
    assert Put(MARKER, {"reason": "delete", "from_broker": 1, "ready": True}) in release.ops


def test_an_unload_is_not_a_deletion() -> None:
    o = Ownership(OwnershipConfig("1", retry_ms=500))
    o.member(7, 0)
    (claim,) = o.assignment_seen(T, True, 0)
    assert isinstance(claim, Claim)
    o.claim_done(T, True, 40, 0, known=True, token=claim.token)
    o.loaded(T, 0)
    o.marker_seen(T, Marker(MarkerReason.UNLOAD, "1", ready=False), 50, 0)
    assert o.assignment_seen(T, False, 0) == [Unload(T, 40, deleted=False)]


def test_unload_step_posts_once_then_waits_until_another_broker_has_it() -> None:
    assignment = ("2", 7)
    post = admin_ops.unload_step(ME, T, "2", assignment, None)
    assert post.step is Step.POST and post.txn is not None
    assert post.txn == admin_ops.unload(ME, T, "2", 7)
    moving = (Marker(MarkerReason.UNLOAD, "2", ready=False), 8)
    assert admin_ops.unload_step(ME, T, "2", assignment, moving).step is Step.WAIT
    assert admin_ops.unload_step(ME, T, "2", None, moving).step is Step.WAIT
    assert admin_ops.unload_step(ME, T, "2", ("3", 9), None).step is Step.DONE
    assert admin_ops.unload_step(ME, T, "2", None, None).step is Step.DONE, "deleted meanwhile"


def test_a_tombstone_decided_on_a_stale_view_does_not_outlive_the_purge() -> None:
    """Neither marker nor owner in the view: the tombstone lands only while the topic exists
    (the operator of the cluster run found one landing late, after the purge, left behind
    for good)."""
    d = cluster("1", "2")
    decision = admin_ops.delete_step(ME, T, None, None, d.manager.registered())
    assert decision.step is Step.POST and decision.txn is not None
    assert not run(d, decision.txn)  # gone already: nothing is left behind
    assert MARKER not in d.store.data
    topic_metadata(d, T)
    assert run(d, decision.txn)
    assert Marker.from_json(d.store.value(MARKER)) == Marker(MarkerReason.DELETE)


def test_a_tombstone_decided_before_an_assignment_landed_does_not_land_after_it() -> None:
    """The view showed neither marker nor owner; the topic was assigned meanwhile (its
    pending marker taken by the load manager) and the tombstone landed late: the purge then
    left a broker assigned a topic whose metadata was gone (the cluster run's seed 31,
    heavy profile, 5 brokers). The tombstone now finds no registered broker assigned it."""
    d = cluster("1", "2")
    topic_metadata(d, T)
    decision = admin_ops.delete_step(ME, T, None, None, d.manager.registered())
    assert decision.step is Step.POST and decision.txn is not None
    d.store.put(keys.assignment_key("2", T), None)  # assigned meanwhile
    assert not run(d, decision.txn)
    assert MARKER not in d.store.data
    d.store.delete(keys.assignment_key("2", T))
    assert run(d, decision.txn)

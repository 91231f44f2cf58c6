"""The admin flows (danube.machines.requests.admin) against the load manager and a model store, run
synchronously (`run_now`): routing to the leader, unloads, drains, deletions (the flow waits
for the owner to let go before it purges), broker modes with a lost answer read back, and
namespace policies merged under a compare that a concurrent change refuses."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from danube import keys as danube_keys
from danube.effects import Outcome, Sleep, StoreList, StoreRead, StoreTxn, TxnAnswer
from danube.effects.flow import Flow, run_now
from danube.machines.cluster import admin_ops, keys, records
from danube.machines.cluster.keys import Marker, MarkerReason
from danube.machines.cluster.replicas import ReplicaSet
from danube.machines.node import paths
from danube.machines.node.settings import merged_policies
from danube.machines.requests import admin as flows
from danube.metadata.model import Put
from danube.testing import ManagerDriver
from danube.values.errors import DanubeError, ErrorCode
from danube.values.names import parse_topic
from tests.cluster.test_load_manager import ME, cluster, give, owner

T = "/default/orders"


class Port:
    """Answers a flow's requests from the driver's store and view; `on_sleep` plays the rest
    of the cluster (an owner letting go) while the flow waits."""

    def __init__(self, d: ManagerDriver, *, leader: str | None = ME) -> None:
        self.d = d
        self.leader = leader
        self.clock = 0
        self.asked: list[Any] = []
        self.on_sleep: Callable[[], None] = lambda: None
        self.on_txn: Callable[[StoreTxn], Outcome | None] = lambda txn: None
        self.served_here = False
        self.view_lags_until = 0
        """Until then (ms on `clock`) the leader's view is not brought up to the store."""

    def settle(self) -> None:
        if self.clock >= self.view_lags_until:
            self.d.settle(0)

    def now(self) -> int:
        return self.clock

    def __call__(self, request: Any) -> Any:
        store = self.d.store
        if isinstance(request, StoreRead):
            return store.data.get(request.key)
        if isinstance(request, StoreList):
            return [kv for k, kv in sorted(store.data.items()) if k.startswith(request.prefix)]
        if isinstance(request, StoreTxn):
            forced = self.on_txn(request)
            ok = forced is None and store.txn(request.compares, request.ops)
            self.settle()
            if ok:
                return TxnAnswer(Outcome.COMMITTED, revision=store.revision)
            found = {key: store.data.get(key) for key in request.read_back}
            return TxnAnswer(forced or Outcome.REFUSED, found)
        if isinstance(request, flows.ReadView):
            return flows.Seen(self.leader, self.d.manager)
        if isinstance(request, Sleep):
            self.clock += request.ms
            self.on_sleep()
            self.settle()
            return None
        self.asked.append(request)
        if isinstance(request, flows.ServedHere):
            return self.served_here
        if isinstance(request, flows.Forward):
            return "the leader's reply"
        return None

    def run(self, flow: Flow[Any]) -> Any:
        return run_now(flow, self)


def mark_ready(d: ManagerDriver, topic: str) -> None:
    """The owner let go of `topic`: its marker becomes ready."""
    kv = d.store.data.get(keys.unassigned_key(topic))
    if kv is not None and kv.value is not None:
        marker = Marker.from_json(kv.value)
        if not marker.ready:
            d.store.put(kv.key, dataclasses.replace(marker, ready=True).to_json())


def created(d: ManagerDriver, topic: str, broker: str) -> None:
    name = parse_topic(topic)
    d.store.put(paths.topic_delivery(name), "reliable")
    d.store.put(paths.namespace_topic(name), {})
    give(d, broker, topic)


def _txn(txn: Any) -> tuple[Any, Any]:
    return txn.compares, txn.ops


def refused(port: Port, flow: Flow[Any]) -> DanubeError:
    with pytest.raises(DanubeError) as caught:
        port.run(flow)
    return caught.value


# -- routing ------------------------------------------------------------------------------------


def test_a_follower_forwards_to_the_leaders_registered_admin_port() -> None:
    d = cluster("1", "2")
    d.store.put(keys.register_key("2"), {"admin_addr": "http://two:50051"})
    port = Port(d, leader="2")
    here = port.run(flows.at_leader(ME, flows.run_here))
    assert here == "the leader's reply"
    assert port.asked == [flows.Forward("http://two:50051")]


def test_no_leader_or_no_admin_address_is_unavailable() -> None:
    d = cluster("1", "2")
    assert refused(Port(d, leader=None), flows.at_leader(ME, flows.run_here)).code is (
        ErrorCode.UNAVAILABLE
    )
    error = refused(Port(d, leader="2"), flows.at_leader(ME, flows.run_here))
    assert "admin address is not registered" in error.message


def test_the_leader_runs_the_call_itself() -> None:
    port = Port(cluster("1", "2"))
    assert port.run(flows.at_leader(ME, flows.run_here)) is None
    assert port.asked == [flows.RunHere()]


# -- unloads and drains -------------------------------------------------------------------------


def test_an_unload_waits_until_another_broker_has_the_topic() -> None:
    d = cluster("1", "2")
    created(d, T, "2")
    port = Port(d)
    port.on_sleep = lambda: mark_ready(d, T)
    port.run(flows.unload_topic(ME, T, port.now))
    assert owner(d, T) == "1"


def test_an_unload_that_nobody_finishes_is_under_way_after_the_wait() -> None:
    d = cluster("1", "2")
    created(d, T, "2")
    port = Port(d)
    error = refused(port, flows.unload_topic(ME, T, port.now))
    assert error.code is ErrorCode.UNAVAILABLE and "under way" in error.message
    assert port.clock >= flows.MOVE_WAIT_MS


def given_back(d: ManagerDriver) -> tuple[Port, list[StoreTxn]]:
    """A replicated topic on broker 2 whose follower (1) is not in sync: the leader can
    only give it back to 2, the broker holding everything acknowledged."""
    created(d, T, "2")
    d.store.put(danube_keys.replicas_key(T), ReplicaSet(7, "2", ("1",), (), ((7, 0),)).to_json())
    d.settle(0)
    port = Port(d)
    unloads: list[StoreTxn] = []

    def on_txn(txn: StoreTxn) -> None:
        if txn.purpose.startswith("unload"):
            unloads.append(txn)

    port.on_txn = on_txn
    return port, unloads


def test_an_unload_the_leader_gives_back_is_not_repeated_and_says_why() -> None:
    """The unload used to post again at every poll until its 30 s wait was over, the topic
    coming back each time with one claim and one epoch more in its replica set (20 a second
    in the simulator). It now waits for another broker to come in sync, and says why not."""
    d = cluster("1", "2")
    port, unloads = given_back(d)
    port.on_sleep = lambda: mark_ready(d, T)
    error = refused(port, flows.unload_topic(ME, T, port.now))
    assert error.code is ErrorCode.FAILED_PRECONDITION, error
    assert "gave /default/orders back to broker 2" in error.message
    assert len(unloads) == 1, f"{len(unloads)} unloads of a topic that can only come back"
    assert owner(d, T) == "2"


def test_a_given_back_topic_is_unloaded_again_once_a_follower_is_in_sync() -> None:
    d = cluster("1", "2")
    port, unloads = given_back(d)

    def on_sleep() -> None:
        mark_ready(d, T)
        if port.clock >= 2_000 and not d.manager.in_sync(T):  # the follower caught up
            d.store.put(
                danube_keys.replicas_key(T),
                ReplicaSet(7, "2", ("1",), ("1",), ((7, 0),)).to_json(),
            )

    port.on_sleep = on_sleep
    port.run(flows.unload_topic(ME, T, port.now))
    assert owner(d, T) == "1"
    assert len(unloads) == 2


def test_an_unload_decided_again_from_a_view_that_lags_is_not_posted_at_every_poll() -> None:
    """Seed 12 of the `peers` swarm: the unload committed, the leader's view went on showing
    the assignment it deleted for 1.3 s, and the same unload, refused, went out at every
    50 ms poll (26 times). It goes again only after a doubling wait (`admin.Reposts`)."""
    d = cluster("1", "2")
    created(d, T, "2")
    port = Port(d)
    port.view_lags_until = 1_000
    port.on_sleep = lambda: mark_ready(d, T)
    unloads: list[int] = []
    port.on_txn = lambda txn: (
        unloads.append(port.clock) if txn.purpose.startswith("unload") else None
    )
    port.run(flows.unload_topic(ME, T, port.now))
    assert owner(d, T) == "1"
    assert unloads == [0, 100, 300, 700], unloads


def test_unloading_an_unknown_topic_is_not_found() -> None:
    port = Port(cluster("1", "2"))
    assert refused(port, flows.unload_topic(ME, "/default/nope", port.now)).code is (
        ErrorCode.NOT_FOUND
    )


def test_a_leader_that_stops_leading_mid_way_says_so() -> None:
    d = cluster("1", "2")
    created(d, T, "2")
    port = Port(d)

    def deposed() -> None:
        port.leader = "2"

    port.on_sleep = deposed
    error = refused(port, flows.unload_topic(ME, T, port.now))
    assert "stopped leading" in error.message


def test_a_drain_marks_the_broker_draining_and_moves_each_topic() -> None:
    d = cluster("1", "2")
    for topic in ("/a/x", "/b/y"):
        created(d, topic, "2")
    port = Port(d)
    port.on_sleep = lambda: [mark_ready(d, t) for t in ("/a/x", "/b/y")]
    plan = port.run(flows.plan_drain(ME, "2", ("a",), (), dry_run=False))
    assert plan.topics == ["/a/x"]
    mode = d.store.value(keys.state_key("2"))
    assert mode == records.state_value(records.DRAINING, "admin_unload")
    assert port.run(flows.drain_topic(ME, "2", "/a/x", port.now)) is True
    assert owner(d, "/a/x") == "1" and owner(d, "/b/y") == "2"


def test_a_dry_run_drain_writes_nothing() -> None:
    d = cluster("1", "2")
    created(d, T, "2")
    revision = d.store.revision
    plan = Port(d).run(flows.plan_drain(ME, "2", (), (), dry_run=True))
    assert plan.topics == [T] and d.store.revision == revision


def test_draining_the_only_active_broker_is_refused() -> None:
    d = cluster("1")
    error = refused(Port(d), flows.plan_drain(ME, "1", (), (), dry_run=False))
    assert error.code is ErrorCode.FAILED_PRECONDITION


def test_a_mode_change_whose_answer_was_lost_counts_when_it_landed() -> None:
    d = cluster("1", "2")
    port = Port(d)

    def lost_after_landing(txn: StoreTxn) -> Outcome | None:
        d.store.txn(txn.compares, txn.ops)
        return Outcome.UNKNOWN

    port.on_txn = lost_after_landing
    port.run(flows.activate(ME, "2", ""))
    assert d.store.value(keys.state_key("2")) == records.state_value("active", "admin_activate")


def test_a_mode_change_that_did_not_land_is_unavailable() -> None:
    port = Port(cluster("1", "2"))
    port.on_txn = lambda txn: Outcome.UNKNOWN
    assert refused(port, flows.activate(ME, "2", "")).code is ErrorCode.UNAVAILABLE


# -- deletion -----------------------------------------------------------------------------------


def test_a_deletion_waits_for_the_owner_then_purges_and_deletes_the_objects() -> None:
    d = cluster("1", "2")
    created(d, T, "2")
    port = Port(d)
    seen_owner_let_go: list[bool] = []

    def owner_lets_go() -> None:
        seen_owner_let_go.append(True)
        mark_ready(d, T)

    port.on_sleep = owner_lets_go
    assert port.run(flows.delete_topic(ME, T, port.now)) == [T]
    assert seen_owner_let_go
    name = parse_topic(T)
    assert not [k for k in d.store.data if k.startswith(paths.topic_prefix(name))]
    assert keys.unassigned_key(T) not in d.store.data
    assert paths.namespace_topic(name) not in d.store.data
    assert owner(d, T) is None
    assert port.asked == [flows.DeleteObjects(T)]


def test_a_purge_whose_answer_was_lost_is_read_back() -> None:
    d = cluster("1", "2")
    created(d, T, "2")
    port = Port(d)
    port.on_sleep = lambda: mark_ready(d, T)

    def lost(txn: StoreTxn) -> Outcome | None:
        if txn.purpose.startswith("purge"):
            d.store.txn(txn.compares, txn.ops)
            return Outcome.UNKNOWN
        return None

    port.on_txn = lost
    assert port.run(flows.delete_topic(ME, T, port.now)) == [T]
    assert port.asked == [flows.DeleteObjects(T)]


def test_a_second_deletion_finds_the_topic_gone_when_its_step_is_refused() -> None:
    """Seed 11 of the `peers` swarm: a second deletion of one topic (its first step lost)
    decided a tombstone, compared on the topic's record, which the first deletion had
    purged: refused at every poll for 30 s, then "not finished; run it again". The
    refusal's read-back finds the record gone: the topic is deleted."""
    d = cluster("1", "2")
    created(d, T, "2")
    first = Port(d)
    first.on_sleep = lambda: mark_ready(d, T)
    assert first.run(flows.delete_topic(ME, T, first.now)) == [T]
    second = Port(d)
    posted: list[str] = []
    second.on_txn = lambda txn: posted.append(txn.purpose) and None
    assert second.run(flows.delete_one(ME, T, flows.MOVE_WAIT_MS, second.now)) is True
    assert posted == [f"delete {T}"]
    assert second.asked == []  # the first deletion deletes the objects


def test_a_purge_refused_because_another_deletion_purged_it_is_done() -> None:
    """Seed 2 of the `peers` swarm: a second deletion's view still showed the ready delete
    marker the first had purged, and it purged again at every poll until its deadline."""
    d = cluster("1", "2")
    created(d, T, "2")
    d.store.txn(
        *_txn(
            admin_ops.unload(
                ME,
                T,
                "2",
                d.store.data[keys.assignment_key("2", T)].mod_revision,
                reason=MarkerReason.DELETE,
            )
        )
    )
    mark_ready(d, T)
    d.settle(0)
    marker = d.store.data[keys.unassigned_key(T)].mod_revision
    assert d.store.txn(*_txn(admin_ops.purge(ME, T, marker)))  # the first deletion's purge
    port = Port(d)
    port.view_lags_until = flows.MOVE_WAIT_MS * 2  # the view keeps showing the marker
    purges: list[int] = []
    port.on_txn = lambda txn: purges.append(port.clock) if txn.purpose.startswith("purge") else None
    assert port.run(flows.delete_one(ME, T, flows.MOVE_WAIT_MS, port.now)) is True
    assert purges == [0]
    assert port.asked == []


def test_deleting_an_unknown_topic_is_not_found() -> None:
    port = Port(cluster("1", "2"))
    assert refused(port, flows.delete_topic(ME, "/default/nope", port.now)).code is (
        ErrorCode.NOT_FOUND
    )


# -- policies -----------------------------------------------------------------------------------


def test_namespace_policies_are_merged_with_the_stores_and_a_race_is_read_again() -> None:
    d = cluster("1")
    key = paths.namespace_policy("default")
    d.store.put(key, merged_policies(None, {"max_producers_per_topic": 3}))
    port = Port(d)
    raced: list[bool] = []

    def concurrent_change(txn: StoreTxn) -> Outcome | None:
        if not raced:
            raced.append(True)
            d.store.txn(
                (), (Put(key, merged_policies(d.store.value(key), {"max_publish_rate": 9})),)
            )
        return None

    port.on_txn = concurrent_change
    merged = port.run(
        flows.namespace_policies("default", {"max_consumers_per_topic": 4}, clustered=True)
    )
    assert merged["max_producers_per_topic"] == 3
    assert merged["max_publish_rate"] == 9
    assert merged["max_consumers_per_topic"] == 4
    assert d.store.value(key) == merged
    assert port.asked == [flows.NamespaceSeen("default", merged)]


def test_policies_of_a_namespace_nobody_created_are_not_found() -> None:
    port = Port(cluster("1"))
    flow = flows.namespace_policies("nope", {"max_publish_rate": 1}, clustered=True)
    assert refused(port, flow).code is ErrorCode.NOT_FOUND


def test_topic_policies_are_the_owners() -> None:
    port = Port(cluster("1"))
    port.served_here = True
    port.run(flows.topic_policies(ME, T, {"max_publish_rate": 1}))
    assert port.asked == [flows.ServedHere(T), flows.TopicPolicies(T, {"max_publish_rate": 1})]


def registered(d: ManagerDriver, broker: str, admin: str | None) -> None:
    value = {"broker_url": f"http://{broker}:6650"} | ({"admin_addr": admin} if admin else {})
    d.store.txn((), (Put(keys.register_key(broker), value),))


def claimed(d: ManagerDriver, topic: str, broker: str) -> None:
    d.store.txn((), (Put(danube_keys.owner_key(topic), {"broker_id": broker}),))


def test_a_topic_served_elsewhere_is_asked_of_its_owners_admin_port() -> None:
    d = cluster("1")
    d.store.txn((), (Put(danube_keys.topic_delivery(parse_topic(T)), "reliable"),))
    registered(d, "2", "http://broker-2:50051")
    claimed(d, T, "2")
    port = Port(d)
    assert port.run(flows.topic_policies(ME, T, {"max_publish_rate": 1})) == "the leader's reply"
    assert port.asked == [flows.ServedHere(T), flows.Forward("http://broker-2:50051")]


@pytest.mark.parametrize(
    ("setup", "code", "says"),
    [
        ("nothing", ErrorCode.NOT_FOUND, "does not exist"),
        ("unclaimed", ErrorCode.UNAVAILABLE, "being assigned"),
        ("mine", ErrorCode.UNAVAILABLE, "loading or moving on this broker"),
        ("unregistered", ErrorCode.UNAVAILABLE, "not registered"),
    ],
)
def test_a_topic_with_no_owner_to_ask_gets_a_clear_answer(
    setup: str, code: ErrorCode, says: str
) -> None:
    d = cluster("1")
    if setup != "nothing":
        d.store.txn((), (Put(danube_keys.topic_delivery(parse_topic(T)), "reliable"),))
    if setup == "mine":
        claimed(d, T, ME)
    if setup == "unregistered":
        claimed(d, T, "2")
        registered(d, "2", None)
    error = refused(Port(d), flows.topic_policies(ME, T, {"max_publish_rate": 1}))
    assert error.code is code and says in error.message

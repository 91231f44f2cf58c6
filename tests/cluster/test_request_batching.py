"""The load manager's decisions on their way to the store (`request_batching.DecisionQueue`):
lanes, a decision made again replacing the one still waiting, and batches etcd accepts.
Both the production port and the simulator's run these rules, so they are checked here once,
against a plain model of what a batch may hold."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from danube.machines.cluster import ownership as own
from danube.machines.cluster.load_manager import Assign, FailOver, SetFollowers, Txn
from danube.machines.cluster.records import MarkerReason
from danube.machines.cluster.request_batching import (
    BATCH,
    FLOW_SLOTS,
    LOADS_IN_FLIGHT,
    DecisionQueue,
    decision_key,
    is_urgent,
)
from danube.metadata.model import Compare, Delete, DeletePrefix, Op, Put


def _assign(topic: str, *ops: Op) -> Assign:
    return Assign(topic, "b", MarkerReason.NEW, (), ops or (Put(f"/a{topic}", 1),))


def _refollow(
    topic: str, *ops: Op, version: int = 1, compares: tuple[Compare, ...] = ()
) -> SetFollowers:
    return SetFollowers(topic, ("b",), compares, ops or (Put(f"/f{topic}", version),))


def test_a_decision_made_again_while_waiting_replaces_it_in_its_place() -> None:
    queue = DecisionQueue()
    assert queue.offer(_refollow("/t/1", version=1))
    assert queue.offer(_refollow("/t/2"))
    assert not queue.offer(_refollow("/t/1", version=2)), "no new taker"
    assert queue.replaced == 1
    taken = queue.take(False)
    assert [t.topic for t in taken] == ["/t/1", "/t/2"], "the first one's place"
    assert taken[0].ops == (Put("/f/t/1", 2),), "as made last"
    assert queue.offer(_refollow("/t/1", version=3)), "taken: a new decision again"


def test_urgent_decisions_have_a_lane_of_their_own() -> None:
    queue = DecisionQueue()
    for i in range(3):
        queue.offer(_refollow(f"/t/{i}"))
    queue.offer(_assign("/t/new"))
    queue.offer(FailOver("/t/dead", "c", (), (Delete("/c/t/dead"),)))
    assert [type(t).__name__ for t in queue.take(True)] == ["Assign", "FailOver"]
    assert queue.take(True) == []
    assert (queue.waiting(True), queue.waiting(False)) == (0, 3)
    assert is_urgent(_assign("/x")) and not is_urgent(_refollow("/x"))
    assert decision_key(_assign("/x")) != decision_key(_refollow("/x"))


def test_batches_hold_at_most_the_batch_size_and_one_on_a_store_without_txn_many() -> None:
    queue = DecisionQueue()
    for i in range(3 * BATCH // 2):
        queue.offer(_refollow(f"/t/{i}"))
    assert [len(queue.take(False)) for _ in range(3)] == [BATCH, BATCH // 2, 0]
    single = DecisionQueue(1)
    single.offer(_refollow("/t/1"))
    single.offer(_refollow("/t/2"))
    assert [len(single.take(False)) for _ in range(3)] == [1, 1, 0]


def test_two_writes_of_a_key_or_a_prefix_deletion_never_share_a_request() -> None:
    queue = DecisionQueue()
    queue.offer(_refollow("/t/1", Put("/shared", 1)))
    queue.offer(_refollow("/t/2", Put("/shared", 2)))
    queue.offer(_refollow("/t/3", DeletePrefix("/p/")))
    queue.offer(_refollow("/t/4"))
    assert [t.topic for t in queue.take(False)] == ["/t/1", "/t/4"], "the others keep waiting"
    assert [t.topic for t in queue.take(False)] == ["/t/2"], "a prefix deletion goes alone"
    assert [t.topic for t in queue.take(False)] == ["/t/3"]


def test_a_write_and_a_compare_of_one_key_never_share_a_request() -> None:
    """etcd checks every compare of a request against the state before it; the simulated
    store applies the request's transactions one after the other. A decision comparing a key
    that another in its batch writes would end differently in the two (found in review):
    such pairs go in separate requests. Compares alone may share (the leader key)."""
    leader = Compare("/leader", "value", "==", "1")
    watched = Compare("/shared", "mod_revision", "==", 4)
    queue = DecisionQueue()
    queue.offer(_refollow("/t/1", Put("/shared", 1), compares=(leader,)))
    queue.offer(_refollow("/t/2", compares=(leader, watched)))
    queue.offer(_refollow("/t/3", compares=(leader,)))
    assert [t.topic for t in queue.take(False)] == ["/t/1", "/t/3"]
    assert [t.topic for t in queue.take(False)] == ["/t/2"]
    queue.offer(_refollow("/t/4", compares=(watched,)))
    queue.offer(_refollow("/t/5", Delete("/shared")))
    assert [t.topic for t in queue.take(False)] == ["/t/4"], "nor a write after a compare"
    assert [t.topic for t in queue.take(False)] == ["/t/5"]


def test_claims_and_loads_wait_for_slots_other_flows_do_not() -> None:
    assert {own.Claim: LOADS_IN_FLIGHT, own.Load: LOADS_IN_FLIGHT} == FLOW_SLOTS


_KEYS = st.sampled_from(["/k/a", "/k/b", "/k/c", "/k/d", "/k/e"])
_OPS = st.lists(
    st.one_of(
        st.builds(Put, _KEYS, st.integers(0, 3)),
        st.builds(Delete, _KEYS),
        st.builds(DeletePrefix, st.just("/k/")),
    ),
    min_size=1,
    max_size=3,
)
_CHECKS = st.lists(st.builds(Compare, _KEYS, st.just("version"), st.just("=="), st.just(1)))
_DECISIONS = st.lists(
    st.tuples(st.sampled_from(["assign", "refollow"]), st.integers(0, 6), _OPS, _CHECKS),
    max_size=40,
)


def _written(txn: Txn) -> set[str]:
    return {op.key for op in txn.ops if isinstance(op, Put | Delete)}


@given(_DECISIONS, st.integers(1, 4))
def test_every_decision_runs_once_as_made_last_in_batches_etcd_accepts(
    made: list[tuple[str, int, list[Op], list[Compare]]], batch: int
) -> None:
    queue = DecisionQueue(batch)
    latest: dict[tuple[str, str], Txn] = {}
    order: dict[bool, list[tuple[str, str]]] = {True: [], False: []}
    for kind, n, ops, checks in made:
        txn = (
            dataclasses.replace(_assign(f"/t/{n}", *ops), compares=tuple(checks))
            if kind == "assign"
            else _refollow(f"/t/{n}", *ops, compares=tuple(checks))
        )
        key = decision_key(txn)
        assert queue.offer(txn) == (key not in latest)
        if key not in latest:
            order[is_urgent(txn)].append(key)
        latest[key] = txn
    for urgent in (True, False):
        ran: list[Txn] = []
        while batch_taken := queue.take(urgent):
            assert len(batch_taken) <= batch
            whole = [t for t in batch_taken if any(isinstance(o, DeletePrefix) for o in t.ops)]
            assert not whole or len(batch_taken) == 1, "a prefix deletion goes alone"
            seen: set[str] = set()
            checked: set[str] = set()
            for txn in batch_taken:
                assert not _written(txn) & seen, "two writes of one key in one request"
                compared = {c.key for c in txn.compares}
                beside = _written(txn) & checked or compared & seen
                assert not beside, "a write beside a compare of one key in one request"
                seen |= _written(txn)
                checked |= compared
            ran.extend(batch_taken)
        assert queue.waiting(urgent) == 0
        assert sorted(map(decision_key, ran)) == sorted(order[urgent]), "each once"
        assert all(txn is latest[decision_key(txn)] for txn in ran), "as made last"
        if ran:
            assert decision_key(ran[0]) == order[urgent][0], "the oldest goes first"

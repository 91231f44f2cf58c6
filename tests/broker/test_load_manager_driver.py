"""The load manager's port runs the decisions that bring topics back before the upkeep a
broker's death also causes, and runs a decision made again while it waits only once.

Issue 23: with 234 topics failed over, the leader also replaced the dead broker as follower
of the ~233 topics it followed; in one shared queue of 8 the `Assign`s waited 15 s behind
those `SetFollowers` (`bench.cluster_e2e failover-many`)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from danube.machines.cluster.load_manager import Assign, LoadManager, SetFollowers
from danube.machines.cluster.ranking import Strategy
from danube.machines.cluster.records import MarkerReason
from danube.metadata.model import Compare, Op, Put, TxnResult
from danube.runtime import load_manager as port
from danube.values.load_manager_config import LoadManagerConfig


class HeldStore:
    """A store whose transactions wait until `release` is set, recording what they were."""

    def __init__(self) -> None:
        self.started: list[tuple[tuple[Compare, ...], tuple[Op, ...]]] = []
        self.release = trio.Event()

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self.started.append((tuple(compares), tuple(success)))
        await self.release.wait()
        return TxnResult(succeeded=True, revision=1, responses=())


def _refollow(topic: str, revision: int) -> SetFollowers:
    compare = Compare(f"/cluster/replicas{topic}", "mod_revision", "==", revision)
    return SetFollowers(topic, ("b",), (compare,), (Put(f"/x{topic}", revision),))


def _assign(topic: str) -> Assign:
    return Assign(topic, "b", MarkerReason.NEW, (), (Put(f"/cluster/brokers/b{topic}", 1),))


def _driver(store: HeldStore) -> port.LoadManagerDriver:
    machine = LoadManager("a", LoadManagerConfig(assignment_strategy=Strategy.FAIR))
    return port.LoadManagerDriver(store, machine)  # type: ignore[arg-type]


@pytest.mark.trio
async def test_assign_is_not_queued_behind_set_followers() -> None:
    store = HeldStore()
    driver = _driver(store)
    async with trio.open_nursery() as nursery:
        driver._nursery = nursery
        driver._apply([_refollow(f"/t/{i}", 1) for i in range(3 * port.TXNS_IN_FLIGHT)])
        driver._apply([_assign("/t/new")])
        await trio.testing.wait_all_tasks_blocked()
        started_ops = [ops for _, ops in store.started]
        assert _assign("/t/new").ops in started_ops
        assert len(store.started) == port.TXNS_IN_FLIGHT + 1
        store.release.set()
    assert len(store.started) == 3 * port.TXNS_IN_FLIGHT + 1


@pytest.mark.trio
async def test_a_decision_made_again_while_waiting_runs_once_as_made_last() -> None:
    store = HeldStore()
    driver = _driver(store)
    async with trio.open_nursery() as nursery:
        driver._nursery = nursery
        driver._apply([_refollow(f"/t/{i}", 1) for i in range(port.TXNS_IN_FLIGHT)])
        driver._apply([_refollow("/t/late", 1)])
        driver._apply([_refollow("/t/late", 2)])  # decided again on a newer view
        await trio.testing.wait_all_tasks_blocked()
        store.release.set()
    late = [compares for compares, ops in store.started if ops[0].key == "/x/t/late"]
    assert late == [_refollow("/t/late", 2).compares]
    assert driver.replaced == 1


class BatchingStore(HeldStore):
    """A store that takes several transactions in one request, as etcd does (`txn_many`)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[list[tuple[Op, ...]]] = []

    async def txn_many(
        self, txns: Sequence[tuple[Sequence[Compare], Sequence[Op]]]
    ) -> list[TxnResult]:
        self.requests.append([tuple(ops) for _, ops in txns])
        await self.release.wait()
        return [TxnResult(succeeded=True, revision=1, responses=()) for _ in txns]


@pytest.mark.trio
async def test_decisions_waiting_together_go_in_few_requests() -> None:
    store = BatchingStore()
    driver = _driver(store)
    many = 3 * port.BATCH // 2
    async with trio.open_nursery() as nursery:
        driver._nursery = nursery
        driver._apply([_assign(f"/t/{i}") for i in range(many)])
        await trio.testing.wait_all_tasks_blocked()
        store.release.set()
    assert [len(r) for r in store.requests] == [port.BATCH, many - port.BATCH]
    assert store.started == []


@pytest.mark.trio
async def test_decisions_writing_one_key_are_not_batched_together() -> None:
    """etcd refuses a transaction whose nested transactions write one key twice."""
    store = BatchingStore()
    driver = _driver(store)
    shared = Put("/cluster/shared", 1)
    twins = [Assign(f"/t/{i}", "b", MarkerReason.NEW, (), (shared,)) for i in range(2)]
    async with trio.open_nursery() as nursery:
        driver._nursery = nursery
        driver._apply([*twins, _assign("/t/other")])
        await trio.testing.wait_all_tasks_blocked()
        store.release.set()
    requests = [*store.requests, *([ops] for _, ops in store.started)]
    assert all(sum(shared in ops for ops in request) <= 1 for request in requests)
    assert sum(len(r) for r in requests) == 3

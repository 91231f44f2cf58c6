"""The cluster's control plane on a real etcd, without data planes: brokers that register, elect
a leader and run the load manager. New topics get assigned and spread, a broker that dies has
its topics failed over to the living, and a new leader picks up where a dead one stopped."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio

from danube.broker.load_manager import LoadManagerDriver
from danube.broker.membership import Change, MembershipDriver
from danube.cluster import keys
from danube.cluster.load_manager import LoadManager, LoadManagerConfig
from danube.cluster.membership import (
    LeadershipGained,
    LeadershipLost,
    Membership,
    MembershipConfig,
)
from danube.cluster.ranking import Strategy
from danube.metadata import MetadataStore
from tests.support.etcd import EtcdStores

pytestmark = [pytest.mark.trio, pytest.mark.slow]


@dataclass
class Node:
    name: str
    membership: MembershipDriver
    load_manager: LoadManagerDriver
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    @property
    def leading(self) -> bool:
        return self.membership.machine.leading


def node(name: str, store: MetadataStore) -> Node:
    manager = LoadManagerDriver(
        store,
        LoadManager(
            name,
            LoadManagerConfig(assignment_strategy=Strategy.FAIR, retry_ms=500),
        ),
    )

    def on_change(change: Change) -> None:
        if isinstance(change, LeadershipGained | LeadershipLost):
            manager.leadership(isinstance(change, LeadershipGained))

    membership = MembershipDriver(
        store,
        Membership(
            MembershipConfig(
                name,
                {"broker_url": f"http://{name}:6650"},
                lease_ttl_ms=2_000,
                renew_interval_ms=400,
                drift_ms=300,
                retry_ms=200,
            )
        ),
        on_change=on_change,
    )
    return Node(name, membership, manager)


@asynccontextmanager
async def cluster(stores: EtcdStores, names: list[str]) -> AsyncIterator[dict[str, Node]]:
    async with trio.open_nursery() as nursery:
        nodes: dict[str, Node] = {}

        async def start(name: str) -> None:
            n = node(name, await stores.open())
            nodes[name] = n

            async def run() -> None:
                with n.scope:
                    async with trio.open_nursery() as inner:
                        inner.start_soon(n.load_manager.run)
                        await n.load_manager.synced.wait()
                        inner.start_soon(n.membership.run)

            nursery.start_soon(run)
            with trio.fail_after(10):
                await n.membership.started.wait()

        for name in names:
            await start(name)
        yield nodes
        nursery.cancel_scope.cancel()


async def assignments(store: MetadataStore) -> dict[str, str]:
    owners = {}
    for kv in await store.scan(keys.BROKERS_PREFIX):
        parsed = keys.parse_assignment_key(kv.key)
        if parsed is not None:
            broker, topic = parsed
            assert topic not in owners, f"{topic} owned twice"
            owners[topic] = broker
    return owners


async def wait_until(check: Callable[[], object], timeout: float = 15.0) -> None:
    with trio.fail_after(timeout):
        while not await check():  # type: ignore[misc]
            await trio.sleep(0.05)


async def post_topics(store: MetadataStore, topics: list[str]) -> None:
    for topic in topics:
        await store.put(keys.unassigned_key(topic), None)


async def test_new_topics_are_assigned_and_spread_over_the_brokers(
    etcd_stores: EtcdStores,
) -> None:
    observer = await etcd_stores.open()
    topics = [f"/default/t{i}" for i in range(9)]
    async with cluster(etcd_stores, ["1", "2", "3"]) as nodes:
        await wait_until(lambda: _leaders(nodes, 1))
        await post_topics(observer, topics)

        async def all_assigned() -> bool:
            return sorted(await assignments(observer)) == sorted(topics)

        await wait_until(all_assigned)
        assert Counter((await assignments(observer)).values()) == {"1": 3, "2": 3, "3": 3}
        assert await observer.scan(keys.UNASSIGNED_PREFIX) == []


async def test_a_dead_brokers_topics_fail_over_to_the_living(etcd_stores: EtcdStores) -> None:
    observer = await etcd_stores.open()
    topics = [f"/default/f{i}" for i in range(6)]
    async with cluster(etcd_stores, ["1", "2", "3"]) as nodes:
        await wait_until(lambda: _leaders(nodes, 1))
        await post_topics(observer, topics)

        async def all_assigned() -> bool:
            return len(await assignments(observer)) == len(topics)

        await wait_until(all_assigned)
        # Kill a broker that is not the leader (no revoke: its lease runs out).
        victim = next(n for n in nodes.values() if not n.leading)
        lost = sorted(t for t, b in (await assignments(observer)).items() if b == victim.name)
        assert lost
        victim.scope.cancel()

        async def failed_over() -> bool:
            owners = await assignments(observer)
            return sorted(owners) == sorted(topics) and victim.name not in owners.values()

        await wait_until(failed_over)
        owners = await assignments(observer)
        assert {owners[t] for t in lost} <= {"1", "2", "3"} - {victim.name}


async def test_a_new_leader_assigns_what_the_dead_one_left(etcd_stores: EtcdStores) -> None:
    observer = await etcd_stores.open()
    async with cluster(etcd_stores, ["1", "2"]) as nodes:
        await wait_until(lambda: _leaders(nodes, 1))
        (leader,) = [n for n in nodes.values() if n.leading]
        (other,) = [n for n in nodes.values() if not n.leading]
        leader.scope.cancel()
        await post_topics(observer, ["/default/late"])  # posted while nobody leads
        await wait_until(lambda: _true(other.leading))

        async def assigned() -> bool:
            return await assignments(observer) == {"/default/late": other.name}

        await wait_until(assigned)


def _leaders(nodes: dict[str, Node], count: int) -> object:
    return _true(sum(n.leading for n in nodes.values()) == count)


async def _true(value: bool) -> bool:
    return value

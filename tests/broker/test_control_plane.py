"""The cluster's control plane on a real etcd, without data planes: brokers that register, elect
a leader and run the load manager. New topics get assigned and spread, a broker that dies has
its topics failed over to the living, and a new leader picks up where a dead one stopped."""

from __future__ import annotations

from collections import Counter

import pytest

from danube.machines.cluster import keys
from danube.testing import wait_until
from tests.support.control_plane import (
    assignments,
    control_plane,
    leaders,
    post_topics,
)
from tests.support.etcd import EtcdStores

pytestmark = [pytest.mark.trio, pytest.mark.slow]


async def test_new_topics_are_assigned_and_spread_over_the_brokers(
    etcd_stores: EtcdStores,
) -> None:
    observer = await etcd_stores.open()
    topics = [f"/default/t{i}" for i in range(9)]
    async with control_plane(etcd_stores.open, ["1", "2", "3"]) as nodes:

        async def one_leader() -> bool:
            return len(leaders(nodes)) == 1

        await wait_until(one_leader)
        await post_topics(observer, topics)

        async def all_assigned() -> bool:
            return sorted(await assignments(observer)) == sorted(topics)

        await wait_until(all_assigned)
        assert Counter((await assignments(observer)).values()) == {"1": 3, "2": 3, "3": 3}
        assert await observer.scan(keys.UNASSIGNED_PREFIX) == []


async def test_a_dead_brokers_topics_fail_over_to_the_living(etcd_stores: EtcdStores) -> None:
    observer = await etcd_stores.open()
    topics = [f"/default/f{i}" for i in range(6)]
    async with control_plane(etcd_stores.open, ["1", "2", "3"]) as nodes:

        async def all_assigned() -> bool:
            return len(leaders(nodes)) == 1 and len(await assignments(observer)) == len(topics)

        await post_topics(observer, topics)
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
    async with control_plane(etcd_stores.open, ["1", "2"]) as nodes:

        async def one_leader() -> bool:
            return len(leaders(nodes)) == 1

        await wait_until(one_leader)
        (leader,) = leaders(nodes)
        (other,) = [n for n in nodes.values() if not n.leading]
        leader.scope.cancel()
        await post_topics(observer, ["/default/late"])  # posted while nobody leads

        async def assigned() -> bool:
            return other.leading and await assignments(observer) == {"/default/late": other.name}

        await wait_until(assigned)

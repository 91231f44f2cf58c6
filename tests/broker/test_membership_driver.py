"""Brokers' membership on a real etcd: registration under a lease, load reports, one leader,
a new leader after a graceful stop or a crash, and self-fencing when etcd cannot be reached."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio

from danube.machines.cluster.keys import LEADER_KEY
from danube.machines.cluster.membership import (
    Fenced,
    LeadershipGained,
    LeadershipLost,
    Membership,
    MembershipConfig,
    Unfenced,
)
from danube.metadata import MetadataStore
from danube.metadata.etcd import EtcdStore, EtcdUnavailable
from danube.runtime.membership import Change, MembershipDriver
from tests.support.etcd import EtcdStores

pytestmark = [pytest.mark.trio, pytest.mark.slow]


class Partitionable:
    """An EtcdStore that can be cut off from etcd: while `cut`, every call fails as an
    unreachable etcd does."""

    def __init__(self, store: EtcdStore) -> None:
        self._store = store
        self.cut = False

    def __getattr__(self, name: str) -> object:
        attribute = getattr(self._store, name)
        if not callable(attribute) or name == "watch":
            return attribute

        async def call(*args: object, **kwargs: object) -> object:
            if self.cut:
                raise EtcdUnavailable("cut off by the test")
            return await attribute(*args, **kwargs)

        return call


@dataclass
class Member:
    name: str
    driver: MembershipDriver
    changes: list[Change] = field(default_factory=list)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    @property
    def leading(self) -> bool:
        return self.driver.machine.leading


def config(name: str) -> MembershipConfig:
    return MembershipConfig(
        name,
        {"broker_url": f"http://{name}:6650", "connect_url": f"http://{name}:6650"},
        lease_ttl_ms=2_000,
        renew_interval_ms=400,
        drift_ms=300,
        retry_ms=200,
        load_report_interval_ms=500,
    )


@asynccontextmanager
async def members(stores: list[MetadataStore], names: list[str]) -> AsyncIterator[list[Member]]:
    async with trio.open_nursery() as nursery:
        started = []
        for name, store in zip(names, stores, strict=True):
            member = Member(name, None)  # type: ignore[arg-type]
            member.driver = MembershipDriver(
                store,
                Membership(config(name)),
                on_change=member.changes.append,
                load_report=lambda name=name: {"broker_id": name, "topics": []},
            )

            async def run(member: Member = member) -> None:
                with member.scope:
                    await member.driver.run()

            nursery.start_soon(run)
            started.append(member)
        with trio.fail_after(10):
            for member in started:
                await member.driver.started.wait()
        yield started
        nursery.cancel_scope.cancel()


async def wait_for(predicate: object, timeout: float = 10.0) -> None:
    assert callable(predicate)
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


async def test_members_register_report_load_and_elect_one_leader(
    etcd_stores: EtcdStores,
) -> None:
    names = ["b1", "b2", "b3"]
    stores = [await etcd_stores.open() for _ in names]
    async with members(stores, names) as group:
        await wait_for(lambda: sum(m.leading for m in group) == 1)
        observer = stores[0]
        registered = {kv.key: kv.value for kv in await observer.scan("/cluster/register/")}
        assert registered == {
            f"/cluster/register/{n}": {
                "broker_url": f"http://{n}:6650",
                "connect_url": f"http://{n}:6650",
            }
            for n in names
        }
        assert all(kv.lease is not None for kv in await observer.scan("/cluster/register/"))
        loads = {kv.key: kv.value for kv in await observer.scan("/cluster/load/")}
        assert loads == {f"/cluster/load/{n}": {"broker_id": n, "topics": []} for n in names}
        (leader,) = [m for m in group if m.leading]
        assert (await observer.get(LEADER_KEY)).value == leader.name  # type: ignore[union-attr]
        # Stay a while: renewals keep everyone a member and the leader in place.
        await trio.sleep(3 * config("x").lease_ttl_s)
        assert [m.name for m in group if m.leading] == [leader.name]
        for m in group:
            assert [type(c) for c in m.changes if isinstance(c, Fenced)] == []
        # No flap at start: a leader-key read answered after the first campaign won must not
        # pass for "the key is gone" (it did, and the winner lost and won again at once).
        assert [c for m in group for c in m.changes if isinstance(c, LeadershipLost)] == []


async def test_a_graceful_stop_hands_leadership_over_at_once(etcd_stores: EtcdStores) -> None:
    names = ["b1", "b2"]
    stores = [await etcd_stores.open() for _ in names]
    async with members(stores, names) as group:
        await wait_for(lambda: sum(m.leading for m in group) == 1)
        (leader,) = [m for m in group if m.leading]
        (other,) = [m for m in group if not m.leading]
        before = trio.current_time()
        await leader.driver.stop()
        leader.scope.cancel()
        await wait_for(lambda: other.leading)
        # A revoked lease is gone at once: well under one TTL, not after it.
        assert trio.current_time() - before < config("x").lease_ttl_s
        assert LeadershipLost("stopping") in leader.changes
        assert await stores[1].get(f"/cluster/register/{leader.name}") is None


async def test_a_crashed_leader_is_replaced_after_its_lease_expires(
    etcd_stores: EtcdStores,
) -> None:
    names = ["b1", "b2"]
    stores = [await etcd_stores.open() for _ in names]
    async with members(stores, names) as group:
        await wait_for(lambda: sum(m.leading for m in group) == 1)
        (leader,) = [m for m in group if m.leading]
        (other,) = [m for m in group if not m.leading]
        leader.scope.cancel()  # no revoke: the lease must run out
        before = trio.current_time()
        await wait_for(lambda: other.leading)
        waited = trio.current_time() - before
        assert 1.0 < waited < 5.0, waited
        assert await stores[1].get(f"/cluster/register/{leader.name}") is None
        assert (await stores[1].get(LEADER_KEY)).value == other.name  # type: ignore[union-attr]


async def test_a_member_cut_off_from_etcd_fences_itself_before_its_lease_expires(
    etcd_stores: EtcdStores,
) -> None:
    names = ["b1", "b2"]
    raw = [await etcd_stores.open() for _ in names]
    stores = [Partitionable(s) for s in raw]
    async with members(stores, names) as group:  # type: ignore[arg-type]
        await wait_for(lambda: sum(m.leading for m in group) == 1)
        index = next(i for i, m in enumerate(group) if m.leading)
        leader, other = group[index], group[1 - index]
        stores[index].cut = True
        await wait_for(lambda: any(isinstance(c, Fenced) for c in leader.changes))
        fenced_at = trio.current_time()
        assert not leader.leading
        # The lease is still alive in etcd when the broker gives up: nobody else leads yet.
        assert await raw[1 - index].get(f"/cluster/register/{leader.name}") is not None
        assert not other.leading
        await wait_for(lambda: other.leading)
        assert trio.current_time() - fenced_at > 0.1
        # Reconnected: the old lease is gone, so it registers with a new one and serves
        # again, as a follower.
        stores[index].cut = False
        unfenced = len([c for c in leader.changes if isinstance(c, Unfenced)])
        await wait_for(
            lambda: len([c for c in leader.changes if isinstance(c, Unfenced)]) > unfenced
        )
        assert await raw[1 - index].get(f"/cluster/register/{leader.name}") is not None
        assert not leader.leading and other.leading
        assert [c for c in leader.changes if isinstance(c, LeadershipGained)] == [
            LeadershipGained()
        ]


async def test_a_late_campaign_of_a_past_incarnation_seen_by_the_watch_is_not_ours(
    etcd_stores: EtcdStores,
) -> None:
    """A crash and a restart within the TTL: the past incarnation's campaign lands after the
    new one watches, naming this broker under a lease it no longer holds. Taking that key as
    its own made a broker lead while the key would die with a lease nobody renews (the
    cluster simulator's seed 425, `leases` profile): the watch event must carry its lease."""
    names = ["b1", "b2"]
    stores = [await etcd_stores.open() for _ in names]
    async with members(stores, names) as group:
        await wait_for(lambda: sum(m.leading for m in group) == 1)
        (leader,) = [m for m in group if m.leading]
        (other,) = [m for m in group if not m.leading]
        past = await stores[0].grant_lease(2)  # the past incarnation's lease, still alive
        await stores[0].put(LEADER_KEY, other.name, lease=past)
        await wait_for(lambda: LeadershipLost("replaced") in leader.changes)
        await trio.sleep(0.5)  # ample for the watch event to reach `other`
        assert not other.leading, "a key put under a past incarnation's lease is not ours"
        assert LeadershipGained() not in other.changes
        await stores[0].revoke(past)  # that lease ends: the key goes, a campaign follows
        await wait_for(lambda: sum(m.leading for m in group) == 1)
        (now_leading,) = [m for m in group if m.leading]
        assert (await stores[0].get(LEADER_KEY)).value == now_leading.name  # type: ignore[union-attr]

"""Brokers' control planes without data planes: each node runs the membership and load
manager drivers against its own store connection, as a broker in cluster mode will. Shared by
the control-plane tests and `bench/cluster_control.py`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from danube.machines.cluster import keys
from danube.machines.cluster.load_manager import LoadManager, LoadManagerConfig
from danube.machines.cluster.membership import (
    LeadershipGained,
    LeadershipLost,
    Membership,
    MembershipConfig,
)
from danube.machines.cluster.ranking import Strategy
from danube.metadata import MetadataStore
from danube.runtime.load_manager import LoadManagerDriver
from danube.runtime.membership import Change, MembershipDriver

FAST_MEMBERSHIP = {
    "lease_ttl_ms": 2_000,
    "renew_interval_ms": 400,
    "drift_ms": 300,
    "retry_ms": 200,
}
"""Short leases for tests: a dead broker is noticed within about two seconds."""


@dataclass
class Node:
    name: str
    membership: MembershipDriver
    load_manager: LoadManagerDriver
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    @property
    def leading(self) -> bool:
        return self.membership.machine.leading


def node(name: str, store: MetadataStore, membership: dict[str, int]) -> Node:
    manager = LoadManagerDriver(
        store,
        LoadManager(name, LoadManagerConfig(assignment_strategy=Strategy.FAIR, retry_ms=500)),
    )

    def on_change(change: Change) -> None:
        if isinstance(change, LeadershipGained | LeadershipLost):
            manager.leadership(isinstance(change, LeadershipGained))

    config = MembershipConfig(name, {"broker_url": f"http://{name}:6650"}, **membership)
    return Node(name, MembershipDriver(store, Membership(config), on_change=on_change), manager)


@asynccontextmanager
async def control_plane(
    open_store: Callable[[], Awaitable[MetadataStore]],
    names: list[str],
    membership: dict[str, int] = FAST_MEMBERSHIP,
) -> AsyncIterator[dict[str, Node]]:
    """Starts one node per name (each a member before the next starts); cancelling a node's
    `scope` is a crash: it neither revokes its lease nor says goodbye."""
    async with trio.open_nursery() as nursery:
        nodes: dict[str, Node] = {}
        for name in names:
            n = node(name, await open_store(), membership)
            nodes[name] = n

            async def run(n: Node = n) -> None:
                with n.scope:
                    async with trio.open_nursery() as inner:
                        inner.start_soon(n.load_manager.run)
                        await n.load_manager.synced.wait()
                        inner.start_soon(n.membership.run)

            nursery.start_soon(run)
            with trio.fail_after(10):
                await n.membership.started.wait()
        yield nodes
        nursery.cancel_scope.cancel()


async def assignments(store: MetadataStore) -> dict[str, str]:
    """topic → broker, from the assignment keys; fails if a topic has two owners."""
    owners: dict[str, str] = {}
    for kv in await store.scan(keys.BROKERS_PREFIX):
        parsed = keys.parse_assignment_key(kv.key)
        if parsed is not None:
            broker, topic = parsed
            assert topic not in owners, f"{topic} owned by {owners[topic]} and {broker}"
            owners[topic] = broker
    return owners


async def post_topics(store: MetadataStore, topics: list[str]) -> None:
    """What a broker creating a topic writes for the load manager: a null marker."""
    for topic in topics:
        await store.put(keys.unassigned_key(topic), None)


def leaders(nodes: dict[str, Node]) -> list[Node]:
    return [n for n in nodes.values() if n.leading]

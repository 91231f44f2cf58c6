"""A broker's part in the cluster: its membership (registration, leader election, load
reports), the load manager every broker keeps current and only the leader acts with, the
ownership of the topics assigned to it, and the namespaces other brokers create.

Start order matters: the load manager holds a whole snapshot of `/cluster/` before the broker
can win the leader key, and the broker claims topics only once it is a registered member.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from danube import keys
from danube.machines.cluster.load_manager import LoadManager, LoadManagerConfig
from danube.machines.cluster.membership import (
    LeadershipGained,
    LeadershipLost,
    Membership,
    MembershipConfig,
    Unfenced,
)
from danube.machines.cluster.ownership import Ownership, OwnershipConfig
from danube.machines.cluster.placement import ViewFacts
from danube.machines.cluster.ranking import LoadReport, TopicLoad
from danube.machines.cluster.records import MarkerReason
from danube.metadata import MetadataStore, WatchEvent
from danube.runtime.broker import BrokerRuntime
from danube.runtime.load_manager import LoadManagerDriver
from danube.runtime.membership import Change, MembershipDriver
from danube.runtime.ownership import OwnershipDriver
from danube.runtime.placement import ClusterPlacement
from danube.runtime.watching import REQUEST_TIMEOUT_S, follow
from danube.values.config import ClusterConfig
from danube.values.errors import DanubeError, ErrorCode, invalid

log = logging.getLogger("danube.runtime")


class ClusterMember:
    def __init__(
        self,
        store: MetadataStore,
        runtime: BrokerRuntime,
        broker_id: str,
        registration: dict[str, Any],
        config: ClusterConfig,
        placement: ClusterPlacement,
    ) -> None:
        self.store = store
        self.placement = placement
        self.runtime = runtime
        self.broker_id = broker_id
        manager_config: LoadManagerConfig = config.load_manager or LoadManagerConfig()
        self.load_manager = LoadManagerDriver(store, LoadManager(broker_id, manager_config))
        membership = Membership(
            MembershipConfig(
                broker_id,
                registration,
                lease_ttl_ms=config.lease_ttl_ms,
                renew_interval_ms=config.renew_interval_ms,
                drift_ms=config.drift_ms,
                load_report_interval_ms=config.load_report_interval_ms,
            )
        )
        self.membership = MembershipDriver(
            store, membership, on_change=self._changed, load_report=self._load_report
        )
        self.ownership = OwnershipDriver(store, Ownership(OwnershipConfig(broker_id)), runtime)
        self._nursery: trio.Nursery | None = None
        placement.view = self._view_of

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled; started once the broker is a member."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(follow, self.store, keys.NAMESPACES_PREFIX, self._read_ns, self._ns)
            nursery.start_soon(self.load_manager.run)
            await self.load_manager.synced.wait()
            nursery.start_soon(self.ownership.run)
            nursery.start_soon(self.membership.run)
            await self.membership.started.wait()
            task_status.started()

    async def leave(self) -> None:
        """Graceful exit, after the broker sealed and uploaded its topics: give up the lease,
        so the cluster moves them at once rather than after the lease's TTL."""
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            await self.membership.stop()

    def spawn(self, work: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Runs `work` for as long as the member runs, beyond the call that started it (a
        broker's drain outlives the admin call whose client stopped waiting)."""
        if self._nursery is None:
            raise DanubeError(ErrorCode.UNAVAILABLE, "this broker is not a cluster member yet")
        self._nursery.start_soon(work, *args)

    def _view_of(self, topic: str) -> ViewFacts | None:
        """What the load manager's view says of `topic`, once it is read (lookups)."""
        if not self.load_manager.synced.is_set():
            return None
        machine = self.load_manager.machine
        assigned = machine.owner(topic)
        broker = None if assigned is None else assigned[0]
        registration = None if broker is None else machine.registration(broker)
        marker = machine.marker(topic)
        deleting = marker is not None and marker[0].reason is MarkerReason.DELETE
        failed = self.ownership.machine.failed_load(topic)
        return ViewFacts(broker, marker is not None, registration, deleting, failed)

    def leader(self) -> str | None:
        machine = self.membership.machine
        return machine.config.broker_id if machine.leading else machine.leader

    def trigger_rebalance(self, max_moves: int | None) -> None:
        if self.load_manager.machine.config.rebalancing is None:
            raise DanubeError(
                ErrorCode.FAILED_PRECONDITION,
                "rebalancing needs a load_manager.rebalancing section in the configuration",
            )
        if max_moves is not None and max_moves < 1:
            raise invalid(f"max_moves must be at least 1, got {max_moves}")
        self.load_manager.trigger_rebalance(max_moves)

    def _changed(self, change: Change) -> None:
        if isinstance(change, LeadershipGained | LeadershipLost):
            self.load_manager.leadership(isinstance(change, LeadershipGained))
        elif isinstance(change, Unfenced):
            self.runtime.fenced = None
            lease = self.membership.machine.lease_id
            assert lease is not None
            self.ownership.member(lease, self.membership.machine.registered_revision)
        else:
            self.runtime.fenced = change.reason

    def _load_report(self) -> dict[str, Any]:
        topics = tuple(TopicLoad(topic) for topic in self.runtime.core.served_topics())
        report = LoadReport(self.broker_id, (), topics, timestamp=int(time.time()))
        return report.to_json()

    async def _read_ns(self) -> int:
        snapshot = await self.store.scan(keys.NAMESPACES_PREFIX)
        seen = {}
        for kv in snapshot:
            name = keys.parse_namespace_policy(kv.key)
            if name is not None:
                seen[name] = kv.value if isinstance(kv.value, dict) else {}
        core = self.runtime.core
        for name in core.namespaces():
            if name not in seen:
                core.namespace_seen(name, None)
        for name, policies in seen.items():
            core.namespace_seen(name, policies)
        return max((kv.mod_revision for kv in snapshot), default=0)

    def _ns(self, event: WatchEvent) -> None:
        name = keys.parse_namespace_policy(event.key)
        if name is None:
            return
        value = event.value if isinstance(event.value, dict) else {}
        policies = value if event.kind == "put" else None
        self.runtime.core.namespace_seen(name, policies)

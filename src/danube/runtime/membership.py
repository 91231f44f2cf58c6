"""Runs a broker's `Membership` machine against the metadata store (spec/cluster.md).

Every request the machine asks for runs as its own task with a deadline, and its outcome goes
back into the machine; the leader key is watched so the machine sees who leads. What the
machine decides for the rest of the broker (fenced, unfenced, leadership gained or lost) is
handed to `on_change`, in the order the machine decided it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from danube.effects import StoreTxn, StoreUnreachable
from danube.effects.flow import drive
from danube.keys import LEADER_KEY
from danube.machines.cluster import membership_flows as flows
from danube.machines.cluster.membership import (
    Effect,
    Fenced,
    LeadershipGained,
    LeadershipLost,
    Membership,
    Unfenced,
    WakeAt,
)
from danube.metadata import MetadataError, MetadataStore, WatchEvent
from danube.runtime.store_port import perform_store
from danube.runtime.watching import REQUEST_TIMEOUT_S, Alarm, follow

log = logging.getLogger("danube.runtime")

Change = Fenced | Unfenced | LeadershipGained | LeadershipLost


def _now_ms() -> int:
    return int(trio.current_time() * 1000)


class MembershipDriver:
    def __init__(
        self,
        store: MetadataStore,
        machine: Membership,
        *,
        on_change: Callable[[Change], None] = lambda change: None,
        load_report: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self.store = store
        self.machine = machine
        self._on_change = on_change
        self._load_report = load_report
        self._nursery: trio.Nursery | None = None
        self._alarm = Alarm(lambda: self._apply(self.machine.tick(_now_ms())))
        self._leader_read = trio.Event()
        self.started = trio.Event()
        """Set once the broker is a registered, unfenced member."""

    async def run(self) -> None:
        """Until cancelled; `stop` first for a graceful exit that revokes the lease."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(
                follow, self.store, LEADER_KEY, self._read_leader, self._leader_event
            )
            nursery.start_soon(self._alarm.run)
            # The first campaign waits for the first read of the leader key: a read answered
            # after the campaign won would tell the machine the key is gone, and the new
            # leader would lose and win again at once.
            await self._leader_read.wait()
            self._apply(self.machine.start(_now_ms()))

    async def stop(self) -> None:
        """Gives up leadership and revokes the lease, so the cluster fails this broker's topics
        over at once instead of after the lease's TTL."""
        self._apply(self.machine.stop())
        lease = self.machine.lease_id
        if lease is not None:
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                try:
                    await self.store.revoke(lease)
                except MetadataError as error:
                    log.warning("event=lease_revoke_failed lease=%d error=%s", lease, error)

    # -- effects ------------------------------------------------------------------------------

    def _apply(self, effects: list[Effect]) -> None:
        assert self._nursery is not None
        for effect in effects:
            if isinstance(effect, WakeAt):
                self._alarm.set(effect.at_ms / 1000)
            elif isinstance(effect, Fenced | Unfenced | LeadershipGained | LeadershipLost):
                self._announce(effect)
            else:
                self._nursery.start_soon(self._request, effect)

    def _announce(self, change: Change) -> None:
        broker = self.machine.config.broker_id
        if isinstance(change, Fenced):
            log.warning("event=broker_fenced broker=%s reason=%r", broker, change.reason)
        elif isinstance(change, Unfenced):
            self.started.set()
            log.info("event=broker_member broker=%s lease=%s", broker, self.machine.lease_id)
        elif isinstance(change, LeadershipGained):
            log.info("event=leader_elected broker=%s", broker)
        else:
            log.info("event=leadership_lost broker=%s reason=%r", broker, change.reason)
        self._on_change(change)

    async def _request(self, effect: Effect) -> None:
        """Runs the request's flow (`danube.machines.cluster.membership_flows`) and feeds the
        machine's answer back."""
        flow = flows.flow_of(self.machine, effect, _now_ms)
        assert flow is not None, effect
        self._apply(await drive(flow, self._perform))

    async def _perform(self, request: Any) -> Any:
        if isinstance(request, flows.MeasureLoad):
            return self._load_report()
        try:
            answer = await perform_store(self.store, request)
        except StoreUnreachable as error:
            log.warning("event=membership_request_failed request=%r error=%s", request, error)
            raise
        if isinstance(request, StoreTxn) and not answer.committed:
            log.warning(
                "event=membership_request_failed request=%r outcome=%s",
                request.purpose, answer.outcome.value,
            )  # fmt: skip
        return answer

    async def _read_leader(self) -> int:
        current = await self.store.get(LEADER_KEY)
        self._leader_read.set()
        if current is None:
            self._apply(self.machine.leader_seen(None, _now_ms()))
            return 0
        leader = str(current.value)
        self._apply(self.machine.leader_seen(leader, _now_ms(), lease=current.lease))
        return current.mod_revision

    def _leader_event(self, event: WatchEvent) -> None:
        if event.key == LEADER_KEY:  # the watch is of a prefix: not /cluster/leader_x
            leader = None if event.kind == "delete" else str(event.value)
            self._apply(self.machine.leader_seen(leader, _now_ms(), lease=event.lease))

"""Runs the broker's `Ownership` machine (`danube.machines.cluster.ownership`) against the metadata
store and the broker core: the data-plane half of cluster mode (spec/cluster.md, "Ownership
fencing" and "Topic moves").

The machine sees this broker's assignments and the unassigned markers, each followed as a read
plus a watch; it decides when to claim, load, unload, drop and release a topic. This driver
runs those steps:

- **Claim / Release**: one store transaction each, the outcome reported back.
- **Load**: reads the topic's metadata, records this broker as the topic's writer (compared on
  the claim, so a stale claim loads nothing), registers the claim as the fencing token of the
  runtime's writes, then adopts the topic in the core and waits for its WAL.
- **Unload**: the core refuses publishes and seals; the driver waits until the WAL is idle,
  every sealed segment is indexed and the cursors are written, then forgets the topic and its
  local files. The unload of a deleted topic skips the seal: it forgets the topic and its
  files at once (the admin's DeleteTopic removes the metadata and objects).
- **Restart** (the core's `TopicStopped(restart=True)`, through the port): the machine's
  unload, release and claim again, as above, keeping the files (a new epoch, same log).
- **Drop**: forgets the topic at once and keeps its files (the lease that held the claim is
  gone; another broker may own the topic already).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import trio
import trio_asyncio

from danube import keys
from danube.effects import StoreTxn, StoreTxns
from danube.effects.flow import Flow, drive
from danube.machines.cluster import ownership as own
from danube.machines.cluster import ownership_flows as flows
from danube.machines.cluster.ownership import SETTLE_POLL_MS, Effect, Ownership, WakeAt
from danube.machines.cluster.records import Marker
from danube.machines.cluster.request_batching import FLOW_SLOTS, LoadQueue
from danube.metadata import MetadataError, MetadataStore, WatchEvent
from danube.runtime.broker import BrokerRuntime, now_ms
from danube.runtime.store_port import STORE_EFFECTS, perform_store
from danube.runtime.watching import REQUEST_TIMEOUT_S, Alarm, failure_text, follow

log = logging.getLogger("danube.runtime")

T = TypeVar("T")

Adoption = tuple[flows.Adopt, "asyncio.Future[None]"]
"""An `Adopt` started in the core and the wait for its metadata and WAL."""

_Change = frozenset[str] | tuple[str, bool]
"""An assignment snapshot (every topic assigned here), or one topic (un)assigned."""


def _monotonic_ms() -> int:
    return int(trio.current_time() * 1000)


class OwnershipDriver:
    def __init__(
        self,
        store: MetadataStore,
        machine: Ownership,
        runtime: BrokerRuntime,
    ) -> None:
        self.store = store
        self.machine = machine
        self.runtime = runtime
        self.core = runtime.core
        self._broker_id = machine.config.broker_id
        self._nursery: trio.Nursery | None = None
        self._alarm = Alarm(lambda: self._apply(self.machine.tick(_monotonic_ms())))
        self._assigned: set[str] = set()
        self._markers: set[str] = set()
        self._changes_in, self._changes = trio.open_memory_channel[_Change](math.inf)
        self._restarts_in, self._restarts = trio.open_memory_channel[str](math.inf)
        runtime.port.on_restart = self._restarts_in.send_nowait
        """The interpreter's `TopicStopped(restart=True)`, on the asyncio loop; the machine
        hears it from `_apply_restarts`, in trio."""
        self._bounds = {kind: trio.CapacityLimiter(n) for kind, n in FLOW_SLOTS.items()}
        """Which effects' flows wait for a slot, and how many: `request_batching`'s rule."""
        self._loads = LoadQueue()
        """Loads waiting for a slot; a slot takes a batch of them (`request_batching`)."""
        self.on_adopted: Callable[[str, tuple[Any, int] | None], Awaitable[None]] | None = None
        """Called after a topic is adopted here (the replication port pushes its replicas
        value, so the owner replicates without waiting for a change)."""

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._alarm.run)
            nursery.start_soon(self._apply_assignments)
            nursery.start_soon(self._apply_restarts)
            prefix = f"{keys.BROKERS_PREFIX}{self._broker_id}/"
            nursery.start_soon(follow, self.store, prefix, self._read_assignments, self._assignment)
            nursery.start_soon(
                follow, self.store, keys.UNASSIGNED_PREFIX, self._read_markers, self._marker
            )

    def member(self, lease_id: int, registered_at: int) -> None:
        """From the membership driver: the broker is registered with this lease, at this
        revision (its claims take no assignment older than that)."""
        self._apply(self.machine.member(lease_id, _monotonic_ms(), registered_at=registered_at))

    # -- the machine's view ---------------------------------------------------------------------

    async def _read_assignments(self) -> int:
        prefix = f"{keys.BROKERS_PREFIX}{self._broker_id}/"
        snapshot = await self.store.scan(prefix)
        found = set()
        for kv in snapshot:
            parsed = keys.parse_assignment_key(kv.key)
            if parsed is not None:
                found.add(parsed[1])
        self._changes_in.send_nowait(frozenset(found))
        return max((kv.mod_revision for kv in snapshot), default=0)

    def _assignment(self, event: WatchEvent) -> None:
        parsed = keys.parse_assignment_key(event.key)
        if parsed is None or parsed[0] != self._broker_id:
            return
        self._changes_in.send_nowait((parsed[1], event.kind == "put"))

    async def _apply_assignments(self) -> None:
        """Assignment changes reach the machine here, one at a time and in the order seen,
        because a deletion waits for its marker to be read (`_unassigned`)."""
        async for change in self._changes:
            if isinstance(change, frozenset):
                for topic in sorted(self._assigned - change):
                    await self._unassigned(topic)
                for topic in sorted(change):
                    self._apply(self.machine.assignment_seen(topic, True, _monotonic_ms()))
                self._assigned = set(change)
                continue
            topic, assigned = change
            if assigned:
                self._assigned.add(topic)
                self._apply(self.machine.assignment_seen(topic, True, _monotonic_ms()))
            else:
                await self._unassigned(topic)

    async def _apply_restarts(self) -> None:
        """A repair rewound a replicated topic's log below what its followers may hold: the
        machine unloads it and claims it again, under a new epoch (`Ownership.restart`)."""
        async for topic in self._restarts:
            log.warning("event=topic_restarting topic=%s", topic)
            self._apply(self.machine.restart(topic, _monotonic_ms()))

    async def _unassigned(self, topic: str) -> None:
        """The leader posted the topic's marker in the transaction that deleted the
        assignment; the marker watch may not have brought it yet, so it is read first and
        the machine decides knowing whether the topic is moved or deleted. A marker that
        does not name this broker is left to the watch (the machine owes it nothing)."""
        self._assigned.discard(topic)
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                found = await self.store.get(keys.unassigned_key(topic))
        except (MetadataError, trio.TooSlowError) as error:
            log.warning("event=marker_read_failed topic=%s error=%s", topic, failure_text(error))
            found = None
        if found is not None:
            try:
                marker = Marker.from_json(found.value)
            except ValueError:
                marker = None
            if marker is not None and marker.from_broker == self._broker_id and not marker.ready:
                self._apply(
                    self.machine.marker_seen(
                        topic, marker, found.mod_revision, now_ms=_monotonic_ms()
                    )
                )
        self._apply(self.machine.assignment_seen(topic, False, _monotonic_ms()))

    async def _read_markers(self) -> int:
        snapshot = await self.store.scan(keys.UNASSIGNED_PREFIX)
        now = _monotonic_ms()
        found = set()
        for kv in snapshot:
            topic = keys.parse_unassigned_key(kv.key)
            if topic is not None:
                found.add(topic)
                self._see_marker(topic, kv.value, kv.mod_revision, now)
        for topic in sorted(self._markers - found):
            self._apply(self.machine.marker_seen(topic, None, 0, now))
        self._markers = found
        return max((kv.mod_revision for kv in snapshot), default=0)

    def _marker(self, event: WatchEvent) -> None:
        topic = keys.parse_unassigned_key(event.key)
        if topic is None:
            return
        now = _monotonic_ms()
        if event.kind == "put":
            self._markers.add(topic)
            self._see_marker(topic, event.value, event.mod_revision, now)
        else:
            self._markers.discard(topic)
            self._apply(self.machine.marker_seen(topic, None, 0, now))

    def _see_marker(self, topic: str, value: Any, revision: int, now: int) -> None:
        try:
            marker = Marker.from_json(value)
        except ValueError as error:
            log.warning("event=marker_unreadable topic=%s error=%s", topic, error)
            return
        self._apply(self.machine.marker_seen(topic, marker, revision, now))

    # -- effects --------------------------------------------------------------------------------

    def _apply(self, effects: list[Effect]) -> None:
        if self._nursery is None:
            return
        for effect in effects:
            if isinstance(effect, WakeAt):
                self._alarm.set(effect.at_ms / 1000)
                continue
            if isinstance(effect, own.Load):
                if self._loads.offer(effect):
                    self._nursery.start_soon(self._take_loads)
                continue
            flow = flows.flow_of(self.machine, effect, _monotonic_ms)
            if flow is not None:
                self._nursery.start_soon(self._run, flow, self._bounds.get(type(effect)))

    async def _run(self, flow: Flow[list[Effect]], bound: trio.CapacityLimiter | None) -> None:
        """Carries out one effect's flow (`danube.machines.cluster.ownership_flows`) and feeds the
        machine's answer back; claims and loads wait for a slot (`request_batching.FLOW_SLOTS`)."""
        if bound is None:
            self._apply(await drive(flow, self._perform))
            return
        async with bound:
            answer = await drive(flow, self._perform)
        self._apply(answer)

    async def _take_loads(self) -> None:
        """One taker per new load: once a load slot is free, the loads waiting then, as one
        flow (`request_batching.LoadQueue`); none left (an earlier taker took them): the
        slot is given back at once."""
        async with self._bounds[own.Load]:
            batch = self._loads.take()
            if not batch:
                return
            adoptions: list[Adoption] = []
            answer = await drive(
                flows.load_many(self.machine, batch, _monotonic_ms),
                partial(self._perform, adoptions=adoptions),
            )
            await self._adopted_all(adoptions)
        self._apply(answer)

    async def _perform(self, request: Any, adoptions: list[Adoption] | None = None) -> Any:
        """`adoptions`: a batch's (`load_many`) `Adopt`s are started in the core's order and
        answered at once, their waits (metadata durable, WAL loaded) kept here for the
        driver to await together before it feeds the batch's answer to the machine. Waited
        one after the other (60-100 ms each: etcd and disk waits), a failover's batch of 27
        topics took 2.3 s to adopt; together, the survivor that is not the leader adopted
        each topic at most 0.35-0.85 s after its writer record, against 1.3-4.0 s
        (bench/RESULTS.md, 2026-12-02)."""
        if adoptions is not None and isinstance(request, flows.Adopt):
            adoptions.append((request, await self._on_loop(lambda: self._start_adopt(request))))
            return None
        if isinstance(request, STORE_EFFECTS):
            answer = await perform_store(self.store, request)
            if isinstance(request, StoreTxn):
                log.info(
                    "event=ownership_txn what=%r outcome=%s",
                    request.purpose, answer.outcome.value,
                )  # fmt: skip
            elif isinstance(request, StoreTxns):
                for txn, one in zip(request.txns, answer, strict=True):
                    log.info(
                        "event=ownership_txn what=%r outcome=%s", txn.purpose, one.outcome.value
                    )
            return answer
        if isinstance(request, flows.Adopt):
            await self._adopt(request)
        elif isinstance(request, flows.Seal):
            await self._on_loop(lambda: self._seal(request.topic))
        elif isinstance(request, flows.AwaitSettled):
            while not self.core.settled(request.topic):
                await trio.sleep(SETTLE_POLL_MS / 1000)
            await trio_asyncio.aio_as_trio(self.runtime.flush_metadata)()
            return self.core.lifecycle.tail_kept(request.topic)
        elif isinstance(request, flows.Forget):
            await self._on_loop(lambda: self._forget(request))
        else:
            raise AssertionError(f"an ownership flow asked for {request!r}")
        return None

    async def _adopt(self, request: flows.Adopt) -> None:
        settled = await self._on_loop(lambda: self._start_adopt(request))
        await self._adopted_all([(request, settled)])

    async def _start_adopt(self, request: flows.Adopt) -> asyncio.Future[None]:
        """Adopts the topic in the core and starts the step's effects now, in the core's
        order (on the asyncio loop); the future is done once its metadata is durable and its
        WAL loaded (`BrokerRuntime.start`), and logs `topic_loaded` then."""
        assert self.runtime.claims is not None
        self.runtime.claims[request.topic] = request.claim_revision
        step = self.core.adopt(
            request.entries, keep_local=request.keep_local, epoch=request.claim_revision
        )
        return asyncio.ensure_future(self._loaded(request, self.runtime.start(step)))

    @staticmethod
    async def _loaded(request: flows.Adopt, settled: Awaitable[None]) -> None:
        await settled
        log.info("event=topic_loaded topic=%s kept_local_wal=%s", request.topic, request.keep_local)

    async def _adopted_all(self, adoptions: list[Adoption]) -> None:
        """Waits for every adoption started, then reads each topic's replica set back."""
        if not adoptions:
            return

        async def every() -> None:
            await asyncio.gather(*(settled for _, settled in adoptions))

        await trio_asyncio.aio_as_trio(every)()
        if self.on_adopted is None or self._nursery is None:
            return
        for request, _ in adoptions:
            # Beside the flow, not in it: the load flow would otherwise wait for these
            # reads (issue 23).
            self._nursery.start_soon(self._adopted, request.topic, request.replica_set)

    async def _adopted(self, topic: str, written: tuple[Any, int] | None) -> None:
        assert self.on_adopted is not None
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                await self.on_adopted(topic, written)
        except (MetadataError, trio.TooSlowError) as error:
            # the watch brings the value later (the claim wrote it)
            log.warning("event=replicas_read_failed topic=%s error=%s", topic, failure_text(error))

    async def _seal(self, topic: str) -> None:
        self.runtime.apply(self.core.unload(topic, now_ms()).effects)

    async def _forget(self, request: flows.Forget) -> None:
        topic = request.topic
        removed = self.core.remove(topic, reason=request.reason, delete_files=request.delete_files)
        self.runtime.apply(removed.effects)
        if self.runtime.claims is not None:
            self.runtime.claims.pop(topic, None)
        level = logging.WARNING if request.event == "topic_dropped" else logging.INFO
        log.log(level, "event=%s topic=%s reason=%r", request.event, topic, request.reason)

    async def _on_loop(self, work: Callable[[], Awaitable[T]]) -> T:
        """Core calls and the runtime's effects happen on the asyncio loop, in one order with
        the gRPC handlers' (see BrokerRuntime)."""
        return await trio_asyncio.aio_as_trio(work)()

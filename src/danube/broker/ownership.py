"""Runs the broker's `Ownership` machine (`danube.cluster.ownership`) against the metadata
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
- **Drop**: forgets the topic at once and keeps its files (the lease that held the claim is
  gone; another broker may own the topic already).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
import trio_asyncio

from danube import keys
from danube.broker.runtime import BrokerRuntime, now_ms
from danube.broker.watching import REQUEST_TIMEOUT_S, Alarm, failure_text, follow
from danube.cluster.ownership import (
    SETTLE_POLL_MS,
    Claim,
    Drop,
    Effect,
    Load,
    Ownership,
    Release,
    Unload,
    WakeAt,
    become_writer,
    load_entries,
    load_reads,
    own_claim,
    owner_key,
    release_done,
)
from danube.cluster.records import Marker
from danube.metadata import KeyValue, MetadataError, MetadataStore, WatchEvent

log = logging.getLogger("danube.broker")

T = TypeVar("T")

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

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._alarm.run)
            nursery.start_soon(self._apply_assignments)
            prefix = f"{keys.BROKERS_PREFIX}{self._broker_id}/"
            nursery.start_soon(follow, self.store, prefix, self._read_assignments, self._assignment)
            nursery.start_soon(
                follow, self.store, keys.UNASSIGNED_PREFIX, self._read_markers, self._marker
            )

    def member(self, lease_id: int) -> None:
        """From the membership driver: the broker is registered with this lease."""
        self._apply(self.machine.member(lease_id, _monotonic_ms()))

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
            elif isinstance(effect, Claim):
                self._nursery.start_soon(self._claim, effect)
            elif isinstance(effect, Release):
                self._nursery.start_soon(self._release, effect)
            elif isinstance(effect, Load):
                self._nursery.start_soon(self._load, effect)
            elif isinstance(effect, Unload):
                self._nursery.start_soon(self._unload, effect)
            elif isinstance(effect, Drop):
                self._drop(effect.topic)

    async def _claim(self, effect: Claim) -> None:
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                result = await self.store.txn(effect.compares, effect.ops)
        except (MetadataError, trio.TooSlowError) as error:
            log.warning("event=claim_failed topic=%s error=%s", effect.topic, failure_text(error))
            succeeded, revision, known = False, 0, False
        else:
            succeeded, revision, known = result.succeeded, result.revision, True
            if not succeeded:
                known, found = await self._owner(effect.topic)
                if known and own_claim(found, self._broker_id, self.machine.lease_id):
                    assert found is not None
                    succeeded, revision = True, found.mod_revision
            if succeeded:
                log.info("event=topic_claimed topic=%s revision=%d", effect.topic, revision)
        self._apply(
            self.machine.claim_done(effect.topic, succeeded, revision, _monotonic_ms(), known=known)
        )

    async def _owner(self, topic: str) -> tuple[bool, KeyValue | None]:
        """(read, the claim in the store): after a compare failed, what is really there
        (`own_claim`, `release_done`); `read` False when the store did not answer."""
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                return True, await self.store.get(owner_key(topic))
        except (MetadataError, trio.TooSlowError):
            return False, None

    async def _release(self, effect: Release) -> None:
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                result = await self.store.txn(effect.compares, effect.ops)
            succeeded = result.succeeded
        except (MetadataError, trio.TooSlowError) as error:
            log.warning("event=release_failed topic=%s error=%s", effect.topic, failure_text(error))
            succeeded = False
        else:
            if not succeeded:
                read, found = await self._owner(effect.topic)
                succeeded = read and release_done(effect, found)
        if succeeded:
            log.info("event=topic_released topic=%s", effect.topic)
        self._apply(self.machine.released(effect.topic, succeeded, _monotonic_ms()))

    async def _load(self, effect: Load) -> None:
        topic = effect.topic
        try:
            entries, keep_local = await self._prepare(topic, effect.claim_revision)
        except (MetadataError, trio.TooSlowError, LookupError) as error:
            log.warning("event=topic_load_failed topic=%s error=%s", topic, failure_text(error))
            self._apply(self.machine.load_failed(topic, _monotonic_ms()))
            return
        assert self.runtime.claims is not None
        self.runtime.claims[topic] = effect.claim_revision
        revision = effect.claim_revision
        await self._on_loop(lambda: self._adopt(entries, keep_local, revision))
        log.info("event=topic_loaded topic=%s kept_local_wal=%s", topic, keep_local)
        self._apply(self.machine.loaded(topic, _monotonic_ms()))

    async def _prepare(self, topic: str, claim_revision: int) -> tuple[dict[str, Any], bool]:
        """The topic's metadata, and whether a WAL directory found here is still its own."""
        prefixes, policy_key = load_reads(topic)
        with trio.fail_after(REQUEST_TIMEOUT_S):
            scanned = [kv for prefix in prefixes for kv in await self.store.scan(prefix)]
            policy = await self.store.get(policy_key)
        entries = load_entries(topic, scanned, policy)
        writer = become_writer(topic, self._broker_id, claim_revision, entries)
        with trio.fail_after(REQUEST_TIMEOUT_S):
            result = await self.store.txn(writer.compares, writer.ops)
        if not result.succeeded:
            raise LookupError(f"the claim on {topic} is gone")
        return entries, writer.keep_local

    async def _adopt(self, entries: dict[str, Any], keep_local: bool, epoch: int) -> None:
        await self.runtime.run(self.core.adopt(entries, keep_local=keep_local, epoch=epoch))

    async def _unload(self, effect: Unload) -> None:
        topic, started = effect.topic, trio.current_time()
        if effect.deleted:
            await self._on_loop(lambda: self._forget(topic, f"topic {topic} was deleted", True))
            log.info("event=topic_deleted_here topic=%s", topic)
            self._apply(self.machine.unloaded(topic, _monotonic_ms()))
            return
        await self._on_loop(lambda: self._seal(topic))
        while not self.core.settled(topic):
            await trio.sleep(SETTLE_POLL_MS / 1000)
        await trio_asyncio.aio_as_trio(self.runtime.flush_metadata)()
        if not self.machine.unloading(topic, effect.claim_revision):
            log.info("event=unload_overtaken topic=%s", topic)
            return
        await self._on_loop(lambda: self._forget(topic, "moved to another broker", True))
        log.info("event=topic_unloaded topic=%s seconds=%.3f", topic, trio.current_time() - started)
        self._apply(self.machine.unloaded(topic, _monotonic_ms()))

    async def _seal(self, topic: str) -> None:
        self.runtime.apply(self.core.unload(topic, now_ms()).effects)

    async def _forget(self, topic: str, reason: str, delete_files: bool) -> None:
        removed = self.core.remove(topic, reason=reason, delete_files=delete_files)
        self.runtime.apply(removed.effects)
        if self.runtime.claims is not None:
            self.runtime.claims.pop(topic, None)

    def _drop(self, topic: str) -> None:
        log.warning("event=topic_dropped topic=%s reason=ownership_lost", topic)
        assert self._nursery is not None
        reason = "this broker lost its ownership of the topic"
        self._nursery.start_soon(self._on_loop, lambda: self._forget(topic, reason, False))

    async def _on_loop(self, work: Callable[[], Awaitable[T]]) -> T:
        """Core calls and the runtime's effects happen on the asyncio loop, in one order with
        the gRPC handlers' (see BrokerRuntime)."""
        return await trio_asyncio.aio_as_trio(work)()

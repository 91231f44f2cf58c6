"""`MetadataStore` over an in-process `MetadataState`: tests, the simulator, and the base of the
embedded store, which adds durability through the `_persist` hook."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import ClassVar, Self

import trio

from danube.metadata.model import (
    CompactedError,
    Compare,
    Delete,
    DeletePrefix,
    JSONValue,
    KeyValue,
    Op,
    Put,
    StoreClosed,
    TxnResult,
    WatchEvent,
)
from danube.metadata.state import MetadataState, PreparedTxn


class _Watcher:
    __slots__ = ("after", "backlog", "error", "prefix", "receive", "send")

    def __init__(self, prefix: str, after: int, backlog: list[WatchEvent], buffer: int) -> None:
        self.prefix = prefix
        # Live events at or below this revision were already covered by the backlog.
        self.after = after
        self.backlog = deque(backlog)
        self.send, self.receive = trio.open_memory_channel[WatchEvent](buffer)
        # Raised to the consumer once the buffered events are drained; None ends iteration.
        self.error: Exception | None = None


class _WatchStream(AsyncIterator[WatchEvent]):
    def __init__(self, watcher: _Watcher) -> None:
        self._watcher = watcher

    async def __anext__(self) -> WatchEvent:
        watcher = self._watcher
        if watcher.backlog:
            await trio.lowlevel.checkpoint()
            return watcher.backlog.popleft()
        try:
            return await watcher.receive.receive()
        except trio.EndOfChannel:
            if watcher.error is not None:
                raise watcher.error from None
            raise StopAsyncIteration from None


class MemoryStore:
    """The reference `MetadataStore`: etcd semantics, nothing survives the process.

    Writers are serialised by one lock so that a subclass persisting between prepare and commit
    still applies transactions in revision order. Expired leases are collected at the start of
    every operation; `run_lease_expiry` also collects them while nobody calls the store, which
    is what makes a dead holder's ephemeral keys disappear for watchers.
    """

    LEASE_CHECK_INTERVAL_S: ClassVar[float] = 0.5

    def __init__(
        self,
        clock: Callable[[], float] = trio.current_time,
        *,
        watch_buffer: int = 1024,
        history_limit: int = 10_000,
        state: MetadataState | None = None,
    ) -> None:
        if watch_buffer < 1:
            raise ValueError("watch_buffer must be at least 1")
        self._clock = clock
        self._watch_buffer = watch_buffer
        self._state = MetadataState(history_limit) if state is None else state
        self._write_lock = trio.Lock()
        self._watchers: dict[_Watcher, None] = {}
        self._closed_reason: str | None = None
        self._closed = trio.Event()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- reads --------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        await self._begin_read()
        return self._state.get(key)

    async def scan(self, prefix: str) -> list[KeyValue]:
        await self._begin_read()
        return self._state.scan(prefix)

    @asynccontextmanager
    async def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncGenerator[AsyncIterator[WatchEvent], None]:
        await self._begin_read()
        current = self._state.revision
        if start_revision is None:
            watcher = _Watcher(prefix, current, [], self._watch_buffer)
        else:
            backlog = self._state.events_since(start_revision, prefix)
            watcher = _Watcher(prefix, max(current, start_revision), backlog, self._watch_buffer)
        self._watchers[watcher] = None
        try:
            yield _WatchStream(watcher)
        finally:
            self._watchers.pop(watcher, None)
            watcher.receive.close()

    # -- writes -------------------------------------------------------------------------------

    async def put(self, key: str, value: JSONValue, lease: int | None = None) -> int:
        return (await self.txn((), (Put(key, value, lease),))).revision

    async def delete(self, key: str) -> bool:
        deleted: bool = (await self.txn((), (Delete(key),))).responses[0]
        return deleted

    async def delete_prefix(self, prefix: str) -> int:
        count: int = (await self.txn((), (DeletePrefix(prefix),))).responses[0]
        return count

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        async with self._write_lock:
            self._ensure_open()
            self._expire_leases()
            prepared = self._state.prepare(compares, success, failure)
            if prepared.changes:
                await self._persist(prepared)
            self._publish(self._state.commit(prepared))
        return prepared.result

    # -- leases -------------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: float) -> int:
        await self._begin_read()
        return self._state.grant_lease(ttl_s, self._clock())

    async def keepalive(self, lease_id: int) -> None:
        await self._begin_read()
        self._state.keepalive(lease_id, self._clock())

    async def revoke(self, lease_id: int) -> None:
        async with self._write_lock:
            self._ensure_open()
            self._expire_leases()
            self._publish(self._state.revoke(lease_id))

    async def run_lease_expiry(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Collects expired leases every LEASE_CHECK_INTERVAL_S until the store closes."""
        task_status.started()
        while not self._closed.is_set():
            with trio.move_on_after(self.LEASE_CHECK_INTERVAL_S):
                await self._closed.wait()
            async with self._write_lock:
                if self._closed_reason is None:
                    self._expire_leases()

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        # Under the lock, so a write that is being persisted finishes first; shielded, because
        # a store whose owner is being cancelled must still end its watchers.
        with trio.CancelScope(shield=True):
            async with self._write_lock:
                if self._closed_reason is None:
                    self._shut("the metadata store is closed", None)

    # -- for subclasses -----------------------------------------------------------------------

    async def _persist(self, prepared: PreparedTxn) -> None:
        """Makes a prepared change durable before it becomes visible. Called with the write
        lock held; if it raises, the change is not applied. Memory keeps nothing."""

    def _shut(self, reason: str, watch_error: StoreClosed | None) -> None:
        """Stops the store: later calls raise StoreClosed(reason); watchers drain what they
        have, then end (or raise `watch_error`, for a store that failed rather than closed)."""
        self._closed_reason = reason
        for watcher in self._watchers:
            watcher.error = watch_error
            watcher.send.close()
        self._watchers.clear()
        self._closed.set()

    # -- internals ----------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._closed_reason is not None:
            raise StoreClosed(self._closed_reason)

    async def _begin_read(self) -> None:
        await trio.lowlevel.checkpoint()
        self._ensure_open()
        # A writer may be between prepare and commit; changing the state under it would
        # invalidate its transaction, so expiry waits for the next call or the expiry task.
        if not self._write_lock.locked():
            self._expire_leases()

    def _expire_leases(self) -> None:
        self._publish(self._state.expire(self._clock()))

    def _publish(self, events: Sequence[WatchEvent]) -> None:
        for event in events:
            for watcher in list(self._watchers):
                if event.mod_revision <= watcher.after or not event.key.startswith(watcher.prefix):
                    continue
                try:
                    watcher.send.send_nowait(event)
                except trio.WouldBlock:
                    watcher.error = CompactedError(
                        f"watch on {watcher.prefix!r} fell more than {self._watch_buffer} events "
                        f"behind; changes from revision {event.mod_revision} on were dropped"
                    )
                    watcher.send.close()
                    del self._watchers[watcher]

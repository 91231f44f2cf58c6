"""The broker process's adapter between the gRPC handlers and the effect interpreter.

gRPC handlers run on the asyncio loop that trio-asyncio hosts; they call the core
synchronously (one thread, so no locks) and hand the resulting effects here. The one
interpreter (`danube.interpreter`, spec/effects.md) carries them out against the production
port (`danube.runtime.io_port`): a topic's WAL file effects in order, metadata changes by one
writer in the order the core produced them, the checkpoint writer, loads and drops. What is
left here is the asyncio side of waiting: a reply waits until every metadata change produced
before it is durable (no client is ever told about state a crash could forget), and a
reliable publish's reply also for the WAL acknowledgement that covers its offset.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

import trio

from danube.interpreter import Interpreter
from danube.machines.cluster.ownership import NotOwner, fence_compares
from danube.machines.node.core import BrokerCore, Effect, PersistMeta, Step
from danube.metadata import MetadataStore
from danube.runtime.io_port import ProductionPort, StreamSlot, monotonic_ms, now_ms
from danube.runtime.memory_return import rss_bytes
from danube.runtime.metrics import BrokerMetrics
from danube.runtime.object_store import ObjectStore
from danube.values.errors import DanubeError, ErrorCode

T = TypeVar("T")

__all__ = ["BrokerRuntime", "StreamSlot", "monotonic_ms", "now_ms", "persist"]


async def persist(
    store: MetadataStore, effect: PersistMeta, claims: Mapping[str, int] | None = None
) -> None:
    """One metadata change written before the interpreter runs (the bootstrap's)."""
    result = await store.txn(fence_compares(effect.keys, claims), effect.ops())
    if not result.succeeded:
        raise NotOwner("this broker's claim on the topic is gone")


class BrokerRuntime:
    def __init__(
        self,
        core: BrokerCore,
        store: MetadataStore,
        wal_root: Path,
        nursery: trio.Nursery,
        loop: asyncio.AbstractEventLoop,
        objects: ObjectStore | None = None,
        *,
        metrics: BrokerMetrics,
        clustered: bool = False,
    ) -> None:
        self.core = core
        self.metrics = metrics
        self.claims: dict[str, int] | None = {} if clustered else None
        """Cluster mode: topic -> revision of this broker's ownership claim, the fencing
        token of every metadata write for the topic (kept by the ownership driver)."""
        self.objects = objects
        """The object tier (None without one); the admin's cluster DeleteTopic uses it too."""
        self._loop = loop
        self.port = ProductionPort(
            store, wal_root, nursery, loop, objects, metrics=metrics, claims=lambda: self.claims
        )
        self.interpreter = Interpreter(core, self.port, objects=objects is not None)
        self.fenced: str | None = None
        """Cluster mode: why this broker may not acknowledge publishes now (its membership
        is not renewed in time), else None."""
        self.transports: list[Callable[[], tuple[int, int]]] = []
        """Each gRPC server's `transport_counts` (`server.py` adds them): open streams and
        client connections, reported to the core at each tick."""
        self.stopping = False
        """Set at shutdown: new receive streams are refused so that clients which reopen
        their stream at once (the official ones do) cannot keep the broker from stopping."""

    # -- steps and their replies --------------------------------------------------------------

    async def run(self, step: Step[T]) -> T:
        """Executes the step's effects and returns its value once its metadata is durable
        and the WALs of the reliable topics it created are loaded."""
        await self.start(step)
        return step.value

    def start(self, step: Step[Any]) -> Coroutine[Any, Any, None]:
        """`run`, split for callers that must keep the core's order between steps: the
        effects start now, before the caller's next await; the result waits for the rest."""
        interpreter = self.interpreter
        first = interpreter.metadata.submitted + 1
        target = interpreter.apply(step.effects)
        settled = self._future()
        interpreter.settle(first, target, step.effects, settled)
        return _wait(settled)

    def apply(self, effects: tuple[Effect, ...] | list[Effect]) -> int:
        """Starts every effect; returns the metadata sequence number a reply must wait for."""
        return self.interpreter.apply(effects)

    async def pace(self, topic: str, count: int) -> None:
        """Holds `count` messages of `topic` as long as its `max_publish_rate` asks
        (`BrokerCore.publish_pace`): the caller's reply, and so its producer, waits."""
        delay_ms = self.core.publish_pace(topic, count, now_ms())
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)

    async def publish(self, topic: str, step: Step[int]) -> int:
        """Runs a reliable publish's step; returns its offset once the WAL acknowledged it
        at the topic's durability level."""
        await self.start_publish(topic, step, step.value)
        return step.value

    def start_publish(self, topic: str, step: Step[Any], through: int) -> Coroutine[Any, Any, None]:
        """`publish`, split as `start` splits `run`, for a step that appended offsets up to
        `through` (a batch): done once the WAL acknowledged all of them."""
        stored = self._future()
        # Registered before any effect runs, so no acknowledgement can slip past it.
        self.interpreter.wait_stored(topic, through, stored)
        return self._acknowledged(self.start(step), stored)

    async def _acknowledged(
        self, settled: Coroutine[Any, Any, None], stored: asyncio.Future[None]
    ) -> None:
        await settled
        await stored
        self.check_unfenced()

    def check_unfenced(self) -> None:
        """A fenced broker (cluster mode) acknowledges nothing: another broker may own the
        topic by now (spec/cluster.md, "Ownership fencing", rule 1)."""
        if self.fenced is not None:
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                f"this broker is fenced ({self.fenced}); look the topic up and send again",
            )

    def _future(self) -> asyncio.Future[None]:
        future = self._loop.create_future()
        # A reply abandoned before it awaited its waiter (a cancelled request) leaves
        # nothing to report: its failure is read here so asyncio does not log it.
        future.add_done_callback(_retrieved)
        return future

    # -- the broker's lifetime ------------------------------------------------------------------

    async def tick(self, period: float) -> None:
        """Time-driven work of the core (WAL flushes and rotation, dispatch timers)."""
        while True:
            await trio.sleep(period)
            self._in_loop(self._tick_core)

    def _tick_core(self) -> Step[None]:
        """The open streams and connections of every server first (the state pool charges
        them, spec/memory.md "State"), then the core's tick with the process's RSS
        (/proc/self/statm: one small read a tick; the budget holds on it, "The process's RSS")."""
        streams = connections = 0
        for counts in self.transports:
            more_streams, more_connections = counts()
            streams += more_streams
            connections += more_connections
        self.core.transport_open(streams, connections)
        return self.core.tick(now_ms(), monotonic_ms(), rss_bytes())

    def _in_loop(self, call: Callable[[], Step[Any]]) -> None:
        """Calls the core from a trio task: on the asyncio loop, where the handlers call it
        too, so every core call and the execution of its effects keep one order."""
        self._loop.call_soon_threadsafe(lambda: self.apply(call().effects))

    async def quiesce(self, timeout: float, upload_timeout: float = 0.0) -> None:
        """Graceful stop: cursors persisted, WALs sealed and idle (or `timeout` passed), and,
        with an object tier, the sealed tails uploaded and indexed (or `upload_timeout`
        passed), so a broker that loses its disk later loses nothing that was stored."""
        applied = trio.Event()

        def quiesce() -> None:
            self.apply(self.core.quiesce(now_ms()).effects)
            applied.set()

        self._loop.call_soon_threadsafe(quiesce)
        await applied.wait()
        with trio.move_on_after(timeout):
            while self.core.wal_busy():
                await trio.sleep(0.01)
        with trio.move_on_after(upload_timeout):
            while self.core.tier_busy():
                await trio.sleep(0.05)
        # The last marks, so that a restart can tell damage from a torn tail.
        marked = trio.Event()
        self._loop.call_soon_threadsafe(self.interpreter.checkpoint_all, marked.set)
        with trio.move_on_after(timeout):
            await marked.wait()
        await self.port.stop()

    async def flush_metadata(self) -> None:
        """Waits until every metadata change submitted so far is durable (shutdown)."""
        target = self.interpreter.metadata.submitted
        flushed = self._future()
        self.interpreter.settle(target + 1, target, (), flushed)
        # a failed write is logged where it failed; nothing waits for it now
        with contextlib.suppress(DanubeError):
            await flushed

    # -- streams --------------------------------------------------------------------------------

    def attach_stream(self, consumer_id: int, generation: int) -> StreamSlot:
        return self.port.streams.attach(consumer_id, generation)

    def detach_stream(self, consumer_id: int, slot: StreamSlot) -> None:
        self.port.streams.detach(consumer_id, slot)

    @property
    def open_streams(self) -> int:
        return len(self.port.streams.slots)


async def _wait(future: Awaitable[None]) -> None:
    await future


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()

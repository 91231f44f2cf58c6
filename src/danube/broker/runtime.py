"""Executes the core's effects inside the broker process.

gRPC handlers run on the asyncio loop that trio-asyncio hosts; they call the core synchronously
(one thread, so no locks) and hand the resulting effects here. Metadata changes are written by
one writer in the order the core produced them, and a reply waits until every change produced
before it is durable: no client is ever told about state a crash could forget.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass, field
from typing import TypeVar

import trio_asyncio

from danube.core.errors import DanubeError, ErrorCode
from danube.dispatch import ConsumerReady
from danube.metadata import Delete, DeletePrefix, MetadataStore, Put
from danube.node.core import BrokerCore, Effect, EndStream, PersistMeta, Step

log = logging.getLogger("danube.broker")

T = TypeVar("T")


@dataclass(slots=True)
class StreamSlot:
    """The live receive stream of one consumer, as its writer sees it."""

    generation: int
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False


async def persist(store: MetadataStore, effect: PersistMeta) -> None:
    ops = [
        *(DeletePrefix(prefix) for prefix in effect.delete_prefixes),
        *(Delete(key) for key in effect.deletes),
        *(Put(key, value) for key, value in effect.puts),
    ]
    await store.txn([], ops)


class BrokerRuntime:
    def __init__(self, core: BrokerCore, store: MetadataStore) -> None:
        self.core = core
        self._store = store
        self._slots: dict[int, StreamSlot] = {}
        """Open streams by generation: an old stream stays addressable after a takeover."""
        self._current: dict[int, int] = {}
        """consumer id -> generation of its newest stream (where its messages go)."""
        self._pending: collections.deque[PersistMeta] = collections.deque()
        self._submitted = 0
        self._durable = 0
        self._writer_wakeup = asyncio.Event()
        self._progress = asyncio.Event()
        self._write_failure: str | None = None
        self.stopping = False
        """Set at shutdown: new receive streams are refused so that clients which reopen
        their stream at once (the official ones do) cannot keep the broker from stopping."""

    async def run(self, step: Step[T]) -> T:
        """Executes the step's effects and returns its value once its metadata is durable."""
        target = self.apply(step.effects)
        while self._durable < target:
            await self._progress.wait()
        if self._write_failure is not None:
            raise DanubeError(
                ErrorCode.UNAVAILABLE,
                f"the broker could not persist metadata ({self._write_failure}); retry later",
            )
        return step.value

    def apply(self, effects: tuple[Effect, ...] | list[Effect]) -> int:
        """Starts every effect; returns the metadata sequence number a reply must wait for."""
        for effect in effects:
            if isinstance(effect, ConsumerReady):
                generation = self._current.get(effect.consumer_id)
                slot = self._slots.get(generation) if generation is not None else None
                if slot is not None:
                    slot.wakeup.set()
            elif isinstance(effect, EndStream):
                slot = self._slots.get(effect.generation)
                if slot is not None:
                    slot.ended = True
                    slot.wakeup.set()
            else:
                self._pending.append(effect)
                self._submitted += 1
                self._writer_wakeup.set()
        return self._submitted

    def attach_stream(self, consumer_id: int, generation: int) -> StreamSlot:
        slot = StreamSlot(generation)
        self._slots[generation] = slot
        self._current[consumer_id] = generation
        return slot

    def detach_stream(self, consumer_id: int, slot: StreamSlot) -> None:
        self._slots.pop(slot.generation, None)
        if self._current.get(consumer_id) == slot.generation:
            del self._current[consumer_id]

    @property
    def open_streams(self) -> int:
        return len(self._slots)

    async def flush_metadata(self) -> None:
        """Waits until every metadata change submitted so far is durable (shutdown)."""
        while self._durable < self._submitted:
            await self._progress.wait()

    async def write_metadata(self) -> None:
        """The single metadata writer (an asyncio task for the broker's lifetime)."""
        while True:
            await self._writer_wakeup.wait()
            self._writer_wakeup.clear()
            while self._pending:
                effect = self._pending.popleft()
                try:
                    await trio_asyncio.trio_as_aio(persist)(self._store, effect)
                except Exception as error:
                    self._write_failure = f"{type(error).__name__}: {error}"
                    log.error("event=metadata_write_failed error=%r", self._write_failure)
                self._durable += 1
                progress, self._progress = self._progress, asyncio.Event()
                progress.set()

"""One etcd watch: a grpclib stream drained by an asyncio task of the store's loop into trio.

The asyncio task (`_Watch.pump`) runs on the trio thread (see danube.metadata.etcd.loop), so it
hands each response to the consumer's trio memory channel directly, in etcd's order, with no
thread in between.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Protocol

import trio
from grpclib.client import Channel
from grpclib.const import Cardinality

from danube.metadata.etcd import wire
from danube.metadata.model import CompactedError, MetadataCorrupted, MetadataError, WatchEvent

WATCH = "/etcdserverpb.Watch/Watch"


class WatchOwner(Protocol):
    """What a watch needs of its store."""

    watch_buffer: int

    def error(self, exc: BaseException) -> Exception: ...

    def watch_event(self, event: wire.Event) -> WatchEvent: ...


class Watch:
    """One etcd watch stream, read by an asyncio task into a trio channel.

    A response is taken whole, because etcd packs up to 1000 revisions into one when it replays
    history and the consumer cannot read in the middle of it; a response that arrives while
    `watch_buffer` events are still unread ends the watch with CompactedError instead, after
    the consumer has read those.
    """

    def __init__(
        self, owner: WatchOwner, prefix: str, request: wire.Encoded, endpoint: str
    ) -> None:
        self.owner = owner
        self.prefix = prefix
        self.request = request
        self.endpoint = endpoint
        # Bounded by the check in `_deliver`, not by the channel (see above).
        self.send, self.receive = trio.open_memory_channel[WatchEvent](math.inf)
        # Set once etcd confirmed the watch or it ended, whichever came first.
        self.settled = trio.Event()
        # Set once the asyncio task is over (it holds the stream until then).
        self.finished = trio.Event()
        self.created = False
        self.ended = False
        # Raised to the consumer once the buffered events are drained; None ends iteration.
        self.error: Exception | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, channel: Channel) -> None:
        """Starts the reading task; an asyncio coroutine (run it on the store's loop)."""
        self._task = asyncio.ensure_future(self._pump(channel))

    def end(self, error: Exception | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.error = error
        self.send.close()
        self.settled.set()
        if self._task is not None:
            self._task.cancel()
        else:
            self.finished.set()

    async def _pump(self, channel: Channel) -> None:
        try:
            # The request side stays open: etcd would take its end as "no more requests",
            # not as the end of the watch, but an open stream is the usual shape.
            async with channel.request(
                WATCH,
                Cardinality.STREAM_STREAM,
                wire.Encoded,
                wire.WatchReply,
            ) as stream:
                await stream.send_message(self.request)
                async for response in stream:
                    if not self._deliver(response):
                        await stream.cancel()
                        return
            self.end(MetadataError(f"etcd at {self.endpoint} ended the watch on {self.prefix!r}"))
        except asyncio.CancelledError:
            pass  # `end`, or the store's loop closing
        except Exception as exc:
            # After `end` the stream fails as cancelled, which nobody needs to hear about.
            self.end(self.owner.error(exc))
        finally:
            self.finished.set()

    def _deliver(self, response: wire.WatchReply) -> bool:
        """Takes one watch response; returns whether to keep reading the stream."""
        if self.ended:
            return False
        if response.compact_revision:
            self.end(
                CompactedError(
                    f"watch on {self.prefix!r}: etcd compacted its history up to revision "
                    f"{response.compact_revision}; re-read the keys and watch from the current "
                    "revision"
                )
            )
            return False
        if response.canceled:
            reason = response.cancel_reason or "no reason given"
            self.end(MetadataError(f"etcd cancelled the watch on {self.prefix!r}: {reason}"))
            return False
        if response.created:
            self.created = True
            self.settled.set()
        if not response.events:
            return True
        if self.send.statistics().current_buffer_used >= self.owner.watch_buffer:
            self.end(
                CompactedError(
                    f"watch on {self.prefix!r} fell more than {self.owner.watch_buffer} events "
                    f"behind; changes from revision {response.events[0].kv.mod_revision} on "
                    "were dropped"
                )
            )
            return False
        try:
            events = [self.owner.watch_event(event) for event in response.events]
        except MetadataCorrupted as exc:
            self.end(exc)
            return False
        for event in events:
            self.send.send_nowait(event)
        return True


BURST = 32
"""Events a watch hands over already received without a trio checkpoint between them. A
checkpoint per event gave every other runnable task (gRPC handlers, client lookups) a turn
between two events of one etcd response: on a busy leader a failover's markers reached the
load manager 4-13 ms apart, 0.6 s after the transaction that wrote them, and 1.5-1.9 s
passed from the first `FailOver` to the last `Assign` of 100 topics (bench/RESULTS.md,
2026-12-02; 0.75-1.41 s with bursts).
Bounded, so that a long replay still lets the loop run (at most `BURST` events' handling at
a time) and a cancellation is seen."""


class WatchStream(AsyncIterator[WatchEvent]):
    def __init__(self, watch: Watch) -> None:
        self._watch = watch
        self._unyielded = 0

    async def __anext__(self) -> WatchEvent:
        receive = self._watch.receive
        try:
            if self._unyielded < BURST:
                try:
                    event = receive.receive_nowait()
                except trio.WouldBlock:
                    pass
                else:
                    self._unyielded += 1
                    return event
            self._unyielded = 0
            return await receive.receive()
        except trio.EndOfChannel:
            if self._watch.error is not None:
                raise self._watch.error from None
            raise StopAsyncIteration from None


def watch_request(start: bytes, end: bytes, start_revision: int | None) -> wire.Encoded:
    # etcd's start is inclusive, ours is not; 0 is etcd's "from now on".
    first = 0 if start_revision is None else start_revision + 1
    return wire.Encoded(wire.watch_create_request(start, end, first))

"""What the cluster drivers share: the deadline of one store request, a single alarm that the
latest request of a machine resets, and a key space followed as a read plus a watch."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
import trio_asyncio

from danube.metadata import MetadataError, MetadataStore, WatchEvent
from danube.values.errors import DanubeError, ErrorCode

log = logging.getLogger("danube.runtime")

T = TypeVar("T")

REQUEST_TIMEOUT_S = 3.0
WATCH_RETRY_S = 0.5


def failure_text(error: BaseException) -> str:
    """What a failed store request says in a log line or an error: `trio.TooSlowError` (our
    deadline) carries no message, and an exception object is always truthy."""
    return str(error) or "timeout"


async def store_call_from_grpc(call: Callable[..., Awaitable[T]], *args: Any) -> T:
    """A store request from a gRPC handler (asyncio), run in trio with a deadline; a store
    that does not answer is UNAVAILABLE to the client, who retries."""

    async def bounded() -> T:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            return await call(*args)

    try:
        result: T = await trio_asyncio.trio_as_aio(bounded)()
    except (MetadataError, trio.TooSlowError) as error:
        raise DanubeError(
            ErrorCode.UNAVAILABLE, f"the metadata store did not answer ({failure_text(error)})"
        ) from None
    return result


class Alarm:
    """Calls `fire` once at the time last `set` (trio clock seconds); a later `set` replaces
    an earlier one, as the machines' WakeAt and ScheduleTick effects say."""

    def __init__(self, fire: Callable[[], None]) -> None:
        self._fire = fire
        self._at: float | None = None
        self._changed = trio.Event()

    def set(self, at_s: float) -> None:
        self._at = at_s
        self._changed.set()

    async def run(self) -> None:
        while True:
            self._changed = trio.Event()
            if self._at is None:
                await self._changed.wait()
                continue
            with trio.move_on_at(self._at):
                await self._changed.wait()
                continue
            self._at = None
            self._fire()


async def follow(
    store: MetadataStore,
    prefix: str,
    read: Callable[[], Awaitable[int]],
    on_event: Callable[[WatchEvent], None],
) -> None:
    """The key space under `prefix` as a machine must see it: `read` applies its state now and
    returns the newest revision that state includes, then every later change goes to
    `on_event`. The watch opens before the read, so no change falls between them; an event at
    or below the read's revision is already in it and is skipped (a later one is newer, or a
    delete of a key the read no longer had, which changes nothing). After a watch error
    (compaction, the store unreachable) it starts over; it returns when the store closes."""
    while True:
        try:
            async with store.watch(prefix) as events:
                seen = await read()
                async for event in events:
                    if event.mod_revision > seen:
                        on_event(event)
                return
        except MetadataError as error:
            log.warning("event=watch_restart prefix=%s error=%s", prefix, error)
            await trio.sleep(WATCH_RETRY_S)

"""Where the etcd client's asyncio meets the caller's trio: an asyncio loop of the store's own.

grpclib is asyncio code. Each `EtcdStore` runs it on a trio-asyncio loop that a system task of
the caller's trio run hosts, so every call and every watch runs on the caller's trio thread,
with no worker threads and no second event loop thread. The store does not borrow the broker's
trio-asyncio loop (runtime/server.py opens it): the broker connects its store before that loop
exists (recovery reads metadata first) and closes it after that loop has closed, and tests and
tools open stores with no broker loop at all. Two trio-asyncio loops in one trio run are
independent: asyncio code finds its loop through the trio task that runs it.

A system task rather than a task of the caller's: `EtcdStore.connect` returns a store that
outlives the call, and nothing gives it a nursery. The task ends when the store closes, or is
cancelled with the other system tasks when the trio run ends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio
import trio_asyncio

from danube.metadata.model import StoreClosed

log = logging.getLogger(__name__)

T = TypeVar("T")


class AsyncioHost:
    """One trio-asyncio loop, hosted by a system task; start it with `AsyncioHost.start`."""

    def __init__(self) -> None:
        self._loop: trio_asyncio.TrioEventLoop | None = None
        self._stop = trio.Event()
        self._stopped = trio.Event()

    @classmethod
    async def start(cls, name: str) -> AsyncioHost:
        host = cls()
        ready = trio.Event()
        trio.lowlevel.spawn_system_task(host._host, ready, name=name)
        await ready.wait()
        return host

    async def _host(self, ready: trio.Event) -> None:
        try:
            async with trio_asyncio.open_loop() as loop:
                self._loop = loop
                ready.set()
                await self._stop.wait()
        except Exception:
            # A system task must not raise: that would crash the whole trio run.
            log.exception("event=etcd_asyncio_loop_failed")
        finally:
            self._loop = None
            ready.set()
            self._stopped.set()

    async def run(self, function: Callable[..., Awaitable[T]], *args: object) -> T:
        """Runs the asyncio coroutine function on this loop and returns its result in trio.

        Cancelling the caller cancels the asyncio task (trio_asyncio.aio_as_trio).
        """
        loop = self._loop
        if loop is None:
            raise StoreClosed("the metadata store is closed")
        result: T = await trio_asyncio.aio_as_trio(function, loop=loop)(*args)
        return result

    async def stop(self) -> None:
        """Ends the loop (its asyncio tasks are cancelled first) and waits until it has."""
        self._stop.set()
        with trio.CancelScope(shield=True):
            await self._stopped.wait()

"""A closed connection's streams leave nothing alive (spec/memory.md, "Giving memory back";
bench/RESULTS.md, issue 28 part 6): grpclib kept a finished request task in its handler until
a tenth later stream, a closed connection's tasks for good, and the connection's handler in
the server until a tenth later connection. A cancelled task holds its exception, whose
traceback holds the handler's frames and the stream: 3,000 streams closed at the end of a
load kept 38 MiB of live objects, which no collection or `malloc_trim` could give back."""

from __future__ import annotations

import asyncio
import gc
import weakref

from grpclib.client import Channel

from danube.runtime.h2_guard import GuardedHandler
from tests.broker.test_h2_abuse import serving, settle
from tests.broker.test_transport_counts import _slow
from tests.support.aio import run


def _request_tasks(served: object) -> list[weakref.ref[asyncio.Task[None]]]:
    tasks = []
    for handler in list(served.server._handlers):  # type: ignore[attr-defined]
        assert isinstance(handler, GuardedHandler)
        tasks += [weakref.ref(t) for t in [*handler._tasks.values(), *handler._cancelled]]
    return tasks


def test_streams_cut_with_their_connection_leave_no_task_nor_handler() -> None:
    async def scenario() -> None:
        async with serving(delay=5) as served:
            channel = Channel("127.0.0.1", served.port)
            calls = [asyncio.ensure_future(_slow(channel)) for _ in range(5)]
            await settle(lambda: served.probe.started == 5)
            tasks = _request_tasks(served)
            assert len(tasks) == 5
            channel.close()  # the calls are cut off with their connection
            await asyncio.gather(*calls, return_exceptions=True)
            await settle(lambda: served.server.transport_counts() == (0, 0))
            await settle(lambda: not served.server._handlers)
            assert not served.server._handlers, "a closed connection's handler was kept"
            del calls
            gc.collect()
            assert [t for t in tasks if t() is not None] == [], "its request tasks live on"

    run(scenario)


def test_a_finished_call_lets_go_of_its_task_at_once() -> None:
    async def scenario() -> None:
        async with serving(delay=0.05) as served:
            channel = Channel("127.0.0.1", served.port)
            call = asyncio.ensure_future(_slow(channel))
            await settle(lambda: served.probe.started == 1)
            tasks = _request_tasks(served)
            await call
            await settle(lambda: served.server.transport_counts()[0] == 0)
            gc.collect()
            assert [t for t in tasks if t() is not None] == []
            (handler,) = served.server._handlers  # the connection stays open: its handler too
            assert not handler._tasks and not handler._cancelled
            channel.close()
            await settle(lambda: not served.server._handlers)
            assert not served.server._handlers

    run(scenario)

"""The runtime's side of the publish pool's waiters (spec/memory.md, "Back-pressure"): the
request driver sleeps a waiting publish on a future the pool's release resolves, so it goes
on as soon as room frees (not at the next poll, not at its timeout), and one whose time runs
out is refused and leaves the queue."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from danube.machines.memory.budget import split
from danube.machines.memory.publish import PublishPool
from danube.machines.requests import publish
from danube.runtime.request_driver import RequestDriver
from danube.values.errors import DanubeError, ErrorCode


class _Core:
    def __init__(self, pool: PublishPool) -> None:
        self.publish_pool = pool
        self.memory = split(16 * 1024 * 1024)


def _clock() -> int:
    return int(time.monotonic() * 1000)


def test_a_waiting_publish_is_woken_by_the_release_and_one_out_of_time_is_refused() -> None:
    async def scenario() -> None:
        pool = PublishPool(1_000, wait_ms=5_000, max_waiting_bytes=1_200)
        driver = RequestDriver(runtime=None)  # type: ignore[arg-type]
        assert pool.reserve(1_000)
        core: Any = _Core(pool)
        waiting = asyncio.ensure_future(
            driver.run(publish.admitted(core, 600, _clock, stream=False))
        )
        behind = asyncio.ensure_future(
            driver.run(publish.admitted(core, 600, _clock, stream=False))
        )
        await asyncio.sleep(0.05)
        assert pool.waiting == 2 and not waiting.done()
        started = time.monotonic()
        pool.release(1_000)  # room for the first in line only
        assert await asyncio.wait_for(waiting, 1) is pool
        assert time.monotonic() - started < 0.5  # woken by the release, far before its timeout
        assert pool.used == 600 and pool.waiting == 1 and not behind.done()
        behind.cancel()  # its client left: out of the queue
        with pytest.raises(asyncio.CancelledError):
            await behind
        assert pool.waiting == 0 and pool.used == 600

        short = PublishPool(1_000, wait_ms=100)
        assert short.reserve(1_000)
        with pytest.raises(DanubeError) as refused:
            await driver.run(publish.admitted(_Core(short), 10, _clock, stream=False))  # type: ignore[arg-type]
        assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
        assert short.waiting == 0 and short.refused == 1 and short.paused_ms >= 100

    asyncio.run(scenario())

"""The broker's asyncio loop, hosted by trio-asyncio, running its ready callbacks in batches.

Issue 23, point 1. Every asyncio callback (a task's step, a future's done callback, a
`call_soon` from the WAL writer threads) reaches trio-asyncio's loop through a trio memory
channel, and its loop takes them one at a time: for each, a `trio.move_on_after` cancel
scope, a channel `receive` and a trip through trio's scheduler. In a profile of the publish
hot path without gRPC (`bench/hot_path.py`, bench/RESULTS.md 2026-11-29) that per-callback
machinery was about a fifth of the broker's CPU, and a publish runs a dozen callbacks.

`open_loop` is `trio_asyncio.open_loop` whose loop, after waiting for the first callback,
runs the others already queued at that moment without a cancel scope or a checkpoint each
(as asyncio's own loop runs the handles ready at the start of an iteration), then lets trio
run its tasks (I/O readiness, the nursery's tasks) before the next batch. Callbacks still
run one at a time, in the order they were queued; timers and trio-flavoured handles take
trio-asyncio's own path.

It wraps a private method of trio-asyncio (`_main_loop_one`, version 0.16): when that is not
there, the loop is left as trio-asyncio made it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio_asyncio

BATCH_LIMIT = 256
"""Callbacks run at most in one batch: trio's tasks (reading sockets among them) wait no
longer than this many callbacks."""

SWITCH_INTERVAL_S = 0.001
"""CPython's switch interval while the broker's loop runs (its default is 5 ms). A worker
thread doing CPU-bound work (a schema check under its budget, an object upload's signing)
keeps the GIL until the loop's thread has waited this long, and the loop's thread gives the
GIL up at every socket call: a call over TLS makes a dozen, so with 5 ms each one HealthCheck
waited 80-100 ms behind one schema check (the hostile suite's anyOf-doubling check, 1 CI run
in 3 over its 100 ms limit; 19-25 ms with 1 ms). Threads that only wait on the disk or the
network are not affected: they give the GIL up themselves."""


def batched(loop: Any) -> bool:
    """Makes `loop` (a trio-asyncio loop) run its ready callbacks in batches; returns whether
    it could (the private attributes it relies on are there)."""
    one = getattr(loop, "_main_loop_one", None)
    receiver = getattr(loop, "_q_recv", None)
    if one is None or receiver is None or not hasattr(loop, "_stopped"):
        return False

    async def main_loop_one(no_wait: bool = False) -> None:
        await one(no_wait)
        ready = min(receiver.statistics().current_buffer_used, BATCH_LIMIT)
        for _ in range(ready):
            if loop._stopped.is_set():
                return
            try:
                await one(True)
            except trio.WouldBlock:
                return

    loop._main_loop_one = main_loop_one
    return True


@asynccontextmanager
async def open_loop() -> AsyncIterator[asyncio.AbstractEventLoop]:
    """`trio_asyncio.open_loop()`, its callbacks run in batches (see the module's docstring),
    with the loop's thread waiting at most `SWITCH_INTERVAL_S` for the GIL."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
    try:
        async with trio_asyncio.open_loop() as loop:
            batched(loop)
            yield loop
    finally:
        sys.setswitchinterval(interval)
